"""NPD006 fix: the NPU MLA pool's state tables are empty without the NSA indexer.

Port of https://github.com/sgl-project/sglang/pull/25383 (in sglang 0.5.13). sglang 0.5.12
gave ``NPUMLATokenToKVPool`` a ``get_state_buf_infos`` (hardware_backend/npu/memory_pool_npu.py:298)
that describes the indexer's K buffer (``index_k_buffer``) layer by layer. The pool's ``__init__``
only builds that buffer when the model has the NSA indexer (``index_head_dim`` set, DeepSeek-V3.2);
for every other MLA model (DeepSeek-V3/R1, Kimi, GLM) it is ``None``, and PD start-up
(``_init_kv_manager`` -> ``setup_state_kv_args``, disaggregation/utils.py:575, which calls it on
every pool that has it) raised ``TypeError: 'NoneType' object is not subscriptable``: neither a
prefill nor a decode server started. The pull request (0.5.13, memory_pool_npu.py:356) returns
empty tables when ``index_head_dim is None`` and the same tables as before otherwise; that is the
replacement, written for 0.5.12's shape only (0.5.11 has no such method, 0.5.13 the fixed one).

Safety: ``safe``. With the indexer it returns what 0.5.12 returns; without it, the method could
not return at all before, and 0.5.12's ``setup_state_kv_args`` does not register the NPU MLA
pool's state tables anyway (it sets ``kv_buf_groups`` and ``total_kv_layers`` from the KV tables
only), so empty tables change nothing that is transferred. Prefill and decode both need it.
"""

from __future__ import annotations

from typing import Any

from npudoctor.patching.fixbase import Fix, Safety

POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"
UTILS = "sglang.srt.disaggregation.utils"


def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
    """Pointers, byte lengths and item lengths of the indexer K buffer per layer; none without it."""
    if self.index_head_dim is None:  # no NSA indexer: __init__ left index_k_buffer None
        return [], [], []
    layers = range(self.layer_num)
    return (
        [self.index_k_buffer[i].data_ptr() for i in layers],
        [self.index_k_buffer[i].nbytes for i in layers],
        [self.index_k_buffer[i][0].nbytes for i in layers],
    )


class StartupTablesOverride(Fix):
    id = "NPD006"
    title = "NPU MLA pool reports no state buffers without the NSA indexer (PD start-up)"
    upstream = "https://github.com/sgl-project/sglang/pull/25383"
    safety = Safety.SAFE
    replaces = (f"{POOLS}:NPUMLATokenToKVPool.get_state_buf_infos",)
    # index_k_buffer exists iff index_head_dim is not None (the constructor), and what the start-up
    # does with the tables (setup_state_kv_args keeps none of the NPU MLA pool's state tables).
    anchors = (
        f"{POOLS}:NPUMLATokenToKVPool.__init__",
        f"{UTILS}:setup_state_kv_args",
    )
    # scripts/fix_shapes.py NPD006 0.5.12 (0.5.13 ships the fixed method; 0.5.11 has none)
    written_for = {
        "0.5.12": {
            f"{POOLS}:NPUMLATokenToKVPool.get_state_buf_infos": "88d29f06f83661c5",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "0705f82021cf02d5",
            f"{UTILS}:setup_state_kv_args": "79e269eae7ddead7",
        }
    }

    def implementations(self) -> dict[str, Any]:
        return {self.replaces[0]: get_state_buf_infos}


FIX = StartupTablesOverride()
