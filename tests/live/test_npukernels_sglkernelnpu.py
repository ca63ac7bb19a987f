"""The references of the sgl-kernel-npu functions on the dense and MoE paths agree with sglang's
own portable computations of the same step (RMSNorm then rotate-half RoPE; top-k renormalisation),
written here independently."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels import SGL_KERNEL_NPU
from npudoctor.live.npukernels.norm import l1_norm, split_qkv_rmsnorm_rope
from npudoctor.live.npukernels.rope import fused_rope_qk_mqa


def angles_for(tokens: int, rope_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rope_dim, 2).double() / rope_dim)
    return torch.arange(tokens).double()[:, None] * inv_freq  # (T, rope_dim / 2)


def rotate_pairs(x, angles, first, second):
    out = x.double().clone()
    a, b = x[..., first].double(), x[..., second].double()
    c, s = angles.cos()[:, None, :], angles.sin()[:, None, :]
    out[..., first], out[..., second] = a * c - b * s, b * c + a * s
    return out


def test_the_sgl_kernel_npu_references_are_listed_by_their_import_path():
    assert SGL_KERNEL_NPU["sgl_kernel_npu.norm.l1_norm.l1_norm"] is l1_norm


def test_l1_norm_divides_each_row_by_its_sum():
    w = torch.rand(5, 8).bfloat16()
    out = l1_norm(w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, w.float() / w.float().sum(1, keepdim=True))


@pytest.mark.parametrize("neox", [True, False])
def test_split_qkv_rmsnorm_rope_is_per_head_rms_norm_then_rope(neox):
    torch.manual_seed(0)
    tokens, heads, kv_heads, head_dim, rope_dim = 3, 4, 2, 16, 8  # a partial rotary dim
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim)
    q_w, k_w = torch.randn(head_dim), torch.randn(head_dim)
    angles = angles_for(tokens, rope_dim)
    cos = torch.cat([angles.cos()] * 2, -1).float().view(tokens, 1, 1, rope_dim)  # get_cos_sin_with_position
    sin = torch.cat([angles.sin()] * 2, -1).float().view(tokens, 1, 1, rope_dim)
    q, k, v = split_qkv_rmsnorm_rope(
        qkv,
        sin,
        cos,
        heads * head_dim,
        kv_heads * head_dim,
        head_dim,
        eps=1e-6,
        q_weight=q_w,
        k_weight=k_w,
        is_neox_style=neox,
    )
    first, second = (
        (torch.arange(4), torch.arange(4) + 4) if neox else (torch.arange(0, 8, 2), torch.arange(1, 8, 2))
    )
    for out, raw, n, w in (
        (q, qkv[:, : heads * head_dim], heads, q_w),
        (k, qkv[:, heads * head_dim : (heads + kv_heads) * head_dim], kv_heads, k_w),
    ):
        x = raw.reshape(tokens, n, head_dim).double()
        normed = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double()
        torch.testing.assert_close(
            out.reshape(tokens, n, head_dim).double(),
            rotate_pairs(normed, angles, first, second),
            rtol=1e-5,
            atol=1e-5,
        )
    torch.testing.assert_close(v, qkv[:, (heads + kv_heads) * head_dim :])


def test_split_qkv_rmsnorm_rope_asserts_a_power_of_two_head_dim_as_its_wrapper_does():
    with pytest.raises(AssertionError, match="head_dim"):
        split_qkv_rmsnorm_rope(torch.randn(1, 48), torch.randn(1, 12), torch.randn(1, 12), 24, 12, 12)


@pytest.mark.parametrize("neox", [True, False])
def test_fused_rope_qk_mqa_rotates_query_and_key_with_each_tokens_row(neox):
    torch.manual_seed(1)
    tokens, head_dim, rope_dim = 4, 16, 8
    q, k = torch.randn(tokens, 4, head_dim).bfloat16(), torch.randn(tokens, 2, head_dim).bfloat16()
    angles = angles_for(tokens, rope_dim)
    cos_sin = torch.cat([angles.cos(), angles.sin()], -1).float()  # cos_sin_cache.index_select(0, positions)
    q_out, k_out = fused_rope_qk_mqa(q, k, cos_sin, rope_dim, neox)
    first, second = (
        (torch.arange(4), torch.arange(4) + 4) if neox else (torch.arange(0, 8, 2), torch.arange(1, 8, 2))
    )
    torch.testing.assert_close(q_out, rotate_pairs(q, angles, first, second).bfloat16())
    torch.testing.assert_close(k_out, rotate_pairs(k, angles, first, second).bfloat16())


def test_fused_rope_qk_mqa_refuses_head_counts_its_kernel_cannot_span():
    with pytest.raises(NotImplementedError, match="query"):
        fused_rope_qk_mqa(torch.randn(2, 3, 8), torch.randn(2, 1, 8), torch.randn(2, 8), 8, True)
