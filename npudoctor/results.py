"""The objects every check returns and every formatter renders.

All of them are frozen dataclasses: a check builds its result once, the runner may
derive a new one (``dataclasses.replace``) when an ignore entry applies, and the
formatters only read. ``to_dict`` gives the JSON shape (schema version
``SCHEMA_VERSION``), which the JSON, SARIF, JUnit, GitHub and Markdown outputs all
derive from.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

SCHEMA_VERSION = "1"


class Status(str, enum.Enum):
    """Outcome of one check. Ordered by severity for ``--fail-on``."""

    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}


class Impact(str, enum.Enum):
    """What a defect does to a deployment it bites: every check and catalog record names one (its
    worst consequence). The gate's severity: a finding of an impact in ``DEFAULT_FAILING`` is a
    ``fail``; a leak or a performance loss is a ``warn`` unless ``--fail-on`` names its impact
    (``Gate``), so a gate blocks a release that crashes or corrupts, not one that wastes memory."""

    STARTUP_CRASH = "startup-crash"
    RUNTIME_CRASH = "runtime-crash"
    SILENT_WRONG_OUTPUT = "silent-wrong-output"
    LEAK = "leak"
    PERFORMANCE = "performance"

    @property
    def meaning(self) -> str:
        return _MEANING[self]


_MEANING = {
    Impact.STARTUP_CRASH: "the server does not start",
    Impact.RUNTIME_CRASH: "a crash or hang at run time",
    Impact.SILENT_WRONG_OUTPUT: "silent wrong output or corrupted state, no error",
    Impact.LEAK: "a resource leak",
    Impact.PERFORMANCE: "a feature silently off or slow",
}
DEFAULT_FAILING = frozenset({Impact.STARTUP_CRASH, Impact.RUNTIME_CRASH, Impact.SILENT_WRONG_OUTPUT})


class Depth(str, enum.Enum):
    """How the evidence was obtained: by reading the source, or by running it."""

    STATIC = "static"
    LIVE = "live"


@dataclass(frozen=True)
class Location:
    """A place in the target's sglang source, relative to the directory holding ``sglang/``."""

    path: str
    line: int
    symbol: str = ""

    def __str__(self) -> str:
        suffix = f" ({self.symbol})" if self.symbol else ""
        return f"{self.path}:{self.line}{suffix}"


@dataclass(frozen=True)
class Evidence:
    """One observation: what the property requires, what the code does, and where."""

    expected: str
    observed: str
    location: Location | None = None


@dataclass(frozen=True)
class Remediation:
    fix_id: str | None = None
    fixed_in: str | None = None  # the first later release where the property holds (npudoctor.target.history)
    advice: str = ""
    unfixed_as_of: str | None = None  # the newest release checked, when it still has the defect
    # the one upgrade recommended: the first release from which every check of the deployment holds
    # (``Check.remediation``), so that the report can say which release fixes all its findings
    upgrade_to: str | None = None
    # a catalog record's workaround, in the deployment's own form where one is known
    # (``npudoctor.deployment.workarounds.with_workaround``): the compact report's one line of it
    workaround: str = ""

    @property
    def upstream(self) -> str | None:
        """Where upstream stands, as every format says it: the release that fixes it, or the newest
        release checked that still has it (None: neither is known)."""
        if self.fixed_in:
            return f"fixed upstream in sglang {self.fixed_in}"
        if self.unfixed_as_of:
            return f"not fixed upstream as of sglang {self.unfixed_as_of}"
        return None


@dataclass(frozen=True)
class Result:
    id: str
    title: str
    status: Status
    depth: Depth
    summary: str
    evidence: tuple[Evidence, ...] = ()
    remediation: Remediation | None = None
    assumptions: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    ignored: str | None = None  # reason, when an ignore entry downgraded this result
    error: str | None = None  # the exception text, for status ERROR
    impact: str | None = None  # the check's ``Impact`` (None: not a defect, e.g. an expired ignore entry)

    @property
    def live_unavailable(self) -> bool:
        """An ``error`` at the live depth: the check was asked at ``--depth live`` and the live depth
        could not run it (``engine.check.verdict``), so nothing was judged. A probe that raised is an
        ``error`` of the static depth with ``error`` set."""
        return self.status is Status.ERROR and self.depth is Depth.LIVE and self.error is None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["depth"] = self.depth.value
        return data


@dataclass(frozen=True)
class Gate:
    """What counts against a deployment (``--fail-on``, or the deployment YAML's ``fail_on``): the
    lowest status that is a finding (``fail`` or ``warn``), and the impacts whose findings are a
    ``fail`` (the others a ``warn``). Its words, comma-separated: ``fail`` (the default) or ``warn``,
    and any impact to fail on as well (``--fail-on leak``, ``--fail-on leak,performance``)."""

    threshold: Status = Status.FAIL
    failing: frozenset[Impact] = DEFAULT_FAILING

    WORDS: ClassVar[tuple[str, ...]] = ("fail", "warn", *(i.value for i in Impact))

    @classmethod
    def parse(cls, text: str | None, where: str = "--fail-on") -> Gate:
        """The gate of ``text`` (None: the default); ``ValueError`` names the word it does not know."""
        words = [w.strip() for w in (text or "fail").split(",") if w.strip()]
        unknown = [w for w in words if w not in cls.WORDS]
        if unknown or not words:
            raise ValueError(
                f"{where}: {unknown[0] if unknown else repr(text)} is not one of {', '.join(cls.WORDS)}"
            )
        threshold = Status.WARN if "warn" in words else Status.FAIL
        return cls(threshold, DEFAULT_FAILING | {Impact(w) for w in words if w not in ("fail", "warn")})

    def grade(self, result: Result) -> Result:
        """A defect's finding as this gate sees it: a ``fail`` whose impact does not fail is a
        ``warn``, saying which ``--fail-on`` makes it fail."""
        if result.status is not Status.FAIL or result.impact is None or Impact(result.impact) in self.failing:
            return result
        note = f"impact {result.impact} ({Impact(result.impact).meaning}): a warn; --fail-on {result.impact} makes it fail"
        return replace(result, status=Status.WARN, assumptions=(*result.assumptions, note))


@dataclass(frozen=True)
class TargetInfo:
    version: str | None
    path: str
    source: str  # "installed" or "path"
    # the tree's .py files npudoctor did not read ("path: why": a FIFO, a dangling link, too large)
    unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    target: TargetInfo
    deployment: dict[str, Any]
    results: tuple[Result, ...]
    fail_on: Status = Status.FAIL
    failing_impacts: tuple[str, ...] = tuple(i.value for i in Impact if i in DEFAULT_FAILING)  # Gate.failing
    tool_version: str = ""
    live: dict[str, Any] | None = None  # what the live child cost, or why it could not run
    depth: str = "auto"  # the depth asked for (static, live or auto)
    # the fixes `fix --apply` recorded beside the target, as the verdicts took them (None: none recorded)
    recorded_fixes: dict[str, Any] | None = None

    def findings(self) -> list[Result]:
        """Results at or above ``fail_on`` that no ignore entry covers."""
        return [r for r in self.results if r.ignored is None and r.status.severity >= self.fail_on.severity]

    def unchecked(self) -> list[Result]:
        """The findings that are checks the live depth could not run (``Result.live_unavailable``).
        When every finding is one, ``check`` exits 5, not 1: a missing install is not a defect; a
        defect found beside them still exits 1, so a gate never passes one for an install problem."""
        return [r for r in self.findings() if r.live_unavailable]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "npudoctor", "version": self.tool_version},
            "target": asdict(self.target),
            "deployment": self.deployment,
            "fail_on": self.fail_on.value,
            "failing_impacts": list(self.failing_impacts),
            "depth": self.depth,
            "live": self.live,
            "recorded_fixes": self.recorded_fixes,
            "results": [r.to_dict() for r in self.results],
            "summary": self.counts(),
        }

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for r in self.results:
            counts[r.status.value] += 1
        counts["findings"] = len(self.findings())
        return counts
