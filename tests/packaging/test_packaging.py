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


# --- the install lines the documentation prints ----------------------------------------------------

# where an operator reads an install command: the README, the examples' README and the CI snippets
INSTALL_DOCS = ("README.md", "examples/README.md", "examples/ci/*.yml", "examples/ci/*.yaml")


def _wheel_name() -> str:
    """The file name ``pip wheel .`` gives npudoctor (pure Python: py3-none-any)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return f"{project['name']}-{project['version']}-py3-none-any.whl"


def _install_lines() -> list[tuple[str, list[str]]]:
    """Every ``pip install ...`` of the documentation: (file, its arguments), a snippet's
    ``$VARIABLE`` replaced by the value the snippet sets."""
    import re
    import shlex

    found = []
    for pattern in INSTALL_DOCS:
        for path in sorted(REPO.glob(pattern)):
            text = path.read_text()
            assigned = re.findall(r'^\s*([A-Z][A-Z0-9_]*):\s*("[^"]*"|\S+)', text, re.MULTILINE)
            values = {name: value.strip('"') for name, value in assigned}
            for line in re.findall(r"pip install ([^`\n]+)", text):
                command = line.split("#")[0].split("&&")[0]
                words = shlex.split(
                    re.sub(r"\$\{?([A-Z0-9_]+)\}?", lambda m, known=values: known.get(m[1], m[0]), command)
                )
                found.append((str(path.relative_to(REPO)), words))
    return found


def test_every_install_line_names_something_that_exists():
    """npudoctor is on no package index: every install command the documentation prints names the
    checkout (``pip install .``), a file of it (``-r``/``-c``), or the wheel ``pip wheel .`` builds
    from it, never a bare project name or a URL nobody serves."""
    lines = _install_lines()
    assert {doc for doc, _ in lines} >= {
        "README.md",
        "examples/ci/github-actions.yml",
        "examples/ci/gitlab-ci.yml",
    }
    for doc, words in lines:
        targets = [
            w for i, w in enumerate(words) if not w.startswith("-") and words[i - 1] not in ("-r", "-c")
        ]
        files = [words[i + 1] for i, w in enumerate(words) if w in ("-r", "-c")]
        assert targets or files, (doc, words)
        for name in files:
            assert (REPO / name).is_file(), (doc, words)
        for target in targets:
            if target.endswith(".whl"):
                assert Path(target).name == _wheel_name(), (doc, words)
            else:
                assert target in (".", "./"), (doc, words)  # the checkout itself


def test_the_wheel_the_examples_name_installs_and_runs(wheel, tmp_path):
    """The wheel ``pip wheel --no-deps . -w dist`` builds is the file the CI snippets install; installed
    into a fresh venv, its ``npudoctor`` runs (~15 s). (Its dependencies come from this venv, appended after
    the fresh venv's own site-packages by a .pth file: the npudoctor that runs is the wheel's.)"""
    import sysconfig
    import venv

    assert wheel.name == _wheel_name()
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    done = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check", wheel],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "dependencies-from-the-test-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([tmp_path / "venv" / "bin" / "npudoctor", "--version"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert _wheel_name().split("-")[1] in done.stdout
    where = subprocess.run([python, "-c", "import npudoctor; print(npudoctor.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout  # fmt: skip
    assert where.startswith(site), where
