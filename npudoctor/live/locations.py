"""Where live sglang code lives: ``file:line`` of functions, of a running frame, of the frame that raised.

Live probes call the target's real functions; their evidence names the installed source
the same way the static depth does (paths relative to the directory holding ``sglang/``).
An exception on a live path is described once (``Raised``): the sglang line that raised it, the
sglang calls that led there, and whether sglang's own code or npudoctor's simulation raised it.
"""

from __future__ import annotations

import linecache
import traceback
from dataclasses import dataclass
from typing import Any, TypeVar

from npudoctor.results import Evidence, Location

_PACKAGE = "/sglang/"
# Folders of the code a live path runs that is sglang's or npudoctor's own (a stand-in, a CPU
# reference kernel, the simulated process group, a runtime fix), not a library they call.
_OWN_CODE = (_PACKAGE, "/npudoctor/", "/checks/", "/fixes/")
R = TypeVar("R", bound="Raised")
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


def frame_location(frame: Any) -> Location | None:
    """The line a running frame is at, in the sglang source (None outside sglang)."""
    code = frame.f_code
    path = relative(code.co_filename)
    if path is None:
        return None
    return Location(path, frame.f_lineno, getattr(code, "co_qualname", code.co_name))


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


@dataclass(frozen=True)
class Raised:
    """An exception on a live path: type, message, the innermost sglang frame it passed through and
    the sglang frames that led there, and whose code raised it."""

    kind: str
    message: str
    location: Location | None
    # the sglang frames it passed through, outermost first (the last is ``location``)
    frames: tuple[Location, ...] = ()
    # the exception comes from a ``raise`` statement of sglang's own code (its innermost frame is
    # sglang's, at a raise), not from a CPU reference kernel or the simulated process group sglang
    # called, nor from an operation that failed in sglang's code
    raised_by_sglang: bool = False
    # the innermost frame of sglang or npudoctor code the exception passed is sglang's (it failed in
    # sglang's own code, or in a library sglang called there), not npudoctor's (a CPU reference
    # kernel, the simulated process group, a stand-in)
    in_sglang_code: bool = False
    # an AttributeError on None: sglang's code used a value sglang's code returned as None (e.g. 0.5.23
    # InterleaveCPStrategy.run_attention returns None and do_cp_attn_fia calls .view on it), not an
    # attribute one of npudoctor's stand-ins lacks
    on_none: bool = False

    @classmethod
    def of(cls: type[R], error: BaseException, **more: Any) -> R:
        """``error`` described; ``more`` fills the fields a subclass adds."""
        every = list(traceback.walk_tb(error.__traceback__))
        frames = tuple(
            Location(path, line or 0, getattr(frame.f_code, "co_qualname", frame.f_code.co_name))
            for frame, line in every
            if (path := relative(frame.f_code.co_filename)) is not None
        )
        innermost = every[-1] if every else None
        own = [
            f.f_code.co_filename for f, _ in every if any(part in f.f_code.co_filename for part in _OWN_CODE)
        ]
        raised_by_sglang = (
            innermost is not None
            and _PACKAGE in innermost[0].f_code.co_filename
            and linecache.getline(innermost[0].f_code.co_filename, innermost[1] or 0)
            .strip()
            .startswith("raise")
        )
        return cls(
            kind=type(error).__name__,
            message=str(error),
            location=frames[-1] if frames else None,
            frames=frames,
            raised_by_sglang=raised_by_sglang,
            in_sglang_code=bool(own) and _PACKAGE in own[-1],
            on_none=isinstance(error, AttributeError) and "'NoneType' object" in str(error),
            **more,
        )

    def __str__(self) -> str:
        where = f" at {self.location.path}:{self.location.line}" if self.location else ""
        return f"{self.kind}: {self.message}{where}"

    @property
    def through(self) -> str:
        """``; reached through a.py:1 (f) -> b.py:2 (g)``: the sglang calls that led to the raise."""
        outer = self.frames[:-1]
        if not outer:
            return ""
        return "; reached through " + " -> ".join(f"{f.path}:{f.line} ({f.symbol})" for f in outer)
