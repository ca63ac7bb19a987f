"""CPU references of the gated-activation kernels sglang's NPU forwards call.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fast_gelu.md``, ``torch_npu-npu_clipped_swiglu.md``; ``npu_swiglu`` and ``npu_geglu``
by their schemas in ``op_plugin/config/op_plugin_functions.yaml`` and the SwiGlu/GeGlu formulas of
the CANN operator reference: the input is split into two halves ``A, B`` along ``dim``;
SwiGlu is ``silu(A) * B``; GeGlu activates the left half when ``activate_left`` else the right one,
``approximate`` 1 = tanh GELU, 0 = erf GELU).

Call sites: sglang ``srt/layers/activation.py`` ``SiluAndMul.forward_npu`` (swiglu),
``GeluAndMul.forward_npu`` (geglu, ``activate_left=True``), ``QuickGELU.forward_npu``
(fast_gelu), 0.5.4-0.5.23; ``npu_swiglu`` also in the NPU MoE expert MLP (``torch.ops.npu``);
``npu_clipped_swiglu`` in ``models/deepseek_v2.py``'s MLP with a ``swiglu_limit`` (0.5.20-0.5.23).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given


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


def npu_clipped_swiglu(
    x: torch.Tensor,
    *,
    group_index: torch.Tensor | None = None,
    dim: int = -1,
    alpha: float = 1.702,
    limit: float = 7.0,
    bias: float = 1.0,
    interleaved: bool = True,
) -> torch.Tensor:
    """``torch_npu.npu_clipped_swiglu``: ``x`` split along ``dim`` into ``A, B`` (even/odd
    elements if ``interleaved``, else halves); ``A = A.clamp(max=limit)``,
    ``B = B.clamp(-limit, limit)``; ``y = A * sigmoid(alpha * A) * (B + bias)``, in float32, in
    ``x``'s dtype. The grouped form (``group_index``, rows past its sum left undefined) is refused."""
    op = "npu_clipped_swiglu"
    refuse_given(op, {"group_index": group_index})
    if x.dim() < 2 or x.shape[dim] % 2:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} has no even dim {dim} to split")
    xf = x.float().movedim(dim, -1)
    a, b = (xf[..., ::2], xf[..., 1::2]) if interleaved else xf.chunk(2, dim=-1)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit)
    return (a * torch.sigmoid(alpha * a) * (b + bias)).movedim(-1, dim).to(x.dtype)


KERNELS = {
    "npu_clipped_swiglu": npu_clipped_swiglu,
    "npu_swiglu": npu_swiglu,
    "npu_geglu": npu_geglu,
    "npu_fast_gelu": npu_fast_gelu,
}
