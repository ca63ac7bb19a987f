"""The ``npudoctor`` command line: ``main`` maps every outcome to a documented exit code.

One module per command (``check_command``, ``advise_command``, ``fix_command``, ``run_command``,
``info_commands`` for list/explain/env), registered on the typer app in ``app``; ``output`` is where
they write. A command module imports what its work needs inside the command, so ``--help``,
``list`` and ``explain`` start without the engine's runner or any probe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

import typer

from npudoctor.cli import output
from npudoctor.cli.app import app
from npudoctor.errors import ExitCode, NpudoctorError
from npudoctor.terminal import TerminalConsole


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) while a command works. Not ``KeyboardInterrupt``, which typer turns into a
    silent exit 130 on its own; a ``BaseException``, so no ``except Exception`` on the way (a check
    that broke becomes an ``error`` result) takes it for a failure."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: map errors to the documented exit codes, one line each, never a traceback;
    Ctrl-C is one line and 130 (128 + SIGINT), as a shell reports a command SIGINT stopped."""
    output.tolerant_streams()
    with _ctrl_c():
        try:
            code = _main(argv)
            try:  # a reader gone while the last lines sat in the buffer: 141 here too
                if sys.stdout is not None and not sys.stdout.closed:
                    sys.stdout.flush()
            except BrokenPipeError:
                return output.stdout_gone()
            except (OSError, ValueError):
                pass
            return code
        except (Interrupted, KeyboardInterrupt):
            return _interrupted()


def _main(argv: list[str] | None) -> int:
    try:
        code = app(args=argv, prog_name="npudoctor", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except NpudoctorError as error:
        output.say(f"error: {error}")
        return int(error.exit_code)
    except (Interrupted, KeyboardInterrupt):
        return _interrupted()
    except (output.ReaderGone, BrokenPipeError):
        return output.stdout_gone()
    except Exception as error:
        if _is_usage_error(error):
            output.say(f"error: {error.format_message()}")
            return int(ExitCode.USAGE)
        # anything else is our bug: say so, with a way to see it
        if os.environ.get("NPUDOCTOR_DEBUG"):
            TerminalConsole(stderr=True, highlight=False).print_exception()
        output.say(f"internal error: {type(error).__name__}: {error} (NPUDOCTOR_DEBUG=1 shows the traceback)")
        return int(ExitCode.INTERNAL)
    return int(code) if isinstance(code, int) else int(ExitCode.OK)


def _is_usage_error(error: Exception) -> bool:
    """click's UsageError family (bad flag, bad value), whether typer uses click or its vendored copy."""
    return (
        callable(getattr(error, "format_message", None))
        and getattr(error, "exit_code", None) == ExitCode.USAGE
    )


@contextlib.contextmanager
def _ctrl_c() -> Iterator[None]:
    """While a command runs, Ctrl-C raises ``Interrupted`` (once: a second one ends the process at
    once, 130). Worker processes a command starts are spared it (``service.advise``): the command
    stops them. A SIGINT the shell has this process ignore (a background job) stays ignored."""
    global _said_interrupted
    _said_interrupted = False
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:
            yield
            return
        signal.signal(signal.SIGINT, _first_ctrl_c)
    except ValueError:  # not the main thread (an embedder's): no handler of ours
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_said_interrupted = False


def _first_ctrl_c(_signum, _frame) -> None:
    signal.signal(signal.SIGINT, _second_ctrl_c)  # the way out stays clean of another Ctrl-C
    raise Interrupted


def _second_ctrl_c(_signum, _frame) -> None:
    if not _said_interrupted:
        output.say("interrupted")
    os._exit(130)


def _interrupted() -> int:
    global _said_interrupted
    if not _said_interrupted:
        output.say("interrupted")
        _said_interrupted = True
    return output.EXIT_INTERRUPTED
