"""Exceptions that map to the documented exit codes.

The CLI catches these and prints one line; anything else escaping a command is an
internal error (exit 3).
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """Exit codes of ``npudoctor``; documented in ``--help`` and the README, never renumbered."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    INTERNAL = 3
    NOTHING_TO_CHECK = 4


class NpudoctorError(Exception):
    exit_code = ExitCode.INTERNAL


class InputError(NpudoctorError):
    """Bad user input: a file, field or flag. The message names which."""

    exit_code = ExitCode.USAGE


class NoTargetError(NpudoctorError):
    """No sglang to check."""

    exit_code = ExitCode.NOTHING_TO_CHECK


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to one short line, for error messages that echo the user's input
    (a huge integer has no repr in Python 3.11+, a deeply nested list may not either)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
