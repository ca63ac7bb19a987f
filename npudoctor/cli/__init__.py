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
from npudoctor.errors import ExitCode, NpudoctorError, close_matches, did_you_mean, short_repr
from npudoctor.terminal import TerminalConsole


class Interrupted(BaseException):
    """A signal that stops a command while it works: Ctrl-C (SIGINT), SIGTERM (a supervisor, a CI
    runner's cancel), SIGHUP (the terminal closed). Raised in the main thread, so every ``finally``
    on the way runs: the live child is killed and reaped, ``advise``'s workers ended, temporary
    folders removed; the default action of SIGTERM and SIGHUP would end the process without any of it.
    Not ``KeyboardInterrupt``, which typer turns into a silent exit 130 on its own; a
    ``BaseException``, so no ``except Exception`` on the way (a check that broke becomes an
    ``error`` result) takes it for a failure."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum


# The signals that stop a command through ``Interrupted``, and the line each says. SIGQUIT keeps its
# default action (a core dump to debug with); the live child and advise's workers die with this process
# whatever ends it (``npudoctor.interpreters.die_with_parent``).
STOPPING_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hangup"}


def main(argv: list[str] | None = None) -> int:
    """Entry point: map errors to the documented exit codes, one line each, never a traceback;
    Ctrl-C is one line and 130 (128 + SIGINT), SIGTERM 143 and SIGHUP 129, as a shell reports a
    command such a signal stopped."""
    output.tolerant_streams()
    with _stopped_by_signals():
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
        except (Interrupted, KeyboardInterrupt) as stop:
            return _interrupted(stop)


def _main(argv: list[str] | None) -> int:
    try:
        code = app(args=argv, prog_name="npudoctor", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except NpudoctorError as error:
        output.say(f"error: {error}")
        return int(error.exit_code)
    except (Interrupted, KeyboardInterrupt) as stop:
        return _interrupted(stop)
    except (output.ReaderGone, BrokenPipeError):
        return output.stdout_gone()
    except Exception as error:
        if _is_usage_error(error):
            output.say(f"error: {_usage_line(error)}")
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


def _usage_line(error: Exception) -> str:
    """A usage error as one line of npudoctor's own. typer checks option values with pydantic,
    whose words leak into click's ("Invalid value for '--format' / '-f': Value error, 'sarf' is not
    one of 'text', ..."): a value that is none of an option's choices reads ``--format: 'sarf' is
    not one of text, json, ...; did you mean sarif?``, any other keeps click's line without
    pydantic's "Value error, "."""
    param = getattr(error, "param", None)
    choices = _choices(param)
    cause = error.__cause__
    given = None
    with contextlib.suppress(AttributeError, IndexError, KeyError, TypeError):
        given = cause.errors()[0]["input"]  # type: ignore[union-attr]
    if choices and isinstance(given, str) and given not in choices:
        close = close_matches(given.lower(), choices)
        return f"{param.opts[0]}: {short_repr(given)} is not one of {', '.join(choices)}{did_you_mean(close)}"
    return error.format_message().replace("Value error, ", "")  # type: ignore[attr-defined]


def _choices(param) -> list[str]:
    """The values an option accepts when they are a fixed few (an Enum annotation), else []."""
    import enum

    try:
        annotation = param.get_runtime_param().annotation
    except Exception:  # typer's runtime parameter is private: without it, no choices, click's line
        return []
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    return []


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While a command runs, each of ``STOPPING_SIGNALS`` raises ``Interrupted`` (once: a second one
    ends the process at once, 128 + N). Worker processes a command starts are spared Ctrl-C
    (``service.advise``): the command stops them. A signal the caller has this process ignore (a
    background job's SIGINT, ``nohup``'s SIGHUP) stays ignored."""
    global _said_interrupted
    _said_interrupted = False
    previous = {}
    try:
        for signum in STOPPING_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _first_stop)
    except ValueError:  # not the main thread (an embedder's): no handler of ours
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_said_interrupted = False


def _first_stop(signum, _frame) -> None:
    for caught in STOPPING_SIGNALS:  # the way out stays clean of another signal
        if signal.getsignal(caught) is _first_stop:
            signal.signal(caught, _second_stop)
    raise Interrupted(signum)


def _second_stop(signum, _frame) -> None:
    if not _said_interrupted:
        with contextlib.suppress(OSError):
            output.say(STOPPING_SIGNALS[signal.Signals(signum)])
    os._exit(128 + signum)


def _interrupted(stop: BaseException) -> int:
    """What a stopping signal ends a command with: its line, and 128 + N."""
    global _said_interrupted
    signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
    if not _said_interrupted:
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            output.say(STOPPING_SIGNALS[signal.Signals(signum)])
        _said_interrupted = True
    return 128 + int(signum)
