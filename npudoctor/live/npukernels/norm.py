"""CPU references of the RMSNorm kernels sglang's NPU forwards call.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_add_rms_norm.md``; ``npu_rms_norm`` and
``npu_gemma_rms_norm`` by their schemas in ``op_plugin/config/op_plugin_functions.yaml`` and the
RmsNorm/GemmaRmsNorm formulas of the CANN operator reference):
``y = x / sqrt(mean(x^2) + epsilon) * gamma`` (Gemma: ``* (1 + gamma)``), computed in float32,
``rstd = 1 / sqrt(mean(x^2) + epsilon)`` in float32 with the normalised dims kept as 1.

Call sites: sglang ``srt/layers/layernorm.py`` ``RMSNorm.forward_npu`` (rms_norm, add_rms_norm
with a residual), ``GemmaRMSNorm.forward_npu`` (gemma_rms_norm, add_rms_norm with
``1 + weight``), 0.5.4-0.5.23.
"""

from __future__ import annotations

import torch


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


KERNELS = {
    "npu_rms_norm": npu_rms_norm,
    "npu_gemma_rms_norm": npu_gemma_rms_norm,
    "npu_add_rms_norm": npu_add_rms_norm,
}
