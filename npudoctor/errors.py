"""Exceptions that map to the documented exit codes.

The CLI catches these and prints one line; anything else escaping a command is an
internal error (exit 3).
"""

from __future__ import annotations

import enum


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
