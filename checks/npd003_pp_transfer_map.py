"""NPD003: with PP, every prefill layer's K/V (and indexer) buffer goes to the same layer and kind on decode.

The Ascend ``send_kvcache`` must slice the decode pointer list per buffer group with the
prefill stage's start layer (https://github.com/sgl-project/sglang/pull/23893).

The static probe arrives with the static-depth issue; until then the check is registered
with its metadata and reports ``skip``.
"""

from __future__ import annotations

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts
from npudoctor.results import Status
from npudoctor.target import Target


class PipelineTransferMap(Check):
    id = "NPD003"
    title = "PD KV transfer with pipeline parallelism maps every layer to the same layer and kind"
    upstream = ("https://github.com/sgl-project/sglang/pull/23893",)
    fixed_in = "0.5.12"
    why = "With PP on the prefill side, the Ascend transfer must slice the decode pointer list per buffer group; otherwise prefill stage layers land in the wrong layer or in the V buffer instead of K, and the model silently produces garbage."
    bites_when = "PD disaggregation on Ascend with pp_size > 1 on the prefill (or decode) role; MLA models in the known releases; decode with extra draft layers."
    how_to_fix = (
        "Upgrade sglang, or apply the npudoctor runtime override for NPD003 (group-aware PP pointer slicing)."
    )

    def static(self, target: Target, facts: Facts) -> Probe:
        return Probe(Status.SKIP, "not implemented yet: the static probe of NPD003 is still to come")


CHECK = PipelineTransferMap()
