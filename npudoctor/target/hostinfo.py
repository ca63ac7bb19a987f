"""``npudoctor env``: what this host has, gathered without importing torch, torch_npu or sglang.

Versions come from package metadata, CANN from its install files, the NPUs from
``npu-smi`` when it is on PATH. Environment variables that steer sglang or the NPU
stack are listed with credential-looking values redacted. Whether the live depth can run
here (``pythonenv.live_readiness``: the modules of its requirements the checked environment lacks, and
``npudoctor.live.toolenv``: which interpreter it runs in) is what ``check`` asks too before it
starts the live child.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
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


def inventory(live_depth: dict) -> dict:
    """The host's inventory; ``live_depth`` is ``npudoctor.live.toolenv.describe()`` (which
    interpreter the live depth runs in), passed in: this module is below the live package."""
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
        "live-depth": live_depth,
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
