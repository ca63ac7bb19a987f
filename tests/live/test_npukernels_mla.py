"""The MLA references: paged latent attention, the latent KV's norm/rope/cache write, and the
absorbed projections, each against a plain computation of the documented semantics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudoctor.live.npukernels.attention import _npu_paged_attention_mla
from npudoctor.live.npukernels.mla import (
    batch_matmul_transpose,
    npu_kv_rmsnorm_rope_cache,
    npu_transpose_batchmatmul,
)


def test_paged_attention_mla_uses_the_latent_part_of_the_cache_as_value():
    torch.manual_seed(0)
    heads, latent, rope, block = 4, 16, 4, 8
    lengths = [5, 11]
    tokens = [torch.randn(n, 1, latent + rope) for n in lengths]
    cache = torch.randn(5, block, 1, latent + rope)
    table = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    for b, t in enumerate(tokens):
        for j in range(t.shape[0]):
            cache[table[b, j // block], j % block] = t[j]
    query = torch.randn(2, heads, latent + rope)
    out = torch.empty(2, heads, latent)
    _npu_paged_attention_mla(
        query=query,
        key_cache=cache,
        num_kv_heads=1,
        num_heads=heads,
        scale_value=0.1,
        block_table=table,
        context_lens=torch.tensor(lengths),
        mla_vheadsize=latent,
        out=out,
    )
    for b, t in enumerate(tokens):
        k = t[:, 0].expand(heads, -1, -1)
        expected = F.scaled_dot_product_attention(query[b][:, None], k, k[..., :latent], scale=0.1)[:, 0]
        torch.testing.assert_close(out[b], expected, rtol=1e-5, atol=1e-5)


def test_kv_rmsnorm_rope_cache_normalises_rotates_and_writes_each_token_to_its_slot():
    torch.manual_seed(1)
    tokens, block = 3, 4
    kv = torch.randn(tokens, 1, 1, 576)
    gamma = torch.randn(512)
    angles = torch.randn(tokens, 1, 1, 32)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    k_cache, ckv_cache = torch.zeros(3, block, 1, 64), torch.zeros(3, block, 1, 512)
    slots = torch.tensor([9, 0, 5])
    _, _, k_rope, c_kv = npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, slots, k_cache, ckv_cache, epsilon=1e-6, cache_mode="PA_BNSD", is_output_kv=True
    )
    latent, rope = kv[..., :512].double(), kv[..., 512:].double()
    expected_c = latent / (latent.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * gamma.double()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    c, s = angles.cos().double(), angles.sin().double()
    expected_k = torch.cat([even * c - odd * s, odd * c + even * s], dim=-1)
    torch.testing.assert_close(c_kv, expected_c.float())
    torch.testing.assert_close(k_rope, expected_k.float())
    for t, slot in enumerate(slots.tolist()):
        torch.testing.assert_close(ckv_cache.view(-1, 512)[slot], expected_c[t, 0, 0].float())
        torch.testing.assert_close(k_cache.view(-1, 64)[slot], expected_k[t, 0, 0].float())
    assert ckv_cache.view(-1, 512)[[1, 2, 3, 4, 6, 7, 8, 10, 11]].abs().sum() == 0


def test_transpose_batchmatmul_is_the_per_head_projection():
    """sglang's absorbed w_kc: q_nope (T, N, D) x w_kc (N, D, R) -> (T, N, R)."""
    torch.manual_seed(2)
    q, w = torch.randn(5, 3, 8), torch.randn(3, 8, 6)
    out = npu_transpose_batchmatmul(q, w, perm_x1=(1, 0, 2), perm_x2=(0, 1, 2), perm_y=(1, 0, 2))
    torch.testing.assert_close(out, torch.einsum("tnd,ndr->tnr", q, w))


def test_batch_matmul_transpose_is_the_same_projection_written_in_place():
    torch.manual_seed(3)
    a, b = torch.randn(5, 3, 8), torch.randn(3, 8, 6)
    out = torch.empty(5, 3, 6)
    batch_matmul_transpose(a, b, out)
    torch.testing.assert_close(out, npu_transpose_batchmatmul(a, b, perm_x1=(1, 0, 2)))


@pytest.mark.parametrize(
    "call, argument",
    [
        (
            lambda: npu_kv_rmsnorm_rope_cache(
                torch.randn(1, 1, 1, 80),
                torch.randn(64),
                torch.randn(1, 1, 1, 16),
                torch.randn(1, 1, 1, 16),
                torch.tensor([0]),
                torch.zeros(1, 4, 1, 16),
                torch.zeros(1, 4, 1, 64),
                cache_mode="PA_BNSD",
            ),
            "kv",
        ),
        (
            lambda: npu_kv_rmsnorm_rope_cache(
                torch.randn(1, 1, 1, 576),
                torch.randn(512),
                torch.randn(1, 1, 1, 64),
                torch.randn(1, 1, 1, 64),
                torch.tensor([0]),
                torch.zeros(1, 4, 1, 64),
                torch.zeros(1, 4, 1, 512),
                cache_mode="PA_NZ",
            ),
            "cache_mode",
        ),
        (
            lambda: batch_matmul_transpose(
                torch.randn(1025, 1, 2), torch.randn(1, 2, 2), torch.empty(1025, 1, 2)
            ),
            "tensor_a",
        ),
        (
            lambda: npu_transpose_batchmatmul(
                torch.randn(2, 2, 2), torch.randn(2, 2, 2), scale=torch.ones(4, dtype=torch.int64)
            ),
            "scale",
        ),
    ],
)
def test_undocumented_sizes_and_unmodelled_modes_are_refused_by_name(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
