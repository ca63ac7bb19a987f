"""NPD003 fix: with PP, the Ascend transfer writes each stage buffer into the same layer and kind
on decode.

Two parts, one per shape of the Ascend transfer code:

* 0.5.9-0.5.11: port of https://github.com/sgl-project/sglang/pull/23893 (sglang 0.5.12): the
  Ascend ``send_kvcache`` is replaced by one that slices the decode list per buffer group;
* 0.5.12-0.5.23: npudoctor's own fix (no upstream pull request as of 0.5.23): the MHA pointer
  splitter the Ascend manager inherits, ``CommonKVManager.get_mha_kv_ptrs_with_pp``, is replaced
  on ``AscendKVManager`` by one that slices decode's K and V halves at the served model's layer
  count instead of guessing it from ``dst_layers % stage_layers``.

A PD prefill stage registers one pointer per layer and buffer kind, grouped by kind:
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
  with or without a draft model on decode;
* 0.5.12-0.5.23: #23893 routes MLA through a group-aware splitter; MHA pools still go through
  the same ``get_mha_kv_ptrs_with_pp`` and its guess (byte for byte the 0.5.10 arithmetic, at
  ``disaggregation/common/conn.py:441`` in 0.5.12, ``:1718`` in 0.5.23): Llama-3-70B (80 layers)
  with prefill PP 3 (26 + 27 + 27) writes every stage's V buffers into other layers' K or V
  buffers on decode, also without any draft model; 61 layers over PP 2 likewise.

Upstream's MLA fix slices the decode list per buffer group with ``prefill_start_layer``,
``kv_buf_groups`` and ``total_kv_layers``; sglang's producer sets the last two from 0.5.12 on
(``setup_state_kv_args``), for the NPU MLA pool only. Nothing produces them for MHA, nor for any
pool before 0.5.12, so both replacements derive them from what the prefill stage process knows:

* ``T``, decode's main (target-model) layer count: the served model's ``num_hidden_layers``, from
  the process's model config as sglang itself serves it: ``runtime_context.process_model_config()``
  where the release has it (0.5.18+), else ``get_global_server_args().get_model_config()`` (the
  ``ModelConfig`` built from the server args the scheduler runs with, memoised on them); the
  decode instance serves the same model;
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

0.5.9-0.5.11: everything else is the release's own ``send_kvcache``, unchanged: the page blocks
from ``group_concurrent_contiguous``, one ``_transfer_data`` batch (or one per layer on the
executor with the custom memory pool), and the status it returns. PP prefill has no draft pool on
these releases (``ServerArgs.check_server_args`` rejects PP with speculative decoding), so the
stage's list is its own layers only. 0.5.12+: ``send_kvcache`` is the release's own; only the
splitter it calls for MHA pools is replaced, returning ``(src_k, src_v, dst_k, dst_v, layers)``
as the original does, so every caller of the splitter on the Ascend manager (``send_kvcache``, and
the Mooncake ``send_kvcache_slice`` and head-slice paths it inherits) gets decode's pointers of
the same layer and kind.

Not covered: ``send_kvcache_slice`` on 0.5.10/0.5.11 (prefill and decode with different attention
TP sizes, MHA), which still uses the MHA splitter there.

Anchors: the transfer primitive and page grouping it keeps calling, the manager ``__init__``s that
set the attributes it reads, the NPU pools' ``get_contiguous_buf_infos`` (the per-kind grouping
of both roles' lists), ``get_pp_indices`` and the two server-args functions ``T`` comes from
(``runtime_context.process_model_config`` is not fingerprinted: that module does not exist
before 0.5.14, and a fix waits for every anchored module to be imported).
The ``_init_kv_manager`` of prefill and decode, which append the draft pool's list after the
main one, are not fingerprinted: their modules are not imported where the live probe runs (it
assembles ``kv_args`` as they do), and a fix waits for every anchored module to be imported.

Safety: ``unsafe``. The replacement changes where running code writes KV on every PP prefill
transfer. On 0.5.9 that code is wrong whenever PP > 1; on 0.5.10-0.5.23 it is wrong for the
splits its guess misses (and on 0.5.10/0.5.11 for MLA with the indexer), and right for the
others, which the replacement keeps right (even MHA splits, 60 + 2 MTP layers: see the tests).
Its correctness rests on the layouts and the partition named in ``anchors``, proven on CPU pools
by NPD003's live probe, not on an NPU: an operator opts in (``--unsafe``).
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from npudoctor.patching.fixbase import Fix, Safety

CONN = "sglang.srt.disaggregation.ascend.conn"
RUNTIME = "sglang.srt.runtime_context"
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


def get_mha_kv_ptrs_with_pp(self, src_kv_ptrs: list, dst_kv_ptrs: list) -> tuple[list, list, list, list, int]:
    """The stage's K and V halves and decode's K and V entries of the same global layers (0.5.12+):
    ``(src_k, src_v, dst_k, dst_v, layers)``, as ``CommonKVManager.get_mha_kv_ptrs_with_pp``
    returns them, with decode's halves sliced at the served model's layer count."""
    layers = len(src_kv_ptrs) // 2
    mapped = stage_destinations(self, src_kv_ptrs, dst_kv_ptrs)
    return src_kv_ptrs[:layers], src_kv_ptrs[layers:], mapped[:layers], mapped[layers:], layers


def served_model_layers() -> int:
    """The layer count of the model this process serves, from the ``ModelConfig`` sglang builds
    from the scheduler's server args: ``runtime_context.process_model_config()`` (0.5.18+), else
    ``get_global_server_args().get_model_config()`` (memoised on the server args)."""
    process_model_config = getattr(sys.modules.get(RUNTIME), "process_model_config", None)
    if process_model_config is not None:
        return process_model_config().num_hidden_layers
    return sys.modules[SERVER_ARGS].get_global_server_args().get_model_config().num_hidden_layers


class PipelineTransferMapOverride(Fix):
    id = "NPD003"
    title = "Ascend PD transfer with PP slices the decode pointer list per buffer group"
    upstream = "https://github.com/sgl-project/sglang/pull/23893"
    own = (
        "the Ascend MHA pointer splitter (get_mha_kv_ptrs_with_pp) slices decode's K and V halves at "
        "the served model's layer count instead of guessing it from layer-count divisibility, so every "
        "prefill PP stage's K/V buffers land in the same layer and kind on decode, for 0.5.12-0.5.23"
    )
    safety = Safety.UNSAFE
    replaces = (f"{CONN}:AscendKVManager.send_kvcache", f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp")
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
    # scripts/fix_shapes.py NPD003 0.5.9 0.5.10 ... 0.5.23 (every release from 0.5.9; none shares a shape)
    written_for = {
        "0.5.9": {
            f"{CONN}:AscendKVManager.send_kvcache": "7d574ebae89379fc",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
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
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
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
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
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
        "0.5.12": {
            f"{CONN}:AscendKVManager.send_kvcache": "c46e4b469fb058b1",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "d8978c5ea24f23b5",
            f"{COMMON}:CommonKVManager.__init__": "a450cea87787dfdc",
            f"{CONN}:AscendKVManager.__init__": "4271aea7a1576e6c",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.13": {
            f"{CONN}:AscendKVManager.send_kvcache": "c46e4b469fb058b1",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "a450cea87787dfdc",
            f"{CONN}:AscendKVManager.__init__": "856b832e1b3ca98f",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.14": {
            f"{CONN}:AscendKVManager.send_kvcache": "c46e4b469fb058b1",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "4aaf373390ef748a",
            f"{CONN}:AscendKVManager.__init__": "856b832e1b3ca98f",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "c8a9cd9e32b25c14",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.15": {
            f"{CONN}:AscendKVManager.send_kvcache": "c46e4b469fb058b1",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "4aaf373390ef748a",
            f"{CONN}:AscendKVManager.__init__": "856b832e1b3ca98f",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "2e2c7777af4f161b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.16": {
            f"{CONN}:AscendKVManager.send_kvcache": "c46e4b469fb058b1",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "b25543c015507f07",
            f"{CONN}:AscendKVManager.__init__": "856b832e1b3ca98f",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "2e2c7777af4f161b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "9cd150e7cb03a17b",
        },
        "0.5.17": {
            f"{CONN}:AscendKVManager.send_kvcache": "3a34f6bf345a4788",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "cc7b0cce7da784f8",
            f"{CONN}:AscendKVManager.__init__": "856b832e1b3ca98f",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "2e2c7777af4f161b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "17f48d0e0d2a35fd",
        },
        "0.5.18": {
            f"{CONN}:AscendKVManager.send_kvcache": "6fda52d11b95ff84",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "1418c2a00c68efda",
            f"{CONN}:AscendKVManager.__init__": "5bcd0d99307854db",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "21357bf05b9769b7",
            f"{SERVER_ARGS}:get_global_server_args": "2e2c7777af4f161b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "17f48d0e0d2a35fd",
        },
        "0.5.19": {
            f"{CONN}:AscendKVManager.send_kvcache": "6fda52d11b95ff84",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "553da8dda1dc6961",
            f"{CONN}:AscendKVManager.__init__": "aa9cea7ce383c323",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a29bb261da3b79d0",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "7589a19f19801e68",
            f"{SERVER_ARGS}:get_global_server_args": "9ad003f5e3a64b5c",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "missing",
        },
        "0.5.20": {
            f"{CONN}:AscendKVManager.send_kvcache": "6fda52d11b95ff84",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "346b43c7baaee941",
            f"{CONN}:AscendKVManager.__init__": "d048ff5e4d6f49dd",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "e65f03a9b3a8a3e7",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "7589a19f19801e68",
            f"{SERVER_ARGS}:get_global_server_args": "75ce35f665d7e81b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "missing",
        },
        "0.5.21": {
            f"{CONN}:AscendKVManager.send_kvcache": "e4d2215407367073",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "bb41ad6ec5f137a6",
            f"{CONN}:AscendKVManager.__init__": "7e6bdc5e28329a03",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "e65f03a9b3a8a3e7",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "7589a19f19801e68",
            f"{SERVER_ARGS}:get_global_server_args": "75ce35f665d7e81b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "missing",
        },
        "0.5.22": {
            f"{CONN}:AscendKVManager.send_kvcache": "e4d2215407367073",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "8eebfeb25dff53ac",
            f"{CONN}:AscendKVManager.__init__": "0494c32049df69f7",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a473da17bf4b9792",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "7589a19f19801e68",
            f"{SERVER_ARGS}:get_global_server_args": "75ce35f665d7e81b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "missing",
        },
        "0.5.23": {
            f"{CONN}:AscendKVManager.send_kvcache": "e4d2215407367073",
            f"{CONN}:AscendKVManager.get_mha_kv_ptrs_with_pp": "c8bf8a2a1f52f8e9",
            f"{CONN}:AscendKVManager._transfer_data": "2864acc7a8b8889a",
            "sglang.srt.disaggregation.common.utils:group_concurrent_contiguous": "b878d541e3399cf7",
            f"{COMMON}:CommonKVManager.__init__": "0cf79526b367f4f2",
            f"{CONN}:AscendKVManager.__init__": "0494c32049df69f7",
            f"{POOLS}:NPUMLATokenToKVPool.get_contiguous_buf_infos": "a473da17bf4b9792",
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "f70c53e4745696f9",
            f"{PP_UTILS}:get_pp_indices": "7589a19f19801e68",
            f"{SERVER_ARGS}:get_global_server_args": "75ce35f665d7e81b",
            f"{SERVER_ARGS}:ServerArgs.get_model_config": "missing",
        },
    }

    def installs(self, functions) -> tuple[str, ...]:
        """0.5.9-0.5.11: ``send_kvcache`` (the port of #23893). A ``send_kvcache`` that already
        sends MLA pools through the group-aware splitter (#23893, 0.5.12+) keeps its own code:
        only the MHA splitter it calls is replaced."""
        send = functions.get(self.replaces[0])
        text = ast.unparse(send) if send is not None else ""
        if "get_mla_kv_ptrs_with_pp" in text and "is_mla_backend" in text:
            return (self.replaces[1],)
        return (self.replaces[0],)

    def implementations(self) -> dict[str, Any]:
        return {self.replaces[0]: send_kvcache, self.replaces[1]: get_mha_kv_ptrs_with_pp}


FIX = PipelineTransferMapOverride()
