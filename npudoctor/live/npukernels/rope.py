"""CPU references of the rotary-embedding kernels sglang's NPU forwards call.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_rotary_mul.md``, ``torch_npu-npu_mrope.md``,
``torch_npu-npu_interleave_rope.md``). Two rotations appear there: *half* (GPT-NeoX style,
``x1, x2 = chunk(x, 2)``, ``rotate(x) = cat(-x2, x1)``) and *interleave* (GPT-J style, pairs
``x[..., ::2], x[..., 1::2]``); ``npu_interleave_rope`` first de-interleaves ``x`` (pairs to
halves) and then applies the half rotation.

``fused_rope_qk_mqa`` (sgl-kernel-npu) follows its Triton source.

Call sites: sglang ``srt/layers/rotary_embedding/base.py`` ``RotaryEmbedding.forward_npu``
(npu_mrope with ``mrope_section=[0, 0, 0]``, i.e. plain RoPE), ``mrope.py``
``MRotaryEmbedding.forward_npu`` (npu_mrope with sections), ``rope_variant.py``
(npu_interleave_rope, DeepSeek YaRN), ``utils.py`` ``apply_rotary_pos_emb_npu`` (npu_rotary_mul);
``hardware_backend/npu/modules/deepseek_v2_attention_mla_npu.py`` (npu_interleave_rope).
"""

from __future__ import annotations

import torch

from npudoctor.live.npukernels.unmodelled import refuse

_INTERLEAVE_ROPE_DIM = 64  # npu_interleave_rope: "x, cos and sin must have D == 64"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def npu_rotary_mul(
    input: torch.Tensor,  # noqa: A002 - the documented name
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch_npu.npu_rotary_mul``: ``x * r1 + rotate(x) * r2`` (``r1`` cos, ``r2`` sin,
    broadcast against the 3-D/4-D ``input``), ``rotary_mode`` ``"half"`` or ``"interleave"``.
    The explicit ``rotate`` matrix is refused."""
    op = "npu_rotary_mul"
    if rotate is not None:
        refuse(op, "rotate", "an explicit rotation matrix")
    if rotary_mode not in ("half", "interleave"):
        refuse(op, "rotary_mode", f"{rotary_mode!r} (documented: 'half', 'interleave')")
    if input.dim() not in (3, 4) or r1.dim() != input.dim() or r2.shape != r1.shape:
        raise ValueError(
            f"{op}: input {tuple(input.shape)}, r1 {tuple(r1.shape)}, r2 {tuple(r2.shape)} are not 3-D/4-D alike"
        )
    x = input.float()
    rotated = rotate_half(x) if rotary_mode == "half" else rotate_interleaved(x)
    return (x * r1.float() + rotated * r2.float()).to(input.dtype)


def _mrope_cos_sin(
    op: str, positions: torch.Tensor, cache: torch.Tensor, sections: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``(T, rotary_dim / 2)`` for ``positions`` ``(T,)`` (RoPE) or ``(3, T)`` (MRoPE,
    default cache mode: section ``i`` of the frequencies takes position row ``i``)."""
    if positions.min() < 0 or positions.max() >= cache.shape[0]:
        raise IndexError(f"{op}: position out of range for a cos_sin_cache of {cache.shape[0]} rows")
    cos, sin = cache[positions.long()].float().chunk(2, dim=-1)
    if positions.dim() == 1:
        return cos, sin
    if len(sections) != positions.shape[0] or len(sections) != 3:
        refuse(
            op, "mrope_section", f"{sections} with positions {tuple(positions.shape)} (modelled: 3 sections)"
        )
    if sum(sections) != cos.shape[-1]:
        raise ValueError(f"{op}: mrope_section {sections} does not sum to rotary_dim / 2 = {cos.shape[-1]}")
    bounds = [0, sections[0], sections[0] + sections[1], sum(sections)]
    pick = [slice(bounds[i], bounds[i + 1]) for i in range(3)]
    return (
        torch.cat([cos[i, :, pick[i]] for i in range(3)], dim=-1),
        torch.cat([sin[i, :, pick[i]] for i in range(3)], dim=-1),
    )


def _rope_tokens(
    x: torch.Tensor, head_size: int, cos: torch.Tensor, sin: torch.Tensor, mode: str
) -> torch.Tensor:
    """Rotate the first ``rotary_dim = 2 * cos.shape[-1]`` dims of each head of ``x (T, N*head_size)``."""
    heads = x.reshape(x.shape[0], -1, head_size).float()
    rotary_dim = 2 * cos.shape[-1]
    rot, passed = heads[..., :rotary_dim], heads[..., rotary_dim:]
    c, s = cos[:, None, :], sin[:, None, :]
    if mode == "half":
        x1, x2 = rot.chunk(2, dim=-1)
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    return torch.cat((rot, passed), dim=-1).reshape(x.shape).to(x.dtype)


def npu_mrope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    *,
    mrope_section: list[int] | None = None,
    rotary_mode: str | None = "half",
    cache_mode: str | None = "default",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_mrope``: ``cos, sin = cos_sin_cache[positions].chunk(2)``; the first
    ``rotary_dim = cos_sin_cache.shape[1]`` dims of every head of ``query (T, Nq*head_size)`` and
    ``key (T, Nk*head_size)`` are rotated (``"half"``: ``o1 = x1 cos - x2 sin``,
    ``o2 = x2 cos + x1 sin`` on the halves; ``"interleave"``: on the even/odd pairs), the rest
    passes. ``positions (T,)`` is RoPE (``mrope_section`` None or zeros); ``(3, T)`` is MRoPE with
    three sections in the default cache mode. 4 sections and ``cache_mode="interleave"`` are refused."""
    op = "npu_mrope"
    sections = list(mrope_section or [])
    if cache_mode not in (None, "default"):
        refuse(op, "cache_mode", f"{cache_mode!r} (modelled: 'default')")
    if rotary_mode not in ("half", "interleave", "interleaved"):
        refuse(op, "rotary_mode", f"{rotary_mode!r}")
    if positions.dim() == 1 and any(sections):
        refuse(op, "mrope_section", f"{sections} with 1-D positions")
    if positions.dim() not in (1, 2):
        raise ValueError(f"{op}: positions of shape {tuple(positions.shape)} is not (T,) or (m, T)")
    for name, x in (("query", query), ("key", key)):
        if x.dim() != 2 or x.shape[0] != positions.shape[-1] or x.shape[1] % head_size:
            raise ValueError(
                f"{op}: {name} of shape {tuple(x.shape)} is not (T, N * {head_size}) for {positions.shape[-1]} tokens"
            )
    if cos_sin_cache.shape[1] > head_size or cos_sin_cache.shape[1] % 2:
        raise ValueError(
            f"{op}: cos_sin_cache rotary dim {cos_sin_cache.shape[1]} does not fit head_size {head_size}"
        )
    cos, sin = _mrope_cos_sin(op, positions, cos_sin_cache, sections)
    mode = "half" if rotary_mode == "half" else "interleave"
    return _rope_tokens(query, head_size, cos, sin, mode), _rope_tokens(key, head_size, cos, sin, mode)


def npu_interleave_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_interleave_rope``: ``q = x.reshape(B, N, S, D/2, 2).transpose(-1, -2)
    .reshape(B, N, S, D)`` (pairs to halves), then ``q * cos + rotate_half(q) * sin``; ``x``
    ``(B, N, S, D)``, ``cos``/``sin`` ``(B, 1, S or 1, D)``. The documented constraints (D == 64,
    cos/sin with N == 1) are refused when not met: the document does not say what the kernel does."""
    op = "npu_interleave_rope"
    if x.dim() != 4 or cos.dim() != 4 or sin.shape != cos.shape:
        raise ValueError(
            f"{op}: x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)} are not 4-D"
        )
    if x.shape[-1] != _INTERLEAVE_ROPE_DIM or cos.shape[-1] != _INTERLEAVE_ROPE_DIM:
        refuse(op, "x", f"D = {x.shape[-1]} (cos {cos.shape[-1]}); the document requires 64")
    if cos.shape[1] != 1:
        refuse(op, "cos", f"N = {cos.shape[1]}; the document requires 1")
    b, n, s, d = x.shape
    q = x.float().reshape(b, n, s, d // 2, 2).transpose(-1, -2).reshape(b, n, s, d)
    return (q * cos.float() + rotate_half(q) * sin.float()).to(x.dtype)


def is_power_of_two(n: int) -> bool:
    """The sizes a Triton ``tl.arange`` can span."""
    return n > 0 and n & (n - 1) == 0


def fused_rope_qk_mqa(
    query: torch.Tensor, key: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, is_neox_style: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sgl_kernel_npu.norm.fused_rope_qk_mqa.fused_rope_qk_mqa`` (sgl-kernel-npu
    ``python/sgl_kernel_npu/sgl_kernel_npu/norm/fused_rope_qk_mqa.py``, Triton), as its kernel
    computes: token ``t`` reads row ``t`` of ``cos_sin (T, rotary_dim)`` (``cos`` its first half,
    ``sin`` the second: the caller gathers the rows by position); the first ``rotary_dim`` dims of
    each head of ``query (T, Hq, D)`` and ``key (T, Hk, D)`` are rotated on the pairs
    ``(d, d + rotary_dim / 2)`` (neox) or ``(2d, 2d + 1)``: ``(x1 cos - x2 sin, x1 sin + x2 cos)``;
    the rest passes. Outputs in the inputs' dtypes.

    The kernel's ``tl.arange`` ranges (heads, ``rotary_dim / 2``, the pass-through width) must be
    powers of two; other sizes are refused. sglang: ``RotaryEmbedding.forward_npu`` for bfloat16
    queries with a float32 cache or 3-D keys."""
    op = "fused_rope_qk_mqa"
    if query.dim() != 3 or key.dim() != 3 or key.shape[0] != query.shape[0] or key.shape[2] != query.shape[2]:
        raise ValueError(
            f"{op}: query {tuple(query.shape)} and key {tuple(key.shape)} are not (T, H, D) alike"
        )
    head_dim = query.shape[2]
    widths = {"query heads": query.shape[1], "key heads": key.shape[1], "rotary_dim / 2": rotary_dim // 2}
    if head_dim > rotary_dim:
        widths["head_dim - rotary_dim"] = head_dim - rotary_dim
    odd = {name: n for name, n in widths.items() if not is_power_of_two(n)}
    if odd or rotary_dim > head_dim:
        refuse(op, "query", f"{odd or rotary_dim}: the Triton kernel needs powers of two within head_dim")
    if cos_sin.shape[0] < query.shape[0] or cos_sin.shape[-1] < rotary_dim:
        raise ValueError(
            f"{op}: cos_sin {tuple(cos_sin.shape)} has no row of {rotary_dim} for each of {query.shape[0]} tokens"
        )
    half = rotary_dim // 2
    cos = cos_sin[: query.shape[0], :half].float()[:, None, :]
    sin = cos_sin[: query.shape[0], half:rotary_dim].float()[:, None, :]
    first = torch.arange(half) if is_neox_style else torch.arange(0, rotary_dim, 2)
    second = first + half if is_neox_style else first + 1

    def rotated(x: torch.Tensor) -> torch.Tensor:
        out = x.float().clone()
        x1, x2 = out[..., first].clone(), out[..., second].clone()
        out[..., first], out[..., second] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        return out.to(x.dtype)

    return rotated(query), rotated(key)


# sgl_kernel_npu functions, by the dotted name sglang imports them from
SGL_KERNEL_NPU = {"sgl_kernel_npu.norm.fused_rope_qk_mqa.fused_rope_qk_mqa": fused_rope_qk_mqa}


KERNELS = {
    "npu_rotary_mul": npu_rotary_mul,
    "npu_mrope": npu_mrope,
    "npu_interleave_rope": npu_interleave_rope,
}
