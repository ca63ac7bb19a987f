"""NPD003 fix: with PP, the Ascend ``send_kvcache`` writes each stage buffer into the same layer
and kind on decode.

Port of https://github.com/sgl-project/sglang/pull/23893 (sglang 0.5.12) to the releases before
it. A PD prefill stage registers one pointer per layer and buffer kind, grouped by kind:
``[K_s..K_e-1, V_s..V_e-1(, IK_s..IK_e-1)]`` (the NPU MLA pool keeps the latent and rope parts,
and the NSA indexer K, in separate buffers; the NPU MHA pool K and V). A decode of PP 1 registers
the whole model the same way, ``[K_0..K_T-1, V_0..V_T-1(, IK..)]``, then its draft (MTP/EAGLE)
pool's groups. The stage's group ``g`` must land at decode's ``g * T + s``. Before the fix:

* 0.5.9: ``AscendKVManager.send_kvcache`` has no PP handling at all: stage pointer ``i`` goes to
  decode pointer ``i`` (V0 of stage 0 lands in K30 of DeepSeek-V3; stage 1's K30 in K0);
* 0.5.10, 0.5.11 (same ``ascend/conn.py``): every pool goes through the MHA splitter
  ``CommonKVManager.get_mha_kv_ptrs_with_pp``, which halves the list as ``[K, V]`` (wrong for MLA's
  ``[K, V, IK]``) and guesses decode's draft layers from ``dst_layers % stage_layers``: right
  only when the stage's layer count divides the model's (and decode has fewer draft layers than
  the stage has layers), wrong for 61 layers as 30 + 31 or ``SGLANG_PP_LAYER_PARTITION=20,28``,
  with or without a draft model on decode.

Upstream's fix slices the decode list per buffer group with ``prefill_start_layer``,
``kv_buf_groups`` and ``total_kv_layers``; sglang's producer sets the last two from 0.5.12 on
(``setup_state_kv_args``). On these releases nothing produces them, so the replacement derives
them from what the prefill stage process itself knows:

* ``T``, decode's main (target-model) layer count: the served model's ``num_hidden_layers``, from
  the process's model config as sglang itself serves it (``get_global_server_args()
  .get_model_config()``, the ``ModelConfig`` built from the server args the scheduler runs with,
  memoised on them; the decode instance serves the same model);
* the stage's layers ``[s, e)``: sglang's ``get_pp_indices(T, pp_rank, pp_size)``, the partition
  the model's ``make_layers`` used (it reads ``SGLANG_PP_LAYER_PARTITION``); ``s`` must equal
  ``kv_args.prefill_start_layer``, which ``_init_kv_manager`` took from the pool;
* the number of buffer groups ``G``: the stage's pointer count over its layer count (2 for MHA
  and MLA, 3 for MLA with the indexer);
* decode's draft layers: what is left of its list per group after ``T`` main layers.

``T`` cannot be inferred from pointer counts: for the first stage of a 61-layer model (30 layers)
a decode list of 62 per group is 61 layers + 1 draft layer or 60 + 2, both possible deployments;
a mapping from the counts alone is right for one and wrong for the other (the MHA splitter's
is). When a count does not fit (a pointer list that is not ``G`` whole groups of the stage's
layers, as a pool registering only some of its layers would give; a start layer the partition
does not give; a decode list too short for the stage) the replacement raises instead of
guessing: sglang then reports the transfer thread dead, which is better than KV silently
written into other layers.

A decode with the prefill's PP size registers only its stage's layers (plus the draft pool on its
last stage): a list as long as the stage's is sent pointer for pointer; a longer one that holds
fewer than ``T`` layers per group is read as that stage followed by draft layers.

Everything else is the release's own ``send_kvcache``, unchanged: the page blocks from
``group_concurrent_contiguous``, one ``_transfer_data`` batch (or one per layer on the executor
with the custom memory pool), and the status it returns. PP prefill has no draft pool on these
releases (``ServerArgs.check_server_args`` rejects PP with speculative decoding), so the stage's
list is its own layers only.

Not covered: ``send_kvcache_slice`` (prefill and decode with different attention TP sizes,
MHA), inherited from Mooncake, still uses the MHA splitter; and 0.5.12+, where upstream's group
slicing is in place for MLA and the MHA splitter's divisibility guess remains (an uneven MHA
split is wrong there too, but the static check cannot confirm it, so ``decide`` would never
plan a fix for it; see the tests).

Anchors: the transfer primitive and page grouping it keeps calling, the manager ``__init__``s that
set the attributes it reads, the NPU pools' ``get_contiguous_buf_infos`` (the per-kind grouping
of both roles' lists), ``get_pp_indices`` and the two server-args functions ``T`` comes from.
The ``_init_kv_manager`` of prefill and decode, which append the draft pool's list after the
main one, are not fingerprinted: their modules are not imported where the live probe runs (it
assembles ``kv_args`` as they do), and a fix waits for every anchored module to be imported.

Safety: ``unsafe``. The replacement changes where running code writes KV on every PP prefill
transfer. On 0.5.9 that code is wrong whenever PP > 1; on 0.5.10/0.5.11 it is wrong for MLA
with the indexer and for splits its guess misses, and right for the others, which the
replacement keeps right (even MHA splits, 60 + 2 MTP layers: see the tests). Its correctness
rests on the layouts and the partition named in ``anchors``, proven on CPU pools by NPD003's
live probe, not on an NPU: an operator opts in (``--unsafe``).
"""

from __future__ import annotations

import sys
from typing import Any

from npudoctor.fix import Fix, Safety

CONN = "sglang.srt.disaggregation.ascend.conn"
COMMON = "sglang.srt.disaggregation.common.conn"
POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"
PP_UTILS = "sglang.srt.distributed.utils"
SERVER_ARGS = "sglang.srt.server_args"


class TransferMapError(RuntimeError):
    """The stage's pointer lists cannot be mapped onto decode's without guessing."""


def send_kvcache(
    self,
    mooncake_session_id: str,
    prefill_kv_indices,
    dst_kv_ptrs: list[int],
    dst_kv_indices,
    executor,
):
    """Send the stage's KV pages: with PP, each buffer to the same global layer and kind on decode."""
    import concurrent.futures

    group_concurrent_contiguous = sys.modules[CONN].group_concurrent_contiguous
    prefill_kv_blocks, dst_kv_blocks = group_concurrent_contiguous(prefill_kv_indices, dst_kv_indices)

    src_kv_ptrs = self.kv_args.kv_data_ptrs
    if self.pp_size > 1:
        dst_kv_ptrs = stage_destinations(self, src_kv_ptrs, dst_kv_ptrs)
    layers_params = [
        (src_kv_ptrs[entry], dst_kv_ptrs[entry], self.kv_args.kv_item_lens[entry])
        for entry in range(len(src_kv_ptrs))
    ]

    def set_transfer_blocks(src_ptr: int, dst_ptr: int, item_len: int) -> list[tuple[int, int, int]]:
        transfer_blocks = []
        for prefill_index, decode_index in zip(prefill_kv_blocks, dst_kv_blocks):
            src_addr = src_ptr + int(prefill_index[0]) * item_len
            dst_addr = dst_ptr + int(decode_index[0]) * item_len
            length = item_len * len(prefill_index)
            transfer_blocks.append((src_addr, dst_addr, length))
        return transfer_blocks

    def process_layer(src_ptr: int, dst_ptr: int, item_len: int) -> int:
        return self._transfer_data(mooncake_session_id, set_transfer_blocks(src_ptr, dst_ptr, item_len))

    def process_layers(params: list[tuple[int, int, int]]) -> int:
        transfer_blocks = []
        for src_ptr, dst_ptr, item_len in params:
            transfer_blocks.extend(set_transfer_blocks(src_ptr, dst_ptr, item_len))
        return self._transfer_data(mooncake_session_id, transfer_blocks)

    if self.enable_custom_mem_pool:
        futures = [executor.submit(process_layer, *params) for params in layers_params]
        for future in concurrent.futures.as_completed(futures):
            status = future.result()
            if status != 0:
                for other in futures:
                    other.cancel()
                return status
        return 0
    # Combining all layers' params in one batch transfer is more efficient than several threads
    return process_layers(layers_params)


def stage_destinations(manager: Any, src_kv_ptrs: list[int], dst_kv_ptrs: list[int]) -> list[int]:
    """For each of the stage's pointers (``G`` groups of its layers), decode's pointer of the same
    global layer and buffer kind."""
    total = served_model_layers()
    start, end = sys.modules[PP_UTILS].get_pp_indices(total, manager.pp_rank, manager.pp_size)
    if start != manager.kv_args.prefill_start_layer:
        raise TransferMapError(
            f"PP rank {manager.pp_rank} of {manager.pp_size} starts at layer {start} of {total} "
            f"(get_pp_indices), but its KV pool starts at {manager.kv_args.prefill_start_layer}"
        )
    layers = end - start
    groups, extra = divmod(len(src_kv_ptrs), layers)
    if extra or not groups:
        raise TransferMapError(
            f"the stage registers {len(src_kv_ptrs)} KV pointers: not whole buffer groups of its "
            f"{layers} layers ({start}-{end - 1})"
        )
    if len(dst_kv_ptrs) == len(src_kv_ptrs):  # decode of the same PP size: the same stage's buffers
        return list(dst_kv_ptrs)
    dst_layers, extra = divmod(len(dst_kv_ptrs), groups)
    if extra or dst_layers < layers:
        raise TransferMapError(
            f"decode registers {len(dst_kv_ptrs)} KV pointers: not {groups} buffer groups holding "
            f"layers {start}-{end - 1}"
        )
    if dst_layers >= total:  # decode of PP 1: the whole model's groups, then its draft layers
        stride, offset = total, start
    else:  # decode of the same PP size, on its last stage: this stage's groups, then the draft's
        stride, offset = layers, 0
    return [
        dst_kv_ptrs[group * stride + offset + layer] for group in range(groups) for layer in range(layers)
    ]


def served_model_layers() -> int:
    """The layer count of the model this process serves, from the ``ModelConfig`` sglang builds
    from the scheduler's server args (``ServerArgs.get_model_config``, memoised on them)."""
    return sys.modules[SERVER_ARGS].get_global_server_args().get_model_config().num_hidden_layers


class PipelineTransferMapOverride(Fix):
    id = "NPD003"
    title = "Ascend PD transfer with PP slices the decode pointer list per buffer group"
    upstream = "https://github.com/sgl-project/sglang/pull/23893"
    safety = Safety.UNSAFE
    replaces = (f"{CONN}:AscendKVManager.send_kvcache",)
    anchors = (
        # the transfer primitive and the page blocks the replacement keeps using
        f"{CONN}:AscendKVManager._transfer_data",
        "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous",
        # pp_size, pp_rank, kv_args and enable_custom_mem_pool, as the manager sets them
        f"{COMMON}:CommonKVManager.__init__",
        f"{CONN}:AscendKVManager.__init__",
        # the pointer lists of both roles: one pointer per layer, grouped by buffer kind
        f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos",
        f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos",
        # the stage's layers, and the served model's layer count
        f"{PP_UTILS}:get_pp_indices",
        f"{SERVER_ARGS}:get_global_server_args",
        f"{SERVER_ARGS}:ServerArgs.get_model_config",
    )
    # scripts/fix_shapes.py NPD003 0.5.9 0.5.10 0.5.11
    written_for = {
        "0.5.9": {
            f"{CONN}:AscendKVManager.send_kvcache": "7d574ebae89379fc",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "d8978c5ea24f23b5",
            f"{COMMON}:CommonKVManager.__init__": "cc8b2a0eb9fe87f4",
            f"{CONN}:AscendKVManager.__init__": "df9e9e6b4d67cef2",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "26a4db4e1cac42c6",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.10": {
            f"{CONN}:AscendKVManager.send_kvcache": "f4c1fd7423ae7fc2",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "d8978c5ea24f23b5",
            f"{COMMON}:CommonKVManager.__init__": "5d13d740307bb23e",
            f"{CONN}:AscendKVManager.__init__": "4271aea7a1576e6c",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.11": {
            f"{CONN}:AscendKVManager.send_kvcache": "f4c1fd7423ae7fc2",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "d8978c5ea24f23b5",
            f"{COMMON}:CommonKVManager.__init__": "4cb22f745566952c",
            f"{CONN}:AscendKVManager.__init__": "4271aea7a1576e6c",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
    }

    def implementations(self) -> dict[str, Any]:
        return {self.replaces[0]: send_kvcache}


FIX = PipelineTransferMapOverride()
