"""``advise``'s worker processes start with npudoctor's stop signals waiting.

A signal that stopped npudoctor while a spawned worker was still reading its start-up data left
that worker on a closed pipe (``EOFError: Ran out of input``, a traceback on the user's terminal);
a Ctrl-C in that window was ignored and lost, and advise ran on to the end. Now each signal is
delivered once the workers exist, and npudoctor stops the workers it started.

The first two run in a fresh interpreter, as ``npudoctor advise`` does (a pytest-xdist worker
ignores Ctrl-C itself and has threads of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor

from npudoctor import interpreters
from npudoctor.service import advise


def in_fresh_interpreter(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_ctrl_c_while_workers_start_is_delivered_after_not_lost():
    said = in_fresh_interpreter("""
        import os, signal
        from npudoctor.service import advise
        try:
            with advise.workers_starting(processes=True):
                os.kill(os.getpid(), signal.SIGINT)
                print("held", flush=True)
        except KeyboardInterrupt:
            print("delivered-after")
    """)
    assert said == ["held", "delivered-after"]


def test_a_sigterm_while_workers_start_waits_for_them_whichever_thread_it_reaches():
    said = in_fresh_interpreter("""
        import os, signal, threading, time
        from npudoctor.service import advise
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # a spinner's thread
        signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM", flush=True))
        with advise.workers_starting(processes=True):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # time for another thread to take it
            print("workers-started", flush=True)
        print("after", flush=True)
    """)
    assert said == ["workers-started", "SIGTERM", "after"]


def _pid() -> int:
    return os.getpid()


def test_a_worker_ignores_ctrl_c_and_ends_on_sigterm():
    """A worker started in the block: Ctrl-C (which a terminal sends to the whole group) leaves it
    running, a SIGTERM (npudoctor stopping it) ends it."""
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
