"""CPU references of the gated-activation kernels sglang's NPU forwards call.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fast_gelu.md``; ``npu_swiglu`` and ``npu_geglu``
by their schemas in ``op_plugin/config/op_plugin_functions.yaml`` and the SwiGlu/GeGlu formulas of
the CANN operator reference: the input is split into two halves ``A, B`` along ``dim``;
SwiGlu is ``silu(A) * B``; GeGlu activates the left half when ``activate_left`` else the right one,
``approximate`` 1 = tanh GELU, 0 = erf GELU).

Call sites: sglang ``srt/layers/activation.py`` ``SiluAndMul.forward_npu`` (swiglu),
``GeluAndMul.forward_npu`` (geglu, ``activate_left=True``), ``QuickGELU.forward_npu``
(fast_gelu), 0.5.4-0.5.23; ``npu_swiglu`` also in the NPU MoE expert MLP (``torch.ops.npu``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from npudoctor.live.npukernels.unmodelled import refuse


def _halves(op: str, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[dim] % 2:
        raise ValueError(f"{op}: dim {dim} of x {tuple(x.shape)} is odd, it does not split in halves")
    return x.chunk(2, dim=dim)


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch_npu.npu_swiglu``: ``silu(A) * B`` of the halves of ``self`` along ``dim``, computed in
    float32, in ``self``'s dtype."""
    a, b = _halves("npu_swiglu", self, dim)
    return (F.silu(a.float()) * b.float()).to(self.dtype)


def npu_geglu(
    self: torch.Tensor, dim: int = -1, approximate: int = 1, activate_left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch_npu.npu_geglu``: ``(y, gelu)``, ``gelu`` the activated half (left if
    ``activate_left``) and ``y = gelu * other half``; ``approximate`` 1 tanh, 0 none."""
    if approximate not in (0, 1):
        refuse("npu_geglu", "approximate", f"{approximate} (documented: 0 none, 1 tanh)")
    left, right = _halves("npu_geglu", self, dim)
    active, other = (left, right) if activate_left else (right, left)
    gelu = F.gelu(active.float(), approximate="tanh" if approximate == 1 else "none")
    return (gelu * other.float()).to(self.dtype), gelu.to(self.dtype)


def npu_fast_gelu(input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the documented name
    """``torch_npu.npu_fast_gelu`` on Atlas A2/A3: ``x / (1 + exp(-1.702 x))``."""
    x = input.float()
    return (x * torch.sigmoid(1.702 * x)).to(input.dtype)


KERNELS = {
    "npu_swiglu": npu_swiglu,
    "npu_geglu": npu_geglu,
    "npu_fast_gelu": npu_fast_gelu,
}
