"""Values pickled into a directory other users may reach, read back only when this user wrote them.

Unpickling runs whatever callables the bytes name, and a cache directory is often within
someone else's reach: ``/tmp``, a folder shared between users or restored from a CI cache, a
variable pointed at the wrong place. So an entry is read only if

* it is reached without following a symlink: each directory below the root is opened with
  ``O_NOFOLLOW`` and the next one relative to it (``dir_fd``), so nothing is read, written or
  deleted through a link someone planted, even one swapped in while npudoctor runs (the root
  itself is followed: the user named it);
* it is a regular file of this user (``os.geteuid()``) that no one else may read or write;
* its seal, an HMAC-SHA256 over the entry's place and bytes, checks out. It is made with a
  secret only this user can read (``KEY_FILE`` at the root: 32 random bytes, created 0600 with
  ``O_EXCL``, trusted only as a regular file of this user with no group or other permission);
  it is checked before anything is unpickled. The seal binds the place too, so one genuine
  entry copied over another is refused.

Pickle and not JSON because the values are rich: the checks' ``Probe``s (nested evidence),
live outcomes, parsed tables; a JSON codec per type would have to follow every change to them,
and with the seal a pickle only ever holds bytes this user's own npudoctor wrote. A directory
restored from elsewhere with its key is as trusted as whoever wrote it: leave ``KEY_FILE`` out of
a shared CI cache and every entry is a miss.

The store names what it writes by its own pattern (entries ``<64 hex>.pickle``, staging files
``<64 hex>.<16 hex>.partial``, directories 0700 and files 0600) and ``prune`` deletes only such
files. Any check that fails, and any error, is a miss (``MISS``) or a write left out: a store is a
speed-up, never a reason for a run to fail or to say anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import re
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

KEY_FILE = "npudoctor-key"
KEY_BYTES = 32
SEAL_BYTES = hashlib.sha256().digest_size
MISS = object()  # what ``load`` returns when the store holds no trusted entry

_ENTRY = re.compile(r"[0-9a-f]{64}\.pickle")
_OWN_FILE = re.compile(r"[0-9a-f]{64}(\.pickle|\.[0-9a-f]{16}\.partial)")
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a planted FIFO never blocks
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def entry_name(key: bytes) -> str:
    """The file the entry for ``key`` (any bytes naming what it answers) is kept in."""
    return hashlib.sha256(key).hexdigest() + ".pickle"


class PrivateStore:
    """Pickled values under ``root``, each at ``(*folders, entry_name(key))``."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def load(self, *place: str) -> object:
        """The value kept at ``place`` (folders, then an ``entry_name``), else ``MISS``."""
        *folders, name = place
        if not _ENTRY.fullmatch(name):
            return MISS
        with contextlib.suppress(OSError), self._opened(folders, create=False) as (secret, folder, _):
            fd = os.open(name, _OPEN_FILE, dir_fd=folder)
            with open(fd, "rb") as handle:
                if not _private(os.fstat(fd)):
                    return MISS
                data = handle.read()
            seal, payload = data[:SEAL_BYTES], data[SEAL_BYTES:]
            if not hmac.compare_digest(seal, _seal(secret, place, payload)):
                return MISS
            try:
                return pickle.loads(payload)
            except Exception:  # written by an older npudoctor whose classes have changed
                return MISS
        return MISS

    def save(self, value: object, *place: str) -> bool:
        """Keep ``value`` at ``place`` (replacing one kept before: a reader sees the old entry or the
        new one, whole). True when a folder of ``place`` had to be made for it."""
        *folders, name = place
        if not _ENTRY.fullmatch(name):
            return False
        try:
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return False
        with contextlib.suppress(OSError), self._opened(folders, create=True) as (secret, folder, made):
            staging = f"{name.removesuffix('.pickle')}.{secrets.token_hex(8)}.partial"
            with open(os.open(staging, _CREATE_FILE, 0o600, dir_fd=folder), "wb") as handle:
                handle.write(_seal(secret, place, payload))
                handle.write(payload)
            os.replace(staging, name, src_dir_fd=folder, dst_dir_fd=folder)
            return made
        return False

    def prune(self, folders: tuple[str, ...], generation: re.Pattern, keep: str, kept: int) -> None:
        """Of the directories in ``folders`` named like ``generation``, delete all but the ``kept``
        most recently modified (``keep`` among them): their entries and staging files, then the
        directory if that emptied it. Files of other names, symlinks and other directories stay."""
        with contextlib.suppress(OSError), self._opened(folders, create=False) as (_, parent, _):
            with os.scandir(parent) as found:
                generations = sorted(
                    (entry.stat(follow_symlinks=False).st_mtime, entry.name)
                    for entry in found
                    if generation.fullmatch(entry.name)
                    and entry.name != keep
                    and entry.is_dir(follow_symlinks=False)
                )
            for _, name in generations[: max(0, len(generations) - (kept - 1))]:
                with contextlib.suppress(OSError):
                    _empty_own(parent, name)
                    os.rmdir(name, dir_fd=parent)

    @contextlib.contextmanager
    def _opened(
        self, folders: list[str] | tuple[str, ...], create: bool
    ) -> Iterator[tuple[bytes, int, bool]]:
        """(this user's key, the innermost folder's descriptor, whether a folder was made), each
        folder opened relative to the one before and never through a symlink; no folder is made
        where the key is not one to trust (``OSError``)."""
        descriptors: list[int] = []
        made = False
        try:
            if create:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
            descriptors.append(os.open(self.root, _OPEN_DIRECTORY & ~os.O_NOFOLLOW))
            secret = _key(descriptors[0], create)
            for name in folders:
                if create:
                    try:
                        os.mkdir(name, 0o700, dir_fd=descriptors[-1])
                        made = True
                    except FileExistsError:
                        pass
                descriptors.append(os.open(name, _OPEN_DIRECTORY, dir_fd=descriptors[-1]))
            yield secret, descriptors[-1], made
        finally:
            for fd in descriptors:
                os.close(fd)


def _private(info: os.stat_result) -> bool:
    """A regular file of this user that no one else may read or write."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def _seal(secret: bytes, place: tuple[str, ...] | list[str], payload: bytes) -> bytes:
    mac = hmac.new(secret, "/".join(place).encode("utf-8", "surrogateescape") + b"\0", hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def _key(root: int, create: bool) -> bytes:
    """This user's secret at the root, made when there is none and ``create``; ``OSError`` when
    there is none, or the file there is not one to trust."""
    try:
        fd = os.open(KEY_FILE, _OPEN_FILE, dir_fd=root)
    except FileNotFoundError:
        if create:
            return _new_key(root)
        raise
    with open(fd, "rb") as handle:
        if _private(os.fstat(fd)):
            secret = handle.read(KEY_BYTES + 1)
            if len(secret) == KEY_BYTES:
                return secret
    raise PermissionError(f"{KEY_FILE} is not a private file of {KEY_BYTES} bytes of this user")


def _new_key(root: int) -> bytes:
    """Write a new secret and link it into place: linking never replaces, so of two processes
    making one at once, both end up with the first one linked."""
    staging = f"{KEY_FILE}.{secrets.token_hex(8)}.partial"
    with open(os.open(staging, _CREATE_FILE, 0o600, dir_fd=root), "wb") as handle:
        handle.write(secrets.token_bytes(KEY_BYTES))
    try:
        os.link(staging, KEY_FILE, src_dir_fd=root, dst_dir_fd=root, follow_symlinks=False)
    except FileExistsError:
        pass
    finally:
        os.unlink(staging, dir_fd=root)
    return _key(root, create=False)


def _empty_own(parent: int, name: str) -> None:
    """Delete the store's own files (not directories, not symlinks' targets) in ``parent``/``name``."""
    fd = os.open(name, _OPEN_DIRECTORY, dir_fd=parent)
    try:
        with os.scandir(fd) as found:
            own = [
                e.name for e in found if _OWN_FILE.fullmatch(e.name) and not e.is_dir(follow_symlinks=False)
            ]
        for file in own:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file, dir_fd=fd)
    finally:
        os.close(fd)
