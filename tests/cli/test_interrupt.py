"""Ctrl-C while npudoctor works: one line on stderr, exit 130 (128 + SIGINT, what a shell reports for
a command SIGINT stopped), no traceback from npudoctor or from any process it started.

A terminal sends SIGINT to every process of the foreground job, so the test starts npudoctor in a
session of its own and signals the whole process group, once npudoctor has started work: its
worker processes (``advise``: one per release, side by side) or its live child (``check --depth
live``: sglang imported on CPU) are running. Real releases, an empty static-result cache (so the
work lasts)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.repo import EXAMPLES, REPO

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started, from /proc (Linux)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found += [int(child) for child in text.split()]
    return found


def _interrupted(argv: list[str], parent_only: bool = False) -> subprocess.CompletedProcess:
    """``npudoctor ARGV`` in a session of its own, Ctrl-C'd a second after its first child process
    (a worker, the live child) started; ``parent_only``: SIGINT to npudoctor's process alone (``kill
    -INT PID``), not its group. The result's ``children`` are the processes it had started."""
    command = [str(Path(sys.executable).parent / "npudoctor"), *argv]  # the venv's, as a user runs it
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               env=env, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not _children(process.pid):
        assert process.poll() is None, f"{argv} ended before it started work: {process.communicate()}"
        assert time.monotonic() < deadline, f"{argv} started no process in 120 s"
        time.sleep(0.05)
    time.sleep(1.0)
    assert process.poll() is None, f"{argv} finished before the Ctrl-C"
    children = _children(process.pid)
    if parent_only:
        os.kill(process.pid, signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    done = subprocess.CompletedProcess(command, process.returncode, out, err)
    done.children = children
    return done


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
@pytest.mark.parametrize("command", ["advise", "check --depth live"])
def test_ctrl_c_is_one_line_and_exit_130(release, command):
    if command == "advise":  # four releases, two worker processes
        trees = [
            arg for v in ("0.5.12", "0.5.13", "0.5.14", "0.5.15") for arg in ("--sglang-path", release(v))
        ]
        argv = ["advise", *map(str, trees), "--jobs", "2", "--config", str(DEEPSEEK_PD), "--quiet"]
    else:
        argv = ["check", "--depth", "live", "--sglang-path", str(release("0.5.12")), "--config",
                str(DEEPSEEK_PD), "--quiet"]  # fmt: skip
    done = _interrupted(argv)
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stderr) == (130, "npudoctor: interrupted\n"), done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("command", [[], ["check"], ["fix"], ["advise"], ["run"]])
def test_help_that_lists_exit_codes_lists_130(cli, command):
    code, out, _ = cli(*command, "--help")
    text = " ".join(out.split())  # the help is wrapped to the terminal: a phrase may cross a line
    assert code == 0 and "Exit code" in text
    assert re.search(r"\b130\b[^;.]*(interrupted|Ctrl-C)", text), out


def test_run_reports_a_command_sigint_ended_as_130(release):
    """`npudoctor run`'s exit code is the command's: one a signal ends is 128 + N, as a shell
    reports it (it was the negative number Popen gives, which became exit 254)."""
    env = {**os.environ, "PYTHONPATH": str(release("0.5.23"))}
    done = subprocess.run([str(Path(sys.executable).parent / "npudoctor"), "run", "--depth", "static", "--quiet",
                           "--", "sh", "-c", "kill -INT $$"], capture_output=True, text=True, env=env, cwd=REPO)  # fmt: skip
    assert (done.returncode, done.stderr) == (130, ""), done.stderr


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
def test_a_sigint_to_npudoctor_alone_stops_its_live_child(release):
    """``kill -INT PID`` reaches npudoctor only, not the live child it started: the child must not
    run on alone after npudoctor has exited."""
    argv = ["check", "--depth", "live", "--sglang-path", str(release("0.5.12")), "--config",
            str(DEEPSEEK_PD), "--quiet"]  # fmt: skip
    done = _interrupted(argv, parent_only=True)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() for pid in done.children) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in done.children if Path(f"/proc/{pid}/stat").exists()
             and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]  # fmt: skip
    assert not alive, f"live child still running after npudoctor exited: {alive}"
