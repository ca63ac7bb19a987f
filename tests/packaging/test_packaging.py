"""checks/ and fixes/ ship inside npudoctor, never as top-level packages; so do the live depth's
requirement files, which npudoctor's own live environment is made from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import npudoctor.checks
import npudoctor.fixes

from support.repo import REPO, source_copy


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """npudoctor's wheel, built once from a copy of the source (``source_copy``: never in the
    repository, where another build may be writing ``build/`` at the same moment)."""
    base = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(base),
            str(source_copy(base / "src")),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [built] = base.glob("npudoctor-*.whl")
    return built


def test_wheel_maps_checks_and_fixes_under_npudoctor(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "npudoctor/checks/npd001_cpu_offload_roundtrip/__init__.py" in names
    # every file of every check folder ships (adding a check is adding a folder, nothing else)
    for path in sorted((REPO / "checks").glob("*/*.py")):
        assert f"npudoctor/checks/{path.parent.name}/{path.name}" in names, path
    assert "npudoctor/fixes/__init__.py" in names
    assert "npudoctor/patching/bootstrap/sitecustomize.py" in names  # what `npudoctor run` puts on PYTHONPATH
    assert "npudoctor/data/server_args.json" in names  # every release's ServerArgs fields and flags
    assert not any(n.startswith(("checks/", "fixes/", "tests/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "npudoctor = npudoctor.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_editable_install_maps_the_same_packages():
    assert npudoctor.checks.__path__ == [str(REPO / "checks")]
    assert npudoctor.fixes.__path__ == [str(REPO / "fixes")]
    done = subprocess.run([sys.executable, "-c", "import checks"], capture_output=True, cwd="/")
    assert done.returncode != 0


def test_the_live_environment_is_made_from_files_of_the_installed_wheel(wheel, tmp_path):
    """npudoctor's own live environment (``env --prepare``) is installed from
    ``requirements-live.txt`` and ``constraints-live.txt``; from a wheel installed anywhere, both
    are inside the installed package, with the repository's content, and name the environment."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {"npudoctor/data/requirements-live.txt", "npudoctor/data/constraints-live.txt"} <= set(names)
    installed = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(installed),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from npudoctor.cli import main; sys.exit(main(sys.argv[1:]))"]
        + ["env", "-f", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    live = json.loads(done.stdout)["live-depth"]
    assert "pip install" not in done.stdout and live["prepare"].endswith("npudoctor env --prepare"), live
    for name in ("requirements-live.txt", "constraints-live.txt"):
        path = installed / "npudoctor" / "data" / name
        assert path.read_text() == (REPO / name).read_text()  # the repository's top-level file
    code = "from npudoctor.live import toolenv; print(toolenv.location())"
    here = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert live["live-env"] == here.stdout.strip()  # the same files: the same environment
