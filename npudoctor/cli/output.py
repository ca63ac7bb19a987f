"""Where the command line writes, and what it does when it cannot.

Reports go to stdout (or ``--output``); logs, progress and error lines go to stderr, so
``npudoctor check --format json | jq`` always sees clean JSON. A reader that goes away
(``npudoctor explain NPD001 | head -1``) ends the command as SIGPIPE ends ``cat``: quietly, 141.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from npudoctor.deployment.redact import redact_value
from npudoctor.errors import InputError, file_kind, path_error
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
    destination = _prepared.pop(str(output), None) or _destination(output, "--output", probe=False)
    try:
        destination.write(text)
    except OSError as error:
        raise InputError(f"--output {output}: cannot write ({error.strerror})") from None


def say(message: str) -> None:
    """One unwrapped line on stderr: what a CI log or a grep needs. Every error and progress line
    goes through here, and many quote what the user gave (a path, a flag's value): a URL's password
    and a well-known token format are redacted (``redact_value``) and control characters escaped
    (``printable``), whatever message a command built."""
    sys.stderr.write(f"npudoctor: {printable(redact_value(' '.join(message.split())))}\n")


def require_destination(
    output: Path | None, step_summary: bool = False, inputs: Iterable[tuple[Path, str]] = ()
) -> None:
    """Before any work: the report (and, for a format that writes one, a GitHub step summary) can
    be written where it goes, so a bad ``-o`` is said at once, not after a live run whose results
    it would lose. ``inputs`` are
    what the command reads (the ``--config`` file, the checked sglang tree), each with the words
    that name it: a report is never written over one of them or into one."""
    if output is None:
        require_stdout()
    else:
        _refuse_inputs(output, inputs)
        while _prepared:  # an earlier command's in this process (a test's), never written
            _prepared.popitem()[1].close()
        _prepared[str(output)] = _destination(output, "--output", probe=True)
    summary = os.environ.get("GITHUB_STEP_SUMMARY") if step_summary else None
    if summary:
        _require_summary(Path(summary))


def require_stdout() -> None:
    try:
        usable = (
            sys.stdout is not None and not sys.stdout.closed and os.fstat(sys.stdout.fileno()) is not None
        )
    except (OSError, ValueError, io.UnsupportedOperation):
        usable = sys.stdout is not None and not sys.stdout.closed  # a stream without a descriptor (tests)
    if not usable:
        raise InputError("standard output is closed: write the report with --output FILE")


# The destinations ``require_destination`` prepared, by path, for ``write`` to use: a FIFO or a
# device stays open from the check to the write (closing it would end the reader's input).
_prepared: dict[str, _Destination] = {}


@dataclass
class _Destination:
    """Where a report goes: a regular file (or none yet) is written as a new file beside it and
    renamed over it (``replace``, given ``mode``); a FIFO that has a reader or a character device
    (/dev/null, a terminal) is written as a stream (``stream``, held open from the check)."""

    replace: Path | None = None
    stream: int | None = None
    mode: int | None = None

    def close(self) -> None:
        if self.stream is not None:
            with contextlib.suppress(OSError):
                os.close(self.stream)

    def write(self, text: str) -> None:
        if self.stream is not None:
            with open(self.stream, "w", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(text)
            return
        assert self.replace is not None
        _replace(self.replace, text, self.mode)


def _destination(path: Path, option: str, probe: bool) -> _Destination:
    """How to write ``path`` (``probe``: and that it can be, by making and removing a file beside
    it), or ``InputError``, one line naming it and why.

    A planted link cannot redirect the report: a symbolic link is followed only when it belongs to
    root or to this user (as the kernel's ``protected_symlinks`` rule has it for a shared /tmp:
    /dev/stdout is root's), and a regular file is replaced by rename, never written in place, so a
    hard link someone made to their victim's file loses the name, not the victim its content. A
    FIFO is opened without waiting for a reader: one nobody reads is refused, not waited on for
    ever. A block device, a socket, a directory are refused."""
    shown = f"{option} {path}"
    target, status, followed = _looked_up(path, shown)
    if status is None or stat.S_ISREG(status.st_mode):
        if probe:
            _probe_directory(target.parent, shown)
        # one's own file keeps its mode; another user's (a file planted to be written) is not copied
        own = status is not None and status.st_uid == os.geteuid()
        return _Destination(replace=target, mode=stat.S_IMODE(status.st_mode) if own else None)
    mode = status.st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return _Destination(stream=_open_stream(path, shown, followed))
    raise InputError(
        f"{shown}: is {file_kind(mode)}: refused (a report goes to a regular file, a FIFO or a character device)"
    )


def _looked_up(path: Path, shown: str) -> tuple[Path, os.stat_result | None, bool]:
    """(the path to write, its status or None when there is no file yet, whether a link was
    followed), once its folder is known to be one."""
    try:
        parent_mode = os.stat(path.parent).st_mode
    except FileNotFoundError:
        raise InputError(f"{shown}: no such directory: {path.parent}") from None
    except NotADirectoryError:
        raise InputError(f"{shown}: not a directory: {path.parent}") from None
    except (OSError, ValueError) as error:  # a folder the user cannot enter, a name too long
        raise path_error(shown, error) from None
    if not stat.S_ISDIR(parent_mode):
        raise InputError(f"{shown}: not a directory: {path.parent}")
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return path, None, False
    except (OSError, ValueError) as error:
        raise path_error(shown, error) from None
    if not stat.S_ISLNK(status.st_mode):
        return path, status, False
    if status.st_uid not in (0, os.geteuid()):
        raise InputError(
            f"{shown}: a symbolic link owned by another user (uid {status.st_uid}): refused, "
            "npudoctor does not write where someone else's link points"
        )
    target = Path(os.path.realpath(path))
    try:
        return target, os.stat(path), True
    except FileNotFoundError:  # one's own link to a file not made yet: the file is made there
        return target, None, True
    except (OSError, ValueError) as error:
        raise path_error(shown, error) from None


def _probe_directory(directory: Path, shown: str) -> None:
    """A new file can be made in ``directory`` (where the report is renamed in): made and removed,
    as the real write would meet a read-only file system or a denied directory."""
    try:
        handle, probe = tempfile.mkstemp(dir=directory, prefix=".npudoctor-", suffix=".partial")
    except OSError as error:
        raise InputError(f"{shown}: cannot write ({error.strerror})") from None
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _open_stream(path: Path, shown: str, followed: bool) -> int:
    """``path`` (a FIFO or a character device) opened for writing without waiting: a FIFO nobody
    reads is ENXIO at once. Not through a link unless ``followed`` (one ``_looked_up`` trusts)."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if followed else os.O_NOFOLLOW)
    try:
        stream = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise InputError(
                f"{shown}: is a FIFO (named pipe) nobody reads: refused (npudoctor would wait for a reader)"
            ) from None
        raise path_error(shown, error) from None
    mode = os.fstat(stream).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):  # replaced since it was looked at
        os.close(stream)
        raise InputError(f"{shown}: changed while npudoctor looked at it: refused")
    os.set_blocking(stream, True)  # a reader slower than the report is waited for, as by any writer
    return stream


def _replace(path: Path, text: str, mode: int | None) -> None:
    """``path`` holds ``text``: written to a new file in the same directory, then renamed over it,
    so a reader never sees half a report. The file keeps the mode it had (a new one gets what the
    umask leaves of 0666, as the shell's ``>`` gives)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".npudoctor-", suffix=".partial")
    try:
        with open(handle, "w", encoding="utf-8", errors="backslashreplace") as stream:
            stream.write(text)
            os.fchmod(stream.fileno(), mode if mode is not None else 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def _refuse_inputs(output: Path, inputs: Iterable[tuple[Path, str]]) -> None:
    """``--output`` is not one of the command's inputs (the same file, under any name: a hard link
    too) and not inside one (the checked sglang tree)."""
    try:
        resolved = output.resolve()
    except (OSError, RuntimeError, ValueError):
        return  # said by ``_destination`` next, in its words
    for path, named in inputs:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            if path.is_dir() and resolved.is_relative_to(path.resolve()):
                raise InputError(
                    f"--output {output}: inside {named}: refused (it would change what was checked)"
                )
            if resolved == path.resolve() or (output.exists() and os.path.samefile(output, path)):
                raise InputError(f"--output {output}: is {named}: refused (the report would overwrite it)")


def _require_summary(path: Path) -> None:
    """``$GITHUB_STEP_SUMMARY`` can be appended to (opened to append changes no byte of it; one
    made for the test is removed again). A step summary is a file GitHub reads after the step: a
    regular file, or a character device (/dev/null) to discard it; a FIFO is refused (opening it
    would wait for a reader, or end the input of one that reads)."""
    shown = f"GITHUB_STEP_SUMMARY={path}"
    target, status, followed = _looked_up(path, shown)
    if status is not None and not (stat.S_ISREG(status.st_mode) or stat.S_ISCHR(status.st_mode)):
        raise InputError(
            f"{shown}: is {file_kind(status.st_mode)}: refused (a step summary is appended to a regular file)"
        )
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        os.close(os.open(target, flags | (0 if followed else os.O_NOFOLLOW), 0o666))
    except OSError as error:
        raise InputError(f"{shown}: cannot write ({error.strerror})") from None
    if status is None:
        with contextlib.suppress(OSError):
            target.unlink()


def step_summary(write_to: Callable[[str], None]) -> None:
    """``write_to($GITHUB_STEP_SUMMARY)`` when the variable is set (a GitHub Actions step)."""
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return
    _require_summary(Path(summary_path))  # as it is now: it may have changed during the run
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
