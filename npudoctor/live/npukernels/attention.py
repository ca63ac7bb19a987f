"""CPU references of the attention kernels sglang's Ascend attention backend calls.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md`` and
``..._v2.md``; the op schemas in ``op_plugin/config/op_plugin_functions.yaml``) for the fused
infer attention (FIA) kernels; the ATB paged-attention ops behind ``torch_npu._npu_paged_attention``
and ``torch_npu._npu_flash_attention_qlens`` have no public page, so those follow the semantics
sglang's own portable path computes for the same call (causal attention of each request's new
tokens over its cached prefix) and the limits upstream reported.

Call sites (sglang ``srt/hardware_backend/npu/attention/ascend_backend.py``, 0.5.12-0.5.23;
``srt/layers/attention/ascend_backend.py`` before): ``forward_extend`` (qlens, FIA TND and the
per-request FIA v2 BSND), ``forward_decode`` (``_npu_paged_attention``, FIA BSND), and
``forward_decode_graph`` (FIA ``.out`` in BSH, and BSND with ``query_rope``/``key_rope`` for MLA).
Paged forms: ``block_table[b, j // block_size]`` holds request ``b``'s KV token ``j`` at
``j % block_size``. FIA also takes K/V directly in the query's layout (the MLA prefill, over the new
tokens and over the gathered prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given

# sparse_mode values of FusedInferAttentionScore: 0 = defaultMask (no mask beyond the
# pre_tokens/next_tokens band), 2 = leftUpCausal, 3 = rightDownCausal (causal, aligned to the end of
# the KV); 2/3/4 take a fixed, compressed (2048, 2048) lower-triangular mask.
_NO_MASK, _LEFT_UP_CAUSAL, _RIGHT_DOWN_CAUSAL = 0, 2, 3
_COMPRESSED_MASK_SIDE = 2048
_UNBOUNDED = 2147483647  # the default pre_tokens/next_tokens: no band
_LAYOUTS = ("TND", "BSH", "BSND", "BNSD")
_FIA = "npu_fused_infer_attention_score"
_FIA_V2 = "npu_fused_infer_attention_score_v2"
# sglang#38196: the qlens prefill kernel reads a paged cache with blocks below 128 wrongly.
_QLENS_MIN_BLOCK = 128


def paged_tokens(cache: torch.Tensor, table_row: torch.Tensor, length: int, heads: int) -> torch.Tensor:
    """Request tokens ``0..length-1`` of a paged cache, ``(length, heads, dim)``.

    ``cache`` is ``(blocks, block_size, heads * dim)`` (the BnBsH layout FIA takes) or
    ``(blocks, block_size, heads, dim)`` (the layout of the ATB paged-attention ops).
    """
    block_size = cache.shape[1]
    blocks = -(-length // block_size)
    if blocks > table_row.numel():
        raise ValueError(f"kv length {length} needs {blocks} blocks, block_table row has {table_row.numel()}")
    rows = table_row[:blocks].long()
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= cache.shape[0]):
        raise IndexError(f"block_table entry out of range for a cache of {cache.shape[0]} blocks")
    return cache[rows].reshape(blocks * block_size, heads, -1)[:length]


def causally_visible(n: int, length: int, offset: int) -> torch.Tensor:
    """``(n, length)``: query ``i`` sees KV ``j <= offset + i`` (rightDownCausal: ``offset = L - n``)."""
    return torch.arange(length)[None, :] <= (offset + torch.arange(n))[:, None]


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, causal: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of one request in float32: ``query (n, N, D)`` over ``key (L, N_kv, D)``,
    ``value (L, N_kv, Dv)``; query head ``h`` reads KV head ``h // (N / N_kv)`` (GQA).

    ``causal``: None (every query sees every key), ``"right_down"`` (query ``i`` sees keys
    ``j <= L - n + i``: new tokens after a cached prefix) or ``"left_up"`` (``j <= i``).
    Returns ``(out (n, N, Dv), lse (n, N))``; a query that sees no key gets zeros.
    """
    n, heads = query.shape[0], query.shape[1]
    length, kv_heads = key.shape[0], key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    group = heads // kv_heads
    k = key.float().repeat_interleave(group, dim=1)
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * scale
    if causal is not None:
        visible = causally_visible(n, length, length - n if causal == "right_down" else 0)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (N, n)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", weights, v), lse.transpose(0, 1)


def _check_compressed_causal_mask(op: str, mask: torch.Tensor | None) -> None:
    """sparse_mode 2/3 take the (2048, 2048) mask, True/1 above the diagonal (the document: shape
    (2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048), "the user guarantees it is lower
    triangular"); any other mask is one the kernel would read as that one, so it is refused."""
    if mask is None:
        refuse(op, "atten_mask", "sparse_mode 2/3 need the compressed (2048, 2048) causal mask, got None")
    side = _COMPRESSED_MASK_SIDE
    if mask.shape[-2:] != (side, side) or any(d != 1 for d in mask.shape[:-2]) or mask.dim() > 4:
        raise ValueError(
            f"{op}: atten_mask of shape {tuple(mask.shape)} is not (2048, 2048) for sparse_mode 2/3"
        )
    expected = torch.ones(side, side, dtype=torch.bool).triu(1)
    if not torch.equal(mask.reshape(side, side).bool(), expected):
        refuse(op, "atten_mask", "not the lower-triangular causal mask the kernel assumes")


RequestKV = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def _paged_kv(
    op: str,
    key: torch.Tensor,
    value: torch.Tensor,
    key_rope: torch.Tensor | None,
    kv_lengths: Sequence[int] | None,
    block_table: torch.Tensor,
    block_size: int,
    kv_heads: int,
    requests: int,
) -> list[RequestKV]:
    """Each request's ``(k, v, k_rope)`` from a paged cache ``(blocks, block_size, N_kv * D)``
    (BnBsH); ``kv_lengths`` are per request in every layout."""
    for name, cache in (("key", key), ("value", value), ("key_rope", key_rope)):
        if cache is not None and cache.dim() != 3:
            refuse(
                op,
                name,
                f"shape {tuple(cache.shape)}: only the BnBsH cache layout is modelled (not BnNBsD or NZ)",
            )
    if block_size <= 0 or key.shape[1] != block_size:
        raise ValueError(f"{op}: key of shape {tuple(key.shape)} is not paged with block_size {block_size}")
    if kv_lengths is None:
        raise ValueError(f"{op}: a paged cache needs actual_seq_lengths_kv")
    lengths = [int(x) for x in kv_lengths]
    if len(lengths) != requests or requests > block_table.shape[0]:
        raise ValueError(
            f"{op}: {requests} requests, {len(lengths)} KV lengths, {block_table.shape[0]} block_table rows"
        )
    return [
        (
            paged_tokens(key, block_table[b], n, kv_heads),
            paged_tokens(value, block_table[b], n, kv_heads),
            None if key_rope is None else paged_tokens(key_rope, block_table[b], n, kv_heads),
        )
        for b, n in enumerate(lengths)
    ]


def _contiguous_kv(
    op: str,
    layout: str,
    key: torch.Tensor,
    value: torch.Tensor,
    key_rope: torch.Tensor | None,
    kv_lengths: Sequence[int] | None,
    kv_heads: int,
    requests: int,
) -> list[RequestKV]:
    """Each request's ``(k, v, k_rope)`` from K/V in the query's layout (no cache): TND
    ``(T_kv, N_kv, D)`` split by the *cumulative* ``kv_lengths``; BSH/BSND/BNSD one batch row per
    request, its first ``kv_lengths[b]`` tokens (default all; one value shared)."""

    def tokens_first(x: torch.Tensor) -> torch.Tensor:  # -> (B, S, N_kv, D)
        if layout == "BSH":
            return x.reshape(x.shape[0], x.shape[1], kv_heads, -1)
        return x.transpose(1, 2) if layout == "BNSD" else x

    if layout == "TND":
        if kv_lengths is None:
            raise ValueError(f"{op}: TND needs actual_seq_lengths_kv (cumulative ends)")
        ends = [int(x) for x in kv_lengths]
        if (
            len(ends) != requests
            or (ends and ends[-1] > key.shape[0])
            or any(b < a for a, b in zip([0] + ends, ends))
        ):
            raise ValueError(
                f"{op}: actual_seq_lengths_kv {ends} is not a cumulative split of {key.shape[0]} KV tokens"
            )
        spans = list(zip([0] + ends[:-1], ends))
        return [(key[a:b], value[a:b], None if key_rope is None else key_rope[a:b]) for a, b in spans]
    k, v = tokens_first(key), tokens_first(value)
    kr = None if key_rope is None else tokens_first(key_rope)
    if k.dim() != 4 or k.shape[0] != requests or k.shape[2] != kv_heads:
        raise ValueError(
            f"{op}: key of shape {tuple(key.shape)} is not {layout} with {requests} batches of {kv_heads} heads"
        )
    lengths = [k.shape[1]] * requests if kv_lengths is None else [int(x) for x in kv_lengths]
    if len(lengths) == 1:
        lengths = lengths * requests
    if any(n > k.shape[1] for n in lengths[:requests]):
        raise ValueError(f"{op}: actual_seq_lengths_kv {lengths} exceed the {k.shape[1]} KV tokens")
    return [(k[b, :n], v[b, :n], None if kr is None else kr[b, :n]) for b, n in enumerate(lengths[:requests])]


def _fused_infer_attention(
    op: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_rope: torch.Tensor | None,
    key_rope: torch.Tensor | None,
    atten_mask: torch.Tensor | None,
    q_lengths: Sequence[int] | None,
    kv_lengths: Sequence[int] | None,
    block_table: torch.Tensor | None,
    heads: int,
    kv_heads: int,
    scale: float,
    pre_tokens: int,
    next_tokens: int,
    input_layout: str,
    sparse_mode: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FIA computation shared by v1 and v2 (their arguments differ only in names)."""
    if input_layout not in _LAYOUTS:
        refuse(op, "input_layout", f"{input_layout!r} (modelled: {', '.join(_LAYOUTS)})")
    if (query_rope is None) != (key_rope is None):
        raise ValueError(f"{op}: query_rope and key_rope must be given together")
    kv_heads = kv_heads or heads

    # per-request queries (n_b, N, D) and where their outputs go
    if input_layout == "TND":
        if query.dim() != 3 or query.shape[1] != heads:
            raise ValueError(f"{op}: query of shape {tuple(query.shape)} is not (T, {heads}, D)")
        if q_lengths is None:
            raise ValueError(f"{op}: TND needs actual_seq_lengths (cumulative ends)")
        ends = [int(x) for x in q_lengths]
        if ends and (ends[-1] > query.shape[0] or any(b < a for a, b in zip([0] + ends, ends))):
            raise ValueError(
                f"{op}: actual_seq_lengths {ends} is not a cumulative split of {query.shape[0]} tokens"
            )
        spans = list(zip([0] + ends[:-1], ends))
        tokens = query
        rope_tokens = query_rope
    else:
        if input_layout == "BSH":
            if query.dim() != 3 or query.shape[2] % heads:
                raise ValueError(f"{op}: query of shape {tuple(query.shape)} is not (B, S, {heads} * D)")
            batched = query.reshape(query.shape[0], query.shape[1], heads, -1)
            rope = None if query_rope is None else query_rope.reshape(*batched.shape[:3], -1)
        elif input_layout == "BSND":
            batched, rope = query, query_rope
        else:  # BNSD
            batched = query.transpose(1, 2)
            rope = None if query_rope is None else query_rope.transpose(1, 2)
        if batched.dim() != 4 or batched.shape[2] != heads:
            raise ValueError(
                f"{op}: query of shape {tuple(query.shape)} is not {input_layout} with {heads} heads"
            )
        batch, seq = batched.shape[0], batched.shape[1]
        lengths = [seq] * batch if q_lengths is None else [int(x) for x in q_lengths]
        if len(lengths) == 1:
            lengths = lengths * batch  # one length is shared by every batch (the document)
        if len(lengths) < batch or any(n > seq for n in lengths[:batch]):
            raise ValueError(f"{op}: actual_seq_lengths {lengths} do not fit a query of {batch} x {seq}")
        spans = [(b * seq, b * seq + n) for b, n in enumerate(lengths[:batch])]
        tokens = batched.reshape(batch * seq, heads, -1)
        rope_tokens = None if rope is None else rope.reshape(batch * seq, heads, -1)
    if block_table is None:
        kvs = _contiguous_kv(op, input_layout, key, value, key_rope, kv_lengths, kv_heads, len(spans))
    else:
        kvs = _paged_kv(op, key, value, key_rope, kv_lengths, block_table, block_size, kv_heads, len(spans))

    # the mask. One query per request without rope ignores sparse_mode (the document's special
    # constraint), so it sees its whole KV, as a causal query at the end of its KV does; an explicit
    # mask or a pre/next_tokens band would still apply there and are not modelled.
    single_token = all(end - start <= 1 for start, end in spans) and query_rope is None
    causal_modes = (_LEFT_UP_CAUSAL, _RIGHT_DOWN_CAUSAL)
    causal: str | None = None
    if sparse_mode in causal_modes and not single_token:
        _check_compressed_causal_mask(op, atten_mask)
        causal = "right_down" if sparse_mode == _RIGHT_DOWN_CAUSAL else "left_up"
    elif sparse_mode == _NO_MASK or single_token:
        if atten_mask is not None and sparse_mode not in causal_modes:
            refuse(op, "atten_mask", f"an explicit mask with sparse_mode {sparse_mode}")
        if (pre_tokens, next_tokens) != (_UNBOUNDED, _UNBOUNDED) and sparse_mode not in causal_modes:
            refuse(op, "pre_tokens/next_tokens", f"a band with sparse_mode {sparse_mode}")
    else:
        refuse(op, "sparse_mode", f"{sparse_mode} (modelled: 0, 2, 3)")

    v_dim = kvs[0][1].shape[-1] if kvs else value.shape[-1] // kv_heads
    out = torch.zeros(tokens.shape[0], heads, v_dim, dtype=torch.float32)
    lse = torch.zeros(tokens.shape[0], heads, dtype=torch.float32)
    for (start, end), (k, v, k_rope) in zip(spans, kvs):
        if end == start:
            continue
        q = tokens[start:end]
        if query_rope is not None:
            q = torch.cat([q, rope_tokens[start:end]], dim=-1)
            k = torch.cat([k, k_rope], dim=-1)
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"{op}: query head dim {q.shape[-1]} != key head dim {k.shape[-1]}")
        out[start:end], lse[start:end] = attend(q, k, v, scale, causal)

    if input_layout == "TND":
        return out.to(query.dtype), lse[..., None]
    shaped = out.reshape(batch, seq, heads, -1)
    lse_bnsd = lse.reshape(batch, seq, heads).transpose(1, 2)[..., None]
    if input_layout == "BSH":
        shaped = shaped.reshape(batch, seq, -1)
    elif input_layout == "BNSD":
        shaped = shaped.transpose(1, 2)
    return shaped.to(query.dtype), lse_bnsd


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = _UNBOUNDED,
    next_tokens: int = _UNBOUNDED,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
    **unmodelled: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_fused_infer_attention_score``.

    * layouts: ``TND`` (``query (T, N, D)``, ``actual_seq_lengths`` the *cumulative* ends of the
      requests), ``BSH`` ``(B, S, N*D)``, ``BSND``, ``BNSD`` (``actual_seq_lengths`` per batch,
      default S; one value is shared by all).
    * K/V paged (``block_table`` set): ``(blocks, block_size, N_kv * D)``,
      ``actual_seq_lengths_kv[b]`` request ``b``'s KV length. Not paged: K/V in the query's
      layout, ``actual_seq_lengths_kv`` cumulative in TND, per batch otherwise.
    * ``sparse_mode=3`` (rightDownCausal): query ``i`` of a request with ``n`` queries and ``L``
      KV tokens sees KV ``j <= L - n + i``; ``2`` (leftUpCausal): ``j <= i``; both take the fixed
      compressed (2048, 2048) causal ``atten_mask``. ``0`` without mask or band: the whole KV.
      One query per request without rope: ``sparse_mode`` is ignored (the document).
    * MLA: ``query_rope``/``key_rope`` extend the query and key dims (scores over both);
      ``value`` gives the output.
    * ``inner_precise`` 0/1 choose precision/speed on the device; the reference is float32 either way.

    Returns ``(attention_out, softmax_lse)``: out in the query's layout and dtype with
    ``D = value dim``; lse float32 ``(T, N, 1)`` (TND) or ``(B, N, S, 1)``, computed whatever
    ``softmax_lse_flag`` says (-inf for a query that sees no key). Quantization, shared prefixes,
    ``pse_shift`` and other masks are refused.
    """
    refuse_given(_FIA, unmodelled)
    if antiquant_mode:
        refuse(_FIA, "antiquant_mode", f"{antiquant_mode} (quantized KV)")
    if inner_precise not in (0, 1):
        refuse(_FIA, "inner_precise", f"{inner_precise} (row-invalid correction modes)")
    return _fused_infer_attention(
        _FIA,
        query,
        key,
        value,
        query_rope=query_rope,
        key_rope=key_rope,
        atten_mask=atten_mask,
        q_lengths=actual_seq_lengths,
        kv_lengths=actual_seq_lengths_kv,
        block_table=block_table,
        heads=num_heads,
        kv_heads=num_key_value_heads,
        scale=scale,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        input_layout=input_layout,
        sparse_mode=sparse_mode,
        block_size=block_size,
    )


def _fused_infer_attention_score_out(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    workspace: torch.Tensor | None = None,
    out: Sequence[torch.Tensor] | None = None,
    attention_out: torch.Tensor | None = None,
    softmax_lse: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_fused_infer_attention_score.out``: the same computation written into
    ``out=[attention_out, softmax_lse]`` (sglang's graph decode); ``softmax_lse`` is written only
    with ``softmax_lse_flag`` (sglang passes a 1-element placeholder). The workspace from
    ``_npu_fused_infer_attention_score_get_max_workspace`` is device scratch memory."""
    if out is not None:
        attention_out, softmax_lse = out
    if attention_out is None or softmax_lse is None:
        raise ValueError(f"{_FIA}.out: needs out=[attention_out, softmax_lse]")
    result, lse = npu_fused_infer_attention_score(query, key, value, **kwargs)
    if attention_out.shape != result.shape:
        raise ValueError(f"{_FIA}.out: attention_out {tuple(attention_out.shape)} != {tuple(result.shape)}")
    attention_out.copy_(result)
    if kwargs.get("softmax_lse_flag"):
        softmax_lse.copy_(lse.reshape(softmax_lse.shape))
    return attention_out, softmax_lse


npu_fused_infer_attention_score.out = _fused_infer_attention_score_out  # type: ignore[attr-defined]


def _npu_fused_infer_attention_score_get_max_workspace(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    """``torch_npu._npu_fused_infer_attention_score_get_max_workspace``: the device scratch buffer
    for a later ``.out`` call with the same arguments; on the CPU an empty byte tensor. Arguments
    outside the modelled forms are refused here as in the call itself."""
    refuse_given(_FIA, {k: v for k, v in kwargs.items() if k not in _FIA_KEYWORDS})
    return torch.empty(0, dtype=torch.uint8)


_FIA_KEYWORDS = frozenset(npu_fused_infer_attention_score.__kwdefaults__)


def npu_fused_infer_attention_score_v2(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_query_heads: int = 1,
    num_key_value_heads: int = 0,
    softmax_scale: float = 1.0,
    pre_tokens: int = _UNBOUNDED,
    next_tokens: int = _UNBOUNDED,
    input_layout: str = "BSH",
    sparse_mode: int = 0,
    block_size: int = 0,
    inner_precise: int = 0,
    return_softmax_lse: bool = False,
    **unmodelled: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_fused_infer_attention_score_v2``: the v1 computation (see
    ``npu_fused_infer_attention_score``) under the v2 names: ``num_query_heads``,
    ``softmax_scale``, ``actual_seq_qlen`` (cumulative in TND, per batch otherwise),
    ``actual_seq_kvlen``, ``return_softmax_lse``. ``learnable_sink`` (attention sinks), the
    quantization arguments and ``sparse_mode`` 4 (sliding window) are refused.

    sglang: ``forward_extend``'s per-request BSND prefill over the paged prefix, ``forward_decode``
    with sinks or sliding window (refused), the MTP/verify paths."""
    refuse_given(_FIA_V2, unmodelled)
    if inner_precise not in (0, 1):
        refuse(_FIA_V2, "inner_precise", f"{inner_precise} (row-invalid correction modes)")
    return _fused_infer_attention(
        _FIA_V2,
        query,
        key,
        value,
        query_rope=query_rope,
        key_rope=key_rope,
        atten_mask=atten_mask,
        q_lengths=actual_seq_qlen,
        kv_lengths=actual_seq_kvlen,
        block_table=block_table,
        heads=num_query_heads,
        kv_heads=num_key_value_heads,
        scale=softmax_scale,
        pre_tokens=pre_tokens,
        next_tokens=next_tokens,
        input_layout=input_layout,
        sparse_mode=sparse_mode,
        block_size=block_size,
    )


def npu_attention_update(
    lse: Sequence[torch.Tensor], local_out: Sequence[torch.Tensor], update_type: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``torch_npu.npu_attention_update``: partial attention outputs ``O_i`` (``(rows, D)``) over
    disjoint key sets, with their log-sum-exps ``lse_i`` (``(rows,)``, float32), merged:
    ``lse_m = log(sum_i exp(lse_i))``, ``O = sum_i O_i * exp(lse_i - lse_m)``. Returns ``(O, lse_m)``
    in ``local_out``'s dtype (``lse_m`` only with ``update_type`` 1).

    sglang: the MLA prefill with a cached prefix merges the attention over the new tokens with the
    attention over the prefix (``forward_extend``), and context-parallel prefill merges ranks."""
    op = "npu_attention_update"
    if update_type not in (0, 1):
        refuse(op, "update_type", f"{update_type} (documented: 0 or 1)")
    if not lse or len(lse) != len(local_out):
        raise ValueError(f"{op}: {len(lse)} lse tensors for {len(local_out)} outputs")
    stacked_lse = torch.stack([x.float().reshape(-1) for x in lse])  # (SP, rows)
    outs = torch.stack([o.float() for o in local_out])  # (SP, rows, D)
    if outs.shape[1] != stacked_lse.shape[1]:
        raise ValueError(f"{op}: lse rows {stacked_lse.shape[1]} != out rows {outs.shape[1]}")
    merged_lse = torch.logsumexp(stacked_lse, dim=0)
    weights = torch.exp(stacked_lse - merged_lse).nan_to_num(0.0)  # all -inf rows: no contribution
    merged = (outs * weights[..., None]).sum(dim=0).to(local_out[0].dtype)
    return merged, merged_lse if update_type == 1 else None


def int_list(value: torch.Tensor | Sequence[int] | None) -> list[int] | None:
    """Lengths given as a tensor or a list (sglang passes both), as a list of ints."""
    if value is None:
        return None
    return [int(x) for x in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def _lengths(op: str, name: str, value: torch.Tensor | Sequence[int] | None) -> list[int]:
    lengths = int_list(value)
    if lengths is None:
        raise ValueError(f"{op}: {name} is required")
    return lengths


def _paged_caches(
    op: str, key_cache: torch.Tensor, value_cache: torch.Tensor, kv_heads: int
) -> tuple[int, int]:
    """The ATB caches are ``(blocks, block_size, N_kv, D)``; returns ``(D, Dv)``."""
    if key_cache.dim() != 4 or key_cache.shape[2] != kv_heads:
        refuse(
            op, "key_cache", f"shape {tuple(key_cache.shape)}, modelled (blocks, block_size, {kv_heads}, D)"
        )
    if value_cache.shape[:3] != key_cache.shape[:3]:
        raise ValueError(
            f"{op}: value_cache {tuple(value_cache.shape)} does not page like {tuple(key_cache.shape)}"
        )
    return key_cache.shape[3], value_cache.shape[3]


def _npu_paged_attention(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor | Sequence[int],
    out: torch.Tensor,
    **unmodelled: Any,
) -> None:
    """``torch_npu._npu_paged_attention`` (ATB PagedAttention, decode): ``query (B, N, D)``, one
    token per request, attends to all ``context_lens[b]`` tokens of its paged cache
    ``(blocks, block_size, N_kv, D)``; writes ``out (B, N, Dv)``.

    sglang: ``forward_decode`` without FIA (the default)."""
    op = "_npu_paged_attention"
    refuse_given(op, unmodelled)
    lens = _lengths(op, "context_lens", context_lens)
    _, v_dim = _paged_caches(op, key_cache, value_cache, num_kv_heads)
    q = query.reshape(query.shape[0], num_heads, -1)
    if q.shape[0] != len(lens) or block_table.shape[0] < len(lens):
        raise ValueError(
            f"{op}: {q.shape[0]} queries, {len(lens)} context_lens, {block_table.shape[0]} table rows"
        )
    result = torch.zeros(q.shape[0], num_heads, v_dim, dtype=torch.float32)
    for b, length in enumerate(lens):
        k = paged_tokens(key_cache, block_table[b], length, num_kv_heads)
        v = paged_tokens(value_cache, block_table[b], length, num_kv_heads)
        result[b : b + 1], _ = attend(q[b : b + 1], k, v, scale_value, None)
    out.copy_(result.reshape(out.shape).to(out.dtype))


def _npu_flash_attention_qlens(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    mask: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: torch.Tensor | Sequence[int],
    context_lens: torch.Tensor | Sequence[int],
    scale_value: float,
    num_heads: int,
    num_kv_heads: int,
    out: torch.Tensor,
    **unmodelled: Any,
) -> None:
    """``torch_npu._npu_flash_attention_qlens`` (ATB paged prefill with query lengths): the
    ``seq_len[b]`` new tokens of request ``b`` (``query (T, N*D)`` or ``(T, N, D)``, requests one
    after another) attend causally to its ``context_lens[b]`` cached tokens (cache
    ``(blocks, block_size, N_kv, D)``, the new tokens last): query ``i`` sees ``j <= L - n + i``.
    ``mask`` is the causal mask sglang builds (nonzero strictly above the diagonal); the kernel is
    causal only, so any other mask is refused. Writes ``out (T, N*Dv)``.

    Limit: blocks below 128 tokens are read wrongly by the kernel (sglang#38196, garbage output
    without error); the reference does not model that and refuses them.

    sglang: ``forward_extend`` without FIA for causal layers with head size <= 128 (the default)."""
    op = "_npu_flash_attention_qlens"
    refuse_given(op, unmodelled)
    _, v_dim = _paged_caches(op, key_cache, value_cache, num_kv_heads)
    if key_cache.shape[1] < _QLENS_MIN_BLOCK:
        refuse(op, "key_cache", f"block size {key_cache.shape[1]} below {_QLENS_MIN_BLOCK} (sglang#38196)")
    side = min(mask.shape[-1], mask.shape[-2])
    if not torch.equal(
        mask.reshape(-1, mask.shape[-2], mask.shape[-1])[0, :side, :side] != 0,
        torch.ones(side, side, dtype=torch.bool).triu(1),
    ):
        refuse(op, "mask", "not the causal mask (nonzero strictly above the diagonal)")
    q_lens = _lengths(op, "seq_len", seq_len)
    kv_lens = _lengths(op, "context_lens", context_lens)
    q = query.reshape(query.shape[0], num_heads, -1)
    if (
        len(q_lens) != len(kv_lens)
        or sum(q_lens) != q.shape[0]
        or any(n > L for n, L in zip(q_lens, kv_lens))
    ):
        raise ValueError(
            f"{op}: seq_len {q_lens} / context_lens {kv_lens} do not fit {q.shape[0]} query tokens"
        )
    result = torch.zeros(q.shape[0], num_heads, v_dim, dtype=torch.float32)
    start = 0
    for b, (n, length) in enumerate(zip(q_lens, kv_lens)):
        k = paged_tokens(key_cache, block_table[b], length, num_kv_heads)
        v = paged_tokens(value_cache, block_table[b], length, num_kv_heads)
        result[start : start + n], _ = attend(q[start : start + n], k, v, scale_value, "right_down")
        start += n
    out.copy_(result.reshape(out.shape).to(out.dtype))


def _npu_paged_attention_mla(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor | Sequence[int],
    mla_vheadsize: int,
    out: torch.Tensor,
    **unmodelled: Any,
) -> None:
    """``torch_npu._npu_paged_attention_mla`` (ATB MLA paged decode): as ``_npu_paged_attention``
    over one cache ``(blocks, block_size, N_kv, latent + rope)`` that is both key (all dims) and
    value (its first ``mla_vheadsize`` dims, the latent); ``query (B, N, latent + rope)``; writes
    ``out (B, N, mla_vheadsize)``.

    sglang: ``forward_decode`` for MLA without FIA (``ascend_backend.py``)."""
    op = "_npu_paged_attention_mla"
    refuse_given(op, unmodelled)
    lens = _lengths(op, "context_lens", context_lens)
    if (
        key_cache.dim() != 4
        or key_cache.shape[2] != num_kv_heads
        or not 0 < mla_vheadsize <= key_cache.shape[3]
    ):
        refuse(op, "key_cache", f"shape {tuple(key_cache.shape)} with mla_vheadsize {mla_vheadsize}")
    q = query.reshape(query.shape[0], num_heads, -1)
    if q.shape[0] != len(lens) or block_table.shape[0] < len(lens):
        raise ValueError(
            f"{op}: {q.shape[0]} queries, {len(lens)} context_lens, {block_table.shape[0]} table rows"
        )
    result = torch.zeros(q.shape[0], num_heads, mla_vheadsize, dtype=torch.float32)
    for b, length in enumerate(lens):
        k = paged_tokens(key_cache, block_table[b], length, num_kv_heads)
        result[b : b + 1], _ = attend(q[b : b + 1], k, k[..., :mla_vheadsize], scale_value, None)
    out.copy_(result.reshape(out.shape).to(out.dtype))


def _npu_flash_attention_unpad(
    *,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    seq_len: torch.Tensor | Sequence[int],
    scale_value: float,
    num_heads: int,
    num_kv_heads: int,
    out: torch.Tensor,
    **unmodelled: Any,
) -> None:
    """``torch_npu._npu_flash_attention_unpad`` (ATB unpadded flash attention, no cache): the
    sequences of ``seq_len`` lie one after another in ``query (T, N, D)``, ``key``/``value``
    ``(T, N_kv, D)``; each attends to itself without a mask (a vision encoder); writes ``out``.

    sglang: ``VisionAscendAttention`` (``srt/layers/attention/vision.py``, 0.5.4-0.5.12)."""
    op = "_npu_flash_attention_unpad"
    refuse_given(op, unmodelled)
    lens = _lengths(op, "seq_len", seq_len)
    q = query.reshape(query.shape[0], num_heads, -1)
    k = key.reshape(key.shape[0], num_kv_heads, -1)
    v = value.reshape(value.shape[0], num_kv_heads, -1)
    if sum(lens) != q.shape[0] or k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: seq_len {lens} does not split {q.shape[0]} tokens")
    result = torch.zeros(q.shape[0], num_heads, v.shape[-1], dtype=torch.float32)
    start = 0
    for n in lens:
        result[start : start + n], _ = attend(
            q[start : start + n], k[start : start + n], v[start : start + n], scale_value, None
        )
        start += n
    out.copy_(result.reshape(out.shape).to(out.dtype))


KERNELS = {
    "npu_fused_infer_attention_score": npu_fused_infer_attention_score,
    "npu_fused_infer_attention_score_v2": npu_fused_infer_attention_score_v2,
    "_npu_fused_infer_attention_score_get_max_workspace": _npu_fused_infer_attention_score_get_max_workspace,
    "_npu_paged_attention": _npu_paged_attention,
    "npu_attention_update": npu_attention_update,
    "_npu_paged_attention_mla": _npu_paged_attention_mla,
    "_npu_flash_attention_qlens": _npu_flash_attention_qlens,
    "_npu_flash_attention_unpad": _npu_flash_attention_unpad,
}
