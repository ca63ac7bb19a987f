"""The ``Check`` base class and the registry that finds every check module.

A check is one known defect family: a stable id, the upstream references, when it
matters, and probes that test the property the defect violates. Adding a check is
adding one module to ``npudoctor/checks/`` (the repo's ``checks/``) that defines
``CHECK = SomeCheck()``; nothing else needs editing.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import pkgutil
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from npudoctor.results import Depth, Evidence, Remediation, Result, Status

if TYPE_CHECKING:
    from npudoctor.facts import Facts
    from npudoctor.target import Target


@dataclass(frozen=True)
class Probe:
    """What a probe hands back before the check wraps it into a ``Result``."""

    status: Status
    summary: str
    evidence: tuple[Evidence, ...] = ()
    assumptions: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()


class Check:
    """Base of every check. Subclasses set the metadata and implement ``static``."""

    id: ClassVar[str]
    title: ClassVar[str]
    upstream: ClassVar[tuple[str, ...]] = ()  # pull-request URLs
    fixed_in: ClassVar[str | None] = None  # first release with the fixed shape, if known
    why: ClassVar[str] = ""  # why it matters to a deployment
    bites_when: ClassVar[str] = ""  # the conditions under which the defect shows
    how_to_fix: ClassVar[str] = ""

    def static(self, target: Target, facts: Facts) -> Probe:
        """Read the target's source (never import it) and test the property."""
        raise NotImplementedError

    def run(self, target: Target, facts: Facts, depth: str = "auto") -> Result:
        """Run the probe the depth asks for. The live depth arrives with the NPU simulation layer;
        until a check has one, every depth runs the static probe and says so."""
        probe = self.static(target, facts)
        assumptions = probe.assumptions
        if depth == "live":
            assumptions += ("live probe not available for this check yet: static evidence only",)
        return self.result(
            probe.status, Depth.STATIC, probe.summary, probe.evidence, assumptions, probe.roles
        )

    def result(
        self,
        status: Status,
        depth: Depth,
        summary: str,
        evidence: tuple[Evidence, ...] = (),
        assumptions: tuple[str, ...] = (),
        roles: tuple[str, ...] = (),
    ) -> Result:
        remediation = None
        if status in (Status.FAIL, Status.WARN):
            remediation = Remediation(fix_id=self.id, fixed_in=self.fixed_in, advice=self.how_to_fix)
        return Result(
            id=self.id,
            title=self.title,
            status=status,
            depth=depth,
            summary=summary,
            evidence=tuple(evidence),
            remediation=remediation,
            assumptions=tuple(assumptions),
            roles=tuple(roles),
        )

    def error_result(self, error: BaseException) -> Result:
        """The check itself broke: report it and let the run go on."""
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return Result(
            id=self.id,
            title=self.title,
            status=Status.ERROR,
            depth=Depth.STATIC,
            summary=f"the check could not run: {type(error).__name__}: {error}{where}",
            error=f"{type(error).__name__}: {error}",
        )


def all_checks() -> list[Check]:
    """Every check module in ``npudoctor.checks``, ordered by id."""
    from npudoctor import checks as package

    found: dict[str, Check] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        check = getattr(module, "CHECK", None)
        if isinstance(check, Check):
            if check.id in found:
                raise RuntimeError(f"duplicate check id {check.id} in {info.name}")
            found[check.id] = check
    return [found[key] for key in sorted(found)]


def run_checks(checks: list[Check], target: Target, facts: Facts, depth: str, on_done=None) -> list[Result]:
    """Run each check; one that raises becomes an ``error`` result and the others still run."""
    results = []
    with _collector_paused():
        for check in checks:
            try:
                result = check.run(target, facts, depth)
            except Exception as error:  # a broken check must not hide the others' findings
                result = check.error_result(error)
            results.append(result)
            if on_done is not None:
                on_done(check, result)
    return results


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing sglang's large modules keeps millions of AST nodes alive, and every full
    collection of the cyclic garbage collector re-traverses them all: measured, that made a
    static run several times slower. The checks make no garbage cycles worth collecting
    early, so the collector waits until they are done; its previous state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
