"""NPD002: PD transfer item lengths equal the bytes of one page of the NPU buffer layout.

PD disaggregation moves KV page by page: the transfer engine copies ``item_len`` bytes
per page index, with ``item_len`` taken from the pool's ``get_contiguous_buf_infos``.
With ``ASCEND_USE_FIA=1`` the NPU MHA pool exposes each layer as a token-major view
``(pages * page_size, 1, heads, dim)``, so ``buffer[0]`` is one *token*; sglang 0.5.9
still reported ``buffer[0].nbytes`` and every transfer moved 1/page_size of each page,
leaving decode with garbage KV. The fix multiplies by ``page_size`` under FIA
(https://github.com/sgl-project/sglang/pull/15852).

Static probe (the property, not the diff): run the deployment's NPU pool construction
and its ``get_contiguous_buf_infos`` on symbols (``npudoctor.static.shapes``) with the role's
environment, and require every item length to equal the layer buffer's bytes divided by
its page count, i.e. exactly one page, whatever the layout.

Live probe: build each NPU pool of the deployment's family for every PD role, in the
role's environment (``ASCEND_USE_FIA`` decides the layout at construction), with the
role's real dimensions and a few pages, call the real ``get_contiguous_buf_infos`` and
require every item length to be the registered buffer's bytes divided by the pool's
page count (``size / page_size`` pages plus the padded page 0, the count every sglang
pool allocates).
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.static.poolclasses import pool_family
from npudoctor.target.discovery import Target

from .verdict import FIA_ENV


class TransferItemLengths(Check):
    id = "NPD002"
    kind = CheckKind.DEEP
    title = "PD transfer item lengths match the NPU KV buffer layout"
    upstream = ("https://github.com/sgl-project/sglang/pull/15852",)
    impact = Impact.SILENT_WRONG_OUTPUT
    why = (
        "With ASCEND_USE_FIA=1 the NPU MHA buffer is token-major; if get_contiguous_buf_infos "
        "reports one token per transfer item instead of one page, PD transfer copies a fraction "
        "of each page and decode silently reads garbage KV."
    )
    bites_when = "PD disaggregation with an MHA/GQA model (Qwen3, Qwen3-MoE) and ASCEND_USE_FIA=1."
    how_to_fix = (
        "apply the npudoctor runtime override for NPD002 (item length = one page under FIA; "
        "unsafe): npudoctor fix --apply --unsafe --select NPD002"
    )

    def live_imports(self) -> None:
        from npudoctor.live import livepools  # live only: never loaded at static depth

        livepools.import_pool_modules()

    def out_of_scope(self, facts: Facts) -> Probe | None:
        roles, _, _ = _scope(facts)
        return (
            None
            if roles
            else Probe(Status.SKIP, "not a PD disaggregated deployment: no KV cache is transferred")
        )

    def live(self, target: Target, facts: Facts) -> Probe:
        from .live import live_probe  # live only: never loaded at static depth

        return live_probe(facts, *_scope(facts))

    def static(self, target: Target, facts: Facts) -> Probe:
        from .static import static_probe  # not loaded when the answer is cached

        return static_probe(target.tree, facts, *_scope(facts))


def _scope(facts: Facts) -> tuple[list[RoleFacts], list[str], tuple[str, ...]]:
    if not facts.described:
        worst = RoleFacts(
            name="prefill/decode (assumed)", disaggregation_mode="decode", use_fia=True, env={FIA_ENV: "1"}
        )
        return (
            [worst],
            ["mha", "mla"],
            (f"no deployment given: assumed PD disaggregation with {FIA_ENV}=1, MHA and MLA models",),
        )
    roles = [r for r in facts.roles if r.disaggregation_mode in ("prefill", "decode")]
    if facts.model is None:
        return roles, ["mha", "mla"], ("no model config given: checked both MHA and MLA pools",)
    return roles, [pool_family(facts.model.attention)], ()


CHECK = TransferItemLengths()
