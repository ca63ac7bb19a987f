"""The ``npudoctor`` command line: ``main`` maps every outcome to a documented exit code.

One module per command (``check_command``, ``advise_command``, ``fix_command``, ``run_command``,
``info_commands`` for list/explain/env), registered on the typer app in ``app``; ``output`` is where
they write. A command module imports what its work needs inside the command, so ``--help``,
``list`` and ``explain`` start without the engine's runner or any probe.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from npudoctor.cli import output
from npudoctor.cli.app import app
from npudoctor.errors import ExitCode, NpudoctorError


def main(argv: list[str] | None = None) -> int:
    """Entry point: map errors to the documented exit codes, one line each, never a traceback."""
    output.tolerant_streams()
    code = _main(argv)
    try:  # a reader gone while the last lines sat in the buffer: 141 here too
        if sys.stdout is not None and not sys.stdout.closed:
            sys.stdout.flush()
    except BrokenPipeError:
        return output.stdout_gone()
    except (OSError, ValueError):
        pass
    return code


def _main(argv: list[str] | None) -> int:
    try:
        code = app(args=argv, prog_name="npudoctor", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except NpudoctorError as error:
        output.say(f"error: {error}")
        return int(error.exit_code)
    except KeyboardInterrupt:
        output.say("interrupted")
        return 130
    except (output.ReaderGone, BrokenPipeError):
        return output.stdout_gone()
    except Exception as error:
        if _is_usage_error(error):
            output.say(f"error: {error.format_message()}")
            return int(ExitCode.USAGE)
        # anything else is our bug: say so, with a way to see it
        if os.environ.get("NPUDOCTOR_DEBUG"):
            Console(stderr=True, highlight=False).print_exception()
        output.say(f"internal error: {type(error).__name__}: {error} (NPUDOCTOR_DEBUG=1 shows the traceback)")
        return int(ExitCode.INTERNAL)
    return int(code) if isinstance(code, int) else int(ExitCode.OK)


def _is_usage_error(error: Exception) -> bool:
    """click's UsageError family (bad flag, bad value), whether typer uses click or its vendored copy."""
    return (
        callable(getattr(error, "format_message", None))
        and getattr(error, "exit_code", None) == ExitCode.USAGE
    )
