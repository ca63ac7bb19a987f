"""The CPU reference of npu_fused_infer_attention_score agrees with PyTorch's own attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudoctor.live.npukernels import npu_fused_infer_attention_score

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 16


def paged(kv: list[torch.Tensor], blocks_per_request: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scatter each request's (L, KV_HEADS, DIM) KV into shuffled blocks of one paged cache."""
    total = len(kv) * blocks_per_request + 1
    cache = torch.randn(total, BLOCK, KV_HEADS * DIM)  # garbage where no request writes
    order = torch.randperm(total - 1) + 1
    table = order[: len(kv) * blocks_per_request].reshape(len(kv), blocks_per_request).int()
    for b, tokens in enumerate(kv):
        flat = tokens.reshape(-1, KV_HEADS * DIM)
        for j in range(flat.shape[0]):
            cache[table[b, j // BLOCK], j % BLOCK] = flat[j]
    return cache, table


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
    """Reference: query i sees key j <= offset + i (offset = kv_len - n_q)."""
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    mask = torch.arange(k.shape[0])[None, :] <= (offset + torch.arange(q.shape[0]))[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=0.3
    )
    return out.transpose(0, 1)


def test_paged_tnd_right_down_causal_matches_sdpa_per_request():
    torch.manual_seed(0)
    kv_lens, q_lens = [37, 50], [5, 50]  # a chunk at the end of request 0, a whole request 1
    keys = [torch.randn(n, KV_HEADS, DIM) for n in kv_lens]
    values = [torch.randn(n, KV_HEADS, DIM) for n in kv_lens]
    queries = [torch.randn(n, HEADS, DIM) for n in q_lens]
    k_cache, table = paged(keys, 4)
    v_cache = k_cache.clone()
    for b, tokens in enumerate(values):
        flat = tokens.reshape(-1, KV_HEADS * DIM)
        for j in range(flat.shape[0]):
            v_cache[table[b, j // BLOCK], j % BLOCK] = flat[j]
    out, lse = npu_fused_infer_attention_score(
        torch.cat(queries),
        k_cache,
        v_cache,
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        sparse_mode=3,
        next_tokens=0,
        scale=0.3,
        actual_seq_lengths=[5, 55],
        actual_seq_lengths_kv=kv_lens,
    )
    expected = torch.cat([sdpa(q, k, v, kv - len(q)) for q, k, v, kv in zip(queries, keys, values, kv_lens)])
    assert out.shape == (55, HEADS, DIM) and lse.shape == (55, HEADS, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_wrong_cumulative_split_changes_the_answer():
    """Passing per-request lengths where cumulative ends are due is visible in the output."""
    torch.manual_seed(1)
    keys = [torch.randn(20, KV_HEADS, DIM) for _ in range(2)]
    cache, table = paged(keys, 2)
    q = torch.randn(40, HEADS, DIM)
    common = dict(
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        sparse_mode=3,
        scale=0.3,
        actual_seq_lengths_kv=[20, 20],
    )
    right, _ = npu_fused_infer_attention_score(q, cache, cache, actual_seq_lengths=[20, 40], **common)
    wrong, _ = npu_fused_infer_attention_score(q, cache, cache, actual_seq_lengths=[20, 20], **common)
    assert not torch.allclose(right[20:], wrong[20:])


@pytest.mark.parametrize(
    "change",
    [
        {"input_layout": "BSH"},
        {"block_table": None},
        {"sparse_mode": 2},
        {"pse_shift": torch.zeros(1)},
        {"sparse_mode": 0, "next_tokens": 0},
    ],
)
def test_arguments_outside_the_modelled_subset_are_refused(change):
    q = torch.randn(4, HEADS, DIM)
    cache = torch.randn(2, BLOCK, KV_HEADS * DIM)
    kwargs = dict(
        block_table=torch.zeros(1, 1, dtype=torch.int32),
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        sparse_mode=3,
        actual_seq_lengths=[4],
        actual_seq_lengths_kv=[4],
    )
    kwargs.update(change)
    with pytest.raises(NotImplementedError):
        npu_fused_infer_attention_score(q, cache, cache, **kwargs)
