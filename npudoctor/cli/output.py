"""Where the command line writes, and what it does when it cannot.

Reports go to stdout (or ``--output``); logs, progress and error lines go to stderr, so
``npudoctor check --format json | jq`` always sees clean JSON. A reader that goes away
(``npudoctor explain NPD001 | head -1``) ends the command as SIGPIPE ends ``cat``: quietly, 141.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from npudoctor.deployment.redact import redact_value
from npudoctor.errors import InputError
from npudoctor.terminal import TerminalConsole, printable

EXIT_BROKEN_PIPE = 141


class ReaderGone(Exception):
    """The reader of stdout went away (a closed pipe). Not an ``OSError``: click answers an EPIPE
    ``OSError`` with ``sys.exit(1)`` itself, and rich with ``SystemExit(1)``; ``main`` ends on this."""


class _Stdout(TerminalConsole):
    """stdout as rich prints on it; a reader that went away is ``ReaderGone``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise ReaderGone


def console() -> Console:
    """The console reports are printed on (stdout; its width from the terminal, or $COLUMNS, else 80)."""
    require_stdout()
    return _Stdout(highlight=False)


def write(text: str, output: Path | None = None) -> None:
    """The report on stdout (or in ``output``): every plain write of the CLI goes through here."""
    if output is None:
        require_stdout()
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise ReaderGone from None
        return
    try:
        output.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as error:
        raise InputError(f"--output {output}: cannot write ({error.strerror})") from None


def say(message: str) -> None:
    """One unwrapped line on stderr: what a CI log or a grep needs. Every error and progress line
    goes through here, and many quote what the user gave (a path, a flag's value): a URL's password
    and a well-known token format are redacted (``redact_value``) and control characters escaped
    (``printable``), whatever message a command built."""
    sys.stderr.write(f"npudoctor: {printable(redact_value(' '.join(message.split())))}\n")


def require_destination(output: Path | None, github: bool = False) -> None:
    """Before any work: the report (and a GitHub step summary) can be written where it goes, so a
    bad ``-o`` is said at once, not after a live run whose results it would lose."""
    if output is None:
        require_stdout()
    else:
        _require_writable(output, "--output")
    summary = os.environ.get("GITHUB_STEP_SUMMARY") if github else None
    if summary:
        _require_writable(Path(summary), "GITHUB_STEP_SUMMARY=")


def require_stdout() -> None:
    try:
        usable = (
            sys.stdout is not None and not sys.stdout.closed and os.fstat(sys.stdout.fileno()) is not None
        )
    except (OSError, ValueError, io.UnsupportedOperation):
        usable = sys.stdout is not None and not sys.stdout.closed  # a stream without a descriptor (tests)
    if not usable:
        raise InputError("standard output is closed: write the report with --output FILE")


def _require_writable(path: Path, option: str) -> None:
    """``path`` can be written: opened for appending (which changes no byte of a file that exists;
    one created for the test is removed again), so a read-only file system or a denied directory is
    found as the real write would find it."""
    shown = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    if path.is_dir():
        raise InputError(f"{shown}: is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(
            f"{shown}: {'not a directory' if parent.exists() else 'no such directory'}: {parent}"
        )
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise InputError(f"{shown}: cannot write ({error.strerror})") from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()


def step_summary(write_to: Callable[[str], None]) -> None:
    """``write_to($GITHUB_STEP_SUMMARY)`` when the variable is set (a GitHub Actions step)."""
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return
    try:
        write_to(summary_path)
    except OSError as error:
        raise InputError(f"GITHUB_STEP_SUMMARY={summary_path}: cannot write ({error.strerror})") from None


def stdout_gone() -> int:
    """The reader of stdout went away (``npudoctor explain NPD001 | head -1``): end as a command that
    SIGPIPE stopped does, quietly with 141 (128 + SIGPIPE), the status a shell reports for ``cat``
    there. stdout is pointed at /dev/null so that flushing it at exit raises nothing more."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def tolerant_streams() -> None:
    """Text npudoctor prints can hold what the console cannot encode: a lone surrogate from a YAML
    escape ("\\ud800") or from a non-UTF-8 file name, a character outside a legacy locale's charset.
    Such a character is written as a backslash escape rather than ending the run with an error."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")
