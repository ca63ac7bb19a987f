"""The rotary-embedding references rotate as their documents say: half (NeoX) vs interleaved
(GPT-J) pairs, computed here from the angle of each pair independently."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.rope import npu_interleave_rope, npu_mrope, npu_rotary_mul

BASE = 10000.0


def cos_sin_cache(positions: int, rotary_dim: int) -> torch.Tensor:
    """sglang's RotaryEmbedding cache: cat(cos, sin) of the (positions, rotary_dim / 2) angles."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    angles = torch.arange(positions).double()[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def rotate_pairs(
    x: torch.Tensor, angles: torch.Tensor, first: torch.Tensor, second: torch.Tensor
) -> torch.Tensor:
    """Rotate each pair (x[first[i]], x[second[i]]) by angles[..., i]: the plain 2-D rotation."""
    out = x.clone().double()
    a, b = x[..., first].double(), x[..., second].double()
    c, s = angles.cos(), angles.sin()
    out[..., first], out[..., second] = a * c - b * s, b * c + a * s
    return out.to(x.dtype)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_mrope_with_1d_positions_rotates_each_head_as_plain_rope(mode):
    torch.manual_seed(0)
    tokens, heads, kv_heads, head_size, rotary_dim = 5, 2, 1, 16, 8  # a partial rotary dim
    positions = torch.tensor([0, 3, 7, 2, 9])
    q, k = torch.randn(tokens, heads * head_size), torch.randn(tokens, kv_heads * head_size)
    cache = cos_sin_cache(16, rotary_dim)
    q_out, k_out = npu_mrope(positions, q, k, cache, head_size, mrope_section=[0, 0, 0], rotary_mode=mode)
    inv_freq = 1.0 / BASE ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    angles = positions.double()[:, None, None] * inv_freq  # (T, 1, rotary_dim / 2)
    half = rotary_dim // 2
    first, second = (
        (torch.arange(half), torch.arange(half) + half)
        if mode == "half"
        else (torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2))
    )
    for out, x, n in ((q_out, q, heads), (k_out, k, kv_heads)):
        expected = rotate_pairs(x.reshape(tokens, n, head_size), angles, first, second)
        torch.testing.assert_close(out.reshape(tokens, n, head_size), expected)


def test_mrope_sections_take_their_positions_row():
    torch.manual_seed(1)
    tokens, head_size = 4, 12
    positions = torch.randint(0, 20, (3, tokens))
    q, k = torch.randn(tokens, head_size), torch.randn(tokens, head_size)
    cache = cos_sin_cache(20, head_size)
    q_out, _ = npu_mrope(positions, q, k, cache, head_size, mrope_section=[2, 2, 2], rotary_mode="half")
    inv_freq = 1.0 / BASE ** (torch.arange(0, head_size, 2).double() / head_size)
    rows = torch.tensor([0, 0, 1, 1, 2, 2])  # section i of the 6 frequencies reads positions[i]
    angles = positions.double().T[:, rows] * inv_freq  # (T, 6)
    expected = rotate_pairs(q, angles, torch.arange(6), torch.arange(6) + 6)
    torch.testing.assert_close(q_out, expected)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_is_x_cos_plus_rotated_x_sin(mode):
    torch.manual_seed(2)
    x, angles = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 4)
    if mode == "half":
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        first, second = torch.arange(4), torch.arange(4) + 4
    else:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        first, second = torch.arange(0, 8, 2), torch.arange(1, 8, 2)
    out = npu_rotary_mul(x, cos, sin, rotary_mode=mode)
    torch.testing.assert_close(out, rotate_pairs(x, angles, first, second))


def test_interleave_rope_rotates_adjacent_pairs_and_returns_them_as_halves():
    """DeepSeek's rope: pair (x[2i], x[2i+1]) rotated by angle i, output de-interleaved."""
    torch.manual_seed(3)
    x, angles = torch.randn(3, 2, 1, 64), torch.randn(3, 1, 1, 32)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    out = npu_interleave_rope(x, cos, sin)
    even, odd = x[..., 0::2].double(), x[..., 1::2].double()
    expected = torch.cat(
        [even * angles.cos() - odd * angles.sin(), odd * angles.cos() + even * angles.sin()], -1
    )
    torch.testing.assert_close(out, expected.float())


@pytest.mark.parametrize(
    "call, argument",
    [
        (
            lambda: npu_interleave_rope(
                torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)
            ),
            "x",
        ),
        (
            lambda: npu_rotary_mul(
                torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8), rotate=torch.eye(8)
            ),
            "rotate",
        ),
        (
            lambda: npu_mrope(
                torch.zeros(2, dtype=torch.long),
                torch.randn(2, 8),
                torch.randn(2, 8),
                cos_sin_cache(4, 8),
                8,
                cache_mode="interleave",
            ),
            "cache_mode",
        ),
        (
            lambda: npu_mrope(
                torch.zeros(2, dtype=torch.long),
                torch.randn(2, 8),
                torch.randn(2, 8),
                cos_sin_cache(4, 8),
                8,
                mrope_section=[1, 1, 2],
            ),
            "mrope_section",
        ),
    ],
)
def test_undocumented_or_unmodelled_forms_are_refused_by_name(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
