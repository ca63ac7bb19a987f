"""NPD004: the NPU FIA context-parallel path reads only fields ``ContextParallelMetadata`` defines.

``do_cp_attn_fia`` read removed scalar fields and split q with ``torch.chunk(q, 2)``; the fix
splits at ``total_q_prev_tokens`` and passes cumulative per-request lengths
(https://github.com/sgl-project/sglang/pull/26705).

The static probe arrives with the static-depth issue; until then the check is registered
with its metadata and reports ``skip``.
"""

from __future__ import annotations

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts
from npudoctor.results import Status
from npudoctor.target import Target


class ContextParallelMetadataFields(Check):
    id = "NPD004"
    title = "NPU FIA context-parallel attention reads only fields its metadata defines"
    upstream = ("https://github.com/sgl-project/sglang/pull/26705",)
    fixed_in = "0.5.13"
    why = "The FIA context-parallel prefill path read scalar fields removed from ContextParallelMetadata and split q with torch.chunk(q, 2): AttributeError, or wrong attention for a batch of more than one request."
    bites_when = "Prefill with context parallelism (attn_cp_size > 1 / prefill context parallel) on Ascend with FIA, batch size > 1."
    how_to_fix = "Use a release where do_cp_attn_fia matches its metadata, or apply the npudoctor runtime override for NPD004."

    def static(self, target: Target, facts: Facts) -> Probe:
        return Probe(Status.SKIP, "not implemented yet: the static probe of NPD004 is still to come")


CHECK = ContextParallelMetadataFields()
