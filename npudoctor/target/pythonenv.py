"""The Python environment sglang runs in: this interpreter's, or the one ``--python PATH`` names.

npudoctor installed in its own venv (pipx-style) does not share an environment with the sglang it
judges: ``--python`` names the interpreter sglang serves from. npudoctor never imports anything
from that environment into its own process; it asks that interpreter once, isolated (``-I``, as
every interpreter npudoctor starts: ``npudoctor.interpreters``), to print as JSON its version, its
``sys.path`` and where the packages npudoctor needs are, found without importing them
(``importlib.util.find_spec``, ``importlib.metadata``). The answer is bounded (``_MAX_ANSWER``)
and so is the wait (``_TIMEOUT_SECONDS``): a path that is not a Python (a shell script that reads
stdin, a binary that prints megabytes) is one line, exit 2.

Without ``--python`` the environment is this interpreter's, read in this process the same way.
Both give a ``PythonEnvironment``: where sglang is (``npudoctor.target.discovery``), which live
requirements import there, and the folders of its packages, which the live depth puts on its
interpreter's path (``npudoctor.live.toolenv``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from npudoctor.errors import InputError

_TIMEOUT_SECONDS = 60  # a generous guard: a cold interpreter on a busy host starts in seconds
_MAX_ANSWER = 1024 * 1024

# The live depth's CPU dependency set, shipped inside npudoctor (package data): what npudoctor's
# own live environment is made from (``npudoctor.live.toolenv``), wherever npudoctor is installed.
LIVE_REQUIREMENTS = "requirements-live.txt"
LIVE_CONSTRAINTS = "constraints-live.txt"
# Requirements whose import name is not the distribution's name.
_IMPORT_NAMES = {"pillow": "PIL", "pyzmq": "zmq", "apache-tvm-ffi": "tvm_ffi"}
# Without these no live probe runs: npudoctor's live helpers build sglang's tensors with torch and
# their page indices with numpy. Any other requirement this host lacks is stood in where a release
# imports it (npudoctor.live.standins), and the report names it.
LIVE_NEEDS = ("torch", "numpy")


@dataclass(frozen=True)
class LiveReadiness:
    """Which modules of the live depth's requirements the checked environment lacks."""

    missing: tuple[str, ...]  # import names, in the requirements' order
    python: str  # the checked environment's interpreter

    @property
    def runs(self) -> bool:
        """Whether the live depth can run in the checked environment's own interpreter (it needs
        ``LIVE_NEEDS``; the rest is stood in). When it cannot, npudoctor's own live environment may
        (``npudoctor.live.toolenv``)."""
        return not set(LIVE_NEEDS) & set(self.missing)

    def reason(self, blocking_only: bool = False) -> str | None:
        """One line: what is missing (of ``LIVE_NEEDS`` only, ``blocking_only``), and where (None
        when nothing is). Never an install command: the checked environment is the one sglang
        serves from."""
        if not self.missing:
            return None
        blocking = [m for m in self.missing if m in LIVE_NEEDS]
        others = [] if blocking_only and blocking else [m for m in self.missing if m not in LIVE_NEEDS]
        first, *rest = blocking + others
        nor = f" (nor {', '.join(rest)})" if rest else ""
        return f"{first} is not installed for {self.python}{nor}"


def live_data_file(name: str) -> Path:
    """A file of npudoctor's package data (``npudoctor/data/``), where this npudoctor is installed."""
    return Path(__file__).resolve().parents[1] / "data" / name


def live_requirements() -> list[str]:
    """The import names of the live depth's requirements (``requirements-live.txt``), in order."""
    try:
        lines = live_data_file(LIVE_REQUIREMENTS).read_text(encoding="utf-8").splitlines()
    except OSError:
        return list(LIVE_NEEDS)
    names: list[str] = []
    for line in lines:
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
        if found:
            name = _IMPORT_NAMES.get(found.group(1).lower(), found.group(1).replace("-", "_"))
            if name not in names:
                names.append(name)
    return names


def live_readiness() -> LiveReadiness:
    """The live depth's requirements the checked environment (``npudoctor.target.pythonenv``:
    this interpreter's, or ``--python``'s) lacks, found without importing them."""
    environment = checked()
    return LiveReadiness(
        tuple(name for name in live_requirements() if name not in environment.findable),
        environment.executable,
    )


def findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def installed_sglang() -> tuple[str, str | None] | None:
    """The installed ``sglang`` package folder of this interpreter and its version (None: none)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return next(iter(spec.submodule_search_locations)), version


# Run by the named interpreter (``-I -c``) with the import names to look for as its arguments; the
# standard library only, and nothing it finds is imported. Python 3.8+ syntax: a Python too old
# for npudoctor still answers, and is refused by its version.
_ASK = r"""
import importlib.metadata, importlib.util, json, sys, sysconfig
def findable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False
def sglang():
    try:
        spec = importlib.util.find_spec("sglang")
    except Exception:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        version = importlib.metadata.version("sglang")
    except Exception:
        version = None
    return [list(spec.submodule_search_locations)[0], version]
paths = sysconfig.get_paths()
print(json.dumps({
    "npudoctor-asks": 1,
    "executable": sys.executable,
    "version": list(sys.version_info[:3]),
    "path": sys.path,
    "stdlib": [paths.get("stdlib"), paths.get("platstdlib")],
    "findable": [name for name in sys.argv[1:] if findable(name)],
    "sglang": sglang(),
}))
"""


@dataclass(frozen=True)
class PythonEnvironment:
    """One Python environment, as its interpreter sees it (isolated: no ``PYTHONPATH``, no user site)."""

    executable: str  # as the user named it (``--python``), else ``sys.executable``
    version: tuple[int, int, int]
    path: tuple[str, ...]  # its ``sys.path``
    stdlib: tuple[str, ...]  # the standard library's folders
    findable: frozenset[str]  # of the import names asked for, those found there
    sglang: tuple[str, str | None] | None  # the ``sglang`` package folder and its version
    named: bool  # given with ``--python`` (not the interpreter npudoctor runs in)

    @property
    def is_npudoctors(self) -> bool:
        """The interpreter npudoctor itself runs in."""
        return not self.named

    def package_folders(self) -> list[str]:
        """The folders of ``sys.path`` that hold its packages (site-packages, those its ``.pth``
        files add): every absolute, existing folder but the standard library's (its extension
        modules' ``lib-dynload`` too: built for this Python only)."""
        stdlib = {os.path.normpath(p) for p in self.stdlib if p}
        stdlib |= {os.path.join(p, "lib-dynload") for p in stdlib}
        return [
            entry
            for entry in self.path
            if os.path.isabs(entry) and os.path.normpath(entry) not in stdlib and os.path.isdir(entry)
        ]

    def describe(self) -> str:
        return f"{'.'.join(map(str, self.version))} ({self.executable})"


@functools.lru_cache(maxsize=1)
def own() -> PythonEnvironment:
    """The environment of the interpreter npudoctor runs in, as an isolated interpreter of it sees
    it (its package folders hold npudoctor's own dependencies; not the working directory nor
    ``PYTHONPATH``, which ``python -m npudoctor`` has on its ``sys.path``); read in this process,
    its first entry left out, when it cannot be asked."""
    try:
        return ask(sys.executable, ())
    except InputError:
        here = _this_interpreter(())
        return dataclasses.replace(here, path=here.path[1:])


def _this_interpreter(names: tuple[str, ...]) -> PythonEnvironment:
    import sysconfig

    paths = sysconfig.get_paths()
    return PythonEnvironment(
        executable=sys.executable,
        version=tuple(sys.version_info[:3]),
        path=tuple(sys.path),
        stdlib=(paths.get("stdlib", ""), paths.get("platstdlib", "")),
        findable=frozenset(name for name in names if findable(name)),
        sglang=installed_sglang(),
        named=False,
    )


def ask(python: str, names: tuple[str, ...]) -> PythonEnvironment:
    """The environment of the interpreter ``python`` (a path the user gave), asked isolated; an
    ``InputError`` (exit 2, one line) when it is not an executable Python npudoctor can use."""
    shown = f"--python {python}"
    if not os.path.isfile(python):
        raise InputError(f"{shown}: no such file" if not os.path.exists(python) else f"{shown}: not a file")
    if not os.access(python, os.X_OK):
        raise InputError(f"{shown}: not executable")
    executable = os.path.abspath(python)
    try:
        done = subprocess.run(
            [executable, "-I", "-c", _ASK, *names],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InputError(f"{shown}: not a Python interpreter (no answer in {_TIMEOUT_SECONDS} s)") from None
    except OSError as error:
        raise InputError(f"{shown}: cannot run it: {(error.strerror or str(error)).lower()}") from None
    try:
        if len(done.stdout) > _MAX_ANSWER:
            raise ValueError
        answer = json.loads(done.stdout)
        if not isinstance(answer, dict) or answer.get("npudoctor-asks") != 1:
            raise ValueError
        version = tuple(int(v) for v in answer["version"])
        found = answer["sglang"]
        environment = PythonEnvironment(
            executable=executable,
            version=version,  # type: ignore[arg-type]
            path=tuple(str(p) for p in answer["path"]),
            stdlib=tuple(str(p) for p in answer["stdlib"] if p),
            findable=frozenset(str(n) for n in answer["findable"]),
            sglang=(str(found[0]), None if found[1] is None else str(found[1])) if found else None,
            named=True,
        )
    except (ValueError, KeyError, TypeError, IndexError):
        raise InputError(
            f"{shown}: not a Python interpreter (it did not answer as one: exit {done.returncode})"
        ) from None
    if version[:2] < (3, 10):
        raise InputError(f"{shown}: Python {'.'.join(map(str, version))}: sglang needs 3.10 or newer")
    return environment


_named: PythonEnvironment | None = None


def use_python(python: str | os.PathLike | None) -> None:
    """Make the interpreter ``python`` (``--python``) the one whose environment this run checks
    (None: npudoctor's own again). Asked now, so a bad path is an error before any work."""
    global _named
    _named = None if python is None else ask(os.fspath(python), tuple(live_requirements()))


def checked() -> PythonEnvironment:
    """The environment this run checks: ``--python``'s, else npudoctor's own interpreter's."""
    if _named is not None:
        return _named
    return _this_interpreter(tuple(live_requirements()))


def named() -> PythonEnvironment | None:
    """The environment ``--python`` named, if one did."""
    return _named
