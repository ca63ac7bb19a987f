"""``npudoctor env``: what this host has, gathered without importing torch, torch_npu or sglang.

Versions come from package metadata, CANN from its install files, the NPUs from
``npu-smi`` when it is on PATH. Environment variables that steer sglang or the NPU
stack are listed with credential-looking values redacted. Whether the live depth can run
here (``live_readiness``: the modules of its requirements the checked environment lacks, and
``npudoctor.live.toolenv``: which interpreter it runs in) is what ``check`` asks too before it
starts the live child.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from npudoctor import __version__
from npudoctor.deployment.redact import redact_env

RELEVANT_ENV_PREFIXES = (
    "ASCEND_",
    "SGLANG_",
    "HCCL_",
    "PYTORCH_NPU_",
    "TASK_QUEUE_",
    "NPUDOCTOR_",
    "HF_",
    "CANN_",
)
_CANN_VERSION_FILES = (
    "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
    "/usr/local/Ascend/ascend-toolkit/latest/ascend_toolkit_install.info",
    "/usr/local/Ascend/cann/version.cfg",
)


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
    from npudoctor.target import pythonenv

    checked = pythonenv.checked()
    return LiveReadiness(
        tuple(name for name in live_requirements() if name not in checked.findable), checked.executable
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


def _live_depth() -> dict:
    """Whether the live depth runs, in which interpreter (the checked environment's, or npudoctor's
    own live environment), and the command that prepares that environment."""
    from npudoctor.live import toolenv

    readiness = live_readiness()
    chosen = toolenv.select()
    environment = toolenv.location()
    ran = isinstance(chosen, toolenv.LiveInterpreter)
    return {
        "runs": ran,
        "interpreter": chosen.python if ran else None,
        "uses": chosen.where if ran else None,
        "missing": list(readiness.missing) if not ran or chosen.where == "host" else [],
        "reason": chosen.reason if not ran else readiness.reason() if chosen.where == "host" else None,
        "live-env": str(environment),
        "live-env-state": toolenv.state(environment) or "ready",
        "prepare": toolenv.prepare_command(),
    }


def inventory() -> dict:
    from npudoctor.target import pythonenv

    named = pythonenv.named()
    return {
        "npudoctor": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        **({"checked-python": named.describe()} if named else {}),
        "platform": platform.platform(),
        "torch": _dist_version("torch") if not named else _found(named, "torch"),
        "torch_npu": _dist_version("torch_npu") if not named else _found(named, "torch_npu"),
        "sglang": _sglang(),
        "cann": _cann_version(),
        "npu-smi": _npu_smi(),
        "live-depth": _live_depth(),
        "environment": redact_env(
            {k: v for k, v in sorted(os.environ.items()) if k.startswith(RELEVANT_ENV_PREFIXES)}
        ),
    }


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _found(environment, name: str) -> str:
    return "installed" if name in environment.findable else "not installed"


def _sglang() -> str:
    from npudoctor.target import pythonenv

    found = pythonenv.checked().sglang
    if found is None:
        return "not installed"
    return f"{found[1] or 'unknown version'} ({found[0]})"


def _cann_version() -> str:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    candidates = [Path(home, "version.cfg"), Path(home, "ascend_toolkit_install.info")] if home else []
    for path in [*candidates, *map(Path, _CANN_VERSION_FILES)]:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() in (
                "version",
                "toolkit_installed_version",
                "runtime_running_version",
            ):
                return f"{value.strip().strip('[]')} ({path})"
        return f"unknown version ({path})"
    return "not found"


def _npu_smi() -> str:
    exe = shutil.which("npu-smi")
    if exe is None:
        return "not found"
    try:
        done = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{exe}: failed ({error})"
    first = next((line.strip() for line in done.stdout.splitlines() if "Version" in line), "")
    return f"{exe}: exit {done.returncode}" + (f", {first}" if first else "")
