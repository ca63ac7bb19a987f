"""What both NPD006 probes share: the pool kinds a deployment builds, the table builders PD
start-up calls, and the verdict each depth gives from the pools it judged."""

from __future__ import annotations

from dataclasses import dataclass

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Status

# What ``_init_kv_manager`` (disaggregation/prefill.py, decode.py) asks every KV pool for: the KV
# data tables always, the state-buffer tables where the release calls them (0.5.4+ behind
# ``hasattr``; ``setup_state_kv_args`` in disaggregation/utils.py since 0.5.12).
TABLES = ("get_contiguous_buf_infos", "get_state_buf_infos")


@dataclass(frozen=True)
class Kind:
    """One KV pool kind the deployment builds: its family (``mla``/``mha``) and the model's facts."""

    label: str
    family: str
    model: ModelFacts


def verdict(
    roles: list[RoleFacts],
    evidence: list[Evidence],
    assumptions: tuple[str, ...],
    failing: list[str],
    unknown: list[str],
    depth: str,
) -> Probe:
    names = tuple(r.name for r in roles)
    if failing:
        return Probe(
            Status.FAIL,
            f"{', '.join(dict.fromkeys(failing))}: building the KV manager's transfer tables fails or "
            f"misdescribes the pool's buffers; the PD server dies at start-up or registers wrong memory ({depth})",
            tuple(evidence),
            assumptions,
            names,
        )
    if unknown:
        return Probe(
            Status.WARN,
            "cannot tell: " + "; ".join(dict.fromkeys(unknown)),
            tuple(evidence),
            assumptions,
            names,
        )
    return Probe(
        Status.PASS,
        f"every PD role's start-up transfer tables build and describe the registered buffers ({depth})",
        tuple(evidence),
        assumptions,
        names,
    )
