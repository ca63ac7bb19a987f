"""Which interpreter the live depth runs in, and npudoctor's own live environment.

The live depth imports the checked sglang's modules, and needs torch and numpy for it
(``pythonenv.LIVE_NEEDS``). npudoctor never asks a user to install anything into the environment
sglang serves from: a CPU torch pinned over the one sglang and torch_npu need would break the
image. So the live interpreter is

* the checked environment's own (``npudoctor.target.pythonenv``: npudoctor's interpreter, or
  ``--python``'s) when torch and numpy are found there: the live depth then runs the host's own
  torch (and torch_npu), as sglang would;
* else a venv of npudoctor's own, kept in its cache as pre-commit and pipx keep tool
  environments: ``<cache>/live-env/<key>``, the key naming the Python it is made with and a hash of
  the requirement files shipped with npudoctor (``npudoctor/data/requirements-live.txt`` and
  ``constraints-live.txt``), so a new requirement set is a new environment. The checked
  environment's package folders (an installed sglang, its pure-Python dependencies) follow the
  venv's own on the live interpreter's path: the venv's torch wins;
* else none: the live depth does not run, and the report's one hint is the command that
  prepares the venv (``prepare_command``).

``check`` never builds the venv by itself: it downloads a torch (hundreds of MB), which a CI
gate or an offline runner must not do behind the user's back. ``npudoctor env --prepare`` builds
it (``prepare``), once: in a temporary folder beside its place, renamed into place only when pip
succeeded, so a half-built venv is never used; under a lock, so two runs do not both build; in
folders private to the user (0700). One found there that is not this user's, or a symlink, is
never used (as ``npudoctor.target.privatestore`` refuses a cache entry).

The live interpreter runs isolated (``-I``) as every interpreter npudoctor starts; npudoctor's
own package folders (its dependencies: PyYAML, packaging, wrapt) come last on its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from npudoctor.errors import ExitCode, NpudoctorError
from npudoctor.target import pythonenv, resultcache

FOLDER = "live-env"  # in npudoctor's cache directory (``resultcache.cache_dir``)
MARKER = "npudoctor-live-env.json"  # written last, before the rename: the venv is complete
_STAGING_SUFFIX = ".partial"


class PrepareError(NpudoctorError):
    """The live environment could not be prepared (pip failed, a folder that is not ours): exit 2."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class LiveInterpreter:
    """The interpreter the live depth runs in, and the folders it puts after its own ``sys.path``."""

    python: str
    last: tuple[str, ...]  # the checked environment's package folders, then npudoctor's own
    where: str  # "host": the checked environment's interpreter; "live-env": npudoctor's venv

    def key(self) -> str:
        """What the live depth's answer depends on of it (the result cache's key): the interpreter,
        its folders and the distributions installed in them."""
        digest = hashlib.sha256(self.python.encode("utf-8", "surrogateescape"))
        for entry in self.last:
            digest.update(b"\0" + entry.encode("utf-8", "surrogateescape"))
        if self.where == "live-env":
            digest.update(Path(self.python).parents[1].name.encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class NoLiveInterpreter:
    """The live depth cannot run: why, and the one command that makes it run."""

    reason: str
    prepare: str


def key(requirements: Path | None = None, constraints: Path | None = None) -> str:
    """The live environment's folder name: the Python it is made with (its version and the base
    interpreter a venv links to), and the requirement files it is installed from."""
    digest = hashlib.sha256(f"{sys.version}\0{getattr(sys, '_base_executable', sys.executable)}".encode())
    for path in _requirement_files(requirements, constraints):
        digest.update(b"\0" + path.read_bytes())
    return f"py{sys.version_info[0]}.{sys.version_info[1]}-{digest.hexdigest()[:16]}"


def location(requirements: Path | None = None, constraints: Path | None = None) -> Path:
    return resultcache.cache_dir() / FOLDER / key(requirements, constraints)


def python_in(environment: Path) -> Path:
    return environment / "bin" / "python"


def state(environment: Path) -> str | None:
    """None when ``environment`` is a complete live environment of this user; else why not (not
    prepared; not this user's; a symlink ...)."""
    try:
        info = os.lstat(environment)
    except FileNotFoundError:
        return "not prepared"
    except OSError as error:
        return f"unreadable: {(error.strerror or str(error)).lower()}"
    refused = _refused(info)
    if refused:
        return refused
    try:
        marker = os.lstat(environment / MARKER)
    except OSError:
        return "incomplete (no marker): not npudoctor's"
    if not stat.S_ISREG(marker.st_mode) or marker.st_uid != os.geteuid():
        return "its marker is not this user's file"
    if not os.access(python_in(environment), os.X_OK):
        return "its interpreter is gone (was the Python it was made with removed?)"
    return None


def _refused(info: os.stat_result) -> str | None:
    """Why a folder of the live environment's is not one to use: a symlink, not a directory, not
    this user's, or others may write in it."""
    if stat.S_ISLNK(info.st_mode):
        return "a symlink, never followed"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if info.st_uid != os.geteuid():
        return f"owned by another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return "writable by other users"
    return None


def npudoctor_invocation() -> list[str]:
    """The words that run this npudoctor: ``npudoctor`` when the one on ``PATH`` runs in this
    interpreter, else ``<this python> -m npudoctor``."""
    found = shutil.which("npudoctor")
    if found:
        with contextlib.suppress(OSError), open(found, "rb") as script:
            first = script.readline(4096)
            if first.startswith(b"#!") and first[2:].strip() == os.fsencode(sys.executable):
                return ["npudoctor"]
    return [sys.executable, "-m", "npudoctor"]


def prepare_command() -> str:
    """The command that prepares the live environment, as the user pastes it."""
    from npudoctor.terminal import shell_join

    return shell_join([*npudoctor_invocation(), "env", "--prepare"])


def select() -> LiveInterpreter | NoLiveInterpreter:
    """The interpreter the live depth runs in (see the module's docstring), or why there is none."""
    checked = pythonenv.checked()
    readiness = pythonenv.live_readiness()
    if readiness.runs:
        last = () if checked.is_npudoctors else _unique(pythonenv.own().package_folders())
        return LiveInterpreter(checked.executable, last, "host")
    environment = location()
    why = state(environment)
    if why is None:
        checked_folders = (checked if checked.named else pythonenv.own()).package_folders()
        last = _unique([*checked_folders, *pythonenv.own().package_folders()])
        return LiveInterpreter(str(python_in(environment)), last, "live-env")
    return NoLiveInterpreter(
        reason=f"{readiness.reason(blocking_only=True)}, and npudoctor's own live environment "
        f"({environment}) is {why}",
        prepare=prepare_command(),
    )


def _unique(folders: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(folders))


def _requirement_files(requirements: Path | None, constraints: Path | None) -> tuple[Path, Path]:
    return (
        requirements or pythonenv.live_data_file(pythonenv.LIVE_REQUIREMENTS),
        constraints or pythonenv.live_data_file(pythonenv.LIVE_CONSTRAINTS),
    )


def prepare(
    say: Callable[[str], None], requirements: Path | None = None, constraints: Path | None = None
) -> Path:
    """Build the live environment if it is not there (see the module's docstring), and return it.

    ``requirements`` and ``constraints``: the files to install from, npudoctor's shipped ones when
    None (the tests' small set; never a user's choice: the key is then theirs)."""
    requirements, constraints = _requirement_files(requirements, constraints)
    environment = location(requirements, constraints)
    root = environment.parent
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError as error:
        raise PrepareError(f"cannot make {root}: {(error.strerror or str(error)).lower()}") from None
    refused = _refused(os.lstat(root))
    if refused:
        raise PrepareError(f"{root} is {refused}: npudoctor keeps no environment there")
    if state(environment) is None:
        say(f"the live environment is ready: {environment}")
        return environment
    with _locked(root / f"{environment.name}.lock", say):
        why = state(environment)
        if why is None:  # another npudoctor built it while this one waited
            say(f"the live environment is ready: {environment}")
            return environment
        if why != "not prepared":
            raise PrepareError(f"{environment} is {why}: remove it and prepare again")
        _remove_partials(root, environment.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{environment.name}.", suffix=_STAGING_SUFFIX, dir=root))
        try:
            _build(staging, requirements, constraints, root / f"{environment.name}.log", say)
            os.rename(staging, environment)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    say(f"the live environment is ready: {environment}")
    return environment


def _build(
    staging: Path, requirements: Path, constraints: Path, log: Path, say: Callable[[str], None]
) -> None:
    """A venv in ``staging`` with the requirements installed and the marker written last; pip's
    output goes to ``log`` (shown by path when it fails)."""
    python = str(python_in(staging))
    steps = (
        ("making a venv", [sys.executable, "-I", "-m", "venv", str(staging)]),
        (
            f"installing the live depth's requirements with pip (torch and the packages sglang imports; "
            f"minutes on a first download) from {requirements}",
            [
                python,
                "-I",
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                str(requirements),
                "-c",
                str(constraints),
            ],
        ),
    )
    with _private_log(log) as output:
        for what, command in steps:
            say(f"live environment: {what}")
            output.write(f"$ {' '.join(command)}\n".encode())
            output.flush()
            try:
                done = subprocess.run(
                    command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, check=False
                )
            except OSError as error:
                raise PrepareError(
                    f"preparing the live environment failed: {command[0]}: {(error.strerror or '').lower()}"
                ) from None
            if done.returncode != 0:
                raise PrepareError(
                    f"preparing the live environment failed: {' '.join(command[1:4])} exited "
                    f"{done.returncode} (log: {log})"
                )
    marker = {"key": staging.name, "requirements": str(requirements), "constraints": str(constraints)}
    with open(
        os.open(staging / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w"
    ) as f:
        json.dump(marker, f)


@contextlib.contextmanager
def _private_log(log: Path) -> Iterator:
    """The build's log, replaced each build: a file of this user's, never through a symlink."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(log).st_mode):
            os.unlink(log)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as output:
        yield output


@contextlib.contextmanager
def _locked(lock: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Hold ``lock`` (``flock``): one npudoctor builds, another waits for it."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another npudoctor preparing the live environment ({lock})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_partials(root: Path, name: str) -> None:
    """Staging folders of builds that never finished (killed npudoctors), ours, under the lock."""
    with os.scandir(root) as found:
        for entry in found:
            if (
                entry.name.startswith(f".{name}.")
                and entry.name.endswith(_STAGING_SUFFIX)
                and entry.is_dir(follow_symlinks=False)
                and entry.stat(follow_symlinks=False).st_uid == os.geteuid()
            ):
                shutil.rmtree(entry.path, ignore_errors=True)


def describe() -> dict:
    """Whether the live depth runs, in which interpreter (the checked environment's, or npudoctor's
    own live environment), and the command that prepares that environment."""
    readiness = pythonenv.live_readiness()
    chosen = select()
    environment = location()
    ran = isinstance(chosen, LiveInterpreter)
    return {
        "runs": ran,
        "interpreter": chosen.python if ran else None,
        "uses": chosen.where if ran else None,
        "missing": list(readiness.missing) if not ran or chosen.where == "host" else [],
        "reason": chosen.reason if not ran else readiness.reason() if chosen.where == "host" else None,
        "live-env": str(environment),
        "live-env-state": state(environment) or "ready",
        "prepare": prepare_command(),
    }
