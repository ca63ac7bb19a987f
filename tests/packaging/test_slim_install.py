"""A plain `pip install .` of the checkout (no torch, no sglang) in a fresh venv: a slim CI image.

The static depth, every report format, ``list``, ``explain``, ``env`` and the fix plan work there;
``--depth auto`` reports why the live depth did not run and gives the static verdicts. The venv is
real (no system site-packages), npudoctor is installed from a copy of this checkout with only its
declared dependencies.
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

from npudoctor.formatters import NAMES as FORMAT_NAMES

from support.repo import EXAMPLES, source_copy

pytestmark = pytest.mark.slow  # builds a venv and installs into it (~1 min)


@pytest.fixture(scope="module")
def slim(tmp_path_factory) -> Path:
    """The ``npudoctor`` executable of a venv holding npudoctor and its dependencies only."""
    base = tmp_path_factory.mktemp("slim")
    source = source_copy(base / "src")
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
                           capture_output=True, text=True)  # fmt: skip
    assert found.stdout.strip() == "None", "the slim venv must not have torch"
    return base / "venv" / "bin" / "npudoctor"


def run(executable: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.parametrize("output_format", FORMAT_NAMES)
def test_static_check_in_every_format(slim, release, tmp_path, output_format):
    done = run(slim, "check", "--depth", "static", "-f", output_format, "--sglang-path", release("0.5.12"),
               "--config", EXAMPLES / "deepseek-v3-pd.yaml", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr  # 0.5.12 has NPD001 for this deployment
    assert "NPD001" in done.stdout and "Traceback" not in done.stderr


def test_auto_depth_says_why_live_did_not_run(slim, release, tmp_path):
    done = run(slim, "check", "-f", "json", "--sglang-path", release("0.5.12"),
               "--config", EXAMPLES / "deepseek-v3-pd.yaml", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["live"]["ran"] is False and "torch is not installed" in report["live"]["reason"]
    npd001 = next(r for r in report["results"] if r["id"] == "NPD001")
    assert (npd001["status"], npd001["depth"]) == ("fail", "static")
    assert any(a.startswith("live depth not run: torch is not installed") for a in npd001["assumptions"])


@pytest.mark.parametrize(
    "args",
    [("list",), ("explain", "NPD001"), ("env",), ("env", "-f", "json"), ("fix", "-f", "json"), ("fix",)],
    ids=" ".join,
)
def test_other_commands(slim, release, tmp_path, args):
    extra = (
        ("--sglang-path", release("0.5.12"), "--config", EXAMPLES / "deepseek-v3-pd.yaml")
        if args[0] == "fix"
        else ()
    )
    done = run(slim, *args, *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "Traceback" not in done.stderr
    if args == ("fix", "-f", "json"):
        plan = {entry["id"]: entry["action"] for entry in json.loads(done.stdout)["plan"]}
        assert plan["NPD001"] == "apply", plan
    if args[0] == "env" and "json" in args:
        assert json.loads(done.stdout)["torch"] == "not installed"


def test_prepare_builds_the_live_environment_once_and_the_live_depth_runs_in_it(slim, release, tmp_path):
    """Where torch is not installed, ``env --prepare`` builds npudoctor's own live environment from
    the shipped requirement files (the one test that really builds it), a second one reuses it, and
    ``check`` then runs the live depth in it, the slim venv's sglang-free environment untouched."""
    first = run(slim, "env", "--prepare", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stderr.splitlines()
    assert any("making a venv" in line for line in lines) and any("pip" in line for line in lines), lines
    environment = Path(lines[-1].rsplit("the live environment is ready: ", 1)[1])
    marker = (environment / "npudoctor-live-env.json").stat().st_ino
    again = run(slim, "env", "--prepare", cwd=tmp_path)
    assert (again.returncode, again.stderr) == (
        0,
        f"npudoctor: the live environment is ready: {environment}\n",
    )
    assert (environment / "npudoctor-live-env.json").stat().st_ino == marker
    inventory = json.loads(run(slim, "env", "-f", "json", cwd=tmp_path).stdout)
    assert inventory["torch"] == "not installed"  # the slim venv itself got nothing
    live = inventory["live-depth"]
    assert (live["runs"], live["uses"], live["interpreter"]) == (
        True,
        "live-env",
        str(environment / "bin" / "python"),
    )
    done = run(slim, "check", "-f", "json", "--depth", "live", "--select", "NPD001", "--sglang-path",
               release("0.5.12"), "--config", EXAMPLES / "deepseek-v3-pd.yaml", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["live"]["ran"] is True, report["live"]
    npd001 = next(r for r in report["results"] if r["id"] == "NPD001")
    assert (npd001["status"], npd001["depth"]) == ("fail", "live"), npd001
