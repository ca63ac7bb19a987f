"""The RMSNorm references follow the documented formula, computed here independently."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.norm import npu_add_rms_norm, npu_gemma_rms_norm, npu_rms_norm


def formula(x: torch.Tensor, gamma: torch.Tensor, eps: float, gemma: bool = False) -> torch.Tensor:
    xf = x.double()
    rms = (xf.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    weight = (1 + gamma.double()) if gemma else gamma.double()
    return (xf / rms * weight).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_is_x_over_rms_times_gamma(dtype):
    torch.manual_seed(0)
    x, gamma = torch.randn(5, 3, 64).to(dtype), torch.randn(64).to(dtype)
    y, rstd = npu_rms_norm(x, gamma, 1e-5)
    assert y.dtype == dtype and rstd.dtype == torch.float32 and rstd.shape == (5, 3, 1)
    torch.testing.assert_close(y, formula(x, gamma, 1e-5))


def test_gemma_rms_norm_scales_by_one_plus_gamma():
    torch.manual_seed(1)
    x, gamma = torch.randn(7, 32), torch.randn(32)
    y, _ = npu_gemma_rms_norm(x, gamma, 1e-6)
    torch.testing.assert_close(y, formula(x, gamma, 1e-6, gemma=True))


def test_add_rms_norm_returns_the_normalised_sum_and_the_sum():
    torch.manual_seed(2)
    residual, x, gamma = (
        torch.randn(4, 16).bfloat16(),
        torch.randn(4, 16).bfloat16(),
        torch.randn(16).bfloat16(),
    )
    y, rstd, total = npu_add_rms_norm(residual, x, gamma, 1e-6)
    exact_sum = residual.double() + x.double()
    torch.testing.assert_close(total, exact_sum.bfloat16())
    torch.testing.assert_close(
        y, (exact_sum / (exact_sum.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * gamma.double()).bfloat16()
    )
    assert rstd.shape == (4, 1)


def test_a_gamma_that_is_not_the_trailing_dims_is_an_error():
    with pytest.raises(ValueError, match="gamma"):
        npu_rms_norm(torch.randn(4, 16), torch.randn(8))
