"""Exceptions that map to the documented exit codes.

The CLI catches these and prints one line; anything else escaping a command is an
internal error (exit 3).
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from typing import Any


class ExitCode(enum.IntEnum):
    """Exit codes of ``npudoctor``; documented in ``--help`` and the README, never renumbered."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    INTERNAL = 3
    NOTHING_TO_CHECK = 4
    # could not check as asked: --depth live, and the live depth could not run (torch missing, the
    # live run crashed or timed out, sglang does not import): not a defect, and not a pass
    LIVE_UNAVAILABLE = 5


class NpudoctorError(Exception):
    exit_code = ExitCode.INTERNAL


class InputError(NpudoctorError):
    """Bad user input: a file, field or flag. The message names which."""

    exit_code = ExitCode.USAGE


class UnknownLaunchFlag(InputError):
    """A flag of a launch command that sglang does not take, as written (``flag``): the command line
    tells by it an npudoctor option written after ``--``, where sglang's nearest flag would mislead."""

    def __init__(self, message: str, flag: str):
        super().__init__(message)
        self.flag = flag


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


def close_matches(given: str, choices: list[str]) -> list[str]:
    """The choices closest to a value that is none of them (``difflib``), best first, at most three."""
    import difflib

    return difflib.get_close_matches(given, choices, n=3, cutoff=0.6)


def did_you_mean(close: list[str], quote: bool = False) -> str:
    """``"; did you mean A, B?"`` (the user reads the likely choice first), or "" for no match."""
    return f"; did you mean {', '.join(repr(c) if quote else c for c in close)}?" if close else ""


def unknown_ids(where: str, noun: str, unknown: list[str], known: list[str]) -> InputError:
    """The one error for ids no registry has (``explain``, ``--select``, ``--ignore``, a config's
    ignore list): the close matches first, then every known id when they are few, else the
    command that lists them all (not a paragraph of 66 ids)."""
    close = list(dict.fromkeys(match for token in unknown for match in close_matches(token, known)))
    shown = ", ".join(t if t.isprintable() and t else short_repr(t) for t in unknown)
    every = f"known: {', '.join(known)}" if len(known) <= 12 else "every id: npudoctor list"
    prefix = f"{where}: " if where else ""
    many = "s" if len(unknown) > 1 else ""
    return InputError(f"{prefix}unknown {noun} id{many} {shown}{did_you_mean(close)} ({every})")


# The words for an OSError's errno where the system's own (``strerror``) would mislead: ENOTDIR on
# ``a/b/c`` means a folder on the way is a file, not that ``c`` should have been a directory.
_REASONS = {
    errno.ENOTDIR: "a component of the path is not a directory",
}


def path_error(shown: str, error: OSError | ValueError) -> InputError:
    """One line (exit 2) for a path the user gave that the system refused: ``shown`` (the option
    and the path as given) and why: a folder on the way the user cannot enter (EACCES), a name
    longer than the file system takes (ENAMETOOLONG), a link loop (ELOOP), a NUL in the path
    (``ValueError``). These are the user's to fix, not npudoctor's bugs (exit 3)."""
    if isinstance(error, ValueError):
        return InputError(f"{shown}: a path cannot hold a NUL character")
    reason = _REASONS.get(error.errno) or (error.strerror or type(error).__name__).lower()
    where = os.fsdecode(error.filename) if isinstance(error.filename, (str, bytes, os.PathLike)) else None
    if where is not None and not shown.endswith(where):  # a folder inside it, a file it names
        return InputError(f"{shown}: {where}: {reason}")
    return InputError(f"{shown}: {reason}")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, as a message names it ("a FIFO (named pipe)")."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"
