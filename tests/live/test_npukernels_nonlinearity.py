"""The gated activations follow their documented formulas, computed here independently."""

from __future__ import annotations

import math

import pytest
import torch

from npudoctor.live.npukernels.nonlinearity import npu_clipped_swiglu, npu_fast_gelu, npu_geglu, npu_swiglu


def test_swiglu_is_silu_of_the_first_half_times_the_second():
    torch.manual_seed(0)
    x = torch.randn(3, 2, 20)
    a, b = x[..., :10], x[..., 10:]
    torch.testing.assert_close(npu_swiglu(x), a / (1 + torch.exp(-a)) * b)


@pytest.mark.parametrize("approximate", [0, 1])
@pytest.mark.parametrize("activate_left", [True, False])
def test_geglu_activates_the_documented_half(approximate, activate_left):
    torch.manual_seed(1)
    x = torch.randn(6, 16)
    left, right = x[:, :8], x[:, 8:]
    active, other = (left, right) if activate_left else (right, left)
    if approximate:
        gelu = 0.5 * active * (1 + torch.tanh(math.sqrt(2 / math.pi) * (active + 0.044715 * active**3)))
    else:
        gelu = 0.5 * active * (1 + torch.erf(active / math.sqrt(2)))
    y, g = npu_geglu(x, dim=-1, approximate=approximate, activate_left=activate_left)
    torch.testing.assert_close(g, gelu)
    torch.testing.assert_close(y, gelu * other)


def test_fast_gelu_is_the_a2_a3_formula():
    x = torch.linspace(-6, 6, 101)
    torch.testing.assert_close(npu_fast_gelu(x), x / (1 + torch.exp(-1.702 * x)))


def test_geglu_refuses_an_undocumented_approximation():
    with pytest.raises(NotImplementedError, match="approximate"):
        npu_geglu(torch.randn(2, 4), approximate=2)


@pytest.mark.parametrize("interleaved", [True, False])
def test_clipped_swiglu_clamps_then_gates(interleaved):
    """DeepSeek's MLP with swiglu_limit: gate clamped above, up clamped both ways."""
    torch.manual_seed(2)
    x = torch.randn(4, 12) * 6
    gate, up = (x[:, ::2], x[:, 1::2]) if interleaved else (x[:, :6], x[:, 6:])
    gate, up = torch.minimum(gate, torch.tensor(5.0)), up.clamp(-5.0, 5.0)
    expected = gate / (1 + torch.exp(-gate)) * up
    out = npu_clipped_swiglu(x, alpha=1, limit=5.0, bias=0, interleaved=interleaved)
    torch.testing.assert_close(out, expected)


def test_clipped_swiglu_refuses_the_grouped_form():
    with pytest.raises(NotImplementedError, match="group_index"):
        npu_clipped_swiglu(torch.randn(4, 8), group_index=torch.tensor([2, 1]))
