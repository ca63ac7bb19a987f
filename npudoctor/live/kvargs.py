"""``kv_args`` as sglang's ``_init_kv_manager`` fills them from a PD role's KV pools.

The live probes that run sglang's PD start-up and transfer code (NPD003's ``send_kvcache``,
NPD006's transfer tables) need the container the KV manager is built with. sglang fills it in
``_init_kv_manager`` (``disaggregation/prefill.py`` and ``decode.py``), whose modules pull in the
transfer backends, so the fields are filled here as it fills them, from the pools' own
``get_contiguous_buf_infos`` (the draft pool's appended), and the release's
``setup_state_kv_args`` (0.5.12+) completes them where the caller asks for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from npudoctor.deployment.facts import ModelFacts, RoleFacts

UTILS_MODULE = "sglang.srt.disaggregation.utils"


def state_producer() -> Callable | None:
    """The installed ``setup_state_kv_args`` (0.5.12+): it fills the state tables, and sets
    ``kv_buf_groups`` and the layer counts the Ascend transfer reads; None before."""
    return getattr(sys.modules.get(UTILS_MODULE), "setup_state_kv_args", None)


def initial_kv_args(
    args_class: type, pool: Any, draft_pool: Any, model: ModelFacts, role: RoleFacts, stage: int = 0
) -> Any:
    """``kv_args`` of a role's PP ``stage`` with the KV tables filled, before the state tables
    (``state_producer``, or the pool's ``get_state_buf_infos`` before 0.5.12) complete them."""
    kv_args = args_class()
    kv_args.engine_rank = 0
    kv_args.pp_rank = stage
    kv_args.system_dp_rank = 0
    if role.disaggregation_mode == "prefill":
        kv_args.prefill_pp_size = role.pp_size
        kv_args.prefill_start_layer = pool.start_layer
        kv_args.prefill_end_layer = getattr(pool, "end_layer", None)
        kv_args.mla_compression_ratios = None
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    draft_entries = 0
    if draft_pool is not None:
        draft_ptrs, draft_lens, draft_items = draft_pool.get_contiguous_buf_infos()
        ptrs, lens, items = ptrs + draft_ptrs, lens + draft_lens, items + draft_items
        draft_entries = len(draft_ptrs)
    kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = ptrs, lens, items
    kv_args.num_draft_entries = draft_entries
    kv_args.kv_layer_ids = _layer_ids(pool, draft_pool, draft_entries, model)
    if not model.attention.is_mla:
        kv_args.kv_head_num = pool.head_num
        kv_args.total_kv_head_num = model.num_kv_heads
    kv_args.page_size = pool.page_size
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = [], [], []
    kv_args.state_data_ptrs, kv_args.state_data_lens, kv_args.state_item_lens = [], [], []
    kv_args.ib_device = None
    kv_args.gpu_id = 0
    return kv_args


def _layer_ids(pool: Any, draft_pool: Any, draft_entries: int, model: ModelFacts) -> list[int]:
    build = getattr(sys.modules.get(UTILS_MODULE), "build_kv_layer_ids", None)  # 0.5.2x
    if build is None:
        return []
    return build(
        token_to_kv_pool=pool,
        draft_token_to_kv_pool=draft_pool,
        num_draft_entries=draft_entries,
        num_hidden_layers=model.num_layers,
    )
