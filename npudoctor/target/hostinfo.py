"""``npudoctor env``: what this host has, gathered without importing torch, torch_npu or sglang.

Versions come from package metadata, CANN from its install files, the NPUs from
``npu-smi`` when it is on PATH. Environment variables that steer sglang or the NPU
stack are listed with credential-looking values redacted. Whether the live depth can run
here (``live_readiness``: the modules of its requirements this interpreter lacks) is what the
live child asks too before it starts.
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


# The live depth's CPU dependency set, shipped inside npudoctor (package data), so the install
# command printed names files that exist wherever npudoctor is installed.
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
    """Which modules of the live depth's requirements this interpreter lacks."""

    missing: tuple[str, ...]  # import names, in the requirements' order

    @property
    def runs(self) -> bool:
        """Whether the live depth can run here (it needs ``LIVE_NEEDS``; the rest is stood in)."""
        return not set(LIVE_NEEDS) & set(self.missing)

    @property
    def install(self) -> str:
        return live_install_command()

    def reason(self) -> str | None:
        """One line: what is missing and how to install it (None when nothing is)."""
        if not self.missing:
            return None
        blocking = [m for m in self.missing if m in LIVE_NEEDS]
        first, *rest = blocking + [m for m in self.missing if m not in LIVE_NEEDS]
        nor = f" (nor {', '.join(rest)})" if rest else ""
        return (
            f"{first} is not installed in this interpreter{nor}: the live depth imports sglang with "
            f"npudoctor's live requirements; install them with: {self.install}"
        )


def live_data_file(name: str) -> Path:
    """A file of npudoctor's package data (``npudoctor/data/``), where this npudoctor is installed."""
    return Path(__file__).resolve().parents[1] / "data" / name


def live_install_command() -> str:
    """The command that installs the live depth's requirements (the files shipped with npudoctor)."""
    return f"pip install -r {live_data_file(LIVE_REQUIREMENTS)} -c {live_data_file(LIVE_CONSTRAINTS)}"


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
    """The live depth's requirements this interpreter lacks (found without importing them)."""
    return LiveReadiness(tuple(name for name in live_requirements() if not _findable(name)))


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _live_depth() -> dict:
    readiness = live_readiness()
    return {
        "runs": readiness.runs,
        "missing": list(readiness.missing),
        "reason": readiness.reason(),
        "install": readiness.install,
    }


def inventory() -> dict:
    return {
        "npudoctor": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": _dist_version("torch"),
        "torch_npu": _dist_version("torch_npu"),
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


def _sglang() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return "not installed"
    return f"{_dist_version('sglang')} ({next(iter(spec.submodule_search_locations))})"


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
