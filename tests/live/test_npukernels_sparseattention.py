"""DSA's NPU kernels: the lightning indexer's top-k is the brute-force top-k of its documented
score, and sparse flash attention over indices that cover every visible token is causal attention
over the whole KV (so what the indexer drops is all that changes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudoctor.live.npukernels.sparseattention import npu_lightning_indexer, npu_sparse_flash_attention

BLOCK = 16


def paged(tokens: list[torch.Tensor], blocks_per_request: int) -> tuple[torch.Tensor, torch.Tensor]:
    dim = tokens[0].shape[-1]
    total = len(tokens) * blocks_per_request + 1
    cache = torch.randn(total, BLOCK, 1, dim)
    table = (torch.randperm(total - 1)[: len(tokens) * blocks_per_request] + 1).reshape(len(tokens), -1).int()
    for b, t in enumerate(tokens):
        for j in range(t.shape[0]):
            cache[table[b, j // BLOCK], j % BLOCK, 0] = t[j]
    return cache, table


def test_indexer_picks_the_best_visible_tokens_by_the_documented_score():
    torch.manual_seed(0)
    kv_lens, q_lens, heads, top = [20, 9], [4, 9], 3, 6
    keys = [torch.randn(n, 128) for n in kv_lens]
    cache, table = paged(keys, 2)
    q, w = torch.randn(13, heads, 128), torch.randn(13, heads)
    indices, _ = npu_lightning_indexer(
        q,
        cache,
        w,
        actual_seq_lengths_query=torch.tensor([4, 13]),
        actual_seq_lengths_key=torch.tensor(kv_lens),
        block_table=table,
        layout_query="TND",
        layout_key="PA_BSND",
        sparse_count=top,
        sparse_mode=3,
    )
    assert indices.shape == (13, 1, top) and indices.dtype == torch.int32
    starts = [0, 4]
    for b, (n, length) in enumerate(zip(q_lens, kv_lens)):
        for i in range(n):
            t = starts[b] + i
            visible = length - n + i + 1
            score = [float((w[t] * torch.relu(q[t] @ keys[b][j])).sum()) for j in range(visible)]
            best = sorted(range(visible), key=lambda j: -score[j])[:top]
            row = indices[t, 0].tolist()
            assert row[: len(best)] == best and all(x == -1 for x in row[len(best) :])


def test_sparse_attention_over_every_visible_token_is_causal_mla_attention():
    torch.manual_seed(1)
    heads, length, n = 4, 18, 5
    latent, rope = torch.randn(length, 512), torch.randn(length, 64)
    c_cache, table = paged([latent], 2)
    r_cache = torch.randn(c_cache.shape[0], BLOCK, 1, 64)
    for j in range(length):
        r_cache[table[0, j // BLOCK], j % BLOCK, 0] = rope[j]
    q_nope, q_pe = torch.randn(n, heads, 512), torch.randn(n, heads, 64)
    everything = torch.arange(length, dtype=torch.int32).expand(n, 1, length).contiguous()
    out, _, _ = npu_sparse_flash_attention(
        q_nope,
        c_cache,
        c_cache,
        everything,
        0.05,
        block_table=table,
        actual_seq_lengths_query=[n],
        actual_seq_lengths_kv=[length],
        query_rope=q_pe,
        key_rope=r_cache,
        layout_query="TND",
        layout_kv="PA_BSND",
        sparse_mode=3,
        attention_mode=2,
    )
    q = torch.cat([q_nope, q_pe], -1).transpose(0, 1)
    k = torch.cat([latent, rope], -1).expand(heads, -1, -1)
    mask = torch.arange(length)[None, :] <= (length - n + torch.arange(n))[:, None]
    expected = F.scaled_dot_product_attention(q, k, latent.expand(heads, -1, -1), attn_mask=mask, scale=0.05)
    torch.testing.assert_close(out, expected.transpose(0, 1), rtol=1e-4, atol=1e-4)


def test_sparse_attention_reads_only_the_listed_tokens():
    torch.manual_seed(2)
    length = 10
    latent = torch.randn(length, 512)
    cache, table = paged([latent], 1)
    q = torch.randn(1, 2, 512)
    listed = torch.tensor([[[7, 2, -1, -1]]], dtype=torch.int32)
    out, _, _ = npu_sparse_flash_attention(
        q,
        cache,
        cache,
        listed,
        0.1,
        block_table=table,
        actual_seq_lengths_query=[1],
        actual_seq_lengths_kv=[length],
        layout_query="TND",
        layout_kv="PA_BSND",
        sparse_mode=3,
    )
    k = latent[[7, 2]]
    expected = torch.softmax(q[0] @ k.T * 0.1, -1) @ k
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "call, argument",
    [
        (
            lambda: npu_sparse_flash_attention(
                torch.randn(1, 1, 512),
                torch.randn(1, BLOCK, 1, 512),
                torch.randn(1, BLOCK, 1, 512),
                torch.zeros(1, 1, 1, dtype=torch.int32),
                1.0,
                block_table=torch.zeros(1, 1, dtype=torch.int32),
                actual_seq_lengths_query=[1],
                actual_seq_lengths_kv=[1],
                layout_query="TND",
                layout_kv="PA_BSND",
                sparse_block_size=4,
            ),
            "sparse_block_size",
        ),
        (
            lambda: npu_lightning_indexer(
                torch.randn(1, 1, 64),
                torch.randn(1, BLOCK, 1, 64),
                torch.randn(1, 1),
                actual_seq_lengths_query=[1],
                actual_seq_lengths_key=[1],
                block_table=torch.zeros(1, 1, dtype=torch.int32),
                layout_query="TND",
                layout_key="PA_BSND",
            ),
            "query/key",
        ),
    ],
)
def test_unmodelled_forms_are_refused_by_name(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
