"""CPU references of the Ascend kernels that the live probes' code paths call.

A live probe runs sglang's real glue code around an NPU kernel (argument preparation,
splitting, concatenation); only the kernel itself is replaced, by a plain PyTorch
implementation of its documented semantics for the arguments those paths use.
Anything outside that subset raises ``NotImplementedError`` naming the argument, so a
probe never passes on a kernel call the reference does not model.

``npudoctor.live.npusim.npu_runtime`` installs ``KERNELS`` on the stand-in ``torch_npu`` and
as ``torch.ops.npu`` for the duration of the probe calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# sparse_mode values of npu_fused_infer_attention_score (CANN operator reference):
# 0 = no mask beyond pre/next_tokens, 3 = rightDownCausal (causal, aligned to the end of the KV).
_NO_MASK, _RIGHT_DOWN_CAUSAL = 0, 3
_UNBOUNDED = 2147483647  # the default pre_tokens/next_tokens: no band


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = _UNBOUNDED,
    next_tokens: int = _UNBOUNDED,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    block_table: torch.Tensor | None = None,
    block_size: int = 0,
    **unsupported: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_fused_infer_attention_score`` for the TND layout with a paged KV cache.

    * ``query``: ``(T, N, D)``, the queries of all requests one after another;
      ``actual_seq_lengths`` are their *cumulative* ends (TND convention), one per request.
    * ``key``/``value``: paged caches ``(blocks, block_size, N_kv * D)``; request ``b``'s KV
      token ``j`` lives in block ``block_table[b, j // block_size]`` at ``j % block_size``;
      ``actual_seq_lengths_kv[b]`` is request ``b``'s KV length (per request, not cumulative,
      as in paged mode).
    * ``sparse_mode=3`` (rightDownCausal): query ``i`` of a request with ``n`` queries and
      ``L`` KV tokens sees KV tokens ``j <= L - n + i``; ``atten_mask`` is the fixed
      compressed causal mask the kernel takes in that mode and carries no information.
      ``sparse_mode=0`` with no mask: every query sees its request's whole KV.
    * GQA: query head ``h`` reads KV head ``h // (N / N_kv)``.

    Returns ``(attention_out (T, N, Dv), softmax_lse (T, N, 1))`` in the query's dtype.
    """
    given = {k: v for k, v in unsupported.items() if v is not None}
    if given:
        raise NotImplementedError(
            f"CPU reference of npu_fused_infer_attention_score: unsupported {sorted(given)}"
        )
    if input_layout != "TND" or block_table is None:
        raise NotImplementedError(
            f"CPU reference of npu_fused_infer_attention_score: only TND with a paged KV cache "
            f"(got input_layout={input_layout!r}, block_table={'set' if block_table is not None else None})"
        )
    if sparse_mode not in (_NO_MASK, _RIGHT_DOWN_CAUSAL) or (
        sparse_mode == _NO_MASK and atten_mask is not None
    ):
        raise NotImplementedError(
            f"CPU reference of npu_fused_infer_attention_score: sparse_mode={sparse_mode}"
        )
    if sparse_mode == _NO_MASK and (pre_tokens, next_tokens) != (_UNBOUNDED, _UNBOUNDED):
        # in mode 0 these bound a band around the diagonal; mode 3 ignores them
        raise NotImplementedError(
            "CPU reference of npu_fused_infer_attention_score: a pre_tokens/next_tokens band in sparse_mode 0"
        )
    if actual_seq_lengths is None or actual_seq_lengths_kv is None:
        raise NotImplementedError(
            "CPU reference of npu_fused_infer_attention_score: needs actual_seq_lengths(_kv)"
        )
    ends = [int(x) for x in actual_seq_lengths]
    kv_lens = [int(x) for x in actual_seq_lengths_kv]
    if len(ends) != len(kv_lens):
        raise ValueError(f"actual_seq_lengths has {len(ends)} requests, actual_seq_lengths_kv {len(kv_lens)}")
    if len(ends) > block_table.shape[0]:
        raise ValueError(f"{len(ends)} requests but block_table has {block_table.shape[0]} rows")
    if ends and (ends[-1] > query.shape[0] or any(b < a for a, b in zip([0] + ends, ends))):
        raise ValueError(
            f"actual_seq_lengths {ends} is not a cumulative split of {query.shape[0]} query tokens"
        )
    kv_heads = num_key_value_heads or num_heads
    if query.dim() != 3 or query.shape[1] != num_heads:
        raise ValueError(f"query of shape {tuple(query.shape)} is not (T, {num_heads}, D)")
    if block_size <= 0 or key.shape[1] != block_size:
        raise ValueError(f"key of shape {tuple(key.shape)} is not paged with block_size {block_size}")
    if key.shape[-1] % kv_heads or value.shape[-1] % kv_heads:
        raise ValueError(
            f"key/value last dims {key.shape[-1]}/{value.shape[-1]} are not a multiple of {kv_heads} heads"
        )
    head_dim, v_dim = key.shape[-1] // kv_heads, value.shape[-1] // kv_heads
    if query.shape[2] != head_dim:
        raise ValueError(f"query head dim {query.shape[2]} != key head dim {head_dim}")
    group = num_heads // kv_heads

    out = torch.zeros(query.shape[0], num_heads, v_dim, dtype=torch.float32)
    lse = torch.zeros(query.shape[0], num_heads, 1, dtype=torch.float32)
    start = 0
    for b, (end, kv_len) in enumerate(zip(ends, kv_lens)):
        n = end - start
        if n == 0:
            continue
        blocks = -(-kv_len // block_size)
        if blocks > block_table.shape[1]:
            raise ValueError(
                f"request {b}: kv length {kv_len} needs {blocks} blocks, block_table has {block_table.shape[1]}"
            )
        rows = block_table[b, :blocks].long()
        k = key[rows].reshape(-1, kv_heads, head_dim)[:kv_len].float()
        v = value[rows].reshape(-1, kv_heads, v_dim)[:kv_len].float()
        k = k.repeat_interleave(group, dim=1)  # (L, N, D)
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].float()  # (n, N, D)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if sparse_mode == _RIGHT_DOWN_CAUSAL:
            visible = torch.arange(kv_len)[None, :] <= (kv_len - n + torch.arange(n))[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
        logsumexp = torch.logsumexp(scores, dim=-1)  # (N, n)
        weights = torch.exp(scores - logsumexp[..., None]).nan_to_num(0.0)
        out[start:end] = torch.einsum("hqk,khd->qhd", weights, v)
        lse[start:end, :, 0] = logsumexp.transpose(0, 1)
        start = end
    return out.to(query.dtype), lse.to(query.dtype)


def npu_scatter_nd_update_(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_scatter_nd_update_`` (ScatterNdUpdate, in place): ``indices`` of shape
    ``(N, K)`` address the first ``K`` dims of ``self``, and ``self[indices[i]] = updates[i]``;
    ``updates`` has shape ``(N, *self.shape[K:])``. Returns ``self``. Out-of-range indices raise, as
    the kernel does not write them anywhere sensible."""
    if indices.dim() != 2:
        raise NotImplementedError(
            f"CPU reference of npu_scatter_nd_update_: indices of shape {tuple(indices.shape)}, not (N, K)"
        )
    count, depth = indices.shape
    if depth > self.dim() or tuple(updates.shape) != (count, *self.shape[depth:]):
        raise ValueError(
            f"npu_scatter_nd_update_: updates of shape {tuple(updates.shape)} for indices "
            f"{tuple(indices.shape)} into {tuple(self.shape)}"
        )
    index = tuple(indices.long().unbind(dim=1))
    for dim, positions in enumerate(index):
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.shape[dim]):
            raise IndexError(
                f"npu_scatter_nd_update_: index out of range for dim {dim} of size {self.shape[dim]}"
            )
    self[index] = updates.to(self.dtype)
    return self


KERNELS: dict[str, Callable[..., Any]] = {
    "npu_fused_infer_attention_score": npu_fused_infer_attention_score,
    "npu_scatter_nd_update_": npu_scatter_nd_update_,
}
