"""``--python PATH``: npudoctor installed in a venv of its own (pipx-style) checks the sglang of the
environment sglang runs in, and runs the live depth in that environment's interpreter where torch
and numpy import there.

The environment is a real venv (no pip, no system site-packages) whose site-packages holds a real
release, as ``pip install sglang`` leaves it: the ``sglang`` package and its ``dist-info`` (linked
from the release cache, read only)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from support.repo import EXAMPLES

VERSION = "0.5.12"


def site_packages(environment: Path) -> Path:
    return environment / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.fixture
def serving(release, tmp_path) -> Path:
    """A venv with sglang installed (and nothing else: no torch, no numpy)."""
    environment = tmp_path / "serving"
    venv.create(environment, with_pip=False, symlinks=True)
    tree = Path(release(VERSION))
    for name in ("sglang", f"sglang-{VERSION}.dist-info"):
        (site_packages(environment) / name).symlink_to(tree / name)
    return environment


def npudoctor(*args, env: dict | None = None, cwd: Path) -> subprocess.CompletedProcess:
    """npudoctor, run by this interpreter, where no sglang is installed (this venv has none)."""
    return subprocess.run(
        [sys.executable, "-m", "npudoctor", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=900,
    )


def test_the_sglang_of_that_environment_is_checked(serving, tmp_path):
    python = serving / "bin" / "python"
    done = npudoctor("check", "--depth", "static", "--config", EXAMPLES / "deepseek-v3-pd.yaml",
                     "-f", "json", "--python", python, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]  # 0.5.12 has NPD001 for this deployment
    report = json.loads(done.stdout)
    assert report["target"]["version"] == VERSION
    assert report["target"]["path"] == str(site_packages(serving) / "sglang")
    assert report["target"]["source"] == "installed"
    assert any(r["id"] == "NPD001" and r["status"] == "fail" for r in report["results"])
    # without --python, npudoctor's own interpreter has no sglang: exit 4
    alone = npudoctor("check", "--depth", "static", cwd=tmp_path)
    assert alone.returncode == 4 and "--python PATH" in alone.stderr, alone.stderr
    shown = npudoctor("env", "-f", "json", "--python", python, cwd=tmp_path)
    inventory = json.loads(shown.stdout)
    assert inventory["sglang"] == f"{VERSION} ({site_packages(serving) / 'sglang'})"
    assert inventory["checked-python"].endswith(f"({python})")


@pytest.mark.parametrize(
    "command", [("check",), ("fix",), ("run", "--", "true"), ("advise", "--releases", VERSION), ("env",)]
)
def test_a_path_that_is_not_a_python_is_one_line_exit_2(tmp_path, command):
    script = tmp_path / "not-python"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    text = tmp_path / "text"
    text.write_text("")
    for given, says in (
        (script, "not a Python interpreter"),
        (text, "not executable"),
        (tmp_path / "gone", "no such file"),
    ):
        name, *rest = command
        done = npudoctor(name, "--python", given, *rest, cwd=tmp_path)
        assert done.returncode == 2, (given, done.stderr)
        assert done.stderr == f"npudoctor: error: --python {given}: {says}\n" or (
            done.stderr.startswith(f"npudoctor: error: --python {given}: {says}")
            and done.stderr.count("\n") == 1
        ), done.stderr


def test_the_live_child_runs_in_that_interpreter(serving, tmp_path):
    """The venv gets this interpreter's packages (torch, numpy) by a ``.pth`` line: torch imports
    there, so the live depth runs in the venv's interpreter, the host's torch with it. A ``.pth``
    line of the venv's own records each interpreter that starts there."""
    site = site_packages(serving)
    (site / "host-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = tmp_path / "started"
    (site / "probe.pth").write_text(
        "import os, sys; p = os.environ.get('NPUDOCTOR_TEST_PROBE'); "
        "p and open(p, 'a').write(repr([sys.executable, sys.orig_argv]) + '\\n')\n"
    )
    python = serving / "bin" / "python"
    done = npudoctor("check", "--depth", "live", "--select", "NPD001", "--config", EXAMPLES / "deepseek-v3-pd.yaml",
                     "-f", "json", "--python", python, env={"NPUDOCTOR_TEST_PROBE": str(probe)},
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["live"]["ran"] is True, report["live"]
    # one line per start, or two: a venv's site-packages may be reached twice (lib64 -> lib)
    started = [ast.literal_eval(line) for line in sorted(set(probe.read_text().splitlines()))]
    children = [(executable, argv) for executable, argv in started if "npudoctor.live.child_process" in argv]
    assert len(children) == 1, started
    executable, argv = children[0]
    assert executable == str(python) and argv[1] == "-I", children
    npd001 = next(r for r in report["results"] if r["id"] == "NPD001")
    assert npd001["depth"] == "live", npd001
