"""Ctrl-C while npudoctor works: one line on stderr, exit 130 (128 + SIGINT, what a shell reports for
a command SIGINT stopped), no traceback from npudoctor or from any process it started.

A terminal sends SIGINT to every process of the foreground job, so the test starts npudoctor in a
session of its own and signals the whole process group as soon as npudoctor has started work (a
positive sign, no fixed wait): its worker processes (``advise``: one per release, side by side) or
its live child (``check --depth live``: sglang imported on CPU) are running. Real releases, an
empty static-result cache (so the work lasts: seconds to minutes after the sign, against the
microseconds between the sign and the signal). Timeouts are 600 s guards, never bounds."""

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


def _interrupted(argv: list[str], scratch: Path, parent_only: bool = False) -> subprocess.CompletedProcess:
    """``npudoctor ARGV`` in a session of its own (``scratch``: its ``TMPDIR`` and an empty
    static-result cache), Ctrl-C'd once its work is under way: its first child process (an advise
    worker) exists, and for the live depth the live child has made its folder in ``TMPDIR``;
    for advise, both workers exist and npudoctor is done starting them (it ignores SIGINT only while
    it starts them, so they inherit the ignored signal: a Ctrl-C in that window is not this test's);
    ``parent_only``: SIGINT to npudoctor's process alone (``kill -INT PID``), not its group. The
    result's ``children`` are the processes it had started."""
    command = [str(Path(sys.executable).parent / "npudoctor"), *argv]  # the venv's, as a user runs it
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    (scratch / "cache").mkdir()
    (scratch / "tmp").mkdir()
    env.update(NPUDOCTOR_CACHE_DIR=str(scratch / "cache"), TMPDIR=str(scratch / "tmp"))
    live = "live" in argv
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               env=env, start_new_session=True)  # fmt: skip
    guard = time.monotonic() + 600
    while not (children := _children(process.pid)) or (
        (live and not any((scratch / "tmp").glob("**/npudoctor-live-*")))
        or (not live and (len(children) < 2 or _ignores_sigint(process.pid)))
    ):
        assert process.poll() is None, f"{argv} ended before it started work: {process.communicate()}"
        assert time.monotonic() < guard, f"{argv} started no process in 600 s"
        time.sleep(0.05)
    if parent_only:
        os.kill(process.pid, signal.SIGINT)
    else:
        os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=600)
    done = subprocess.CompletedProcess(command, process.returncode, out, err)
    done.children = children
    return done


def _ignores_sigint(pid: int) -> bool:
    """Whether ``pid`` ignores SIGINT now (``SigIgn`` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process still running (not a zombie waiting for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
@pytest.mark.parametrize("command", ["advise", "check --depth live"])
def test_ctrl_c_is_one_line_and_exit_130(release, tmp_path, command):
    if command == "advise":  # four releases, two worker processes
        trees = [
            arg for v in ("0.5.12", "0.5.13", "0.5.14", "0.5.15") for arg in ("--sglang-path", release(v))
        ]
        argv = ["advise", *map(str, trees), "--jobs", "2", "--config", str(DEEPSEEK_PD), "--quiet"]
    else:
        argv = ["check", "--depth", "live", "--sglang-path", str(release("0.5.12")), "--config",
                str(DEEPSEEK_PD), "--quiet"]  # fmt: skip
    done = _interrupted(argv, tmp_path)
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
def test_a_sigint_to_npudoctor_alone_stops_its_live_child(release, tmp_path):
    """``kill -INT PID`` reaches npudoctor only, not the live child it started: the child must not
    run on alone after npudoctor has exited."""
    argv = ["check", "--depth", "live", "--sglang-path", str(release("0.5.12")), "--config",
            str(DEEPSEEK_PD), "--quiet"]  # fmt: skip
    done = _interrupted(argv, tmp_path, parent_only=True)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    guard = time.monotonic() + 600  # the child's own teardown may take a while on a busy host
    while any(_running(pid) for pid in done.children) and time.monotonic() < guard:
        time.sleep(0.1)
    alive = [pid for pid in done.children if _running(pid)]
    assert not alive, f"live child still running after npudoctor exited: {alive}"
