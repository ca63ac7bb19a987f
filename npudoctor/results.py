"""The objects every check returns and every formatter renders.

All of them are frozen dataclasses: a check builds its result once, the runner may
derive a new one (``dataclasses.replace``) when an ignore entry applies, and the
formatters only read. ``to_dict`` gives the JSON shape (schema version
``SCHEMA_VERSION``), which the JSON, SARIF, JUnit, GitHub and Markdown outputs all
derive from.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

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
    # (``npudoctor.service.workarounds.with_workaround``): the compact report's one line of it
    workaround: str = ""


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["depth"] = self.depth.value
        return data


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
    tool_version: str = ""
    live: dict[str, Any] | None = None  # what the live child cost, or why it could not run
    depth: str = "auto"  # the depth asked for (static, live or auto)
    # the fixes `fix --apply` recorded beside the target, as the verdicts took them (None: none recorded)
    recorded_fixes: dict[str, Any] | None = None

    def findings(self) -> list[Result]:
        """Results at or above ``fail_on`` that no ignore entry covers."""
        return [r for r in self.results if r.ignored is None and r.status.severity >= self.fail_on.severity]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "npudoctor", "version": self.tool_version},
            "target": asdict(self.target),
            "deployment": self.deployment,
            "fail_on": self.fail_on.value,
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
