"""What a run says while it works, on stderr: ``check``, ``fix`` and ``run`` share it.

On a terminal it is rich's spinner, replaced line by line and gone when the run ends. Anywhere else
(a CI log, ``2> file``) a spinner draws nothing useful and silence looks like a hang, so each step is
one plain line with the seconds elapsed since the run started::

    npudoctor: [0.0 s] checking sglang 0.5.12 (7 check(s), 53 catalog record(s), depth auto)
    npudoctor: [0.4 s] live probes: importing sglang 0.5.12 on CPU
    npudoctor: [7.3 s] live probe NPD001: KV cache CPU offload/reload round-trips on the NPU pool

rich's progress is imported only when a spinner is shown (a CI run does not pay for it).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from npudoctor.terminal import TerminalConsole, printable


class Progress:
    """Steps of one run on stderr; with ``enabled`` False (``--quiet``) it says nothing."""

    def __init__(self, terminal: bool, enabled: bool = True):
        self._terminal = terminal
        self._enabled = enabled
        self._started = time.perf_counter()
        self._bar = None
        self._task = None

    @classmethod
    def for_stderr(cls, quiet: bool = False) -> Progress:
        """The progress of a command: a spinner when stderr is a terminal, else plain lines."""
        return cls(terminal=_is_terminal(sys.stderr), enabled=not quiet)

    def __enter__(self) -> Progress:
        self._started = time.perf_counter()
        if self._enabled and self._terminal:
            from rich.progress import Progress as Bar
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            console = TerminalConsole(file=sys.stderr, highlight=False)
            # a step names a release's version, which its tree states: shown as written, no markup
            self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                            TimeElapsedColumn(), console=console, transient=True)  # fmt: skip
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=None)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    def step(self, text: str) -> None:
        """A step begins: the spinner shows it, or one line is written."""
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, description=text)
            return
        try:
            sys.stderr.write(f"npudoctor: [{time.perf_counter() - self._started:.1f} s] {printable(text)}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: the run goes on without its progress
            self._enabled = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
