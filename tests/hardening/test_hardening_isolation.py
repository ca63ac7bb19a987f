"""Every Python interpreter npudoctor starts for itself runs npudoctor's code and the user's
installed packages, nothing from the folder it was started in and no site customisation of the
user's: the live child, the zygote, the ``pip download`` of ``advise`` and its static workers.

The folder ``npudoctor`` is run from here holds what a pull request's workspace could: an
``npudoctor/`` package, ``pickle.py``, ``torch.py``, ``pip.py``, each leaving a mark named by the
process that ran it; a ``sitecustomize.py`` on ``PYTHONPATH`` and a ``usercustomize.py`` in the
user site do the same. npudoctor itself (the parent, started as its console script is: a script
whose folder, not the working directory, leads ``sys.path``) may run the user's customisations;
no process it starts may run any of them.

And a tree whose path holds the path separator (``--sglang-path /x/col:on``) is the tree the live
depth imports, whatever ``/x/col`` holds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import npudoctor
from npudoctor.live import zygote

from support.repo import EXAMPLES, fetch_sglang
from support.truths import expected_status

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"
PLANTED_MODULES = ("pickle", "torch", "pip")


def mark_code(marks: Path, name: str) -> str:
    return f"import os\nopen(os.path.join({str(marks)!r}, '{name}-%d' % os.getpid()), 'w').close()\n"


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A working directory holding code that must never run, and the user's site customisations."""
    marks = tmp_path / "marks"
    marks.mkdir()
    folder = tmp_path / "workspace"
    (folder / "npudoctor").mkdir(parents=True)
    (folder / "npudoctor" / "__init__.py").write_text(mark_code(marks, "npudoctor"))
    for name in PLANTED_MODULES:
        (folder / f"{name}.py").write_text(mark_code(marks, name))
    (tmp_path / "user-site").mkdir()
    (tmp_path / "user-site" / "sitecustomize.py").write_text(mark_code(marks, "sitecustomize"))
    user_site = (
        tmp_path / "userbase" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    )
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(mark_code(marks, "usercustomize"))
    return folder


def run_from(
    workspace: Path, *args, env: dict | None = None, timeout: int = 900
) -> tuple[subprocess.CompletedProcess, dict]:
    """``npudoctor ARGS`` from ``workspace``, as a console script starts it; its result and what the
    planted code ran in a process other than npudoctor's own (name -> pids)."""
    launcher = workspace.parent / "bin" / "npudoctor"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(
        "import sys\nfrom npudoctor.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n"
    )
    this_npudoctor = str(Path(npudoctor.__file__).resolve().parents[1])  # the tree under test
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([this_npudoctor, str(workspace.parent / "user-site")]),
        "PYTHONUSERBASE": str(workspace.parent / "userbase"),
        **(env or {}),
    }
    done = subprocess.Popen(
        [sys.executable, str(launcher), *map(str, args)],
        cwd=workspace,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = done.communicate(timeout=timeout)
    ran: dict[str, list[int]] = {}
    for mark in (workspace.parent / "marks").iterdir():
        name, pid = mark.name.rsplit("-", 1)
        if int(pid) != done.pid:
            ran.setdefault(name, []).append(int(pid))
    return subprocess.CompletedProcess(done.args, done.returncode, out, err), ran


@pytest.mark.slow
def test_the_live_child_runs_nothing_from_the_working_directory(workspace, release):
    """A live run (a fresh child importing a real sglang, and torch) from a folder with
    ``npudoctor/``, ``pickle.py`` and ``torch.py``: none of them runs, nor the user's customisations,
    and the live depth still finds npudoctor, torch and the tree."""
    done, ran = run_from(
        workspace, "check", "--depth", "live", "--sglang-path", release("0.5.13"), "--config", DEEPSEEK,
        "--select", "NPD006", "--format", "json", "--quiet",
    )  # fmt: skip
    assert ran == {}, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["live"]["ran"] is True, report["live"]
    [result] = report["results"]
    assert (result["status"], result["depth"]) == (expected_status("0.5.13", "NPD006", "mla"), "live"), result


def test_the_zygote_runs_nothing_from_the_working_directory(workspace, release, monkeypatch):
    """A zygote (the live runs of a caller that runs many) started from that folder: its start
    imports npudoctor and pickle, from npudoctor's and Python's own folders."""
    monkeypatch.chdir(workspace)
    marks = workspace.parent / "marks"
    environment = {**os.environ, "PYTHONPATH": str(workspace.parent / "user-site")}
    zygote._Zygote(str(release("0.5.13")), [], environment).close()  # it starts, sees no request, ends
    assert sorted(p.name.rsplit("-", 1)[0] for p in marks.iterdir()) == []


def test_advise_workers_run_nothing_from_the_working_directory(workspace, release, monkeypatch):
    """``advise`` at the static depth checks releases in spawned worker processes: from that folder
    they import neither its ``pickle.py`` nor the user's customisations, and still check."""
    trees = [release("0.5.12"), release("0.5.13")]
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(fetch_sglang.cache_dir()))
    done, ran = run_from(
        workspace, "advise", "--sglang-path", trees[0], "--sglang-path", trees[1], "--releases", "0.5.13",
        "--config", DEEPSEEK, "--select", "NPD006", "--jobs", "2", "--format", "json", "--quiet",
    )  # fmt: skip
    assert ran == {}, done.stderr[-2000:]
    rows = json.loads(done.stdout)["releases"]
    assert [row["report"]["results"][0]["status"] for row in rows] == ["fail", "pass", "pass"], rows


def test_advise_downloads_with_pip_not_a_pip_py_of_the_working_directory(workspace, release, tmp_path):
    """A release not in the cache is downloaded by ``python -m pip download``: pip's, not the
    folder's ``pip.py``; pip still reads the user's ``PIP_*`` settings (an index nobody answers)."""
    release("0.5.13")
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(fetch_sglang.cache_dir() / "pypi-sglang.json", cache / "pypi-sglang.json")  # no index read
    offline = {
        "NPUDOCTOR_SGLANG_CACHE": str(cache),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_NO_CACHE_DIR": "1",
    }
    done, ran = run_from(
        workspace, "advise", "--releases", "0.5.13", "--format", "json", "--quiet", env=offline
    )
    assert ran == {}, done.stderr[-2000:]
    [row] = json.loads(done.stdout)["releases"]
    assert row["error"].startswith("cannot download sglang==0.5.13: "), row
    assert "127.0.0.1" in row["error"] or "No matching distribution" in row["error"], row  # pip's own words


@pytest.mark.slow
def test_a_tree_whose_path_holds_the_path_separator_is_the_tree_imported(release, tmp_path):
    """``--sglang-path /x/col:on`` where ``/x/col`` is another release: the live depth imports
    ``col:on``'s sglang (0.5.13, where NPD006's defect is fixed), not ``col``'s (0.5.12, where it
    is not), and judges it under its own version."""
    assert expected_status("0.5.12", "NPD006", "mla") != expected_status("0.5.13", "NPD006", "mla")
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "col").symlink_to(release("0.5.12"))
    # a copy (hard links), not a link: npudoctor names a tree by its real path
    shutil.copytree(release("0.5.13"), folder / f"col{os.pathsep}on", copy_function=os.link)
    this_npudoctor = str(Path(npudoctor.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "check", "--depth", "live", "--sglang-path", folder / f"col{os.pathsep}on",
         "--config", DEEPSEEK, "--select", "NPD006", "--format", "json", "--quiet"],
        env={**os.environ, "PYTHONPATH": this_npudoctor}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["target"]["version"] == "0.5.13" and report["live"]["ran"] is True, report["live"]
    [result] = report["results"]
    assert (result["status"], result["depth"]) == (expected_status("0.5.13", "NPD006", "mla"), "live"), result


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
@pytest.mark.parametrize("whom", ["the terminal's Ctrl-C (the process group)", "kill -INT (npudoctor alone)"])
def test_an_interrupted_live_run_leaves_no_scratch_folder(release, tmp_path, whom):
    """SIGINT while the live child imports sglang: what it keeps in ``$TMPDIR`` (its scratch folder
    ``npudoctor-live-*``: the hubs' caches, the probes' model; the stand-ins' metadata) goes with it,
    however the child ended."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    command = [sys.executable, "-m", "npudoctor", "check", "--depth", "live", "--sglang-path",
               release("0.5.12"), "--config", DEEPSEEK, "--select", "NPD006", "--quiet"]  # fmt: skip
    this_npudoctor = str(Path(npudoctor.__file__).resolve().parents[1])
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": this_npudoctor}
    process = subprocess.Popen(list(map(str, command)), env=env, start_new_session=True, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    guard = time.monotonic() + 600  # a guard, ends as soon as the sign is there
    # the child imports sglang under the NPU simulation: the stand-ins are in place
    while not [*scratch.glob("npudoctor-standins-*"), *scratch.glob("*/npudoctor-standins-*")]:
        assert process.poll() is None, (
            f"npudoctor ended before its live child imported: {process.communicate()}"
        )
        assert time.monotonic() < guard, "no live child importing sglang in 600 s"
        time.sleep(0.05)
    assert process.poll() is None, "the live run finished before the Ctrl-C"
    if whom.startswith("kill"):
        os.kill(process.pid, signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 130, err
    guard = time.monotonic() + 600  # the child's own exit, if it is what removes it (slow on a busy host)
    while list(scratch.glob("npudoctor-live-*")) and time.monotonic() < guard:
        time.sleep(0.1)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("npudoctor-")] == []
