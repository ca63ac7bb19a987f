"""``npudoctor fix --apply``: record the enabled fixes where every sglang process finds them.

The record is one small distribution, ``npudoctor-fixes-activation``, written into a
directory on the path of the interpreter that runs sglang (``site_dir``: by default the
directory sglang is imported from): a ``.dist-info`` with ``METADATA``, a ``RECORD`` (so ``pip
uninstall npudoctor-fixes-activation`` also removes it), the plan (``npudoctor-fixes.json``)
and an ``entry_points.txt`` that registers ``npudoctor.patching.activation:sglang_plugin`` in
sglang's plugin group ``sglang.srt.plugins``. sglang 0.5.11+ loads that group in every
scheduler process (``load_plugins()``), so the fixes are applied there; ``SGLANG_PLUGINS``
can select the plugin by its name, ``npudoctor``.

Several ``fix`` at once (two CI jobs, a ``--status`` while an ``--apply`` runs, a ``fix`` killed
half-way) must leave one whole record or none. Writers (``--apply``, ``--revert``) take an
exclusive ``flock`` on ``.npudoctor-fixes.lock`` beside the record, created for the change and
removed when it ends (so nothing stays behind for pip to list). Readers (``--status``, and sglang's
plugin loader, which finds the ``.dist-info`` and reads its ``entry_points.txt``, then the plugin,
which reads the plan through ``importlib.metadata``) take no lock and see the old record or the
new one:

- the first ``--apply`` writes the ``.dist-info`` beside its final name (``.npudoctor-new-*``)
  and renames it into place: it appears whole;
- a later ``--apply`` keeps the ``.dist-info`` and replaces each file in it that differs with
  ``os.replace``, which is atomic per file. A directory that holds files cannot be replaced in one
  step: moving the old one away and the new one in leaves a moment with no record at all, in which
  a scheduler starting up would run without its fixes. ``METADATA``, ``entry_points.txt`` and
  ``INSTALLER`` never change (they are written again only when someone changed or removed them);
  ``RECORD`` goes in before the plan, its hash of the plan checked by nothing for an installed
  distribution (pip reads ``RECORD`` for the file list it uninstalls), and the plan last: when a
  file cannot be replaced, those already replaced are put back, so a failed ``--apply`` leaves the
  fixes recorded before;
- ``--revert`` renames the ``.dist-info`` away (``.npudoctor-old-*``), one step that changes
  nothing when the directory refuses it (read-only, immutable), then deletes it: a revert that
  cannot finish leaves the record whole, never an empty ``.dist-info`` (which pip lists as a
  distribution named "None").

A ``fix`` killed half-way leaves a ``.npudoctor-new-*`` or ``.npudoctor-old-*`` folder (and
perhaps the lock file, which the kernel has already unlocked). The next ``--apply``, ``--revert``
or ``--status`` removes such a folder under the lock, so never one a live writer holds, and only
when it is this user's and holds nothing but the record's files.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from npudoctor.errors import InputError
from npudoctor.patching.planfile import DIST_NAME, PLAN_FILE, plan_of

try:
    import fcntl
except ImportError:  # Windows, never an Ascend host: the record is written without the lock
    fcntl = None

if TYPE_CHECKING:
    from npudoctor.target.discovery import Target

DIST_INFO = "npudoctor_fixes_activation-1.dist-info"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "npudoctor"
PLUGIN_OBJECT = "npudoctor.patching.activation:sglang_plugin"  # what the entry point names
SITE_ENV = "NPUDOCTOR_SITE"  # where the record goes instead of this interpreter's site-packages
LOCK_FILE = ".npudoctor-fixes.lock"
LOCK_TIMEOUT = 60.0  # seconds: a change holds the lock for milliseconds; longer is a stopped `fix`
STAGING_PREFIX = ".npudoctor-new-"  # a record being written
RETIRED_PREFIX = ".npudoctor-old-"  # a record being deleted
# flock is not supported on this file system (Lustre without -o flock, some FUSE): the record is
# then written without the lock, each step still atomic for readers
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def site_dir(site: Path | None = None, target: Target | None = None) -> Path:
    """The directory that holds the record: ``site``, ``$NPUDOCTOR_SITE``, else where ``target``'s
    sglang is imported from (``import_dir``), else this interpreter's site-packages."""
    chosen = site or os.environ.get(SITE_ENV)
    if chosen:
        return Path(chosen)
    return import_dir(target) if target is not None else Path(sysconfig.get_paths()["purelib"])


def import_dir(target: Target) -> Path:
    """The directory on ``sys.path`` that sglang's processes import ``target`` from, where they
    also find the record's entry point; ``InputError`` (with the ``--site`` to give) when that
    cannot be told.

    - the installed sglang: the ``sys.path`` entry that holds ``sglang/``; an editable install
      that maps the package through an import hook has none, and is found through this
      interpreter's site-packages, where its hook is;
    - ``--sglang-path``: the directory holding ``sglang/`` when it is an import root (an unpacked
      wheel or a site-packages: a ``*.dist-info`` beside ``sglang/``); a source checkout is
      imported through an install of its own, which npudoctor cannot see.
    """
    root = target.root.resolve()
    if target.source == "installed":
        entries = {Path(entry or ".").resolve() for entry in sys.path}
        return root if root in entries else Path(sysconfig.get_paths()["purelib"])
    if any(root.glob("*.dist-info")):
        return root
    raise InputError(
        f"--sglang-path {target.root}: a source tree, not a directory sglang is imported from, so npudoctor "
        "cannot tell where its processes look for plugins: give --site DIR, a directory on the sys.path of "
        'the interpreter that runs it (its site-packages: python -c "import sysconfig; '
        "print(sysconfig.get_paths()['purelib'])\"), or start it with `npudoctor run`"
    )


class Written(NamedTuple):
    """What ``write`` did: the record's ``.dist-info``, and the document of the record it replaced
    (None: there was none, or it could not be read)."""

    record: Path
    replaced: dict | None


def write(plan: dict, site: Path | None = None, target: Target | None = None) -> Written:
    """Write (or replace) the record with ``plan`` in ``site_dir(site, target)``, under the lock."""
    directory = _existing(site_dir(site, target))
    final = directory / DIST_INFO
    failure = f"cannot write the fix record in {directory}"
    with _exclusive(directory, failure):
        _remove_leftovers(directory)
        if final.is_symlink() or (final.exists() and not final.is_dir()):
            raise InputError(f"{failure}: {final} is not the directory npudoctor writes")
        replaced = _replaced(directory)
        staging = None
        try:
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
            _fill(staging, plan)
            if final.is_dir():
                _replace_files(staging, final)  # the files left in staging go below
            else:
                os.rename(staging, final)
        except OSError as error:  # a full disk, a record directory someone made unwritable
            raise InputError(f"{failure} ({error.strerror or error})") from None
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return Written(final, replaced)


def _replace_files(staging: Path, final: Path) -> None:
    """Move the files of ``staging`` that differ over those of the record ``final``, the plan last;
    when one cannot be replaced (a file someone made immutable), put back the ones already moved
    and raise: a failed ``--apply`` leaves the record it found, its plan above all."""
    changed = [name for name in _FILES if not _same(staging / name, final / name)]
    changed.sort(key=lambda name: name == PLAN_FILE)  # RECORD first: its hash of the plan nothing checks
    previous: dict[str, bytes | None] = {}
    for name in changed:
        try:
            previous[name] = (final / name).read_bytes()
        except FileNotFoundError:
            previous[name] = None
    done: list[str] = []
    try:
        for name in changed:
            os.replace(staging / name, final / name)
            done.append(name)
    except OSError:
        for name in reversed(done):
            with contextlib.suppress(OSError):
                _restore(final / name, previous[name], staging)
        raise


def _same(new: Path, old: Path) -> bool:
    try:
        return old.is_file() and not old.is_symlink() and old.read_bytes() == new.read_bytes()
    except OSError:
        return False


def _restore(path: Path, content: bytes | None, staging: Path) -> None:
    """Put ``content`` back at ``path`` in one rename (None: there was no such file)."""
    if content is None:
        path.unlink()
        return
    back = staging / f".back-{path.name}"
    back.write_bytes(content)
    os.replace(back, path)


def require_writable(site: Path | None = None, target: Target | None = None) -> Path:
    """The record's directory, once it is known that ``write`` can stage a record there: said before
    ``--apply`` plans (a live run), the way ``write`` would find it (``os.access`` passes root)."""
    directory = _existing(site_dir(site, target))
    try:
        probe = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
    except OSError as error:
        raise InputError(
            f"cannot write to {directory} ({error.strerror}): use --site DIR with a writable directory "
            f"that sglang's processes have on sys.path (PYTHONPATH), or `npudoctor run`"
        ) from None
    with contextlib.suppress(FileNotFoundError):  # a `fix` holding the lock took it for a leftover
        probe.rmdir()
    return directory


def _existing(directory: Path) -> Path:
    if not directory.is_dir():
        raise InputError(
            f"{directory}: not a directory (set --site or {SITE_ENV} to a directory on sys.path)"
        )
    return directory


def _fill(staging: Path, plan: dict) -> None:
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1\n"
        "Summary: npudoctor runtime fixes enabled by `npudoctor fix --apply`\n",
        "entry_points.txt": f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_OBJECT}\n",
        PLAN_FILE: json.dumps(plan, indent=2, sort_keys=True) + "\n",
        "INSTALLER": "npudoctor\n",
    }
    for name, text in files.items():
        (staging / name).write_text(text, encoding="utf-8")
    (staging / "RECORD").write_text(_record(files), encoding="utf-8")
    staging.chmod(0o755)


def _replaced(directory: Path) -> dict | None:
    """The document of the record ``write`` is about to replace (None: none, or damaged)."""
    try:
        return read(directory)
    except InputError:
        return None


def remove(site: Path | None = None, target: Target | None = None) -> Path | None:
    """Delete the record; returns its former path, or None when there was none. A record that
    cannot be removed stays whole (``InputError``)."""
    directory = site_dir(site, target)
    final = directory / DIST_INFO
    if not final.exists() and not final.is_symlink():
        tidy(directory)  # what a killed `fix` left goes too
        return None
    _require_removable(final)
    failure = f"cannot remove {final} (the record is unchanged)"
    with _exclusive(directory, failure):
        _remove_leftovers(directory)
        if not final.exists() and not final.is_symlink():
            return None  # another --revert removed it while this one waited for the lock
        _require_removable(final)
        retired = directory / f"{RETIRED_PREFIX}{secrets.token_hex(8)}"
        try:
            os.rename(final, retired)
        except OSError as error:
            raise InputError(f"{failure}: {error.strerror or error}") from None
        # readers no longer see the record; a file that resists deletion goes with the next `fix`
        shutil.rmtree(retired, ignore_errors=True)
    return final


def _require_removable(final: Path) -> None:
    if final.is_symlink() or not final.is_dir():
        raise InputError(f"{final} is not the directory npudoctor writes; not removed")
    # the names --apply writes: a record whose plan or RECORD is damaged still goes, anything
    # someone else put there stays
    try:
        unexpected = sorted({p.name for p in final.iterdir()} - set(_FILES))
    except OSError as error:
        raise InputError(f"cannot remove {final} ({error.strerror})") from None
    if unexpected:
        raise InputError(
            f"{final} holds files npudoctor did not write ({', '.join(unexpected)}); not removed"
        )


def tidy(site: Path | None = None, target: Target | None = None) -> None:
    """Remove what a ``fix`` killed half-way left in the record's directory, if the lock is free
    (``fix --status``, ``--revert`` with no record): never waits, never fails."""
    directory = site_dir(site, target)
    if _leftovers(directory):
        with contextlib.suppress(InputError), _exclusive(directory, "", timeout=0):
            _remove_leftovers(directory)


@contextlib.contextmanager
def _exclusive(directory: Path, failure: str, timeout: float | None = None) -> Iterator[None]:
    """Hold the record's lock (``flock`` on ``LOCK_FILE`` in ``directory``) for one change;
    ``InputError`` starting with ``failure`` when it cannot be had within ``timeout`` seconds
    (default ``LOCK_TIMEOUT``).

    The file is removed when the change ends. A writer that was waiting then holds the lock of a
    file no longer there, so it locks again until the file it holds is the one at that name."""
    if fcntl is None:
        yield
        return
    path = directory / LOCK_FILE
    timeout = LOCK_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        try:  # 0600, never through a symlink: no one else can hold it or point it elsewhere
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise InputError(
                f"{failure}: cannot open the lock file {path} ({error.strerror or error})"
            ) from None
        try:
            locked = _lock(descriptor, deadline)
        except OSError as error:
            os.close(descriptor)
            raise InputError(f"{failure}: cannot lock {path} ({error.strerror or error})") from None
        except BaseException:  # Ctrl-C while waiting
            os.close(descriptor)
            raise
        if locked is None:  # no flock here
            os.close(descriptor)
            yield
            return
        if not locked:
            os.close(descriptor)
            raise InputError(
                f"{failure}: another process has held {path} for {timeout:.0f} s (an `npudoctor fix` stopped?)"
            )
        if _names(path, descriptor):
            break
        os.close(descriptor)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(descriptor)


def _lock(descriptor: int, deadline: float) -> bool | None:
    """Lock ``descriptor`` before ``deadline``: True, False (held elsewhere until then), None (the
    file system has no flock)."""
    pause = 0.001
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError as error:
            if error.errno in _NO_FLOCK:
                return None
            raise


def _names(path: Path, descriptor: int) -> bool:
    """Whether ``path`` is still the file ``descriptor`` has open."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _leftovers(directory: Path) -> list[Path]:
    """The staging and retired folders a killed ``fix`` left in ``directory``: by their names, this
    user's, and holding nothing but a record's files."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        with contextlib.suppress(OSError):
            if (
                entry.name.startswith((STAGING_PREFIX, RETIRED_PREFIX))
                and entry.is_dir(follow_symlinks=False)
                and (uid is None or entry.stat(follow_symlinks=False).st_uid == uid)
                and _holds_record_files_only(Path(entry.path))
            ):
                found.append(Path(entry.path))
    return found


def _holds_record_files_only(folder: Path) -> bool:
    """Whether ``folder`` holds a record's files and nothing else (no other name, no symlink);
    they may be in a ``DIST_INFO`` folder, as a ``fix`` from before the lock retired them."""
    for root, folders, files in os.walk(folder):
        if any(name != DIST_INFO for name in folders) or any(name not in _FILES for name in files):
            return False
        if any(os.path.islink(os.path.join(root, name)) for name in (*folders, *files)):
            return False
    return True


def _remove_leftovers(directory: Path) -> None:
    """Under the lock: no live ``fix`` is writing, every leftover is a killed one's."""
    for folder in _leftovers(directory):
        shutil.rmtree(folder, ignore_errors=True)


def read(site: Path | None = None, target: Target | None = None) -> dict | None:
    """The recorded plan document in ``site_dir(site, target)`` (None when nothing is recorded there)."""
    path = site_dir(site, target) / DIST_INFO / PLAN_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:  # a --revert removed it just now
        return None
    except (OSError, ValueError, RecursionError) as error:
        raise InputError(
            f"{path}: unreadable fix record ({error}); `npudoctor fix --revert` removes it"
        ) from None
    try:
        plan_of(document)  # what sglang's processes would read
    except ValueError as error:
        raise InputError(f"{path}: not a fix record ({error}); `npudoctor fix --revert` removes it") from None
    return document


def read_beside(target: Target) -> tuple[Path, dict] | None:
    """The record ``fix --apply`` wrote for ``target`` where it writes by default (``site_dir``:
    ``$NPUDOCTOR_SITE``, else the directory sglang is imported from): its ``.dist-info`` and plan
    document. None when nothing is recorded there, when there is no such directory (a source tree),
    or when the record there was written for another sglang (its ``sglang.path``), which is not
    this target's. ``InputError`` for a damaged record, as ``read``."""
    try:
        directory = site_dir(None, target)
    except InputError:  # a source tree: its processes' plugin directory cannot be told
        return None
    document = read(directory)
    if document is None:
        return None
    sglang = document.get("sglang")
    recorded = sglang.get("path") if isinstance(sglang, dict) else None
    if not recorded or Path(str(recorded)).resolve() != target.package_dir.resolve():
        return None
    return directory / DIST_INFO, document


_FILES = ("METADATA", "entry_points.txt", PLAN_FILE, "INSTALLER", "RECORD")


def _record(files: dict[str, str]) -> str:
    lines = []
    for name, text in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        lines.append(f"{DIST_INFO}/{name},sha256={digest},{len(text.encode())}")
    lines.append(f"{DIST_INFO}/RECORD,,")
    return "\n".join(lines) + "\n"
