"""Running checks: each check's verdict with the release history, one broken check never hiding the others.

Above the registry (``npudoctor.engine.registry``): a finding's remediation recommends the one
release every check and record in the deployment's scope holds from, so it reads them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from npudoctor.engine.check import Check, LiveOutcome, Probe, cached_static
from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.results import Result
from npudoctor.target import history

if TYPE_CHECKING:
    from npudoctor.deployment.facts import Facts
    from npudoctor.target.discovery import Target


def run_checks(
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str,
    on_done=None,
    live: LiveOutcome | None = None,
    statics: dict[str, Probe] | None = None,
) -> list[Result]:
    """Run each check; one that raises becomes an ``error`` result and the others still run.

    ``live`` is the outcome of the live child (``npudoctor.live.child_process.run``) for these checks, if it ran;
    ``statics`` are static probes already run (``static_probes``), by check id.
    """
    results = []
    statics = statics or {}
    upgrade = functools.cache(lambda: _deployment_upgrade(target, facts))  # one answer per run, if asked
    with collector_paused():
        for check in checks:
            try:
                result = check.run(target, facts, depth, live, statics.get(check.id))
                result = _with_history(check, result, target, facts, upgrade)
            except Exception as error:  # a broken check must not hide the others' findings
                result = check.error_result(error)
            results.append(result)
            if on_done is not None:
                on_done(check, result)
    return results


def _with_history(
    check: Check, result: Result, target: Target, facts: Facts, upgrade: Callable[[], history.Upstream]
) -> Result:
    """A finding's remediation with the release history for this deployment: where the check's
    property holds (a catalog record: its ranges derived from the wheels), and (``upgrade``) the one
    release every check and record in the deployment's scope holds from."""
    if result.remediation is None:
        return result
    if check.kind is CheckKind.CATALOG:
        own = check.upstream_for(target.version)
    elif check.upstream_history:
        own = history.upstream(check.id, facts, target.version)
    else:
        return result
    return dataclasses.replace(result, remediation=check.remediation(own, upgrade()))


def _deployment_upgrade(target: Target, facts: Facts) -> history.Upstream:
    """The first release from which every check and catalog record in the deployment's scope
    holds: all of them, not only those run (``--select`` must not recommend a release another
    check fails or a record ships)."""
    scope = [c for c in all_checks() if c.out_of_scope(facts) is None]
    in_scope = [c.id for c in scope if c.upstream_history]
    records = [c.table() for c in scope if c.kind is CheckKind.CATALOG]
    return history.deployment_upgrade(in_scope, facts, target.version, extra_tables=records)


def static_probes(checks: list[Check], target: Target, facts: Facts, depth: str) -> dict[str, Probe]:
    """The static probe of each check that reads the source at ``depth``, by id. A probe that
    raises is left out: ``run_checks`` runs it again and reports the error in its place."""
    probes = {}
    with collector_paused():
        for check in checks:
            with contextlib.suppress(Exception):
                if check.reads_source(facts, depth):
                    probes[check.id] = cached_static(check, target, facts)
    return probes


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Parsing sglang's large modules keeps millions of AST nodes alive, and every full
    collection of the cyclic garbage collector re-traverses them all: measured, that made a
    static run several times slower. The checks make no garbage cycles worth collecting
    early, so the collector waits until they are done; its previous state is restored (nested,
    only the outermost pause resumes it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
