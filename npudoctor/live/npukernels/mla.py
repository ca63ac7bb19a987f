"""CPU references of the kernels of sglang's NPU MLA (DeepSeek) attention module.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_kv_rmsnorm_rope_cache.md``,
``torch_npu-npu_transpose_batchmatmul.md``); sgl-kernel-npu's ``csrc/batch_matmul_transpose/README.md``
for the custom op it registers as ``torch.ops.npu.batch_matmul_transpose``.

Call sites: sglang ``srt/hardware_backend/npu/modules/deepseek_v2_attention_mla_npu.py``
(0.5.12-0.5.23): the latent KV's norm, rope and cache write with DeepSeek YaRN rope
(``npu_kv_rmsnorm_rope_cache``, ``cache_mode="PA_BNSD"``), and the absorbed ``w_kc``/``w_vc``
projections (``npu_transpose_batchmatmul``; ``batch_matmul_transpose`` when a dimension reaches 65536).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from npudoctor.live.npukernels.rope import npu_interleave_rope
from npudoctor.live.npukernels.unmodelled import refuse, refuse_given

# the document: hidden_size 576 = rms_size 512 (the latent) + rope_size 64, no other sizes
_RMS_SIZE, _ROPE_SIZE = 512, 64
_PAGED_MODES = ("PA", "PA_BNSD")
_BMM_TRANSPOSE_MAX_M = 1024  # sgl-kernel-npu batch_matmul_transpose README: "m <= 1024"


def npu_kv_rmsnorm_rope_cache(
    kv: torch.Tensor,
    gamma: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    index: torch.Tensor,
    k_cache: torch.Tensor,
    ckv_cache: torch.Tensor,
    *,
    k_rope_scale: torch.Tensor | None = None,
    c_kv_scale: torch.Tensor | None = None,
    k_rope_offset: torch.Tensor | None = None,
    c_kv_offset: torch.Tensor | None = None,
    epsilon: float = 1e-5,
    cache_mode: str = "Norm",
    is_output_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``torch_npu.npu_kv_rmsnorm_rope_cache``, unquantized, paged (``cache_mode`` PA/PA_BNSD):
    ``kv (B, 1, S, 576)`` splits into the latent (512 dims, RMS-normalised with ``gamma``) and the
    rope part (64 dims, rotated as ``npu_interleave_rope``: pairs to halves, then rotate-half with
    ``cos``/``sin (B, 1, S, 64)``); token ``t``'s results go to slot ``index[t]`` of
    ``ckv_cache``/``k_cache`` ``(blocks, block_size, 1, D)``, in place. Returns
    ``(k_cache, ckv_cache, k_rope, c_kv)``, the last two only with ``is_output_kv``.

    Refused: other sizes than the documented 512 + 64, the quantization scales/offsets, the NZ
    and per-block modes and the non-paged ``Norm`` mode."""
    op = "npu_kv_rmsnorm_rope_cache"
    refuse_given(
        op,
        {
            "k_rope_scale": k_rope_scale,
            "c_kv_scale": c_kv_scale,
            "k_rope_offset": k_rope_offset,
            "c_kv_offset": c_kv_offset,
        },
    )
    if cache_mode not in _PAGED_MODES:
        refuse(op, "cache_mode", f"{cache_mode!r} (modelled: {', '.join(_PAGED_MODES)})")
    if kv.dim() != 4 or kv.shape[1] != 1 or kv.shape[-1] != _RMS_SIZE + _ROPE_SIZE:
        refuse(
            op, "kv", f"shape {tuple(kv.shape)}; the document requires (B, 1, S, {_RMS_SIZE} + {_ROPE_SIZE})"
        )
    latent, rope_part = kv.split([_RMS_SIZE, _ROPE_SIZE], dim=-1)
    xf = latent.float()
    c_kv = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.float()).to(kv.dtype)
    k_rope = npu_interleave_rope(rope_part.contiguous(), cos, sin)
    slots = index.reshape(-1).long()
    for name, cache, values in (("ckv_cache", ckv_cache, c_kv), ("k_cache", k_cache, k_rope)):
        flat = cache.view(-1, values.shape[-1])
        if slots.numel() != values.shape[0] * values.shape[2]:
            raise ValueError(f"{op}: {slots.numel()} indices for {values.shape[0] * values.shape[2]} tokens")
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= flat.shape[0]):
            raise IndexError(f"{op}: index out of range for {name} of {flat.shape[0]} slots")
        flat[slots] = values.reshape(-1, values.shape[-1]).to(cache.dtype)
    if not is_output_kv:
        return k_cache, ckv_cache, None, None
    return k_cache, ckv_cache, k_rope, c_kv


def npu_transpose_batchmatmul(
    input: torch.Tensor,  # noqa: A002 - the documented name
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    perm_x1: Sequence[int] = (0, 1, 2),
    perm_x2: Sequence[int] = (0, 1, 2),
    perm_y: Sequence[int] = (1, 0, 2),
    batch_split_factor: int = 1,
) -> torch.Tensor:
    """``torch_npu.npu_transpose_batchmatmul``, unquantized: ``Y = (input^{perm_x1} @
    weight^{perm_x2})^{perm_y}`` with dim 0 the batch; the documented permutations only
    (``perm_x1`` (0,1,2)/(1,0,2), ``perm_x2`` (0,1,2), ``perm_y`` (1,0,2)). ``bias`` (not supported by
    the document), ``scale`` and ``batch_split_factor`` > 1 are refused."""
    op = "npu_transpose_batchmatmul"
    refuse_given(op, {"bias": bias, "scale": scale})
    if batch_split_factor != 1:
        refuse(op, "batch_split_factor", str(batch_split_factor))
    if (
        tuple(perm_x1) not in ((0, 1, 2), (1, 0, 2))
        or tuple(perm_x2) != (0, 1, 2)
        or tuple(perm_y) != (1, 0, 2)
    ):
        refuse(op, "perm_x1/perm_x2/perm_y", f"{tuple(perm_x1)}/{tuple(perm_x2)}/{tuple(perm_y)}")
    if input.dim() != 3 or weight.dim() != 3:
        raise ValueError(f"{op}: input {tuple(input.shape)} and weight {tuple(weight.shape)} must be 3-D")
    a = input.float().permute(*perm_x1)
    if a.shape[0] != weight.shape[0] or a.shape[2] != weight.shape[1]:
        raise ValueError(
            f"{op}: input {tuple(input.shape)} (perm {tuple(perm_x1)}) and weight {tuple(weight.shape)} do not multiply"
        )
    return torch.bmm(a, weight.float()).permute(*perm_y).to(input.dtype)


def batch_matmul_transpose(
    tensor_a: torch.Tensor,
    tensor_b: torch.Tensor,
    tensor_c: torch.Tensor,
    format_mode: str | None = None,
    quant_mode: str | None = None,
) -> None:
    """``torch.ops.npu.batch_matmul_transpose`` (sgl-kernel-npu): ``tensor_c[m, b] =
    tensor_a[m, b] @ tensor_b[b]``, i.e. ``[m, b, n] = [m, b, k] x [b, k, n]``, written in place.

    Refused: the NZ weight format and quantization, and ``m`` above the README's limit of 1024
    (what the kernel does there is not documented; sglang takes this op when a dimension reaches
    65536)."""
    op = "batch_matmul_transpose"
    refuse_given(op, {"quant_mode": quant_mode})
    if format_mode not in (None, "ND"):
        refuse(op, "format_mode", f"{format_mode!r} (modelled: ND)")
    if (
        tensor_a.dim() != 3
        or tensor_b.dim() != 3
        or tensor_a.shape[1] != tensor_b.shape[0]
        or tensor_a.shape[2] != tensor_b.shape[1]
    ):
        raise ValueError(
            f"{op}: tensor_a {tuple(tensor_a.shape)} and tensor_b {tuple(tensor_b.shape)} are not [m, b, k] and [b, k, n]"
        )
    if tensor_a.shape[0] > _BMM_TRANSPOSE_MAX_M:
        refuse(op, "tensor_a", f"m = {tensor_a.shape[0]} above the README's limit of {_BMM_TRANSPOSE_MAX_M}")
    result = torch.einsum("mbk,bkn->mbn", tensor_a.float(), tensor_b.float())
    tensor_c.copy_(result.reshape(tensor_c.shape).to(tensor_c.dtype))


KERNELS = {
    "batch_matmul_transpose": batch_matmul_transpose,
    "npu_kv_rmsnorm_rope_cache": npu_kv_rmsnorm_rope_cache,
    "npu_transpose_batchmatmul": npu_transpose_batchmatmul,
}
