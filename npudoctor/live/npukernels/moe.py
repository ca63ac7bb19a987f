"""CPU references of the MoE routing kernels sglang's NPU MoE path calls.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_moe_gating_top_k_softmax.md``,
``torch_npu-npu_moe_gating_top_k.md``, ``torch_npu-npu_moe_init_routing.md``,
``torch_npu-npu_moe_init_routing_v2.md``, ``torch_npu-npu_moe_compute_expert_tokens.md``,
``torch_npu-npu_grouped_matmul.md``, ``torch_npu-npu_moe_finalize_routing.md``), whose
"equivalent computation" listings these follow.

Call sites (sglang 0.5.23; ``srt/layers/moe`` NPU methods before): ``hardware_backend/npu/moe/topk.py``
``fused_topk_npu`` (gating_top_k_softmax for plain softmax routing such as Qwen3-MoE; gating_top_k with
a correction bias, sigmoid or groups such as DeepSeek), ``moe/init_routing.py`` (v1 with
compute_expert_tokens, or v2 as ``layers/moe/token_dispatcher/ascend_tp.py`` picks),
``moe/matmul.py`` ``GroupedMatmul`` (the experts' gate/up and down projections),
``moe/finalize_routing.py`` (``drop_pad_mode=2`` after v2), ``quantization/moe_methods.py``.

Two index orders appear: v1's ``row_idx[i, k] = k * N + i`` (built by sglang as the document says)
with finalize ``drop_pad_mode`` 0 (column order), and v2's flat ``i * K + k`` with finalize
``drop_pad_mode`` 2 (row order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest of each row, the lower index first among equals (a stable
    descending sort, as the document's listing does)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_gating_top_k_softmax``: ``softmax(x)``'s top ``k`` values and expert
    indices (int32), and ``row_idx = arange(N * k).reshape(k, N).T`` (int32). ``finished`` is refused."""
    op = "npu_moe_gating_top_k_softmax"
    refuse_given(op, {"finished": finished})
    if x.dim() == 3:
        refuse(op, "x", f"shape {tuple(x.shape)}: the 3-D form is not modelled")
    if x.dim() != 2 or not 0 < k <= min(x.shape[-1], 1024):
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} with k={k}")
    probs = x.float().softmax(dim=-1)
    experts = _top_k(probs, k)
    rows = torch.arange(x.shape[0] * k, dtype=torch.int32).reshape(k, x.shape[0]).T.contiguous()
    return probs.gather(1, experts).to(x.dtype), experts.int(), rows


def npu_moe_gating_top_k(
    x: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    tid2eid: torch.Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_gating_top_k``: ``norm = softmax(x)`` (``norm_type`` 0) or
    ``sigmoid(x)`` (1); ``score = norm + bias``; the experts split into ``group_count`` groups,
    each scored by its max (``group_select_mode`` 0) or its top-2 sum (1); outside the best
    ``k_group`` groups scores are -inf; the top ``k`` scores pick the experts; ``y`` are their
    ``norm`` values, divided by their sum + ``eps`` for sigmoid, times ``routed_scaling_factor``.
    Returns ``(y, expert_idx int32, norm float32)``.

    The document says only ``renorm=0`` is supported (sglang passes ``renorm=renormalize``): other
    values are refused, as is the hash routing (``input_ids``/``tid2eid``)."""
    op = "npu_moe_gating_top_k"
    refuse_given(op, {"input_ids": input_ids, "tid2eid": tid2eid})
    if renorm:
        refuse(op, "renorm", f"{renorm}; the document supports only 0 (norm before top-k)")
    if norm_type not in (0, 1) or group_select_mode not in (0, 1):
        refuse(op, "norm_type/group_select_mode", f"{norm_type}/{group_select_mode} (documented: 0 or 1)")
    experts = x.shape[-1]
    if x.dim() != 2 or group_count <= 0 or experts % group_count or not 1 <= k_group <= group_count:
        raise ValueError(f"{op}: x {tuple(x.shape)} with group_count={group_count}, k_group={k_group}")
    if not 1 <= k <= experts // group_count * k_group:
        raise ValueError(f"{op}: k={k} outside [1, {experts // group_count * k_group}]")
    norm = x.float().softmax(dim=-1) if norm_type == 0 else torch.sigmoid(x.float())
    scores = norm if bias is None else norm + bias.float()
    if group_count > 1:
        grouped = scores.reshape(x.shape[0], group_count, -1)
        group_score = grouped.amax(-1) if group_select_mode == 0 else grouped.topk(2, dim=-1).values.sum(-1)
        kept = torch.zeros(x.shape[0], group_count, dtype=torch.bool)
        kept.scatter_(1, _top_k(group_score, k_group), True)
        scores = grouped.masked_fill(~kept[..., None], float("-inf")).reshape(x.shape[0], -1)
    chosen = _top_k(scores, k)
    y = norm.gather(1, chosen)
    if norm_type == 1:
        y = y / (y.sum(dim=-1, keepdim=True) + eps)
    return (y * routed_scaling_factor).to(x.dtype), chosen.int(), norm


def npu_moe_init_routing(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_init_routing``, the document's listing: a stable sort of the flat
    ``expert_idx`` gives ``expanded_expert_idx`` and, through ``row_idx``, each sorted slot's
    source row; ``expanded_row_idx[source] = slot``; ``expanded_x`` the first
    ``min(active_num, N) * K`` sorted rows, ``x[source % N]``."""
    op = "npu_moe_init_routing"
    if expert_idx.dim() != 2 or row_idx.shape != expert_idx.shape or x.shape[0] != expert_idx.shape[0]:
        raise ValueError(
            f"{op}: x {tuple(x.shape)}, row_idx {tuple(row_idx.shape)}, expert_idx {tuple(expert_idx.shape)}"
        )
    rows, k = expert_idx.shape
    order = torch.sort(expert_idx.reshape(-1), stable=True)
    sources = row_idx.reshape(-1).long()[order.indices]
    expanded_row_idx = torch.empty_like(sources)
    expanded_row_idx[sources] = torch.arange(sources.numel())
    active = min(active_num, rows) * k
    return x[sources[:active] % rows], expanded_row_idx.int(), order.values.int()


def npu_moe_compute_expert_tokens(
    sorted_expert_for_source_row: torch.Tensor, num_expert: int
) -> torch.Tensor:
    """``torch_npu.npu_moe_compute_expert_tokens``: for each expert ``i`` the end of its rows in
    the sorted expert list (a binary search), i.e. the cumulative token counts; same dtype."""
    op = "npu_moe_compute_expert_tokens"
    experts = sorted_expert_for_source_row
    if experts.dim() != 1 or not 0 < num_expert <= 2048:
        raise ValueError(
            f"{op}: sorted_expert_for_source_row {tuple(experts.shape)}, num_expert {num_expert}"
        )
    if experts.numel() > 1 and bool((experts[1:] < experts[:-1]).any()):
        raise ValueError(f"{op}: sorted_expert_for_source_row is not sorted")
    ends = torch.searchsorted(experts.long().contiguous(), torch.arange(num_expert), right=True)
    return ends.to(experts.dtype)


def npu_moe_init_routing_v2(
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    *,
    active_num: int = -1,
    expert_capacity: int = -1,
    expert_num: int = -1,
    drop_pad_mode: int = 0,
    expert_tokens_num_type: int = 0,
    expert_tokens_num_flag: bool = False,
    quant_mode: int = -1,
    active_expert_range: Sequence[int] = (),
    row_idx_type: int = 0,
    **unmodelled: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_init_routing_v2``, unquantized and dropless: a stable sort of the flat
    ``expert_idx`` (flat index ``i * K + k``); ``expanded_x[slot] = x[source // K]``;
    ``expanded_row_idx[source] = slot`` (``row_idx_type`` 0, gather) or ``[slot] = source`` (1);
    the tokens per expert as counts (``expert_tokens_num_type`` 1) or their cumsum (0), int64.
    Returns ``(expanded_x, expanded_row_idx int32, expert_tokens, expanded_scale)``; the scale is
    only meaningful when quantizing and is returned empty.

    Refused: quantization (``quant_mode`` other than -1, ``scale``/``offset``), drop/pad
    (``drop_pad_mode`` 1), an active expert range narrower than all experts, the key-value
    histogram (type 2), and an ``active_num`` below ``N * K``."""
    op = "npu_moe_init_routing_v2"
    refuse_given(op, unmodelled)
    rows, k = expert_idx.shape
    if quant_mode != -1:
        refuse(op, "quant_mode", f"{quant_mode} (unquantized only)")
    if drop_pad_mode != 0:
        refuse(op, "drop_pad_mode", f"{drop_pad_mode} (dropless only)")
    if expert_tokens_num_type not in (0, 1):
        refuse(op, "expert_tokens_num_type", f"{expert_tokens_num_type} (modelled: 0 cumsum, 1 count)")
    if row_idx_type not in (0, 1):
        refuse(op, "row_idx_type", str(row_idx_type))
    if active_num not in (-1, 0) and active_num < rows * k:
        refuse(op, "active_num", f"{active_num} below the {rows * k} routed rows")
    if expert_num <= 0:
        refuse(op, "expert_num", f"{expert_num} (the histogram needs the expert count)")
    if list(active_expert_range) not in ([], [0, expert_num]):
        refuse(
            op, "active_expert_range", f"{list(active_expert_range)} narrower than all {expert_num} experts"
        )
    flat = expert_idx.reshape(-1).long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= expert_num):
        raise ValueError(f"{op}: expert_idx outside [0, {expert_num})")
    order = torch.sort(flat, stable=True)
    sources = order.indices
    if row_idx_type == 0:
        expanded_row_idx = torch.empty_like(sources)
        expanded_row_idx[sources] = torch.arange(sources.numel())
    else:
        expanded_row_idx = sources
    counts = torch.bincount(flat, minlength=expert_num)
    tokens = counts if expert_tokens_num_type == 1 else counts.cumsum(0)
    return x[sources // k], expanded_row_idx.int(), tokens.long(), torch.empty(0, dtype=torch.float32)


def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list_type: int = 0,
    act_type: int = 0,
    output_dtype: torch.dtype | None = None,
    **unmodelled: Any,
) -> list[torch.Tensor]:
    """``torch_npu.npu_grouped_matmul`` in the form of an MoE layer's experts: one ``x (M, K)``,
    one ``weight (E, K, N)``, ``group_type=0`` (groups along M), ``split_item`` 2/3 (one output):
    rows of group ``e`` times ``weight[e]``; ``group_list`` the groups' cumulative ends
    (``group_list_type`` 0) or sizes (1). Rows past the last group are zeros. Returns ``[y (M, N)]``
    in ``output_dtype`` (default x's). Quantized and multi-tensor forms, bias and fused
    activations are refused."""
    op = "npu_grouped_matmul"
    refuse_given(op, {"bias": bias, **unmodelled})
    if len(x) != 1 or len(weight) != 1:
        refuse(op, "x/weight", f"{len(x)}/{len(weight)} tensors (modelled: one each)")
    if split_item not in (2, 3) or group_type != 0 or group_list is None:
        refuse(
            op,
            "split_item/group_type/group_list",
            f"{split_item}/{group_type}/{'set' if group_list is not None else None}",
        )
    if group_list_type not in (0, 1):
        refuse(op, "group_list_type", f"{group_list_type} (modelled: 0 cumsum, 1 count)")
    if act_type:
        refuse(op, "act_type", f"{act_type} (a fused activation)")
    (a,), (w,) = x, weight
    if a.dim() != 2 or w.dim() != 3 or w.shape[1] != a.shape[1] or group_list.numel() != w.shape[0]:
        raise ValueError(
            f"{op}: x {tuple(a.shape)}, weight {tuple(w.shape)}, group_list {tuple(group_list.shape)}"
        )
    sizes = (
        group_list.long()
        if group_list_type == 1
        else torch.diff(group_list.long(), prepend=torch.zeros(1, dtype=torch.long))
    )
    if bool((sizes < 0).any()) or int(sizes.sum()) > a.shape[0]:
        raise ValueError(f"{op}: group_list {group_list.tolist()} does not split {a.shape[0]} rows")
    out = torch.zeros(a.shape[0], w.shape[2], dtype=torch.float32)
    start = 0
    for expert, size in enumerate(sizes.tolist()):
        out[start : start + size] = a[start : start + size].float() @ w[expert].float()
        start += size
    return [out.to(output_dtype or a.dtype)]


def npu_moe_finalize_routing(
    expanded_permuted_rows: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    expanded_src_to_dst_row: torch.Tensor,
    export_for_source_row: torch.Tensor | None,
    drop_pad_mode: int = 0,
) -> torch.Tensor:
    """``torch_npu.npu_moe_finalize_routing``, dropless: ``out[i] = skip1[i] + skip2[i] +
    sum_k scales[i, k] * (rows[src_to_dst[s(i, k)]] + bias[expert[i, k]])`` with
    ``s(i, k) = i + k * N`` (``drop_pad_mode`` 0, column order) or ``i * K + k`` (2, row order);
    ``K = scales.shape[1]`` (1 without scales). Drop/pad modes 1 and 3 are refused."""
    op = "npu_moe_finalize_routing"
    if drop_pad_mode not in (0, 2):
        refuse(op, "drop_pad_mode", f"{drop_pad_mode} (modelled: dropless 0 and 2)")
    if skip1 is None and skip2 is not None:
        raise ValueError(f"{op}: skip2 without skip1")
    top_k = 1 if scales is None else scales.shape[1]
    total = expanded_src_to_dst_row.numel()
    if total % top_k or expanded_permuted_rows.dim() != 2 or expanded_permuted_rows.shape[0] != total:
        raise ValueError(f"{op}: rows {tuple(expanded_permuted_rows.shape)}, {total} indices, K={top_k}")
    rows = total // top_k
    src = (
        torch.arange(rows)[:, None] + torch.arange(top_k)[None, :] * rows
        if drop_pad_mode == 0
        else torch.arange(total).reshape(rows, top_k)
    )
    gathered = expanded_permuted_rows.float()[expanded_src_to_dst_row.long()[src]]  # (N, K, H)
    if bias is not None:
        if export_for_source_row is None:
            raise ValueError(f"{op}: bias needs export_for_source_row")
        gathered = gathered + bias.float()[export_for_source_row.long()]
    weights = torch.ones(rows, top_k) if scales is None else scales.float()
    out = (gathered * weights[..., None]).sum(dim=1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(expanded_permuted_rows.dtype)


KERNELS = {
    "npu_moe_gating_top_k_softmax": npu_moe_gating_top_k_softmax,
    "npu_moe_gating_top_k": npu_moe_gating_top_k,
    "npu_moe_init_routing": npu_moe_init_routing,
    "npu_moe_compute_expert_tokens": npu_moe_compute_expert_tokens,
    "npu_moe_init_routing_v2": npu_moe_init_routing_v2,
    "npu_grouped_matmul": npu_grouped_matmul,
    "npu_moe_finalize_routing": npu_moe_finalize_routing,
}
