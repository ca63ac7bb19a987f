"""CPU references of the Ascend ops the dry run's model forwards call (torch_npu's and sgl-kernel-npu's).

The dry run (``ascendsim``) answers every Ascend call sglang makes while it serves a small model
with a plain PyTorch implementation of the op's documented semantics (each reference cites its
document). A reference models exactly the argument forms sglang passes and raises
``NotImplementedError`` naming the argument otherwise, so a call outside that subset is a
simulation gap, never a silent pass.

``DRY_RUN_KERNELS`` is keyed by the name as sglang reaches it: ``torch_npu.<op>`` (also answered as
``torch.ops.npu.<op>``, the same op's dispatcher name), ``torch.ops.npu.<op>`` for an op only
sgl-kernel-npu registers there, and ``sgl_kernel_npu.<module>.<function>``
for sgl-kernel-npu's Python entry points (a function around its own Triton kernel: the reference
is of the whole function, the kernel's source its documentation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _rms_normalised(
    x: torch.Tensor, gamma: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x / sqrt(mean(x^2) + eps) * gamma`` over the trailing dims ``gamma`` covers, computed in
    float32 as the kernel does; returns ``(y in x's dtype, rstd in float32)``."""
    if gamma.dim() == 0 or tuple(x.shape[-gamma.dim() :]) != tuple(gamma.shape):
        raise ValueError(
            f"gamma of shape {tuple(gamma.shape)} does not match the trailing dims of x {tuple(x.shape)}"
        )
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    values = x.float()
    rstd = torch.rsqrt(values.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (values * rstd * gamma.float()).to(x.dtype), rstd


def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)``
    (Ascend PyTorch API reference, "(beta) torch_npu.npu_rms_norm", hiascend.com
    Pytorch/700/apiref/apilist/ptaoplist_000860): ``RmsNorm(x)_i = x_i / Rms(x) * g_i`` with
    ``Rms(x) = sqrt(mean(x^2) + eps)`` over the dims ``gamma`` covers; the outputs are the normalised
    ``y`` and ``rstd = 1 / Rms(x)`` (float32, kept dims)."""
    return _rms_normalised(self, gamma, epsilon)


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) ->
    (Tensor, Tensor, Tensor)`` (the AddRmsNorm operator, CANN ``aclnnAddRmsNorm``): the residual add
    fused with RmsNorm: ``x = x1 + x2``, outputs ``(RmsNorm(x) * gamma, rstd, x)``; sglang's
    ``RMSNorm.forward_npu`` passes the residual as ``x1`` and keeps ``y`` and ``x`` (the new
    residual)."""
    if x1.shape != x2.shape:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ in shape")
    added = (x1.float() + x2.float()).to(x1.dtype)
    y, rstd = _rms_normalised(added, gamma, epsilon)
    return y, rstd, added


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch_npu.npu_swiglu(Tensor self, int dim=-1) -> Tensor`` (Ascend PyTorch API reference,
    "(beta) torch_npu.npu_swiglu", hiascend.com Pytorch/600/apiref/apilist/ptaoplist_000834): ``A``
    and ``B`` are the first and second halves of the input along ``dim`` (its size must be even);
    the output is ``swish(A) * B = A * sigmoid(A) * B``, in the input's dtype."""
    if self.shape[dim] % 2:
        raise ValueError(f"npu_swiglu: dim {dim} of shape {tuple(self.shape)} is not even")
    first, second = self.float().chunk(2, dim=dim)
    return (torch.nn.functional.silu(first) * second).to(self.dtype)


def npu_mrope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    *,
    mrope_section: list[int] | None = None,
    rotary_mode: str = "half",
    **unsupported: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_mrope`` (the RopeWithSinCosCache operator, CANN ``aclnnRopeWithSinCosCache``,
    hiascend.com CANNCommunityEdition/850alpha002/API/aolapi/context/aclnnRopeWithSinCosCache.md) in
    its rope mode: ``positions`` of shape ``(T,)`` (``mrope_section`` unset or all zeros, as
    sglang's ``RotaryEmbedding.forward_npu`` passes it), ``cos_sin_cache`` of shape
    ``(max_position, rotary_dim)`` holding ``[cos | sin]``; ``query``/``key`` are ``(T, heads *
    head_size)`` and each head's first ``rotary_dim`` values are rotated, the rest pass through.
    ``rotary_mode="half"`` (GPT-NeoX) rotates the two halves ``x1, x2``; ``"interleave"`` (GPT-J)
    rotates the even and odd elements: ``(x1 cos - x2 sin, x2 cos + x1 sin)``. Computed in float32,
    returned in the inputs' dtypes. The multimodal mode (positions ``(3, T)``) is not modelled."""
    given = {k: v for k, v in unsupported.items() if v not in (None, "default")}
    if given:
        raise NotImplementedError(f"CPU reference of npu_mrope: unsupported {sorted(given)}")
    if positions.dim() != 1 or any(mrope_section or ()):
        raise NotImplementedError(
            f"CPU reference of npu_mrope: only the rope mode (positions (T,), no mrope_section); got "
            f"positions {tuple(positions.shape)}, mrope_section {mrope_section}"
        )
    if rotary_mode not in ("half", "interleave"):
        raise NotImplementedError(f"CPU reference of npu_mrope: rotary_mode={rotary_mode!r}")
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)  # (T, rotary_dim / 2)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[0] != positions.shape[0] or x.shape[1] % head_size:
            raise ValueError(
                f"npu_mrope: {tuple(x.shape)} is not ({positions.shape[0]}, heads * {head_size})"
            )
        heads = x.float().reshape(x.shape[0], -1, head_size)
        rotated, passed = heads[..., :rotary_dim], heads[..., rotary_dim:]
        if rotary_mode == "half":
            x1, x2 = rotated.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rotated, passed), dim=-1).reshape(x.shape).to(x.dtype)

    return rotate(query), rotate(key)


def _npu_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    """``torch_npu._npu_reshape_and_cache`` (ATB ``ReshapeAndCacheOperation``, CANN ascendtb API
    reference, hiascend.com canncommercial/800/apiref/ascendtbapi/ascendtb_01_0073), in place, ND
    caches: ``key``/``value`` are ``(num_tokens, num_heads, head_size)``, the caches ``(num_blocks,
    block_size, num_heads, head_size)``, ``slot_indices`` int32 ``(num_tokens,)`` the slots
    ``block_id * block_size + offset``; token ``i``'s key and value go to their cache's slot
    ``slot_indices[i]`` (a negative slot is skipped, as the op's tests expect). The dtypes of the
    four tensors must agree (the operation's constraint)."""
    for name, tokens, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if tokens.dim() != 3 or cache.dim() != 4 or tuple(cache.shape[2:]) != tuple(tokens.shape[1:]):
            raise ValueError(
                f"_npu_reshape_and_cache: {name} {tuple(tokens.shape)} does not fit its cache {tuple(cache.shape)}"
                " ((num_tokens, heads, head_size) into (blocks, block_size, heads, head_size))"
            )
        if tokens.dtype != cache.dtype:
            raise TypeError(f"_npu_reshape_and_cache: {name} is {tokens.dtype}, its cache {cache.dtype}")
    if slot_indices.dtype != torch.int32 or tuple(slot_indices.shape) != (key.shape[0],):
        raise TypeError(
            f"_npu_reshape_and_cache: slot_indices {slot_indices.dtype} {tuple(slot_indices.shape)}, "
            f"not int32 ({key.shape[0]},)"
        )
    slots = slot_indices.long()
    kept = slots >= 0
    for tokens, cache in ((key, key_cache), (value, value_cache)):
        flat = cache.view(-1, *cache.shape[2:])
        if kept.any() and int(slots[kept].max()) >= flat.shape[0]:
            raise IndexError(
                f"_npu_reshape_and_cache: slot {int(slots.max())} beyond the cache's {flat.shape[0]}"
            )
        flat[slots[kept]] = tokens[kept]


def _paged_causal_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_lens: list[int],
    kv_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Attention of each request's queries over its paged KV, causal aligned to the end of the KV
    (the request's ``n`` queries are its last ``n`` tokens: query ``i`` sees KV tokens
    ``j <= L - n + i``). ``query`` is ``(T, N, D)`` (requests one after another), the caches
    ``(blocks, block_size, N_kv, D)``; request ``b``'s KV token ``j`` is in block
    ``block_table[b, j // block_size]``; GQA: query head ``h`` reads KV head ``h // (N / N_kv)``.
    Returns ``(T, N, Dv)`` float32."""
    if len(query_lens) != len(kv_lens) or len(query_lens) > block_table.shape[0]:
        raise ValueError(
            f"{len(query_lens)} query lengths, {len(kv_lens)} KV lengths, block_table of {block_table.shape[0]} rows"
        )
    if sum(query_lens) != query.shape[0]:
        raise ValueError(f"query lengths {query_lens} do not add up to the {query.shape[0]} query tokens")
    heads, kv_heads, block_size = query.shape[1], key_cache.shape[2], key_cache.shape[1]
    if heads % kv_heads or query.shape[2] != key_cache.shape[3]:
        raise ValueError(f"query {tuple(query.shape)} does not fit the key cache {tuple(key_cache.shape)}")
    out = torch.zeros(query.shape[0], heads, value_cache.shape[3], dtype=torch.float32)
    start = 0
    for b, (n, kv_len) in enumerate(zip(query_lens, kv_lens)):
        if n > kv_len:
            raise ValueError(f"request {b}: {n} queries but only {kv_len} KV tokens")
        blocks = -(-kv_len // block_size)
        if blocks > block_table.shape[1]:
            raise ValueError(
                f"request {b}: {kv_len} KV tokens need {blocks} blocks, block_table has {block_table.shape[1]}"
            )
        rows = block_table[b, :blocks].long()
        k = key_cache[rows].flatten(0, 1)[:kv_len].float().repeat_interleave(heads // kv_heads, dim=1)
        v = value_cache[rows].flatten(0, 1)[:kv_len].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start : start + n].float(), k) * scale
        visible = torch.arange(kv_len)[None, :] <= (kv_len - n + torch.arange(n))[:, None]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[start : start + n] = torch.einsum("hqk,khd->qhd", weights, v)
        start += n
    return out


def _npu_flash_attention_qlens(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    mask: torch.Tensor,
    seq_len: torch.Tensor,
    context_lens: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    out: torch.Tensor,
) -> None:
    """``torch_npu._npu_flash_attention_qlens`` (op-plugin ``ops/atb/FlashAttentionQlensAtb.cpp``: ATB
    ``SelfAttentionOperation`` with ``calcType=PREFIX_ENCODER``, ``maskType=MASK_TYPE_NORM_COMPRESS``,
    ``isTriuMask=1``; CANN ascendtb API reference "SelfAttentionOperation"): a prefill over a paged
    KV cache that already holds the new tokens. ``query`` ``(T, num_heads * D)`` (or ``(T, num_heads,
    D)``), ``seq_len[b]`` request ``b``'s query tokens, ``context_lens[b]`` its KV tokens (prefix +
    new), the caches ``(blocks, block_size, num_kv_heads, D)`` read through ``block_table``; causal
    aligned to the end of each request's KV (the compressed upper-triangular ``mask`` is the fixed
    mask that mode takes and carries no information). Scores are scaled by ``scale_value``. Writes
    ``out`` ``(T, num_heads * Dv)``."""
    if key_cache.dim() != 4 or value_cache.dim() != 4:
        raise NotImplementedError(
            f"CPU reference of _npu_flash_attention_qlens: caches {tuple(key_cache.shape)}, "
            "not ND (blocks, block_size, heads, head_dim)"
        )
    if key_cache.shape[2] != num_kv_heads or query.numel() != query.shape[0] * num_heads * key_cache.shape[3]:
        raise ValueError(
            f"_npu_flash_attention_qlens: query {tuple(query.shape)} / key cache {tuple(key_cache.shape)} "
            f"do not have {num_heads} / {num_kv_heads} heads of {key_cache.shape[3]}"
        )
    result = _paged_causal_attention(
        query.reshape(query.shape[0], num_heads, -1),
        key_cache,
        value_cache,
        block_table,
        [int(n) for n in seq_len],
        [int(n) for n in context_lens],
        scale_value,
    )
    out.view(result.shape).copy_(result.to(out.dtype))


def split_qkv_rmsnorm_rope(
    input: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    q_hidden_size: int,
    kv_hidden_size: int,
    head_dim: int,
    eps: float | None = None,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
    is_neox_style: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sgl-kernel-npu ``sgl_kernel_npu/norm/split_qkv_rmsnorm_rope.py::split_qkv_rmsnorm_rope`` (its
    Triton kernel's source is the documentation; sgl-project/sgl-kernel-npu f425bdf): ``input``
    ``(T, q + 2 kv)`` is split into ``q``, ``k``, ``v``; when ``eps`` is given each head of ``q``
    and ``k`` is RMS-normalised over ``head_dim`` and scaled by ``q_weight``/``k_weight`` (plus
    ``q_bias``/``k_bias`` when given); then each head's first ``rope_dim = sin.shape[-1]`` values
    are rotated with token ``t``'s row of ``sin``/``cos`` (``(T, ..., rope_dim)``, contiguous):
    NeoX style ``x * cos + cat(-x2, x1) * sin`` over the halves ``x1, x2`` (``sin``/``cos`` used as
    given), GPT-J style over the even/odd elements with the first half of ``sin``/``cos`` repeated
    pairwise; ``v`` is copied. The kernel's own preconditions (``head_dim`` a power of two,
    ``q`` a multiple of ``kv``) are asserted as it asserts them. Returns ``(q, k, v)`` in the
    input's dtype."""
    assert 1 << (head_dim - 1).bit_length() == head_dim
    assert q_hidden_size % kv_hidden_size == 0
    tokens = input.shape[0]
    rope_dim = sin.shape[-1]
    if input.dim() != 2 or input.shape[1] != q_hidden_size + 2 * kv_hidden_size:
        raise ValueError(
            f"split_qkv_rmsnorm_rope: input {tuple(input.shape)} is not (T, {q_hidden_size} + 2 * {kv_hidden_size})"
        )
    if sin.numel() != tokens * rope_dim or cos.numel() != tokens * rope_dim or rope_dim > head_dim:
        raise ValueError(
            f"split_qkv_rmsnorm_rope: sin {tuple(sin.shape)} / cos {tuple(cos.shape)} are not {tokens} rows of a rope dim <= {head_dim}"
        )
    sin_rows = sin.reshape(tokens, 1, rope_dim).float()
    cos_rows = cos.reshape(tokens, 1, rope_dim).float()
    if not is_neox_style:
        half = rope_dim // 2
        sin_rows = sin_rows[..., :half].repeat_interleave(2, dim=-1)
        cos_rows = cos_rows[..., :half].repeat_interleave(2, dim=-1)
    q, k, v = input.split([q_hidden_size, kv_hidden_size, kv_hidden_size], dim=-1)

    def normalised_and_rotated(
        x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        heads = x.float().reshape(tokens, -1, head_dim)
        if eps is not None:
            heads = heads * torch.rsqrt(heads.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
            if bias is not None:
                heads = heads + bias.float()
        rotated = heads[..., :rope_dim]
        if is_neox_style:
            x1, x2 = rotated.chunk(2, dim=-1)
            turned = torch.cat((-x2, x1), dim=-1)
        else:
            x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
            turned = torch.stack((-x2, x1), dim=-1).flatten(-2)
        heads = torch.cat((rotated * cos_rows + turned * sin_rows, heads[..., rope_dim:]), dim=-1)
        return heads.reshape(tokens, -1).to(input.dtype)

    return (
        normalised_and_rotated(q, q_weight, q_bias),
        normalised_and_rotated(k, k_weight, k_bias),
        v.contiguous(),
    )


def _npu_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """``torch_npu._npu_paged_attention`` (op-plugin ``ops/atb/PagedAttentionAtb.cpp``: ATB
    ``PagedAttentionOperation``, CANN ascendtb API reference "PagedAttentionOperation"): decode
    attention, one query token per request. ``query`` ``(B, num_heads, D)``, the caches ``(blocks,
    block_size, num_kv_heads, D)`` read through ``block_table``, ``context_lens[b]`` request ``b``'s
    KV tokens (its new token included), all of which its query sees; scores scaled by
    ``scale_value``. Writes ``out`` ``(B, num_heads, Dv)``."""
    if key_cache.dim() != 4 or value_cache.dim() != 4:
        raise NotImplementedError(
            f"CPU reference of _npu_paged_attention: caches {tuple(key_cache.shape)}, "
            "not ND (blocks, block_size, heads, head_dim)"
        )
    if query.dim() != 3 or query.shape[1] != num_heads or key_cache.shape[2] != num_kv_heads:
        raise ValueError(
            f"_npu_paged_attention: query {tuple(query.shape)} / key cache {tuple(key_cache.shape)} "
            f"do not have {num_heads} / {num_kv_heads} heads"
        )
    result = _paged_causal_attention(
        query,
        key_cache,
        value_cache,
        block_table,
        [1] * query.shape[0],
        [int(n) for n in context_lens],
        scale_value,
    )
    out.view(result.shape).copy_(result.to(out.dtype))


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor,
    Tensor, Tensor)`` (CANN ``aclnnMoeGatingTopKSoftmax``, hiascend.com CANNCommunityEdition/
    850alpha002/API/aolapi/context/aclnnMoeGatingTopKSoftmax.md): ``y, expert_idx = topK(softmax(x,
    -1), k)`` (``y`` in ``x``'s dtype, ``expert_idx`` int32) and ``row_idx = arange(rows * k)
    .reshape(k, rows).T`` (int32): the position of each (row, choice) in the choice-major order
    the routing ops expect. ``finished`` (rows whose experts are set to ``num_expert``) is not
    modelled: sglang passes none."""
    if finished is not None:
        raise NotImplementedError("CPU reference of npu_moe_gating_top_k_softmax: finished")
    if x.dim() != 2:
        raise NotImplementedError(
            f"CPU reference of npu_moe_gating_top_k_softmax: x of shape {tuple(x.shape)}, not 2-D"
        )
    if not 0 < k <= min(x.shape[-1], 1024):
        raise ValueError(f"npu_moe_gating_top_k_softmax: k={k} for {x.shape[-1]} experts")
    weights, experts = torch.softmax(x.float(), dim=-1).topk(k, dim=-1)
    rows = x.shape[0]
    row_idx = torch.arange(rows * k, dtype=torch.int32).reshape(k, rows).transpose(0, 1).contiguous()
    return weights.to(x.dtype), experts.to(torch.int32), row_idx


def l1_norm(input: torch.Tensor) -> torch.Tensor:
    """sgl-kernel-npu ``sgl_kernel_npu/norm/l1_norm.py::l1_norm`` (its Triton kernel's source is
    the documentation; sgl-project/sgl-kernel-npu f425bdf): each row of the 2-D ``input`` divided
    by its sum, in float32. The kernel addresses rows as ``row * hidden_size`` (a contiguous
    input) and loads ``tl.arange(0, hidden_size)`` (a power of two, as Triton requires)."""
    if input.dim() != 2 or not input.is_contiguous():
        raise NotImplementedError(
            f"CPU reference of l1_norm: input of shape {tuple(input.shape)}, stride {input.stride()}: "
            "not a contiguous 2-D tensor"
        )
    if input.shape[1] & (input.shape[1] - 1):
        raise ValueError(f"l1_norm: hidden size {input.shape[1]} is not a power of two (tl.arange)")
    values = input.float()
    return values / values.sum(dim=-1, keepdim=True)


def npu_moe_init_routing_v2(
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    active_num: int = -1,
    expert_capacity: int = -1,
    expert_num: int = -1,
    drop_pad_mode: int = 0,
    expert_tokens_num_type: int = 0,
    expert_tokens_num_flag: bool = False,
    quant_mode: int = 0,
    active_expert_range: list[int] | None = None,
    row_idx_type: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_init_routing_v2`` (Ascend PyTorch API reference, hiascend.com Pytorch/700/
    apiref/apilist/ptaoplist_002366, and the golden model of op-plugin's
    ``test_npu_moe_init_routing_v2.py``) in its drop-less, unquantised form (``drop_pad_mode=0``,
    ``quant_mode=-1``, no ``scale``/``offset``): the flat choices ``expert_idx.reshape(-1)`` (row
    ``n``'s choice ``k`` at ``n * K + k``) are sorted stably by expert, experts outside
    ``active_expert_range = [start, end)`` left out; ``expanded_x`` holds, in that order, the token
    row of each kept choice (the first ``active_num``), zero after; ``expanded_row_idx`` (int32,
    ``row_idx_type=0``, scatter form) gives each flat choice its position in ``expanded_x`` (-1 when
    left out), ``row_idx_type=1`` the gather form (the sorted flat choices); with
    ``expert_tokens_num_flag`` the per-expert counts of the kept choices (int64, ``type 1``) or
    their running sum (``type 0``). The fourth output (the quantisation scales) is undefined in
    this form and returned empty."""
    if drop_pad_mode != 0 or quant_mode != -1 or scale is not None or offset is not None:
        raise NotImplementedError(
            f"CPU reference of npu_moe_init_routing_v2: drop_pad_mode={drop_pad_mode}, quant_mode={quant_mode}, "
            f"scale={'set' if scale is not None else None}, offset={'set' if offset is not None else None}"
        )
    if expert_tokens_num_flag and expert_tokens_num_type not in (0, 1):
        raise NotImplementedError(
            f"CPU reference of npu_moe_init_routing_v2: expert_tokens_num_type={expert_tokens_num_type}"
        )
    if row_idx_type not in (0, 1):
        raise NotImplementedError(f"CPU reference of npu_moe_init_routing_v2: row_idx_type={row_idx_type}")
    if x.dim() != 2 or expert_idx.dim() != 2 or expert_idx.shape[0] != x.shape[0]:
        raise ValueError(f"npu_moe_init_routing_v2: x {tuple(x.shape)}, expert_idx {tuple(expert_idx.shape)}")
    rows, k = expert_idx.shape
    start, end = active_expert_range if active_expert_range else (0, expert_num)
    flat = expert_idx.reshape(-1).long()
    kept = (flat >= start) & (flat < end)
    order = torch.argsort(torch.where(kept, flat, torch.iinfo(torch.int32).max), stable=True)
    total = int(kept.sum())
    count = total if active_num <= 0 else min(active_num, total)
    expanded_x = torch.zeros(
        rows * k if active_num <= 0 else min(active_num, rows * k), x.shape[1], dtype=x.dtype
    )
    expanded_x[:count] = x[order[:count] // k]
    if row_idx_type == 1:
        expanded_row_idx = order.to(torch.int32)
    else:
        expanded_row_idx = torch.full((rows * k,), -1, dtype=torch.int32)
        expanded_row_idx[order[:total]] = torch.arange(total, dtype=torch.int32)
    tokens = torch.bincount(flat[kept] - start, minlength=end - start).to(torch.int64)
    if expert_tokens_num_type == 0:
        tokens = tokens.cumsum(0)
    return expanded_x, expanded_row_idx, tokens if expert_tokens_num_flag else torch.empty(0), torch.empty(0)


def npu_grouped_matmul(
    x: list[torch.Tensor],
    weight: list[torch.Tensor],
    *,
    bias: list[torch.Tensor] | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list: torch.Tensor | None = None,
    group_list_type: int = 0,
    output_dtype: torch.dtype | None = None,
    **unsupported: Any,
) -> list[torch.Tensor]:
    """``torch_npu.npu_grouped_matmul`` (Ascend PyTorch API reference "torch_npu.npu_grouped_matmul",
    CANN ``aclnnGroupedMatmulV4``) in the form MoE uses: one ``x`` ``(M, K)`` split along M
    (``group_type=0``) into consecutive groups, one weight ``(E, K, N)`` (group ``e`` multiplies by
    ``weight[e]``, plus ``bias[e]`` when given), one output ``(M, N)`` (``split_item`` 2 or 3).
    ``group_list`` gives the groups' sizes (``group_list_type=1``) or their running ends (``0``);
    rows after the last group are zero. Unquantised only: a scale, offset or antiquant argument is
    not modelled."""
    given = {name: value for name, value in unsupported.items() if value is not None}
    if given:
        raise NotImplementedError(f"CPU reference of npu_grouped_matmul: unsupported {sorted(given)}")
    if split_item not in (2, 3) or group_type != 0 or group_list is None or len(x) != 1 or len(weight) != 1:
        raise NotImplementedError(
            f"CPU reference of npu_grouped_matmul: split_item={split_item}, group_type={group_type}, "
            f"{len(x)} x / {len(weight)} weights, group_list {'set' if group_list is not None else None}"
        )
    if group_list_type not in (0, 1):
        raise NotImplementedError(f"CPU reference of npu_grouped_matmul: group_list_type={group_list_type}")
    (tokens,), (weights,) = x, weight
    if weights.dim() != 3 or tokens.dim() != 2 or tokens.shape[1] != weights.shape[1]:
        raise ValueError(f"npu_grouped_matmul: x {tuple(tokens.shape)} by weight {tuple(weights.shape)}")
    sizes = [int(n) for n in group_list]
    if group_list_type == 0:
        sizes = [b - a for a, b in zip([0, *sizes], sizes)]
    if len(sizes) != weights.shape[0] or min(sizes, default=0) < 0 or sum(sizes) > tokens.shape[0]:
        raise ValueError(
            f"npu_grouped_matmul: group sizes {sizes} for {weights.shape[0]} weights and {tokens.shape[0]} rows"
        )
    out = torch.zeros(tokens.shape[0], weights.shape[2], dtype=torch.float32)
    start = 0
    for group, size in enumerate(sizes):
        rows = tokens[start : start + size].float() @ weights[group].float()
        if bias:
            rows = rows + bias[0][group].float()
        out[start : start + size] = rows
        start += size
    return [out.to(output_dtype or tokens.dtype)]


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
    """``torch_npu.npu_moe_finalize_routing`` (CANN ``aclnnMoeFinalizeRoutingV2``, hiascend.com
    CANNCommunityEdition/81RC1alpha001/apiref/aolapi/context/aclnnMoeFinalizeRoutingV2.md):
    ``out[i] = skip1[i] + skip2[i] + sum_k scales[i, k] * (expanded_x[idx(i, k)] + bias[expert[i,
    k]])`` over the K choices of row ``i``, in the drop-less modes: ``drop_pad_mode=0`` indexes
    ``expanded_src_to_dst_row`` choice-major (``i + k * rows``), ``2`` row-major (``i * K + k``,
    as ``npu_moe_init_routing_v2`` lays it out). Without ``scales`` each choice weighs 1."""
    if drop_pad_mode not in (0, 2):
        raise NotImplementedError(f"CPU reference of npu_moe_finalize_routing: drop_pad_mode={drop_pad_mode}")
    if scales is None and export_for_source_row is None:
        raise NotImplementedError(
            "CPU reference of npu_moe_finalize_routing: neither scales nor experts given"
        )
    rows, k = (scales if scales is not None else export_for_source_row).shape
    index = expanded_src_to_dst_row.long()
    if index.shape != (rows * k,):
        raise ValueError(
            f"npu_moe_finalize_routing: expanded_src_to_dst_row {tuple(index.shape)} for {rows} x {k}"
        )
    index = index.reshape(rows, k) if drop_pad_mode == 2 else index.reshape(k, rows).transpose(0, 1)
    chosen = expanded_permuted_rows.float()[index]  # (rows, K, H)
    if bias is not None:
        chosen = chosen + bias.float()[export_for_source_row.long()]
    weights = scales.float()[..., None] if scales is not None else torch.ones(rows, k, 1)
    out = (chosen * weights).sum(dim=1)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(expanded_permuted_rows.dtype)


def alloc_extend(
    pre_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    out_indices: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """sgl-kernel-npu's ``torch.ops.npu.alloc_extend`` (``csrc/pytorch_extensions.cpp``: ``alloc_extend(
    Tensor pre_lens, Tensor seq_lens, Tensor last_loc, Tensor free_pages, int page_size, Tensor(a!)
    out_indices, Tensor(b!) values)``; ``csrc/alloc_extend``, sgl-project/sgl-kernel-npu f425bdf):
    the paged allocation of an extend batch, the semantics of the Triton ``alloc_extend_kernel``
    (``tritonkernels.alloc_extend_kernel``, one place for it) and of sglang's own fallback
    ``alloc_extend_kernel_ascend`` (0.5.4 ``mem_cache/allocator_ascend.py``); ``values[0]`` receives
    the number of new pages taken. The host code accepts int64 tensors only and raises otherwise."""
    from npudoctor.live.tritonkernels import alloc_extend_kernel

    if any(t.dtype != torch.int64 for t in (pre_lens, seq_lens, last_loc, free_pages, out_indices)):
        raise ValueError("alloc_extend: Only support int64 input dtype")
    alloc_extend_kernel(
        (pre_lens.shape[0],),
        pre_lens,
        seq_lens,
        last_loc,
        free_pages,
        out_indices,
        0,
        page_size,
        out_indices.shape[0],
    )
    new_pages = -(-seq_lens // page_size) - (-(-pre_lens // page_size))
    values.view(-1)[0] = int(new_pages.sum())


def npu_moe_init_routing(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_moe_init_routing(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) ->
    (Tensor, Tensor, Tensor)`` (Ascend PyTorch API reference, hiascend.com Pytorch/60RC3/apiref/
    apilist/ptaoplist_000780): the choices ``expert_idx`` ``(N, K)`` sorted by expert, each carrying
    its ``row_idx`` value (``k * N + n`` as sglang builds it: the choice-major position; ties kept
    in order, which only permutes rows of one expert); ``expanded_x`` holds the token row
    (``row_idx % N``) of the first ``min(N, active_num) * K`` sorted choices; ``expanded_row_idx[
    row_idx value] = its sorted position`` (int32); ``expanded_expert_idx`` the sorted experts."""
    if x.dim() != 2 or expert_idx.shape != row_idx.shape or expert_idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"npu_moe_init_routing: x {tuple(x.shape)}, row_idx {tuple(row_idx.shape)}, expert_idx {tuple(expert_idx.shape)}"
        )
    rows, k = expert_idx.shape
    order = torch.argsort(expert_idx.reshape(-1).long(), stable=True)
    sorted_rows = row_idx.reshape(-1).long()[order]
    kept = min(rows, active_num) * k
    expanded_x = x[sorted_rows[:kept] % rows]
    expanded_row_idx = torch.empty(rows * k, dtype=torch.int32)
    expanded_row_idx[sorted_rows] = torch.arange(rows * k, dtype=torch.int32)
    return expanded_x, expanded_row_idx, expert_idx.reshape(-1)[order].to(torch.int32)


def npu_moe_compute_expert_tokens(
    sorted_expert_for_source_row: torch.Tensor, num_expert: int
) -> torch.Tensor:
    """``torch_npu.npu_moe_compute_expert_tokens(Tensor sorted_expert_for_source_row, int num_expert) ->
    Tensor`` (Ascend PyTorch API reference, hiascend.com Pytorch/60RC3/apiref/apilist/ptaoplist_000455):
    for each expert, the end (one past the last row) of its rows in the sorted choices, found by
    binary search: the running count of choices with an expert ``<= e``, in the input's dtype."""
    ends = torch.searchsorted(sorted_expert_for_source_row.long(), torch.arange(num_expert), right=True)
    return ends.to(sorted_expert_for_source_row.dtype)


# the name as sglang reaches it -> reference
DRY_RUN_KERNELS: dict[str, Callable[..., Any]] = {
    "torch_npu.npu_rms_norm": npu_rms_norm,
    "torch_npu.npu_add_rms_norm": npu_add_rms_norm,
    "torch_npu.npu_swiglu": npu_swiglu,
    "torch_npu.npu_mrope": npu_mrope,
    "torch_npu._npu_reshape_and_cache": _npu_reshape_and_cache,
    "torch_npu._npu_flash_attention_qlens": _npu_flash_attention_qlens,
    "torch_npu._npu_paged_attention": _npu_paged_attention,
    "torch_npu.npu_moe_gating_top_k_softmax": npu_moe_gating_top_k_softmax,
    "torch_npu.npu_moe_init_routing": npu_moe_init_routing,
    "torch_npu.npu_moe_compute_expert_tokens": npu_moe_compute_expert_tokens,
    "torch_npu.npu_moe_init_routing_v2": npu_moe_init_routing_v2,
    "torch_npu.npu_grouped_matmul": npu_grouped_matmul,
    "torch_npu.npu_moe_finalize_routing": npu_moe_finalize_routing,
    "torch.ops.npu.alloc_extend": alloc_extend,
    "sgl_kernel_npu.norm.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope": split_qkv_rmsnorm_rope,
    "sgl_kernel_npu.norm.l1_norm.l1_norm": l1_norm,
}
