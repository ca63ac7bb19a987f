"""``npudoctor fix --apply``: record the enabled fixes where every sglang process finds them.

The record is one small distribution, ``npudoctor-fixes-activation``, written into a
directory on the path of the interpreter that runs sglang (``site_dir``: by default the
directory sglang is imported from): a ``.dist-info`` with ``METADATA``, a ``RECORD`` (so ``pip
uninstall npudoctor-fixes-activation`` also removes it), the plan (``npudoctor-fixes.json``)
and an ``entry_points.txt`` that registers ``npudoctor.patching.activation:sglang_plugin`` in
sglang's plugin group ``sglang.srt.plugins``. sglang 0.5.11+ loads that group in every
scheduler process (``load_plugins()``), so the fixes are applied there; ``SGLANG_PLUGINS``
can select the plugin by its name, ``npudoctor``.

The directory is written beside its final name and renamed into place, so a reader sees
the old record or the new one, never a half-written one. ``remove`` deletes exactly the
files the record lists, leaving the directory as it was before ``--apply``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.errors import InputError
from npudoctor.patching.planfile import DIST_NAME, PLAN_FILE, plan_of

if TYPE_CHECKING:
    from npudoctor.target.discovery import Target

DIST_INFO = "npudoctor_fixes_activation-1.dist-info"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "npudoctor"
SITE_ENV = "NPUDOCTOR_SITE"  # where the record goes instead of this interpreter's site-packages


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


def write(plan: dict, site: Path | None = None, target: Target | None = None) -> Path:
    """Write (or replace) the record with ``plan`` in ``site_dir(site, target)``; returns its directory."""
    directory = site_dir(site, target)
    final = directory / DIST_INFO
    staging = _staging(directory)
    try:
        files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1\n"
            "Summary: npudoctor runtime fixes enabled by `npudoctor fix --apply`\n",
            "entry_points.txt": f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = npudoctor.patching.activation:sglang_plugin\n",
            PLAN_FILE: json.dumps(plan, indent=2, sort_keys=True) + "\n",
            "INSTALLER": "npudoctor\n",
        }
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "RECORD").write_text(_record(files), encoding="utf-8")
        staging.chmod(0o755)
        if final.exists():
            retired = Path(tempfile.mkdtemp(prefix=".npudoctor-old-", dir=directory))
            os.replace(final, retired / DIST_INFO)
            os.replace(staging, final)
            shutil.rmtree(retired)
        else:
            os.replace(staging, final)
    except OSError as error:  # a full disk, a record directory someone made unwritable
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"cannot write the fix record in {directory} ({error.strerror or error})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def require_writable(site: Path | None = None, target: Target | None = None) -> Path:
    """The record's directory, once it is known that ``write`` can stage a record there: said before
    ``--apply`` plans (a live run), the way ``write`` would find it (``os.access`` passes root)."""
    directory = site_dir(site, target)
    _staging(directory).rmdir()
    return directory


def _staging(directory: Path) -> Path:
    """A new empty directory beside the record, renamed into place once written."""
    if not directory.is_dir():
        raise InputError(
            f"{directory}: not a directory (set --site or {SITE_ENV} to a directory on sys.path)"
        )
    try:
        return Path(tempfile.mkdtemp(prefix=".npudoctor-", dir=directory))
    except OSError as error:
        raise InputError(
            f"cannot write to {directory} ({error.strerror}): use --site DIR with a writable directory "
            f"that sglang's processes have on sys.path (PYTHONPATH), or `npudoctor run`"
        ) from None


def remove(site: Path | None = None, target: Target | None = None) -> Path | None:
    """Delete the record; returns its former path, or None when there was none."""
    final = site_dir(site, target) / DIST_INFO
    if not final.exists() and not final.is_symlink():
        return None
    if final.is_symlink() or not final.is_dir():
        raise InputError(f"{final} is not the directory npudoctor writes; not removed")
    try:
        # the names --apply writes: a record whose plan or RECORD is damaged still goes, anything
        # someone else put there stays
        unexpected = sorted({p.name for p in final.iterdir()} - set(_FILES))
        if unexpected:
            raise InputError(
                f"{final} holds files npudoctor did not write ({', '.join(unexpected)}); not removed"
            )
        shutil.rmtree(final)
    except OSError as error:
        raise InputError(f"cannot remove {final} ({error.strerror})") from None
    return final


def read(site: Path | None = None, target: Target | None = None) -> dict | None:
    """The recorded plan document in ``site_dir(site, target)`` (None when nothing is recorded there)."""
    path = site_dir(site, target) / DIST_INFO / PLAN_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
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
