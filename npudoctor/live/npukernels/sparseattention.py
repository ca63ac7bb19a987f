"""CPU references of the sparse-attention kernels of DeepSeek-V3.2's DSA on NPU: the lightning
indexer that picks each query's top-k KV tokens, and the sparse flash attention over them.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_lightning_indexer.md``,
``torch_npu-npu_sparse_flash_attention.md``).

Call sites: sglang ``srt/layers/attention/dsa/dsa_npu_indexer.py`` (the indexer, query TND, key
PA_BSND, ``sparse_mode=3``) and ``srt/hardware_backend/npu/attention/ascend_backend.py``
``forward_sparse`` (SFA, query TND, KV PA_BSND, MLA-absorb ``attention_mode=2``), 0.5.16-0.5.23.

Indices are token positions within a request's KV sequence; a row keeps its valid indices first
and pads with -1 (the document: "valid values in the front part, invalid ones after").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npudoctor.live.npukernels.attention import causally_visible, int_list, paged_tokens
from npudoctor.live.npukernels.unmodelled import refuse, refuse_given

_UNBOUNDED = 2**63 - 1
_INDEXER_DIM = 128  # the document: query and key D equal 128
_SFA_DIM, _SFA_ROPE_DIM = 512, 64  # the document: query/key/value D 512, rope D 64
_PADDING = -1


def _query_spans(
    op: str, query: torch.Tensor, layout: str, lengths: list[int] | None
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Queries as ``(tokens, N, D)`` and each request's ``(start, end)`` among them: TND with
    cumulative ``lengths``, BSND one batch row per request (``lengths`` per batch, default S)."""
    if layout == "TND":
        if lengths is None:
            raise ValueError(f"{op}: TND needs actual_seq_lengths_query (cumulative ends)")
        if (lengths and lengths[-1] > query.shape[0]) or any(b < a for a, b in zip([0] + lengths, lengths)):
            raise ValueError(
                f"{op}: actual_seq_lengths_query {lengths} is not a cumulative split of {query.shape[0]} tokens"
            )
        return query, list(zip([0] + lengths[:-1], lengths))
    if layout == "BSND":
        batch, seq = query.shape[:2]
        per_batch = lengths or [seq] * batch
        if len(per_batch) != batch or any(n > seq for n in per_batch):
            raise ValueError(f"{op}: actual_seq_lengths_query {per_batch} do not fit {batch} x {seq} queries")
        return query.reshape(batch * seq, *query.shape[2:]), [
            (b * seq, b * seq + n) for b, n in enumerate(per_batch)
        ]
    refuse(op, "layout_query", f"{layout!r} (modelled: TND, BSND)")


def _paged_keys(
    op: str, layout_kv: str, block_table: torch.Tensor | None, lengths: list[int] | None, requests: int
) -> list[int]:
    """The per-request KV lengths of a PA_BSND cache (the only KV layout modelled)."""
    if layout_kv != "PA_BSND" or block_table is None:
        refuse(op, "layout_kv", f"{layout_kv!r} (modelled: PA_BSND with a block_table)")
    if lengths is None or len(lengths) != requests or block_table.shape[0] < requests:
        raise ValueError(
            f"{op}: {requests} requests, KV lengths {lengths}, {block_table.shape[0]} block_table rows"
        )
    return lengths


def _visible(n: int, length: int, sparse_mode: int) -> torch.Tensor:
    """``(n, length)``: which KV positions each query of a request sees (3: rightDownCausal)."""
    if sparse_mode == 0:
        return torch.ones(n, length, dtype=torch.bool)
    return causally_visible(n, length, length - n)


def npu_lightning_indexer(
    query: torch.Tensor,
    key: torch.Tensor,
    weights: torch.Tensor,
    *,
    actual_seq_lengths_query: torch.Tensor | Sequence[int] | None = None,
    actual_seq_lengths_key: torch.Tensor | Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    layout_query: str = "BSND",
    layout_key: str = "BSND",
    sparse_count: int = 2048,
    sparse_mode: int = 3,
    pre_tokens: int = _UNBOUNDED,
    next_tokens: int = _UNBOUNDED,
    return_value: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_lightning_indexer``: for each query token, ``score[j] = sum_g w[g] *
    relu(q[g] . k[j])`` over the KV tokens ``j`` it sees (all, or rightDownCausal with
    ``sparse_mode=3``), and the ``sparse_count`` best ``j`` (highest score first, the lower index
    among equals), padded with -1. Returns ``(indices int32, values)``: ``(T, 1, sparse_count)``
    (TND) or ``(B, S, 1, sparse_count)``; values (the scores) only with ``return_value``.

    Modelled: key PA_BSND ``(blocks, block_size, 1, 128)``, query D 128 (the document's sizes),
    no pre/next_tokens band."""
    op = "npu_lightning_indexer"
    if (pre_tokens, next_tokens) != (_UNBOUNDED, _UNBOUNDED):
        refuse(op, "pre_tokens/next_tokens", "the document supports only the defaults")
    if sparse_mode not in (0, 3):
        refuse(op, "sparse_mode", f"{sparse_mode} (documented: 0, 3)")
    if query.shape[-1] != _INDEXER_DIM or key.dim() != 4 or key.shape[2] != 1 or key.shape[3] != _INDEXER_DIM:
        refuse(
            op,
            "query/key",
            f"shapes {tuple(query.shape)}/{tuple(key.shape)}; the document requires D 128 and one key head",
        )
    tokens, spans = _query_spans(op, query, layout_query, int_list(actual_seq_lengths_query))
    kv_lens = _paged_keys(op, layout_key, block_table, int_list(actual_seq_lengths_key), len(spans))
    w = weights.reshape(tokens.shape[0], tokens.shape[1]).float()
    indices = torch.full((tokens.shape[0], 1, sparse_count), _PADDING, dtype=torch.int32)
    values = torch.zeros(tokens.shape[0], 1, sparse_count, dtype=query.dtype)
    for b, ((start, end), length) in enumerate(zip(spans, kv_lens)):
        if end == start:
            continue
        k = paged_tokens(key, block_table[b], length, 1)[:, 0].float()  # (L, D)
        q = tokens[start:end].float()  # (n, N, D)
        scores = (torch.relu(torch.einsum("ngd,ld->ngl", q, k)) * w[start:end, :, None]).sum(dim=1)  # (n, L)
        scores = scores.masked_fill(~_visible(end - start, length, sparse_mode), float("-inf"))
        order = torch.sort(scores, dim=-1, descending=True, stable=True)
        for i in range(end - start):
            chosen = order.indices[i][torch.isfinite(order.values[i])][:sparse_count]
            indices[start + i, 0, : chosen.numel()] = chosen.int()
            values[start + i, 0, : chosen.numel()] = scores[i, chosen].to(query.dtype)
    if layout_query == "BSND":
        indices = indices.reshape(*query.shape[:2], 1, sparse_count)
        values = values.reshape(*query.shape[:2], 1, sparse_count)
    return indices, values if return_value else torch.empty(0, dtype=query.dtype)


def npu_sparse_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sparse_indices: torch.Tensor,
    scale_value: float,
    *,
    block_table: torch.Tensor | None = None,
    actual_seq_lengths_query: torch.Tensor | Sequence[int] | None = None,
    actual_seq_lengths_kv: torch.Tensor | Sequence[int] | None = None,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    sparse_block_size: int = 1,
    layout_query: str = "BSND",
    layout_kv: str = "BSND",
    sparse_mode: int = 3,
    pre_tokens: int = _UNBOUNDED,
    next_tokens: int = _UNBOUNDED,
    attention_mode: int = 0,
    return_softmax_lse: bool = False,
    sinks: torch.Tensor | None = None,
    **unmodelled: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_sparse_flash_attention``, token-wise (``sparse_block_size=1``): each query
    attends (``softmax(q k^T * scale_value) v``) only to the KV positions its row of
    ``sparse_indices`` lists (-1 ends the row), further limited to ``j <= L_kv - L_q + i`` with
    ``sparse_mode=3``. MLA-absorb (``attention_mode=2``): scores over ``[q, query_rope]`` and
    ``[k, key_rope]``. Returns ``(attention_out, softmax_max, softmax_sum)``, the last two
    float32 ``(1, T, N)`` (TND) or ``(B, 1, S, N)``.

    Modelled: KV PA_BSND ``(blocks, block_size, 1, 512)`` with rope 64 (the document's sizes);
    refused: block-wise sparsity, sinks, a pre/next_tokens band, other layouts."""
    op = "npu_sparse_flash_attention"
    refuse_given(op, {"sinks": sinks, **unmodelled})
    if sparse_block_size != 1:
        refuse(op, "sparse_block_size", f"{sparse_block_size} (token-wise 1 only)")
    if (pre_tokens, next_tokens) != (_UNBOUNDED, _UNBOUNDED):
        refuse(op, "pre_tokens/next_tokens", "a band")
    if sparse_mode not in (0, 3):
        refuse(op, "sparse_mode", f"{sparse_mode} (documented: 0, 3)")
    if attention_mode not in (0, 2) or (attention_mode == 2) != (
        query_rope is not None and key_rope is not None
    ):
        refuse(
            op,
            "attention_mode",
            f"{attention_mode} with query_rope/key_rope {'set' if query_rope is not None else None}",
        )
    if (
        key.dim() != 4
        or key.shape[2] != 1
        or key.shape[3] != _SFA_DIM
        or (key_rope is not None and key_rope.shape[-1] != _SFA_ROPE_DIM)
    ):
        refuse(op, "key", f"shape {tuple(key.shape)}; the document requires one KV head of D 512 (rope 64)")
    tokens, spans = _query_spans(op, query, layout_query, int_list(actual_seq_lengths_query))
    rope_tokens = (
        None
        if query_rope is None
        else _query_spans(op, query_rope, layout_query, int_list(actual_seq_lengths_query))[0]
    )
    kv_lens = _paged_keys(op, layout_kv, block_table, int_list(actual_seq_lengths_kv), len(spans))
    rows = sparse_indices.reshape(tokens.shape[0], -1).long()
    heads = tokens.shape[1]
    out = torch.zeros(tokens.shape[0], heads, value.shape[-1], dtype=torch.float32)
    softmax_max = torch.full((tokens.shape[0], heads), float("-inf"))
    softmax_sum = torch.zeros(tokens.shape[0], heads)
    for b, ((start, end), length) in enumerate(zip(spans, kv_lens)):
        k = paged_tokens(key, block_table[b], length, 1)[:, 0].float()
        v = paged_tokens(value, block_table[b], length, 1)[:, 0].float()
        if key_rope is not None:
            k = torch.cat([k, paged_tokens(key_rope, block_table[b], length, 1)[:, 0].float()], dim=-1)
        visible = _visible(end - start, length, sparse_mode)
        for i in range(end - start):
            row = rows[start + i]
            valid = row[: int((row != _PADDING).cumprod(0).sum())]
            if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= length):
                raise IndexError(f"{op}: sparse_indices of query {start + i} outside its {length} KV tokens")
            chosen = valid[visible[i, valid]]
            if chosen.numel() == 0:
                continue
            q = tokens[start + i].float()
            if rope_tokens is not None:
                q = torch.cat([q, rope_tokens[start + i].float()], dim=-1)
            scores = q @ k[chosen].T * scale_value  # (N, |S|)
            top = scores.amax(dim=-1)
            weights = torch.exp(scores - top[:, None])
            softmax_max[start + i], softmax_sum[start + i] = top, weights.sum(dim=-1)
            out[start + i] = (weights / weights.sum(dim=-1, keepdim=True)) @ v[chosen]
    if layout_query == "TND":
        return out.to(query.dtype), softmax_max[None], softmax_sum[None]
    batch, seq = query.shape[:2]
    shape_bnsn = (batch, 1, seq, heads)
    return (
        out.reshape(batch, seq, heads, -1).to(query.dtype),
        softmax_max.reshape(batch, seq, heads)[:, None].reshape(shape_bnsn),
        softmax_sum.reshape(batch, seq, heads)[:, None].reshape(shape_bnsn),
    )


KERNELS = {
    "npu_lightning_indexer": npu_lightning_indexer,
    "npu_sparse_flash_attention": npu_sparse_flash_attention,
}
