"""A signal that ends npudoctor ends everything it started, and removes its temporary folders.

A supervisor (systemd, a CI runner's cancel, a closed terminal) stops a command with SIGTERM,
SIGHUP or SIGQUIT to its main process alone; a runaway one is SIGKILLed. None of these may leave
npudoctor's live child importing sglang, ``advise``'s workers checking releases, or the command
``run`` launched, running on without it, nor an ``npudoctor-live-*`` / ``npudoctor-run-*`` folder
in ``$TMPDIR``.

Each test starts the real CLI in a session of its own, with a private ``TMPDIR`` and an empty
static-result cache (so the work lasts), waits until the process the case is about exists (the
live child's folder, advise's workers, the launched command: a positive sign, no fixed wait),
signals npudoctor's main process at once (or, for Ctrl-C, its process group, as a terminal
does), and then looks for any process left in the session and any folder left in ``TMPDIR``.
Every wait is a 600 s guard that ends as soon as its condition holds, never a bound."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.repo import EXAMPLES

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc")

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
NPUDOCTOR = str(Path(sys.executable).parent / "npudoctor")  # the venv's, as a user runs it


def _session_members(session: int) -> list[str]:
    """The processes still running (not zombies) in ``session``: ``"PID COMMAND"`` each."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended while we looked
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        state, sid = fields[0], int(fields[3])
        if sid == session and state not in ("Z", "X"):
            found.append(f"{stat.parent.name} {name}")
    return found


def _children(pid: int) -> list[int]:
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in children.read_text().split()]
    return found


def _signalled(argv, tmp_path, started, signum, group=False, env=None):
    """``npudoctor ARGV`` in a session of its own with ``TMPDIR`` a private folder, sent ``signum``
    once ``started(pid, tmpdir)`` says the work is under way; returns (exit code, stderr, the
    processes left in its session, what is left in its ``TMPDIR``), once they cleared (or after a
    600 s guard)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    (tmp_path / "cache").mkdir()
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environment.update({"NPUDOCTOR_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}, TMPDIR=str(tmpdir))

    def no_core_files():  # SIGQUIT's default action dumps core
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    stderr = tmp_path / "stderr"  # a file, not a pipe: a survivor would hold a pipe open
    with stderr.open("w") as err:
        process = subprocess.Popen([NPUDOCTOR, *map(str, argv)], stdout=subprocess.DEVNULL, stderr=err,
                                   cwd=tmp_path, env=environment, start_new_session=True,
                                   preexec_fn=no_core_files)  # fmt: skip
    try:
        guard = time.monotonic() + 600
        while not started(process.pid, tmpdir):
            assert process.poll() is None, f"{argv} ended before its work started: {stderr.read_text()}"
            assert time.monotonic() < guard, f"{argv}: its work did not start in 600 s"
            time.sleep(0.05)
        assert process.poll() is None, f"{argv} finished before the signal"
        (os.killpg if group else os.kill)(process.pid, signum)
        process.wait(timeout=600)
        guard = time.monotonic() + 600  # a child's teardown may take a while on a busy host
        while (left := _session_members(process.pid)) and time.monotonic() < guard:
            time.sleep(0.1)
        return process.returncode, stderr.read_text(), left, sorted(p.name for p in tmpdir.iterdir())
    finally:
        if _session_members(process.pid):  # never leave a test's processes behind, whatever it found
            os.killpg(process.pid, signal.SIGKILL)


def _live_child_at_work(_pid, tmpdir: Path) -> bool:
    """The live child started and made its scratch folder (it is importing sglang)."""
    return any(tmpdir.glob("**/npudoctor-live-*"))


@pytest.mark.parametrize(
    ("signum", "group"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True), (signal.SIGINT, False)],
    ids=["SIGTERM", "SIGHUP", "ctrl-c", "kill-INT"],
)
def test_a_signal_to_check_ends_the_live_child_and_removes_its_folder(release, tmp_path, signum, group):
    argv = ["check", "--depth", "live", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--quiet"]  # fmt: skip
    code, err, left, files = _signalled(argv, tmp_path, _live_child_at_work, signum, group=group)
    assert not left, f"still running after npudoctor ended: {left}"
    assert files == [], f"left in TMPDIR: {files}"
    assert (code, "Traceback" in err) == (128 + signum, False), err


def test_a_sigkill_to_check_ends_the_live_child(release, tmp_path):
    """SIGKILL runs no code of npudoctor's: the kernel ends the live child with it."""
    argv = ["check", "--depth", "live", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--quiet"]  # fmt: skip
    code, _, left, _ = _signalled(argv, tmp_path, _live_child_at_work, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert not left, f"still running after npudoctor was killed: {left}"


def _ignores_sigint(pid: int) -> bool:
    """Whether ``pid`` ignores SIGINT now (``SigIgn`` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def _workers_at_work(count: int):
    """advise's ``count`` workers started, and npudoctor done starting them: it ignores SIGINT only
    while it starts them (so they inherit the ignored signal), and hands each its task then; a
    signal inside that window interrupts the start itself, which this test does not aim at."""

    def started(pid, _tmpdir) -> bool:
        return len(_children(pid)) >= count and not _ignores_sigint(pid)

    return started


@pytest.mark.parametrize(
    ("depth", "signum"),
    [
        ("static", signal.SIGTERM),
        ("live", signal.SIGTERM),
        ("static", signal.SIGKILL),
        ("live", signal.SIGKILL),
    ],
    ids=["static-SIGTERM", "live-SIGTERM", "static-SIGKILL", "live-SIGKILL"],
)
def test_a_signal_to_advise_ends_its_workers(release, tmp_path, depth, signum):
    """At the static depth each release is checked in a worker process; at the live depth in a
    thread, with a live child of its own. SIGTERM to npudoctor ends them all at once; SIGKILL runs
    none of npudoctor's code, and the kernel ends them with it."""
    versions = ("0.5.12", "0.5.13", "0.5.14", "0.5.15") if depth == "static" else ("0.5.12", "0.5.13")
    trees = [arg for v in versions for arg in ("--sglang-path", release(v))]
    argv = ["advise", *trees, "--jobs", "2", "--depth", depth, "--config", DEEPSEEK_PD, "--quiet"]
    code, err, left, files = _signalled(argv, tmp_path, _workers_at_work(2), signum)
    assert not left, f"still running after npudoctor ended: {left}"
    if signum == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert files == [], f"left in TMPDIR: {files}"
    assert (code, "Traceback" in err) == (143, False), err


def _command_running(pid, _tmpdir) -> bool:
    """The command ``run`` launched (``sleep``) is running."""
    for child in _children(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "sleep":
                return True
        except OSError:
            pass
    return False


@pytest.fixture(scope="module")
def run_cache(tmp_path_factory) -> str:
    """One static-result cache for the ``run`` cases: the check before the command is the same each
    time (a parse of the release: 20 s), the signal is what differs."""
    return str(tmp_path_factory.mktemp("npudoctor-cache"))


@pytest.mark.parametrize(
    "signum",
    [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM],
    ids=lambda s: s.name,
)
def test_run_hands_a_supervisors_signal_to_the_command(release, tmp_path, run_cache, signum):
    """``run`` forwards what a supervisor sends to the command, waits for it, removes its plan's
    folder and exits with the command's status: ``sleep`` ended by signal N, 128 + N."""
    argv = ["run", "--depth", "static", "--quiet", "--", "sleep", "60"]
    env = {"PYTHONPATH": str(release("0.5.23")), "NPUDOCTOR_CACHE_DIR": run_cache}
    code, err, left, files = _signalled(argv, tmp_path, _command_running, signum, env=env)
    assert not left, f"still running after npudoctor ended: {left}"
    assert files == [], f"left in TMPDIR: {files}"
    assert (code, err) == (128 + signum, "")
