"""Where live sglang code lives: ``file:line`` of functions and of the frame that raised.

Live probes call the target's real functions; their evidence names the installed source
the same way the static depth does (paths relative to the directory holding ``sglang/``).
"""

from __future__ import annotations

import traceback
from typing import Any

from npudoctor.results import Evidence, Location

_PACKAGE = "/sglang/"
# The exceptions ``exception_evidence`` made evidence of during the probe running now: the live
# child judges whether this host, not sglang, raised them (``npudoctor.live.sealing.judged``).
evidenced: list[BaseException] = []


def relative(filename: str) -> str | None:
    """``.../site-packages/sglang/srt/x.py`` -> ``sglang/srt/x.py``; None outside sglang."""
    if _PACKAGE not in filename:
        return None
    return filename[filename.rindex(_PACKAGE) + 1 :]


def code_location(owner: Any, name: str | None = None) -> Location | None:
    """The definition of ``owner.name`` (or of ``owner`` itself, a function) in the sglang source."""
    function = getattr(owner, name, None) if name else owner
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    path = relative(code.co_filename) if code is not None else None
    if path is None:
        return None
    return Location(path, code.co_firstlineno, function.__qualname__)


def raising_location(error: BaseException) -> Location | None:
    """The innermost frame of ``error``'s traceback that is sglang code."""
    frames = [(f, relative(f.filename)) for f in traceback.extract_tb(error.__traceback__)]
    inside = [(f, path) for f, path in frames if path is not None]
    if not inside:
        return None
    frame, path = inside[-1]
    return Location(path, frame.lineno or 0, frame.name)


def exception_evidence(expected: str, error: BaseException) -> Evidence:
    """An exception sglang raised on the probed path, as evidence (the live child sees it: one the
    host caused makes no ``fail``)."""
    evidenced.append(error)
    return Evidence(
        expected=expected,
        observed=f"{type(error).__name__}: {error} (live, CPU)",
        location=raising_location(error),
    )
