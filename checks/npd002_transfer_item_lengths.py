"""NPD002: PD transfer item lengths equal the bytes of one page of the NPU buffer layout.

With ``ASCEND_USE_FIA=1`` the NPU MHA pool views each layer as
``(pages * page_size, 1, heads, dim)``, so ``get_contiguous_buf_infos`` must multiply the
per-token item length by ``page_size`` (https://github.com/sgl-project/sglang/pull/15852).

The static probe arrives with the static-depth issue; until then the check is registered
with its metadata and reports ``skip``.
"""

from __future__ import annotations

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts
from npudoctor.results import Status
from npudoctor.target import Target


class TransferItemLengths(Check):
    id = "NPD002"
    title = "PD transfer item lengths match the NPU KV buffer layout"
    upstream = ("https://github.com/sgl-project/sglang/pull/15852",)
    fixed_in = "0.5.11"
    why = "With ASCEND_USE_FIA=1 the NPU MHA buffer is token-major, one page per transfer item; if get_contiguous_buf_infos reports one token per item, PD transfer copies a fraction of each page and decode reads garbage KV."
    bites_when = "PD disaggregation with an MHA/GQA model (Qwen3, Qwen3-MoE) and ASCEND_USE_FIA=1."
    how_to_fix = "Upgrade sglang, or apply the npudoctor runtime override for NPD002 (item length = one page under FIA)."

    def static(self, target: Target, facts: Facts) -> Probe:
        return Probe(Status.SKIP, "not implemented yet: the static probe of NPD002 is still to come")


CHECK = TransferItemLengths()
