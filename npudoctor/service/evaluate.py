"""Run checks at a depth and reach their verdicts: the one path every command takes.

``npudoctor check``, ``fix`` (plan, ``--apply``, ``--status``), ``run``, ``--with-fix`` and
the in-process API all call ``evaluate``, and every verdict comes from ``check.verdict``:
a deployment gets the same answer whichever command asks. At ``auto`` and ``live`` depth the
live probes run in one child (``npudoctor.live.child_process``), and only for the checks whose scope the
deployment is in: a deployment no check applies to starts no child at all. A live outcome is kept
in the result cache (``npudoctor.target.resultcache``) under the tree, the deployment, npudoctor's code
and the Python environment, and each run probes every check in the deployment's scope
(``live_checks``): the README's flow (``check``, ``fix``, ``fix --apply``, ``--status``, ``run``)
runs the live depth once per input (the installed code; the code with the recorded fixes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, LiveOutcome
from npudoctor.engine.registry import all_checks
from npudoctor.engine.running import collector_paused, run_checks, static_probes
from npudoctor.live import child_process, toolenv
from npudoctor.live.sealing import CAUSED_BY_HOST
from npudoctor.patching.records import DIST_INFO
from npudoctor.results import Result
from npudoctor.target import pythonenv, resultcache
from npudoctor.target.discovery import Target

NO_LIVE_PROBE_APPLIES = (
    "no live probe applies to this deployment (the checks run are out of its scope or have none)"
)


@dataclass(frozen=True)
class Evaluation:
    results: list[Result]
    live: LiveOutcome | None  # None: the live depth was not asked for


def live_checks(checks: list[Check], facts: Facts, depth: str) -> list[Check]:
    """The checks whose live probe a run at ``depth`` starts for this deployment: when any of
    ``checks`` has one, every registered check's in the deployment's scope, not only the selected
    ones'. One live run of a deployment then answers every command that asks about it (``check``,
    ``fix --select NPD001`` as ``check`` hints it, ``fix --status``, ``run``) from one cache entry,
    with the verdicts ``check`` gives; a probe costs well under a second beside the import of sglang.
    An opt-in check (the dry run, seconds per role) joins only when selected."""
    if depth == "static":
        return []
    selected = [c for c in checks if c.has_live and c.out_of_scope(facts) is None]
    if not selected:
        return []
    registered = [
        c for c in all_checks() if c.has_live and c.default_selected and c.out_of_scope(facts) is None
    ]
    return list({c.id: c for c in registered + selected}.values())


def evaluate(
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str = "auto",
    *,
    fixes: dict[str, dict[str, str]] | None = None,
    declined: dict[str, str] | None = None,
    on_step: Callable[[str], None] | None = None,
    on_done: Callable[[Check, Result], None] | None = None,
) -> Evaluation:
    """Each check's verdict at ``depth``. ``fixes`` (``{id: shape}``) are enabled in the live child;
    ``declined`` (``{id: why}``) names runtime fixes asked for but not applied, for the verdicts to say."""
    outcome = None
    statics = {}
    if depth != "static":
        probed = live_checks(checks, facts, depth)
        outcome = _kept_outcome(target, facts, probed, fixes)
        if outcome is not None:
            if on_step is not None:
                on_step("kept")
        elif probed:
            with child_process.start(target, facts, probed, on_step, fixes) as child:
                # the static probes run while the child imports sglang (seconds of a live run)
                statics = static_probes(checks, target, facts, depth)
                outcome = child.outcome()
            _keep_outcome(outcome, target, facts, probed, fixes)
        else:
            outcome = LiveOutcome(unavailable=NO_LIVE_PROBE_APPLIES)
        outcome = _for_checks(outcome, {c.id for c in checks})
        outcome.fixes.update(declined or {})
    with collector_paused():
        results = run_checks(checks, target, facts, depth, on_done, outcome, statics)
    return Evaluation(results, outcome)


def _for_checks(outcome: LiveOutcome, ids: set[str]) -> LiveOutcome:
    """The part of a live run's ``outcome`` about the checks ``ids`` (the run probed every check in
    the deployment's scope, ``live_checks``): the report of a selection names only what it selected."""
    return dataclasses.replace(
        outcome,
        probes={i: p for i, p in outcome.probes.items() if i in ids},
        errors={i: e for i, e in outcome.errors.items() if i in ids},
        not_run={i: why for i, why in outcome.not_run.items() if i in ids},
        probe_seconds={i: t for i, t in outcome.probe_seconds.items() if i in ids},
        fixes=dict(outcome.fixes),
    )


# The environment variables a live child inherits that can change what the probed code does (sglang's
# and torch's switches, the import path, the thread pools); the rest of the caller's environment
# (the terminal, the working directory) cannot, and must not make every shell a cache miss.
_LIVE_ENV_PREFIXES = (
    "ASCEND_",
    "SGLANG_",
    "HCCL_",
    "PYTORCH_",
    "TORCH_",
    "TASK_QUEUE_",
    "PYTHON",
    "LD_",
    "OMP_",
    "MKL_",
    "HF_",
    "TRANSFORMERS_",
    "NPUDOCTOR_",
)


def _live_key(facts: Facts, probed: list[Check], fixes: dict[str, dict[str, str]] | None) -> tuple[str, ...]:
    """What a live run's outcome is a function of, beside the tree and npudoctor's own code (both
    in the cache's key): the deployment, the probes run, the fixes enabled, the Python environment
    and the inherited variables that can change the probed code's behaviour."""
    env = sorted(
        (k, v)
        for k, v in os.environ.items()
        if k.startswith(_LIVE_ENV_PREFIXES) and k != "NPUDOCTOR_CACHE_DIR"
    )
    return (
        repr(facts),
        " ".join(sorted(c.id for c in probed)),
        repr(sorted((fixes or {}).items())),
        repr(env),
        environment_fingerprint(),
    )


def _kept_outcome(
    target: Target, facts: Facts, probed: list[Check], fixes: dict[str, dict[str, str]] | None
) -> LiveOutcome | None:
    if not probed:
        return None
    found = resultcache.lookup("live outcome", target.cache_key, *_live_key(facts, probed, fixes))
    if not isinstance(found, LiveOutcome):
        return None
    return dataclasses.replace(found, from_cache=True)


def _keep_outcome(
    outcome: LiveOutcome,
    target: Target,
    facts: Facts,
    probed: list[Check],
    fixes: dict[str, dict[str, str]] | None,
) -> None:
    """Keep an outcome every probe of which ran to its end: not one where the live depth was
    unavailable, a probe raised or did not run (a timeout, a crash) or could not tell because of
    this host (``live.sealing``), which the next command should try again."""
    if outcome.unavailable or outcome.errors or outcome.not_run:
        return
    if any(CAUSED_BY_HOST in probe.summary for probe in outcome.probes.values()):
        return  # the host's trouble (a file, a timeout) may be gone next time
    resultcache.keep(outcome, "live outcome", target.cache_key, *_live_key(facts, probed, fixes))


def reuse(
    earlier: Evaluation,
    checks: list[Check],
    target: Target,
    facts: Facts,
    depth: str,
    declined: dict[str, str] | None = None,
) -> Evaluation:
    """The verdicts of ``checks`` from an earlier evaluation's live outcome (no new child), with
    the runtime fixes that were asked for and ``declined`` named in them."""
    outcome = earlier.live
    if outcome is not None:
        outcome.fixes.update(declined or {})
    with collector_paused():
        return Evaluation(run_checks(checks, target, facts, depth, None, outcome), outcome)


def environment_fingerprint() -> str:
    """The Python environments the live child imports from: this process's (the interpreter,
    ``sys.path``), the live interpreter ``npudoctor.live.toolenv`` chose (``--python``'s or
    npudoctor's own live environment) with the folders it adds, and the distributions installed on
    each path (their ``*.dist-info`` names carry the versions). The live depth's answer depends on
    them (torch's version, which modules stand in), not only on the tree: an install or upgrade
    beside sglang is a new key. One directory listing per path entry.

    The record ``fix --apply`` writes beside sglang (``npudoctor.patching.records``) is left out:
    the live child loads no sglang plugin, so the record changes nothing it observes (the fixes it
    runs with are a key of their own), and ``fix --status`` and ``run`` right after ``--apply``
    reuse the run ``check`` and ``fix`` made."""

    chosen = toolenv.select()
    digest = hashlib.sha256(f"{sys.executable}\0{sys.version}".encode("utf-8", "surrogateescape"))
    if isinstance(chosen, toolenv.LiveInterpreter):
        digest.update(f"\0{chosen.key()}".encode())
    named = pythonenv.named()
    for entry in [*sys.path, *(named.path if named else ())]:
        digest.update(f"\0{entry}\n".encode("utf-8", "surrogateescape"))
        with contextlib.suppress(OSError), os.scandir(entry or ".") as entries:
            names = sorted(
                e.name
                for e in entries
                if e.name.endswith((".dist-info", ".egg-info", ".pth")) and e.name != DIST_INFO
            )
            digest.update("\n".join(names).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
