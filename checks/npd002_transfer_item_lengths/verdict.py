"""What both NPD002 probes share: the environment variable that switches the NPU MHA pool to the
token-major layout, and the verdict each depth gives from the pools it judged.
"""

from __future__ import annotations

from npudoctor.deployment.facts import RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Status

FIA_ENV = "ASCEND_USE_FIA"


def verdict(
    roles: list[RoleFacts],
    evidence: list[Evidence],
    assumptions: tuple[str, ...],
    failing: list[str],
    unknown: list[str],
) -> Probe:
    """The verdict both depths give from the pools they judged (labels of failing and undecided ones)."""
    names = tuple(r.name for r in roles)
    if failing:
        return Probe(
            Status.FAIL,
            f"{', '.join(failing)}: PD transfer items are not one page; decode would receive partial pages",
            tuple(evidence),
            assumptions,
            names,
        )
    if unknown:
        return Probe(Status.WARN, "cannot tell: " + "; ".join(unknown), tuple(evidence), assumptions, names)
    if not any(r.use_fia for r in roles):
        return Probe(
            Status.SKIP,
            f"{FIA_ENV} is off for every PD role: the page-major layout is in use (its items are one page)",
            tuple(evidence),
            assumptions,
        )
    return Probe(
        Status.PASS,
        "every PD transfer item is one page of its layer buffer",
        tuple(evidence),
        assumptions,
        names,
    )
