"""NPD004 fix: the NPU FIA context-parallel attention reads the per-request CP metadata.

Port of https://github.com/sgl-project/sglang/pull/26705 (sglang 0.5.13). sglang#23269 made
``ContextParallelMetadata`` (``layers/utils/cp_utils.py``) describe a CP extend batch of
several requests: the scalar fields ``actual_seq_q_prev``/``actual_seq_q_next``/
``kv_len_prev``/``kv_len_next`` became per-request ``*_list`` (and ``*_tensor``) fields, with
``total_q_prev_tokens`` the number of local query rows in the "prev" zigzag blocks. It
missed ``AscendAttnBackend.do_cp_attn_fia``, the FIA CP prefill attention of non-MLA models
(``ASCEND_USE_FIA=1``, ``--enable-prefill-context-parallel``), which

* read the removed scalars: ``AttributeError`` at the first CP prefill, even for one request;
* split q with ``torch.chunk(q, 2)``: a CP rank's local rows are laid out
  ``[every request's prev block | every request's next block]``
  (``prepare_context_parallel_metadata``'s ``zigzag_index``), so the boundary is
  ``total_q_prev_tokens``, the midpoint only when there is one request.

The replacement is upstream's fixed method, for the code of that state (the attributes
``forward_extend``/``init_forward_metadata`` set on the backend, the ``RadixAttention``
fields, the ``torch.ops.npu.npu_fused_infer_attention_score`` call the file makes): split q
at ``total_q_prev_tokens``, and give the kernel, for each half, the cumulative per-request
query ends (``np.cumsum(actual_seq_q_*_list)``, TND layout) and the per-request KV lengths
(``kv_len_*_list``, which the preparation already extends by each request's cached prefix).

Anchors: ``prepare_context_parallel_metadata`` builds the fields and the local row layout
the replacement reads (``ContextParallelMetadata`` itself is a dataclass, whose fields the
preparation fills); ``forward_extend`` is the caller, which gathers the KV of every CP rank
into the paged cache before it passes q, the caches and the batch.

Shapes: no release ships the defect (the metadata change and this fix are both in 0.5.13);
a main-branch build between the two pull requests does. known.yaml's "0.5.13+cp-gap" state
reproduces it: 0.5.13 with the 0.5.12 ``do_cp_attn_fia``, which is also 0.5.11's (same ast),
so 0.5.13 with either old body is this one shape. Any other combination (0.5.15's
preparation and caller with the old body, say) is refused with the sites that differ.

Safety: ``unsafe``. It replaces the body of a method that is called on every CP prefill
and changes what it computes (the split point and the lengths given to the kernel), on an
attention hot path where a wrong number is silent. In the defective state the original
raises before it computes anything, but the replacement's correctness rests on the FIA
kernel's TND/paged semantics, proven here against npudoctor's CPU reference of that kernel,
not on an NPU: an operator opts in (``--unsafe``, or ``--with-fix`` to try it on the probes).
"""

from __future__ import annotations

from typing import Any

from npudoctor.patching.fixbase import Fix, Safety

BACKEND = "sglang.srt.hardware_backend.npu.attention.ascend_backend"
CP_UTILS = "sglang.srt.layers.utils.cp_utils"


def do_cp_attn_fia(self, q, k_cache, v_cache, layer, forward_batch):
    """FIA attention of one CP rank's local rows: the prev blocks of every request, then the
    next blocks, each half against the paged KV cache holding every request's full sequence."""
    import numpy as np
    import torch

    cp_meta = forward_batch.attn_cp_metadata
    split = cp_meta.total_q_prev_tokens  # the local rows of every request's prev block
    q_prev = q[:split].contiguous().reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    q_next = q[split:].contiguous().reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    k_cache_paged = k_cache.view(-1, self.page_size, layer.tp_k_head_num * layer.qk_head_dim)
    v_cache_paged = v_cache.view(-1, self.page_size, layer.tp_v_head_num * layer.v_head_dim)

    outputs = []
    for query, q_lens, kv_lens in (
        (q_prev, cp_meta.actual_seq_q_prev_list, cp_meta.kv_len_prev_list),
        (q_next, cp_meta.actual_seq_q_next_list, cp_meta.kv_len_next_list),
    ):
        out, _ = torch.ops.npu.npu_fused_infer_attention_score(
            query,
            k_cache_paged,
            v_cache_paged,
            block_table=self.forward_metadata.block_tables,
            block_size=self.page_size,
            num_heads=layer.tp_q_head_num,
            num_key_value_heads=layer.tp_k_head_num,
            input_layout="TND",
            atten_mask=self.fia_mask,
            sparse_mode=3,
            next_tokens=0,
            scale=layer.scaling,
            actual_seq_lengths=np.cumsum(q_lens).tolist(),  # TND: cumulative query ends
            actual_seq_lengths_kv=kv_lens,  # paged: per-request KV lengths
        )
        outputs.append(out)
    return torch.cat(outputs, dim=0).view(-1, layer.tp_q_head_num * layer.v_head_dim)


class ContextParallelFiaOverride(Fix):
    id = "NPD004"
    title = "NPU FIA context-parallel attention splits q and reads lengths per request"
    upstream = "https://github.com/sgl-project/sglang/pull/26705"
    safety = Safety.UNSAFE
    replaces = (f"{BACKEND}:AscendAttnBackend.do_cp_attn_fia",)
    anchors = (
        f"{CP_UTILS}:prepare_context_parallel_metadata",
        f"{BACKEND}:AscendAttnBackend.forward_extend",
    )
    # scripts/fix_shapes.py NPD004 0.5.13+cp-gap=<tree of tests/support/trees.py cp_gap_tree>
    written_for = {
        "0.5.13+cp-gap": {
            f"{BACKEND}:AscendAttnBackend.do_cp_attn_fia": "0bad8ad5782d2142",
            f"{CP_UTILS}:prepare_context_parallel_metadata": "4ce07f7ca3122d59",
            f"{BACKEND}:AscendAttnBackend.forward_extend": "e01a9c9a4b77e8bb",
        },
    }

    def implementations(self) -> dict[str, Any]:
        return {self.replaces[0]: do_cp_attn_fia}


FIX = ContextParallelFiaOverride()
