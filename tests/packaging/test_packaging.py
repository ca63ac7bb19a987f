"""checks/ and fixes/ ship inside npudoctor, never as top-level packages; so do the live depth's
requirement files, whose install command npudoctor prints."""

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


def test_the_printed_install_command_names_files_of_the_installed_wheel(wheel, tmp_path):
    """``npudoctor env`` (and the live depth, where it cannot run) print ``pip install -r
    requirements-live.txt -c constraints-live.txt``; from a wheel installed anywhere, both files exist
    where the command says, inside the installed package, with the repository's content."""
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
    words = json.loads(done.stdout)["live-depth"]["install"].split()
    files = [Path(words[i + 1]) for i, word in enumerate(words) if word in ("-r", "-c")]
    assert [f.name for f in files] == ["requirements-live.txt", "constraints-live.txt"], words
    for path in files:
        assert path.is_file() and path.is_relative_to(installed / "npudoctor"), path
        assert path.read_text() == (REPO / path.name).read_text()  # the repository's top-level file
