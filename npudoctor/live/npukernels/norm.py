"""CPU references of the RMSNorm kernels sglang's NPU forwards call.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_add_rms_norm.md``; ``npu_rms_norm`` and
``npu_gemma_rms_norm`` by their schemas in ``op_plugin/config/op_plugin_functions.yaml`` and the
RmsNorm/GemmaRmsNorm formulas of the CANN operator reference):
``y = x / sqrt(mean(x^2) + epsilon) * gamma`` (Gemma: ``* (1 + gamma)``), computed in float32,
``rstd = 1 / sqrt(mean(x^2) + epsilon)`` in float32 with the normalised dims kept as 1.

The sgl-kernel-npu functions (``l1_norm``, ``split_qkv_rmsnorm_rope``) have no document beyond
their source (sgl-project/sgl-kernel-npu, ``python/sgl_kernel_npu/sgl_kernel_npu/norm/``): their
references follow what the Triton kernels compute.

Call sites: sglang ``srt/layers/layernorm.py`` ``RMSNorm.forward_npu`` (rms_norm, add_rms_norm
with a residual), ``GemmaRMSNorm.forward_npu`` (gemma_rms_norm, add_rms_norm with
``1 + weight``), 0.5.4-0.5.23.
"""

from __future__ import annotations

import torch

from npudoctor.live.npukernels.rope import is_power_of_two, rotate_half, rotate_interleaved
from npudoctor.live.npukernels.unmodelled import refuse


def _rms_normalised(
    op: str, x: torch.Tensor, gamma: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x * rstd in float32, rstd)`` over the trailing dims of ``x`` that ``gamma`` covers."""
    dims = gamma.dim()
    if dims == 0 or dims > x.dim() or tuple(x.shape[-dims:]) != tuple(gamma.shape):
        raise ValueError(
            f"{op}: gamma of shape {tuple(gamma.shape)} is not the trailing dims of x {tuple(x.shape)}"
        )
    reduced = tuple(range(x.dim() - dims, x.dim()))
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=reduced, keepdim=True) + epsilon)
    return xf * rstd, rstd


def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_rms_norm``: ``(y, rstd)``, ``y = x * rstd * gamma`` in ``x``'s dtype."""
    normalised, rstd = _rms_normalised("npu_rms_norm", self, gamma, epsilon)
    return (normalised * gamma.float()).to(self.dtype), rstd


def npu_gemma_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_gemma_rms_norm``: ``(y, rstd)``, ``y = x * rstd * (1 + gamma)``."""
    normalised, rstd = _rms_normalised("npu_gemma_rms_norm", self, gamma, epsilon)
    return (normalised * (1.0 + gamma.float())).to(self.dtype), rstd


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_add_rms_norm``: ``x = x1 + x2``; returns ``(RMSNorm(x) * gamma, rstd, x)``,
    ``y`` and ``x`` in ``x1``'s dtype (the sum normalised before rounding)."""
    if x1.shape != x2.shape:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ")
    total = x1.float() + x2.float()
    normalised, rstd = _rms_normalised("npu_add_rms_norm", total, gamma, epsilon)
    return (normalised * gamma.float()).to(x1.dtype), rstd, total.to(x1.dtype)


def l1_norm(input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the kernel's name
    """``sgl_kernel_npu.norm.l1_norm.l1_norm`` (sgl-kernel-npu ``python/sgl_kernel_npu/
    sgl_kernel_npu/norm/l1_norm.py``, a Triton kernel): each row of ``input (B, H)`` divided by its
    sum, in float32. sglang: ``fused_topk_npu`` renormalizing the top-k weights (Qwen3-MoE)."""
    if input.dim() != 2:
        raise ValueError(f"l1_norm: input of shape {tuple(input.shape)} is not (B, H)")
    if not is_power_of_two(input.shape[1]):
        refuse(
            "l1_norm",
            "input",
            f"{input.shape[1]} columns; the Triton kernel's tl.arange needs a power of two",
        )
    x = input.float()
    return x / x.sum(dim=1, keepdim=True)


def split_qkv_rmsnorm_rope(
    input: torch.Tensor,  # noqa: A002 - the kernel's name
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
    """``sgl_kernel_npu.norm.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope`` (sgl-kernel-npu
    ``python/sgl_kernel_npu/sgl_kernel_npu/norm/split_qkv_rmsnorm_rope.py``, Triton), as its
    kernel computes: ``input (T, q + 2 kv)`` splits into q, k, v; with ``eps`` each q/k head is
    RMS-normalised in float32 and scaled by its weight (plus bias); then the first
    ``rope_dim = sin.shape[-1]`` dims of each head are rotated with the per-token ``cos``/``sin``
    (``(T, ..., rope_dim)`` in the half layout ``cat(c, c)`` that sglang's
    ``get_cos_sin_with_position`` builds): neox ``x * cos + cat(-x2, x1) * sin`` on the halves,
    else the same on the even/odd pairs with each pair's angle; v passes. Outputs in input's dtype.

    The wrapper asserts ``head_dim`` is a power of two (``triton.next_power_of_2(head_dim) ==
    head_dim``): that assertion is reproduced. sglang: ``Qwen3Attention``/``LlamaAttention``/
    ``Qwen3MoeAttention`` ``forward_prepare_npu``."""
    op = "split_qkv_rmsnorm_rope"
    if not is_power_of_two(head_dim):
        raise AssertionError(
            f"{op}: head_dim {head_dim} is not a power of two (the kernel's wrapper asserts it)"
        )
    if q_hidden_size % kv_hidden_size or input.shape[-1] != q_hidden_size + 2 * kv_hidden_size:
        raise ValueError(
            f"{op}: input {tuple(input.shape)} is not q {q_hidden_size} + 2 x kv {kv_hidden_size}"
        )
    tokens = input.shape[0]
    rope_dim = sin.shape[-1]
    if rope_dim > head_dim or rope_dim % 2:
        raise ValueError(f"{op}: rope dim {rope_dim} does not fit head_dim {head_dim}")
    cos_t = cos.reshape(tokens, 1, rope_dim).float()
    sin_t = sin.reshape(tokens, 1, rope_dim).float()
    half = rope_dim // 2
    if not is_neox_style:  # each pair (2i, 2i + 1) takes angle i of the half layout
        cos_t = cos_t[..., :half].repeat_interleave(2, dim=-1)
        sin_t = sin_t[..., :half].repeat_interleave(2, dim=-1)
    q, k, v = input.split([q_hidden_size, kv_hidden_size, kv_hidden_size], dim=-1)

    def normalised_and_rotated(
        x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        heads = x.reshape(tokens, -1, head_dim).float()
        if eps is not None:
            heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps)
            if weight is not None:
                heads = heads * weight.float()
            if bias is not None:
                heads = heads + bias.float()
        rot, passed = heads[..., :rope_dim], heads[..., rope_dim:]
        rotated = rotate_half(rot) if is_neox_style else rotate_interleaved(rot)
        rot = rot * cos_t + rotated * sin_t
        return torch.cat((rot, passed), dim=-1).reshape(x.shape).to(input.dtype)

    return normalised_and_rotated(q, q_weight, q_bias), normalised_and_rotated(k, k_weight, k_bias), v.clone()


# sgl_kernel_npu functions, by the dotted name sglang imports them from
SGL_KERNEL_NPU = {
    # "binds to" torch_npu.npu_gemma_rms_norm on A2/A3 (sglang layernorm.py's import fallback)
    "sgl_kernel_npu.norm.gemma_rmsnorm.npu_gemma_rms_norm": npu_gemma_rms_norm,
    "sgl_kernel_npu.norm.l1_norm.l1_norm": l1_norm,
    "sgl_kernel_npu.norm.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope": split_qkv_rmsnorm_rope,
}

KERNELS = {
    "npu_rms_norm": npu_rms_norm,
    "npu_gemma_rms_norm": npu_gemma_rms_norm,
    "npu_add_rms_norm": npu_add_rms_norm,
}
