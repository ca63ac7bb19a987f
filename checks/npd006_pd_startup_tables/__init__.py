"""NPD006: PD start-up builds the KV manager's transfer tables, and they describe the registered buffers.

When a PD prefill or decode server starts, ``_init_kv_manager`` (disaggregation/prefill.py,
decode.py) asks its KV pool, and the draft model's pool with MTP/EAGLE, for the tables the
transfer engine registers: ``get_contiguous_buf_infos`` (KV data pointers, byte lengths, item
lengths), then the state-buffer tables (``get_state_buf_infos``, through ``setup_state_kv_args``
in disaggregation/utils.py since 0.5.12; behind ``hasattr`` in ``_init_kv_manager`` in 0.5.4-0.5.11).
This runs for every transfer backend (the tables are the pool's), before any request.

Witness (https://github.com/sgl-project/sglang/pull/25383, in 0.5.13): sglang 0.5.12 gave
``NPUMLATokenToKVPool`` (hardware_backend/npu/memory_pool_npu.py:298) a ``get_state_buf_infos``
that indexes ``self.index_k_buffer``, which its ``__init__`` sets to ``None`` unless the model has
the NSA indexer. A DeepSeek-V3 (MLA without indexer) PD server therefore dies at start-up with
``TypeError: 'NoneType' object is not subscriptable``. 0.5.13 returns empty tables when
``index_head_dim is None`` (memory_pool_npu.py:356). The pull request names the cause: the
refactor of hybrid state transfer (commit d7f4761a, ``setup_state_kv_args``) made the start-up
call ``get_state_buf_infos`` on the NPU MLA pool, a path no MLA model without indexer had taken.

Property: for each PD role and every pool the role builds (the target model's and the draft
model's), the table builders return, without raising, equal-length lists in which each pointer is
the ``data_ptr`` of a real buffer of the pool, each length is that buffer's ``nbytes`` and each item
length divides it; every KV buffer of the pool is registered. Whether one item is one *page* of
the layout is NPD002's property, not repeated here.

Static probe: for each NPU pool class of the deployment's family, run its construction and the
builders the release's start-up calls on symbols, with the deployment's parameters, and require
that none reads a buffer attribute construction left ``None``. Live probe: build the real pools
on CPU for each role (draft pool included), assemble ``kv_args`` as ``_init_kv_manager`` does with
the release's own ``setup_state_kv_args`` where it has one, and check the tables against the
buffers; an exception in sglang's code is ``fail`` at the raising frame.
"""

from __future__ import annotations

from npudoctor.deployment.facts import (
    ASSUMED_GQA,
    ASSUMED_MLA,
    ASSUMED_MLA_INDEXER,
    AttentionKind,
    Facts,
    RoleFacts,
)
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.static.poolclasses import pool_family
from npudoctor.target.discovery import Target

from .verdict import Kind

# With no model given: the kinds under which the tables differ (MLA without the NSA indexer is the
# one the witness bites; with the indexer; GQA), at the real models' dimensions.
_ASSUMED = (
    Kind(
        "MLA without indexer (assumed, DeepSeek-V3 dimensions)",
        "mla",
        ASSUMED_MLA,
    ),
    Kind(
        "MLA with the NSA indexer (assumed, DeepSeek-V3.2 dimensions)",
        "mla",
        ASSUMED_MLA_INDEXER,
    ),
    Kind(
        "GQA (assumed, 48 layers, 4 KV heads)",
        "mha",
        ASSUMED_GQA,
    ),
)


class StartupTransferTables(Check):
    id = "NPD006"
    kind = CheckKind.DEEP
    title = "PD start-up transfer tables build and describe the KV pool's buffers"
    upstream = ("https://github.com/sgl-project/sglang/pull/25383",)
    impact = Impact.STARTUP_CRASH
    why = (
        "At PD start-up each server builds the tables its KV manager registers with the transfer "
        "engine from its KV pools (and the draft model's). If a table builder reads a buffer the "
        "pool does not build for this model, the prefill or decode server dies before serving; if "
        "the tables misdescribe the buffers, the transfer engine registers the wrong memory."
    )
    bites_when = (
        "PD disaggregation (prefill or decode role), any transfer backend; known witness: sglang "
        "0.5.12 with an MLA model without the NSA indexer (DeepSeek-V3/R1, Kimi, GLM) on Ascend."
    )
    how_to_fix = (
        "apply the npudoctor runtime override for NPD006 (port of #25383: no state tables without "
        "the indexer): npudoctor fix --apply --select NPD006"
    )

    def live_imports(self) -> None:
        from npudoctor.live import livepools  # live only: never loaded at static depth

        from . import live as live_module

        livepools.import_pool_modules()
        live_module.import_table_modules()

    def out_of_scope(self, facts: Facts) -> Probe | None:
        scope = _scope(facts)
        return Probe(Status.SKIP, scope) if isinstance(scope, str) else None

    def live(self, target: Target, facts: Facts) -> Probe:
        from . import live as live_module  # live only: never loaded at static depth

        roles, kinds, assumptions = _scope(facts)
        return live_module.live_probe(roles, kinds, assumptions)

    def static(self, target: Target, facts: Facts) -> Probe:
        from .static import static_probe  # not loaded when the answer is cached

        roles, kinds, assumptions = _scope(facts)
        return static_probe(target.tree, roles, kinds, assumptions)


def _scope(facts: Facts) -> tuple[list[RoleFacts], list[Kind], tuple[str, ...]] | str:
    """(PD roles, pool kinds, assumptions), or why the check does not apply."""
    assumptions: list[str] = []
    if not facts.described:
        roles = _assumed_roles()
        return (
            roles,
            list(_ASSUMED),
            (
                "no deployment given: assumed PD prefill and decode (decode with one MTP draft layer), "
                "MLA models with and without the NSA indexer, and a GQA model",
            ),
        )
    if facts.roles:
        roles = [r for r in facts.roles if r.disaggregation_mode in ("prefill", "decode")]
        if not roles:
            return "not a PD disaggregated deployment: no KV manager registers transfer tables"
    else:
        roles = _assumed_roles()
        assumptions.append(
            "no server args given: assumed PD prefill and decode (decode with one MTP draft layer)"
        )
    if facts.model is None:
        assumptions.append("no model config given: checked MLA with and without the NSA indexer, and GQA")
        return roles, list(_ASSUMED), tuple(assumptions)
    model = facts.model
    label = {
        AttentionKind.MLA: "MLA without indexer",
        AttentionKind.MLA_INDEXER: "MLA with the NSA indexer",
    }.get(model.attention, model.attention.value.upper())
    return roles, [Kind(label, pool_family(model.attention), model)], tuple(assumptions)


def _assumed_roles() -> list[RoleFacts]:
    return [
        RoleFacts(name="prefill (assumed)", disaggregation_mode="prefill"),
        RoleFacts(name="decode (assumed)", disaggregation_mode="decode", draft_layers=1),
    ]


CHECK = StartupTransferTables()
