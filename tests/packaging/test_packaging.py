"""checks/ and fixes/ ship inside npudoctor, never as top-level packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import npudoctor.checks
import npudoctor.fixes

from support.repo import REPO


def test_wheel_maps_checks_and_fixes_under_npudoctor(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("npudoctor-*.whl")
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
