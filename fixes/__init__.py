"""Runtime overrides, one module per check id (same id as the check they fix).

For embedders that start sglang's engine in their own process::

    import npudoctor.fixes
    decisions = npudoctor.fixes.apply()            # or apply(["NPD001"], config="deploy.yaml")
    ...
    npudoctor.fixes.revert()                       # restores the exact original objects

``apply`` decides like ``npudoctor fix`` (the check must find the defect, the code must be
a shape the fix was written for) and arms the accepted fixes: they are installed now if
sglang's modules are already imported, else when they are. It never raises for a fix
that cannot apply; the returned decisions say why.
"""

from __future__ import annotations

from pathlib import Path


def apply(
    fix_ids: list[str] | None = None,
    *,
    config: str | Path | None = None,
    unsafe: bool = False,
    depth: str = "auto",
):
    """Apply the fixes the installed sglang needs; returns one ``npudoctor.service.planning.Decision`` per fix.

    ``depth`` is the depth the checks decide at, as in ``npudoctor check`` (``auto``: the live
    probes run in a child interpreter where sglang imports)."""
    from npudoctor.deployment.spec import DeploymentSpec
    from npudoctor.patching import activation
    from npudoctor.patching.planfile import plan_of
    from npudoctor.service import planning
    from npudoctor.service.subject import Need, resolve

    # a name no sglang knows: InputError, nothing applied; an sglang without the Ascend backend is
    # not refused here: the decisions say what applies
    deployment = DeploymentSpec(config=Path(config) if config is not None else None)
    subject = resolve(deployment, depth=depth, need=Need.ANY_SGLANG)
    target = subject.target
    planned = planning.plan(
        planning.select_fixes(list(fix_ids or [])),
        target,
        subject.facts,
        unsafe,
        depth,
    )
    activation.enable(plan_of(planning.record_document(planned, target)))
    return [p.decision for p in planned]


def revert(fix_ids: list[str] | None = None) -> list[str]:
    """Take out the fixes installed in this process (all by default); returns their ids."""
    from npudoctor.patching import activation

    return activation.revert(fix_ids)
