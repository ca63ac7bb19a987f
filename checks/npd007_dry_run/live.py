"""NPD007 live probe: one dry run per role, each in an interpreter of its own, judged here."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from npudoctor import interpreters
from npudoctor.deployment.facts import Facts, ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import processstate
from npudoctor.results import Evidence, Status
from npudoctor.target.discovery import Target

from .outcome import DryRunOutcome
from .smallmodel import describe, small_model

# A role's run: an import of sglang and its start-up, a few seconds of serving. Beyond this it hangs.
ROLE_TIMEOUT = 900.0
_ANSWER_LIMIT = 16 << 20  # what a dry run's answer may weigh (a pickled outcome is a few KB)


def model_config(model: ModelFacts) -> dict[str, Any]:
    """The deployment's config.json as written (its file), else what the facts know of it."""
    try:
        loaded = json.loads(Path(model.source).read_bytes())
        if isinstance(loaded, dict):
            return loaded
    except (OSError, ValueError):
        pass
    return processstate.hf_config(model)


def roles_of(facts: Facts) -> list[RoleFacts]:
    return list(facts.roles) or [RoleFacts(name="server", disaggregation_mode="null")]


def run_role(
    target: Target, role: RoleFacts, config: dict[str, Any], description: list[str]
) -> DryRunOutcome:
    """One role's dry run in a fresh isolated interpreter (this one's, on this one's import path),
    its scratch folder removed afterwards; it dies with this process."""
    scratch = tempfile.mkdtemp(prefix="npudoctor-dryrun-")
    request = {
        "role": role.name,
        "server_args": {**role.server_args, "disaggregation_mode": role.disaggregation_mode},
        "model_config": config,
        "model_description": description,
        "parent": os.getpid(),
    }
    paths = [str(target.root), *(p for p in sys.path if os.path.isabs(p))]
    command = interpreters.npudoctor_command("npudoctor.checks.npd007_dry_run.serve", paths, scratch)
    environment = {**os.environ, **role.env, "TMPDIR": scratch}
    try:
        done = subprocess.run(
            command,
            input=pickle.dumps(request),
            capture_output=True,
            env=environment,
            timeout=ROLE_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return DryRunOutcome(role=role.name, error=f"the dry run did not end within {ROLE_TIMEOUT:.0f} s")
    finally:
        _remove(scratch)
    if not done.stdout or len(done.stdout) > _ANSWER_LIMIT:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return DryRunOutcome(
            role=role.name, error=f"the dry run's interpreter ended (exit {done.returncode}): {tail[0]}"
        )
    return pickle.loads(done.stdout)  # our own child's answer, written by serve.main


def _remove(folder: str) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def live_probe(target: Target, facts: Facts) -> Probe:
    assert facts.model is not None  # out_of_scope skips a deployment without a model
    small = small_model(model_config(facts.model))
    description = describe(small)
    outcomes = [run_role(target, role, small.config, description) for role in roles_of(facts)]
    return judged_outcomes(outcomes, description)


def judged_outcomes(outcomes: list[DryRunOutcome], description: list[str]) -> Probe:
    """The dry runs of every role -> one probe: a ``fail`` where sglang raised on a role's path, a
    ``warn`` where npudoctor could not tell past a step (a gap of the simulation, a module this host
    lacks, a run that did not end), ``error`` where npudoctor's own dry run broke, else ``pass``."""
    from npudoctor.live.ascendsim import leaked

    evidence: list[Evidence] = []
    notes: list[str] = list(description)
    failing, unknown, broken = [], [], []
    for outcome in outcomes:
        ran = [s.name for s in outcome.steps if s.ran]
        not_run = [f"{s.name} ({s.detail})" for s in outcome.steps if not s.ran]
        notes.append(f"{outcome.role}: steps run: {', '.join(ran) or 'none'}")
        notes += [f"{outcome.role}: not run: {item}" for item in outcome.not_simulated]
        notes += [f"{outcome.role}: set for the dry run: {item}" for item in outcome.adjusted]
        if outcome.ops:
            called = ", ".join(f"{name} x{count}" for name, count in sorted(outcome.ops.items()))
            notes.append(f"{outcome.role}: simulated NPU calls: {called}")
        failure = outcome.failure
        if outcome.served_by:
            notes.append(f"{outcome.role}: the model was served by {outcome.served_by}")
        imported = outcome.model_import_failure
        if imported is not None and imported.in_sglang_code and not leaked(imported):
            failing.append(outcome.role)
            evidence.append(
                Evidence(
                    expected=f"role {outcome.role} serves the model with sglang's own implementation of its architecture",
                    observed=(
                        f"{imported.kind}: {imported.message} (dry run, start-up: sglang's model registry skipped "
                        f"the module and served the model by {outcome.served_by}){imported.through}"
                    ),
                    location=imported.location,
                )
            )
        if outcome.error is not None:
            broken.append(f"{outcome.role}: {outcome.error}")
        elif failure is not None and failure.in_sglang_code and not leaked(failure):
            failing.append(outcome.role)
            evidence.append(
                Evidence(
                    expected=f"role {outcome.role} runs its {outcome.failed_step} step",
                    observed=f"{failure.kind}: {failure.message} (dry run, {outcome.failed_step}){failure.through}",
                    location=failure.location,
                )
            )
        elif failure is not None:
            unknown.append(
                f"{outcome.role}: at {outcome.failed_step}: {failure} (raised in npudoctor's simulation)"
            )
        elif outcome.gap is not None:
            unknown.append(f"{outcome.role}: not run past {outcome.gap_step}: {outcome.gap}")
        if not_run and outcome.error is None and failure is None and outcome.gap is None:
            unknown.append(f"{outcome.role}: steps not reached: {'; '.join(not_run)}")
    roles = tuple(o.role for o in outcomes)
    if failing:
        first = evidence[0]
        return Probe(
            Status.FAIL,
            f"sglang raised on the dry run of {', '.join(failing)}: {first.observed.split(' (dry run')[0]}",
            tuple(evidence),
            tuple(notes + unknown),
            roles,
        )
    if broken:
        return Probe(Status.ERROR, "npudoctor's dry run broke: " + "; ".join(broken), (), tuple(notes), roles)
    if unknown:
        return Probe(
            Status.WARN, "the dry run could not tell: " + "; ".join(unknown), (), tuple(notes), roles
        )
    return Probe(
        Status.PASS,
        f"every step of the dry run ran for {', '.join(roles)}",
        (),
        tuple(notes),
        roles,
    )
