"""CPU references of the Ascend ops the dry run's model forwards call (torch_npu's and sgl-kernel-npu's).

The dry run (``ascendsim``) answers every Ascend call sglang makes while it serves a small model
with a plain PyTorch implementation of the op's documented semantics (each reference cites its
document). A reference models exactly the argument forms sglang passes and raises
``NotImplementedError`` naming the argument otherwise, so a call outside that subset is a
simulation gap, never a silent pass.

``DRY_RUN_KERNELS`` is keyed by the name as sglang reaches it: ``torch_npu.<op>`` (also answered as
``torch.ops.npu.<op>``, the same op's dispatcher name) and ``sgl_kernel_npu.<module>.<function>``
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
    "sgl_kernel_npu.norm.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope": split_qkv_rmsnorm_rope,
    "sgl_kernel_npu.norm.l1_norm.l1_norm": l1_norm,
}
