"""The release cache: real sglang releases from PyPI, fetched once as wheels and unpacked.

``npudoctor advise`` and ``scripts/fetch_sglang.py`` (tests, demo, benchmarks) share it.
Each release is downloaded with ``pip download --no-deps sglang==X`` (the wheel only, never
its dependencies) into ``<cache>/wheels``, and its ``sglang/`` package (with the dist-info's
``METADATA``) is unpacked into ``<cache>/trees/X-<first 16 hex digits of the wheel's sha256>/``,
the layout ``npudoctor check --sglang-path`` takes. Stdlib only: the script imports it before
anything is installed.

A tree is handed out only when it proves, each time, to be the unpacked wheel at hand:

* it is found by the wheel's bytes, not by its file name: a replaced wheel is a new tree, and a
  tree cannot answer for another wheel of the same release;
* the wheel holds the release asked for: the version in its ``METADATA`` is the one asked (a
  wheel named for one release that holds another is refused, never checked under the wrong name);
* it is as it was unpacked: the marker (``.complete``, written last) names the wheel's sha256 and
  the count and size of the files unpacked, and the tree still has them (``__pycache__`` aside,
  which the live depth writes);
* nobody but this user (or root) could have written any of it, nor swapped it: every entry is
  owned by this user or root, writable by neither group nor others, and no symlink; the cache's
  folders likewise, and the folders above the cache writable by others only with the sticky bit
  (like ``/tmp``). At the live depth the tree is imported: its code runs in the live child, so a
  file another user could write is code that user chooses.

A tree that fails is moved aside and unpacked again; one that cannot be replaced, a wheel that
cannot be read (a damaged stream, a path too deep), a cache folder that is a file, read-only or
shared is a ``FetchError``: in ``advise`` that release's row, never the whole run. Unpacking takes
regular files and folders only, within a size and an entry count (a few hundred KB of zeros would
otherwise unpack to gigabytes; the count is read from the zip's end record before its directory is
parsed), from a wheel opened once: hashed and unpacked through the same descriptor.

The release list (``INDEX_FILE``, the index's answer kept for a day) is read and written only in a
cache proven private, like the trees: it is staged in a file made new (``O_EXCL``, never through a
link) and renamed into place, and read only from a regular file of this user's (or root's) that is
no link. A copy that is not one to trust, or not a list, is asked again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

try:
    import lzma
except ImportError:  # a Python built without it: zipfile then refuses LZMA entries (RuntimeError)
    lzma = None

COMPLETE = ".complete"  # written last: the proof of what the tree holds (a tree without it is redone)
INDEX_URL = "https://pypi.org/pypi/sglang/json"
INDEX_FILE = "pypi-sglang.json"  # the index's answer, kept in the cache: the release names, a JSON list
INDEX_MAX_AGE = 24 * 3600  # the cached index answer is asked again after a day: releases appear
INDEX_MAX_BYTES = 1 << 20  # the kept list is ~2 KB (a hundred releases): a bigger file is no list of ours
# Unpacking limits, over the entries unpacked (``sglang/`` and the METADATA). The biggest release
# so far, 0.5.23, unpacks to 122 MB in 6,388 entries (its wheel, 39 MB; 0.5.18 was 78 MB in 4,525):
# room for four times that.
MAX_UNPACKED_BYTES = 512 << 20
MAX_ENTRIES = 32_768
# The central directory, read whole and parsed entry by entry before any limit above can be counted:
# its end record's entry count and size are checked first. Real wheels take ~105 bytes an entry.
MAX_CENTRAL_DIRECTORY_BYTES = MAX_ENTRIES * 256
# An entry's path: sglang's deepest so far is 14 folders and its longest 189 characters.
MAX_ENTRY_DEPTH = 64
MAX_ENTRY_NAME = 1024
# the compression methods Python's zipfile reads; a wheel is deflated or stored in practice
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_FINAL = re.compile(r"\d+(\.\d+)*")
_PUBLISHED = re.compile(r"\d+(\.\d+)*(\.post\d+)?")
_METADATA = re.compile(r"sglang-[^/]+\.dist-info/METADATA")
_CHUNK = 1 << 20
_BYTECODE = "__pycache__"
_TRUSTED_OWNERS = {os.geteuid(), 0}  # root can write anything anyway
# What zipfile's readers raise for a damaged wheel: a bad header or CRC (BadZipFile), a truncated
# stream (EOFError), a corrupt deflate, LZMA or bzip2 stream (zlib.error, LZMAError, OSError), an
# encrypted entry or a missing decompressor (RuntimeError, NotImplementedError), names that are not
# text and offsets out of range (ValueError, OverflowError)
_DAMAGE: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    OSError,
    RuntimeError,
    NotImplementedError,
    ValueError,
    OverflowError,
    *((lzma.LZMAError,) if lzma is not None else ()),
)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a new file, never a link's
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # never a link's; a FIFO never blocks


class FetchError(Exception):
    """A release could not be had (not on the index, no network, no wheel, a wheel or a cache
    folder that cannot be trusted): the reason, one line."""


def user_cache_dir() -> Path:
    """``$NPUDOCTOR_SGLANG_CACHE``, else ``$XDG_CACHE_HOME/npudoctor/sglang`` (``~/.cache/...``)."""
    if os.environ.get("NPUDOCTOR_SGLANG_CACHE"):
        return Path(os.environ["NPUDOCTOR_SGLANG_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npudoctor" / "sglang"


def version_key(version: str) -> tuple[int, ...]:
    """Order of final release numbers ("0.5.10" after "0.5.9")."""
    return tuple(int(part) for part in version.split("."))


def release_key(version: str) -> tuple[tuple[int, ...], int]:
    """Order of releases, post-releases included ("0.5.12" < "0.5.12.post1" < "0.5.13")."""
    final, _, post = version.partition(".post")
    return version_key(final), int(post or -1)


def is_final(version: str) -> bool:
    return bool(_FINAL.fullmatch(version))


def fetch(version: str, cache: Path, wheel_dir: Path | None = None) -> Path:
    """The directory holding ``sglang/`` of release ``version``, unpacked from its wheel in
    ``wheel_dir`` (offline; the user's folder, taken as it is) or in ``<cache>/wheels`` (which
    must be this user's), else downloaded from the index; the tree of that wheel's bytes is reused
    when it proves intact (see the module docstring). ``FetchError`` for whatever goes wrong."""
    try:
        _usable(cache)
        trees = _own_folder(cache, "trees")
        if wheel_dir is not None:
            wheel = find_wheel(wheel_dir, version)
            if wheel is None:
                raise FetchError(f"no sglang-{version}-*.whl in {wheel_dir}")
        else:
            wheel = _cached_wheel(_own_folder(cache, "wheels"), version)
        with _open_wheel(wheel, ours=wheel_dir is None) as (handle, sha256):
            tree = trees / f"{version}-{sha256[:16]}"
            if _proven(tree, sha256, version):
                return tree
            return _unpack(handle, wheel, version, sha256, tree)
    except OSError as error:  # a state of the cache no step above foresaw: still this release's error
        raise FetchError(f"the release cache {cache}: {error}") from None


def find_wheel(wheels: Path, version: str) -> Path | None:
    matches = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    return matches[0] if matches else None


def wheel_versions(wheels: Path, finals_only: bool = True) -> list[str]:
    """The releases whose sglang wheel is in ``wheels`` (final ones only, unless told), oldest
    first. Names only: a file that is no wheel is found out when its release is fetched."""
    found = {p.name.split("-")[1] for p in wheels.glob("sglang-*-*.whl")}
    wanted = _FINAL if finals_only else _PUBLISHED
    return sorted((v for v in found if wanted.fullmatch(v)), key=release_key)


def index_versions(cache: Path) -> tuple[list[str], str]:
    """Every final sglang release on PyPI (no pre-, post- or yanked releases), oldest first, and
    a note when the answer is an older copy or could not be kept. The index's answer is kept in the
    cache and asked again once it is a day old; without network the kept copy is used, and said so."""
    names, note = _index_names(cache, INDEX_MAX_AGE)
    return sorted((v for v in names if is_final(v)), key=version_key), note


def published_releases(since: str, cache: Path) -> list[str]:
    """Every release from ``since`` to the newest, post-releases included (no pre-releases), in
    PyPI order: what the catalog's release ranges are derived over (``scripts/catalog_ranges.py``).
    The kept list is used at any age: the ranges are derived over the releases the cache has seen."""
    names, _ = _index_names(cache, max_age=None)
    found = sorted((v for v in names if _PUBLISHED.fullmatch(v)), key=release_key)
    return [v for v in found if release_key(v) >= release_key(since)]


def releases(since: str, cache: Path) -> list[str]:
    """Every final release from ``since`` to the newest, oldest first."""
    versions, _ = index_versions(cache)
    return [v for v in versions if version_key(v) >= version_key(since)]


def _index_names(cache: Path, max_age: float | None) -> tuple[list[str], str]:
    """The release names the index lists, from the copy kept in the cache when it is younger than
    ``max_age`` (None: any age), else asked and kept; and a note for the user, or "".

    The cache is proven private (``_usable``) before anything in it is read or written: in a
    folder another user may write, the copy could be theirs and the staging file a link they
    planted. A copy that is not one to trust (a link, not a regular file, not this user's or
    root's, writable by others) or not a list of names is a miss: the index is asked again."""
    try:
        _usable(cache)
    except FetchError as error:  # asked, neither read nor kept there
        unusable: str | None = str(error)
        kept, age, flaw = None, 0.0, None
    else:
        unusable = None
        kept, age, flaw = _read_index(cache / INDEX_FILE)
    if kept is not None and (max_age is None or age <= max_age):
        return kept, ""
    try:
        names = _ask_index()
    except (OSError, ValueError, http.client.HTTPException) as error:
        if kept is not None:
            hours = f"{age / 3600:.0f} h"
            return kept, f"the release list is {hours} old: {INDEX_URL} could not be read ({error})"
        why = "".join(f"; {reason}" for reason in (unusable, flaw) if reason)
        raise FetchError(f"cannot read the release list from {INDEX_URL}: {error}{why}") from None
    if unusable is not None:
        return names, f"the release list was not kept: {unusable}"
    try:
        _keep_index(cache, names)
    except OSError as error:  # the answer is good for this run all the same
        return names, f"the release list could not be kept in {cache}: {error.strerror or error}"
    return names, ""


def _ask_index() -> list[str]:
    """The releases PyPI lists with a file that is not yanked; ``ValueError`` for an answer of
    another shape, ``OSError`` (or ``HTTPException``, a broken answer) when there is none."""
    with urllib.request.urlopen(INDEX_URL, timeout=30) as answer:
        data = json.load(answer)
    found = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(found, dict) or not all(isinstance(f, list) for f in found.values()):
        raise ValueError("the answer has no release list")
    return sorted(
        v
        for v, files in found.items()
        if files and not all(isinstance(f, dict) and f.get("yanked") for f in files)
    )


def _read_index(listing: Path) -> tuple[list[str] | None, float, str | None]:
    """The release names kept at ``listing`` and their age in seconds; or None and why they are
    not used (None: there is no copy). Opened without following a link or waiting on a FIFO."""
    try:
        fd = os.open(listing, _READ)
    except FileNotFoundError:
        return None, 0.0, None
    except OSError as error:
        what = "is a symlink" if error.errno == errno.ELOOP else f"cannot be read ({error.strerror})"
        return None, 0.0, f"the kept copy {listing} {what}"
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, 0.0, f"the kept copy {listing} is not a regular file"
        why = _writable_by_others(listing, st)
        if why is not None:
            return None, 0.0, f"the kept copy is not used: {why}"
        data = handle.read(INDEX_MAX_BYTES + 1)
    try:
        names = json.loads(data) if len(data) <= INDEX_MAX_BYTES else None
    except ValueError:  # not JSON, not UTF-8: damage (a full disk, an interrupted copy)
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return None, 0.0, f"the kept copy {listing} is not a release list"
    return names, time.time() - st.st_mtime, None


def _keep_index(cache: Path, names: list[str]) -> None:
    """Write the list to a staging file made new (``O_EXCL``: never one that was there, nor through
    a link), then rename it over the kept one: a link there is replaced, never followed, and
    concurrent readers see the whole answer or none."""
    staging = cache / f"{INDEX_FILE}.{os.getpid()}.{secrets.token_hex(4)}.partial"
    fd = os.open(staging, _CREATE, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(names) + "\n")
        os.replace(staging, cache / INDEX_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise


# -- trust: who could have written a path --------------------------------------------------------


def _writable_by_others(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` (an entry of the cache) is not this user's alone, or None."""
    if st.st_uid not in _TRUSTED_OWNERS:
        return f"{path} belongs to uid {st.st_uid}, not to you"
    if st.st_mode & 0o022:
        return f"{path} is writable by {'others' if st.st_mode & 0o002 else 'its group'}"
    return None


def _private_where_it_is(cache: Path) -> None:
    """The folders from ``/`` down to the cache are root's or this user's, and none is writable by
    others unless sticky (``/tmp``: each may remove only their own entries): nobody else can swap
    the cache's trees after they are checked. A group-writable folder above the cache is the
    group's choice (a user-private group, a team's folder) and is taken as it is."""
    real = cache.resolve()
    for folder in (real, *real.parents):
        st = os.lstat(folder)
        if st.st_uid not in _TRUSTED_OWNERS:
            why = f"{folder} belongs to uid {st.st_uid}"
        elif st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            why = f"{folder} is writable by others"
        else:
            continue
        raise FetchError(
            f"the release cache {cache} is not private ({why}): not used; "
            "set NPUDOCTOR_SGLANG_CACHE to a folder only you can write"
        )


def _usable(cache: Path) -> None:
    """The cache folder, made if missing, in a place nobody else can rearrange; once per fetch,
    before its ``trees`` and ``wheels`` (``_own_folder``)."""
    try:
        os.makedirs(cache, mode=0o755, exist_ok=True)
    except FileExistsError:
        raise FetchError(f"the release cache {cache} is not a folder") from None
    except OSError as error:
        raise FetchError(f"cannot write the release cache {cache}: {error.strerror}") from None
    _private_where_it_is(cache)


def _own_folder(cache: Path, name: str) -> Path:
    """``<cache>/<name>`` (``trees``, ``wheels``) of a ``_usable`` cache, made if missing: a real
    folder, this user's (or root's) alone."""
    folder = cache / name
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        pass
    except OSError as error:
        raise FetchError(f"cannot write the release cache {cache}: {error.strerror}") from None
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        raise FetchError(f"{folder} is a symlink: the release cache follows none (make it a folder)")
    if not stat.S_ISDIR(st.st_mode):
        raise FetchError(f"{folder} is not a folder")
    why = _writable_by_others(folder, st)
    if why is not None and not _tighten(folder, st):
        raise FetchError(f"the release cache {cache} is not private ({why}): not used")
    return folder


def _tighten(folder: Path, st: os.stat_result) -> bool:
    """A folder of this user's that group or others may write (made under a umask like 002, e.g.
    ``__pycache__`` by the live child) is made writable by this user only: what is in it is
    checked entry by entry anyway. False: not this user's, or the mode cannot be changed."""
    if st.st_uid != os.geteuid():
        return False
    try:
        os.chmod(folder, stat.S_IMODE(st.st_mode) & ~0o022, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return False
    return True


@contextlib.contextmanager
def _open_wheel(wheel: Path, ours: bool) -> Iterator[tuple[BinaryIO, str]]:
    """The wheel open for reading, and its sha256. Opened without blocking (a FIFO named like a
    wheel would wait for a writer forever) and refused unless a regular file; one in the cache must
    be this user's, never a symlink (a wheel in ``--wheel-dir`` is the user's choice)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if ours else 0)
    try:
        fd = os.open(wheel, flags)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FetchError(f"{wheel} is a symlink: not followed in the release cache") from None
        raise FetchError(f"cannot read {wheel}: {error.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FetchError(f"{wheel} is not a regular file: not read")
    with os.fdopen(fd, "rb") as handle:
        why = _writable_by_others(wheel, st) if ours else None
        if why is not None:
            raise FetchError(
                f"{why}: not used (remove it, or set NPUDOCTOR_SGLANG_CACHE to a private folder)"
            )
        yield handle, _sha256(handle, st)


_DIGESTS: dict[tuple[int, ...], str] = {}  # (device, inode, size, mtime, ctime) -> sha256


def _sha256(handle: BinaryIO, st: os.stat_result) -> str:
    """The file's sha256, once per process while it is unchanged (any write changes its ctime)."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    handle.seek(0)
    return _DIGESTS[key]


# -- trees: proven, or unpacked again --------------------------------------------------------------


def _proven(tree: Path, sha256: str, version: str) -> bool:
    """True: ``tree`` is the wheel ``sha256``'s, as unpacked, and this user's alone. False: there
    is none; one that is not (a symlink, changed, writable by others) is moved aside first."""
    try:
        os.lstat(tree)
    except FileNotFoundError:
        return False
    flaw = _flaw(tree, sha256, version)
    if flaw is None:
        return True
    _discard(tree, flaw)
    return False


def _flaw(tree: Path, sha256: str, version: str) -> str | None:
    """What is wrong with ``tree`` (None: nothing). Every entry is looked at (lstat): the biggest
    release, 0.5.23's 6,400 entries, takes ~50 ms on an idle machine; folders are looked at (and
    made private, ``_tighten``) before what they hold."""
    st = os.lstat(tree)
    if not stat.S_ISDIR(st.st_mode):
        return f"{tree} is not a folder"
    why = _writable_by_others(tree, st)
    if why is not None and not _tighten(tree, st):
        return why
    proof = _read_proof(tree)
    if proof is None or proof.get("sha256") != sha256 or proof.get("version") != version:
        return f"{tree} has no proof of wheel {sha256[:16]}'s content"
    try:
        return _walk_flaw(tree, proof)
    except OSError as error:  # a folder this user cannot read, an entry gone meanwhile
        return f"{tree} cannot be read: {error}"


def _walk_flaw(tree: Path, proof: dict) -> str | None:
    counted = {"sglang", str(proof.get("metadata", "")).split("/")[0]}  # the folders unpacked
    files = size = 0
    pending = [(tree, False, True)]
    while pending:
        folder, count, top = pending.pop()
        try:
            entries = os.scandir(folder)
        except FileNotFoundError:  # removed meanwhile: what it held is not counted, so the count tells
            continue
        with entries:
            for entry in entries:
                path = Path(entry.path)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # gone meanwhile (a live child's bytecode being replaced)
                    continue
                why = _writable_by_others(path, st)
                if stat.S_ISDIR(st.st_mode):
                    if why is not None and not _tighten(path, st):
                        return why
                    # what the live depth writes (bytecode) and what sits beside the unpacked
                    # folders (e.g. a `fix --apply` record) is checked for trust, not counted
                    counts = (entry.name in counted) if top else (count and entry.name != _BYTECODE)
                    pending.append((path, counts, False))
                elif stat.S_ISREG(st.st_mode):
                    if why is not None:
                        return why
                    if count:
                        files += 1
                        size += st.st_size
                else:
                    return f"{path} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'no file or folder'}"
    if (files, size) != (proof.get("files"), proof.get("bytes")):
        unpacked = f"{proof.get('files')} files, {proof.get('bytes')} bytes"
        return f"{tree} changed since it was unpacked ({files} files, {size} bytes; unpacked: {unpacked})"
    return None


def _read_proof(tree: Path) -> dict | None:
    try:
        fd = os.open(tree / COMPLETE, _READ)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            proof = json.loads(handle.read(1 << 16))
        except ValueError:  # an older npudoctor's marker (the wheel's name), or damage
            return None
    return proof if isinstance(proof, dict) else None


def _discard(tree: Path, flaw: str) -> None:
    """Move ``tree`` aside (a symlink is moved, never followed) and remove it."""
    aside = tree.with_name(f".{tree.name}-discarded-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(tree, aside)
    except FileNotFoundError:  # another process moved it first
        return
    except OSError as error:
        raise FetchError(f"{flaw}; it cannot be replaced: {error.strerror}") from None
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(aside)


def _unpack(handle: BinaryIO, wheel: Path, version: str, sha256: str, tree: Path) -> Path:
    _directory_within_limits(handle, wheel)
    try:
        archive = zipfile.ZipFile(handle)
    except _DAMAGE as error:
        raise FetchError(f"cannot unpack {wheel}: {error}") from None
    with archive:
        members, metadata = _members(archive, wheel, version)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}-", dir=tree.parent))
        except OSError as error:
            raise FetchError(f"cannot write the release cache {tree.parent}: {error.strerror}") from None
        try:
            files, size = _extract(archive, members, staging, wheel)
            proof = {"wheel": wheel.name, "sha256": sha256, "version": version, "metadata": metadata}
            (staging / COMPLETE).write_text(json.dumps({**proof, "files": files, "bytes": size}) + "\n")
            os.chmod(staging, 0o755)
            _place(staging, tree, sha256, version)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def _directory_within_limits(handle: BinaryIO, wheel: Path) -> None:
    """The entry count and the size of the central directory, as its end record declares them,
    within the limits: ``zipfile.ZipFile`` reads the whole directory and makes an object of every
    entry before its ``infolist`` can be counted (a million entries: seconds and a gigabyte). The
    record is found by zipfile's own reader (``_EndRecData``, zip64 included; the standard library
    has no public one), so the figures checked are the ones zipfile goes on to use. A record that
    understates the count is caught by the size, and by the count after parsing (``_members``)."""
    end_record = getattr(zipfile, "_EndRecData", None)
    if end_record is None:  # a Python whose zipfile has it no more: the count after parsing holds
        return
    try:
        end = end_record(handle)
    except _DAMAGE as error:
        raise FetchError(f"cannot unpack {wheel}: {error}") from None
    if not end:  # no end record: not a zip, as ZipFile goes on to say
        return
    entries, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]
    if entries > MAX_ENTRIES:
        raise FetchError(f"{wheel} has more than {MAX_ENTRIES} entries ({entries}): not unpacked")
    if size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise FetchError(
            f"{wheel}'s list of entries takes more than {MAX_CENTRAL_DIRECTORY_BYTES >> 20} MiB "
            f"({size >> 20} MiB): not unpacked"
        )


def _members(archive: zipfile.ZipFile, wheel: Path, version: str) -> tuple[list[zipfile.ZipInfo], str]:
    """The entries to unpack (``sglang/`` and the dist-info METADATA), each checked, and the
    METADATA's name; a ``FetchError`` for the first that cannot be unpacked as it is."""
    infos = archive.infolist()
    if len(infos) > MAX_ENTRIES:
        raise FetchError(f"{wheel} has more than {MAX_ENTRIES} entries ({len(infos)}): not unpacked")
    members = [i for i in infos if i.filename.startswith("sglang/")]
    metadata = [i for i in infos if _METADATA.fullmatch(i.filename)]
    if not any(i.filename == "sglang/__init__.py" for i in members):
        raise FetchError(f"{wheel} holds no sglang/ package")
    if not any(i.filename.startswith("sglang/srt/") for i in members):
        raise FetchError(f"{wheel} holds no sglang/srt/ (the server npudoctor checks)")
    if len(metadata) != 1:
        raise FetchError(f"{wheel} has {len(metadata)} sglang-*.dist-info/METADATA, not one")
    for info in [*members, *metadata]:
        _check_entry(info, wheel)
    found = _metadata_version(archive, metadata[0], wheel)
    if found != version:
        raise FetchError(
            f"{wheel} holds sglang {found or 'of no version'}, not {version} (its {metadata[0].filename})"
        )
    total = sum(i.file_size for i in [*members, *metadata])  # as declared: _extract counts what is written
    if total > MAX_UNPACKED_BYTES:
        raise FetchError(
            f"{wheel} unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB ({total >> 20} MiB): not unpacked"
        )
    return [*members, *metadata], metadata[0].filename


def _check_entry(info: zipfile.ZipInfo, wheel: Path) -> None:
    name = info.filename
    parts = name.rstrip("/").split("/")
    if len(parts) > MAX_ENTRY_DEPTH:
        raise FetchError(
            f"{wheel}: {_shown(name)} is deeper than {MAX_ENTRY_DEPTH} folders ({len(parts)}): not unpacked"
        )
    if len(name) > MAX_ENTRY_NAME:
        raise FetchError(
            f"{wheel}: {_shown(name)} is longer than {MAX_ENTRY_NAME} characters ({len(name)}): not unpacked"
        )
    if any(part in ("", ".", "..") for part in parts) or "\\" in name or "\0" in name:
        raise FetchError(f"{wheel}: {_shown(name)!r} is not a plain path: not unpacked")
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: a zip made without Unix modes
        what = "a symlink" if kind == stat.S_IFLNK else "no file or folder"
        raise FetchError(f"{wheel}: {name} is {what}: not unpacked")
    if info.flag_bits & 0x1:
        raise FetchError(f"{wheel}: {name} is encrypted: not unpacked")
    if info.compress_type not in _METHODS:
        raise FetchError(
            f"{wheel}: {name} uses compression method {info.compress_type}, which npudoctor cannot unpack"
        )


def _shown(name: str) -> str:
    """An entry's name for a message: its start and end when it is long."""
    return name if len(name) <= 80 else f"{name[:40]}...{name[-30:]}"


def _metadata_version(archive: zipfile.ZipFile, info: zipfile.ZipInfo, wheel: Path) -> str | None:
    """The ``Version:`` header of the wheel's METADATA (the headers end at the first empty line)."""
    try:
        with archive.open(info) as source:
            text = source.read(1 << 20).decode("utf-8", "replace")
    except _DAMAGE as error:
        raise FetchError(f"cannot unpack {wheel}: {info.filename}: {error}") from None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def _extract(
    archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], staging: Path, wheel: Path
) -> tuple[int, int]:
    """Write ``members`` under ``staging``: folders 0o755, files 0o644 (whatever the umask lets
    through, never more), counting the bytes written, not the sizes the archive declares."""
    made: set[Path] = {staging}
    written = files = size = 0

    def folder(path: Path) -> None:
        missing = []
        while path not in made:
            missing.append(path)
            path = path.parent
        for each in reversed(missing):  # a loop, not a recursion: as deep as an entry may be
            with contextlib.suppress(FileExistsError):
                os.mkdir(each, 0o755)
            made.add(each)

    for info in members:
        target = staging / info.filename
        before = written
        try:
            folder(target if info.is_dir() else target.parent)
            if info.is_dir():
                continue
            with open(target, "xb", opener=_private_file) as out:
                for chunk in _chunks(archive, info, wheel):
                    written += len(chunk)
                    if written > MAX_UNPACKED_BYTES:
                        raise FetchError(
                            f"{wheel} unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB: not unpacked"
                        )
                    out.write(chunk)
        except OSError as error:  # writing: the wheel's damage is _chunks' FetchError
            raise FetchError(
                f"cannot unpack {wheel} into {staging.parent}: {info.filename}: {error.strerror or error}"
            ) from None
        if _BYTECODE not in info.filename.split("/"):  # counted as the proof's walk counts
            files += 1
            size += written - before
    return files, size


def _chunks(archive: zipfile.ZipFile, info: zipfile.ZipInfo, wheel: Path) -> Iterator[bytes]:
    """The entry's bytes as they are decompressed; a ``FetchError`` for a damaged entry."""
    try:
        with archive.open(info) as source:
            while chunk := source.read(_CHUNK):
                yield chunk
    except _DAMAGE as error:
        raise FetchError(f"cannot unpack {wheel}: {info.filename}: {error}") from None


def _private_file(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def _place(staging: Path, tree: Path, sha256: str, version: str) -> None:
    """Rename the unpacked ``staging`` to ``tree``. Another process may have placed the same
    wheel's tree meanwhile: that one is used if it proves intact, else replaced."""
    for _ in range(2):
        try:
            os.rename(staging, tree)
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise FetchError(f"cannot write the release cache {tree.parent}: {error.strerror}") from None
        if _proven(tree, sha256, version):
            return
    raise FetchError(f"cannot place {tree}: another process keeps replacing it")


def _cached_wheel(wheels: Path, version: str) -> Path:
    """The wheel of ``version`` in ``<cache>/wheels``, downloaded if it is not there. One of this
    user's that group or others may write (downloaded under a umask like 002 by an older
    npudoctor) is downloaded again: its bytes are not known to be the ones downloaded."""
    wheel = find_wheel(wheels, version)
    if wheel is None:
        return _download(version, wheels)
    st = os.lstat(wheel)
    why = _writable_by_others(wheel, st)
    if why is None or st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        return wheel  # refused, with the reason, when it is opened
    try:
        return _download(version, wheels)
    except FetchError as error:
        raise FetchError(f"{why}: not used; {error}") from None


def _download(version: str, wheels: Path) -> Path:
    """``pip download`` into a private folder beside ``wheels``, then the wheel, made writable by
    this user only, renamed into ``wheels`` (replacing one of the same name)."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=wheels))
    except OSError as error:
        raise FetchError(f"cannot write the release cache {wheels}: {error.strerror}") from None
    try:
        downloaded = _pip_download(version, staging)
        os.chmod(downloaded, 0o644)
        wheel = wheels / downloaded.name
        os.replace(downloaded, wheel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return wheel


def _pip_download(version: str, wheels: Path) -> Path:
    """``python -I -m pip download`` of the wheel: isolated (as every interpreter npudoctor starts,
    see ``npudoctor.interpreters``; this module imports no npudoctor), so a ``pip.py`` in the
    working directory is not pip. pip still reads the user's ``PIP_*`` settings and its
    configuration files (the index, a proxy)."""
    command = [
        sys.executable,
        "-I",
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(wheels),
        f"sglang=={version}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = find_wheel(wheels, version)
    if done.returncode != 0 or wheel is None:
        reason = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise FetchError(f"cannot download sglang=={version}: {reason}")
    return wheel
