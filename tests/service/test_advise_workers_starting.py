"""``advise``'s worker processes start with npudoctor's stop signals held.

A signal that stopped npudoctor while a spawned worker was still reading its start-up data left
that worker on a closed pipe (``EOFError: Ran out of input``, a traceback on the user's terminal);
a Ctrl-C in that window was ignored and lost, and advise ran on to the end. Held instead, each
signal is delivered once the workers exist, and npudoctor stops the workers it started.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ProcessPoolExecutor

import pytest

from npudoctor import interpreters
from npudoctor.service import advise


def test_a_ctrl_c_while_workers_start_is_delivered_after_not_lost():
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt), advise.workers_starting(processes=True):
        os.kill(os.getpid(), signal.SIGINT)
        reached_the_end = True  # the signal waits: the workers' start-up is not cut in the middle
    assert reached_the_end


def test_a_sigterm_while_workers_start_waits_for_them(monkeypatch):
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("SIGTERM"))
    try:
        with advise.workers_starting(processes=True):
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("workers started")
        seen.append("after")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen[:2] == ["workers started", "SIGTERM"], seen


def _pid() -> int:
    return os.getpid()


def test_a_worker_ignores_ctrl_c_and_ends_on_sigterm():
    """A worker started in the block: Ctrl-C (which a terminal sends to the whole group) leaves it
    running, a SIGTERM (npudoctor stopping it) ends it, although both were held while it started."""
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=interpreters.spawn_context(),
        initializer=advise.worker_started,
        initargs=(os.getpid(),),
    )
    try:
        with advise.workers_starting(processes=True):
            worker = pool.submit(_pid).result(timeout=600)
        os.kill(worker, signal.SIGINT)
        assert pool.submit(_pid).result(timeout=600) == worker  # still there, no traceback
        (process,) = pool._processes.values()
        os.kill(worker, signal.SIGTERM)
        process.join(timeout=600)
        assert process.exitcode == -signal.SIGTERM
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
