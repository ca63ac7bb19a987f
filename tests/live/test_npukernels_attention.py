"""The CPU references of the NPU attention kernels agree with PyTorch's own attention
(``scaled_dot_product_attention`` with the mask each kernel documents), for every layout and
paged form sglang's Ascend backend calls, and refuse the forms they do not model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudoctor.live.npukernels import KERNELS
from npudoctor.live.npukernels.attention import (
    _npu_flash_attention_qlens,
    _npu_flash_attention_unpad,
    _npu_paged_attention,
    npu_attention_update,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
)

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 16
CAUSAL_2048 = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # what sglang's fia_mask is


def paged(
    per_request: list[torch.Tensor], blocks_per_request: int, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's (L, H, D) tokens scattered into shuffled blocks of one (blocks, block, H, D)
    cache; garbage where no request writes. Returns (cache, block_table)."""
    heads, dim = per_request[0].shape[1:]
    total = len(per_request) * blocks_per_request + 1
    cache = torch.randn(total, block, heads, dim)
    order = torch.randperm(total - 1) + 1
    table = order[: len(per_request) * blocks_per_request].reshape(len(per_request), blocks_per_request).int()
    for b, tokens in enumerate(per_request):
        for j in range(tokens.shape[0]):
            cache[table[b, j // block], j % block] = tokens[j]
    return cache, table


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int | None
) -> torch.Tensor:
    """(n, N, D) queries over (L, N_kv, D) keys; query i sees key j <= causal_offset + i (None: all)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = None
    if causal_offset is not None:
        mask = torch.arange(k.shape[0])[None, :] <= (causal_offset + torch.arange(q.shape[0]))[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def requests(
    kv_lens: list[int], q_lens: list[int], heads: int = HEADS, kv_heads: int = KV_HEADS, dim: int = DIM
):
    keys = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    values = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    queries = [torch.randn(n, heads, dim) for n in q_lens]
    return keys, values, queries


def caches(keys, values, blocks_per_request, block=BLOCK):
    k_cache, table = paged(keys, blocks_per_request, block)
    v_cache = k_cache.clone()
    for b, tokens in enumerate(values):
        for j in range(tokens.shape[0]):
            v_cache[table[b, j // block], j % block] = tokens[j]
    return k_cache, v_cache, table


def test_every_family_is_installed_under_its_torch_npu_name():
    assert KERNELS["npu_fused_infer_attention_score"] is npu_fused_infer_attention_score
    assert callable(KERNELS["npu_fused_infer_attention_score"].out)


def test_fia_tnd_right_down_causal_matches_sdpa_per_request():
    """forward_extend with ASCEND_USE_FIA: TND, cumulative query ends, causal after the prefix."""
    torch.manual_seed(0)
    kv_lens, q_lens = [37, 50], [5, 50]  # a chunk at the end of request 0, a whole request 1
    keys, values, queries = requests(kv_lens, q_lens)
    k_cache, v_cache, table = caches(keys, values, 4)
    out, lse = npu_fused_infer_attention_score(
        torch.cat(queries),
        k_cache.flatten(2),
        v_cache.flatten(2),
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        atten_mask=CAUSAL_2048,
        sparse_mode=3,
        next_tokens=0,
        scale=0.3,
        actual_seq_lengths=[5, 55],
        actual_seq_lengths_kv=kv_lens,
    )
    expected = torch.cat(
        [sdpa(q, k, v, 0.3, kv - len(q)) for q, k, v, kv in zip(queries, keys, values, kv_lens)]
    )
    assert out.shape == (55, HEADS, DIM) and lse.shape == (55, HEADS, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_fia_left_up_causal_aligns_the_mask_to_the_start():
    torch.manual_seed(2)
    keys, values, queries = requests([12], [5])
    k_cache, v_cache, table = caches(keys, values, 1)
    out, _ = npu_fused_infer_attention_score(
        queries[0],
        k_cache.flatten(2),
        v_cache.flatten(2),
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        atten_mask=CAUSAL_2048,
        sparse_mode=2,
        scale=0.5,
        actual_seq_lengths=[5],
        actual_seq_lengths_kv=[12],
    )
    torch.testing.assert_close(out, sdpa(queries[0], keys[0], values[0], 0.5, 0), rtol=1e-5, atol=1e-5)


def test_a_wrong_cumulative_split_changes_the_answer():
    """Passing per-request lengths where TND's cumulative ends are due is visible in the output."""
    torch.manual_seed(1)
    keys, values, _ = requests([20, 20], [0, 0])
    k_cache, v_cache, table = caches(keys, values, 2)
    q = torch.randn(40, HEADS, DIM)
    common = dict(
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        sparse_mode=3,
        atten_mask=CAUSAL_2048,
        scale=0.3,
        actual_seq_lengths_kv=[20, 20],
    )
    right, _ = npu_fused_infer_attention_score(
        q, k_cache.flatten(2), v_cache.flatten(2), actual_seq_lengths=[20, 40], **common
    )
    wrong, _ = npu_fused_infer_attention_score(
        q, k_cache.flatten(2), v_cache.flatten(2), actual_seq_lengths=[20, 20], **common
    )
    assert not torch.allclose(right[20:], wrong[20:])


def test_fia_out_bsh_decode_writes_full_attention_into_out():
    """forward_decode_graph: BSH, one query per request, sparse_mode 0, through ``.out``."""
    torch.manual_seed(3)
    kv_lens = [9, 33, 1]
    keys, values, queries = requests(kv_lens, [1, 1, 1])
    k_cache, v_cache, table = caches(keys, values, 3)
    query = torch.cat(queries).reshape(3, 1, HEADS * DIM)
    output = torch.empty(3, 1, HEADS * DIM)
    lse_placeholder = torch.empty(1)
    kwargs = dict(
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="BSH",
        scale=0.25,
        actual_seq_lengths_kv=kv_lens,
        atten_mask=None,
        sparse_mode=0,
    )
    workspace = KERNELS["_npu_fused_infer_attention_score_get_max_workspace"](
        query, k_cache.flatten(2), v_cache.flatten(2), **kwargs
    )
    npu_fused_infer_attention_score.out(
        query,
        k_cache.flatten(2),
        v_cache.flatten(2),
        workspace=workspace,
        out=[output, lse_placeholder],
        **kwargs,
    )
    expected = torch.stack([sdpa(q, k, v, 0.25, None) for q, k, v in zip(queries, keys, values)])
    torch.testing.assert_close(output, expected.reshape(3, 1, HEADS * DIM), rtol=1e-5, atol=1e-5)


def test_fia_bsnd_decode_and_bnsd_agree_with_sdpa():
    torch.manual_seed(4)
    kv_lens = [17, 5]
    keys, values, queries = requests(kv_lens, [1, 1])
    k_cache, v_cache, table = caches(keys, values, 2)
    expected = torch.stack(
        [sdpa(q, k, v, 0.4, None) for q, k, v in zip(queries, keys, values)]
    )  # (B, 1, N, D)
    common = dict(
        block_table=table,
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        scale=0.4,
        actual_seq_lengths_kv=kv_lens,
    )
    bsnd, _ = npu_fused_infer_attention_score(
        torch.stack(queries), k_cache.flatten(2), v_cache.flatten(2), input_layout="BSND", **common
    )
    bnsd, _ = npu_fused_infer_attention_score(
        torch.stack(queries).transpose(1, 2),
        k_cache.flatten(2),
        v_cache.flatten(2),
        input_layout="BNSD",
        **common,
    )
    torch.testing.assert_close(bsnd, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bnsd, expected.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_fia_v2_bsnd_prefill_over_a_cached_prefix_matches_sdpa():
    """forward_extend's per-request FIA v2 call: BSND, actual_seq_qlen per batch, rightDownCausal."""
    torch.manual_seed(5)
    keys, values, queries = requests([40], [7])
    k_cache, v_cache, table = caches(keys, values, 3)
    out, _ = npu_fused_infer_attention_score_v2(
        queries[0][None],
        k_cache.flatten(2),
        v_cache.flatten(2),
        num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="BSND",
        block_table=table,
        block_size=BLOCK,
        actual_seq_qlen=[7],
        actual_seq_kvlen=[40],
        atten_mask=CAUSAL_2048.unsqueeze(0),
        sparse_mode=3,
        softmax_scale=0.3,
    )
    torch.testing.assert_close(
        out[0], sdpa(queries[0], keys[0], values[0], 0.3, 40 - 7), rtol=1e-5, atol=1e-5
    )


def test_fia_mla_scores_over_latent_and_rope_parts_and_reads_the_latent_value():
    """MLA decode: query_rope/key_rope add to the scores; the latent cache is the value."""
    torch.manual_seed(6)
    latent, rope_dim, heads = 16, 4, 4
    latent_kv = [torch.randn(11, 1, latent)]
    rope_k = [torch.randn(11, 1, rope_dim)]
    q_nope, q_rope = torch.randn(1, 1, heads, latent), torch.randn(1, 1, heads, rope_dim)
    c_cache, table = paged(latent_kv, 1)
    r_cache = torch.randn(c_cache.shape[0], BLOCK, 1, rope_dim)
    r_cache[table[0, 0], :11] = rope_k[0]
    out, _ = npu_fused_infer_attention_score(
        q_nope,
        c_cache.flatten(2),
        c_cache.flatten(2),
        query_rope=q_rope,
        key_rope=r_cache.flatten(2),
        num_heads=heads,
        num_key_value_heads=1,
        block_table=table,
        block_size=BLOCK,
        input_layout="BSND",
        scale=0.2,
        actual_seq_lengths_kv=[11],
        antiquant_mode=0,
        antiquant_scale=None,
        sparse_mode=0,
    )
    q = torch.cat([q_nope[0], q_rope[0]], dim=-1)[0]  # (N, latent + rope)
    k = torch.cat([latent_kv[0], rope_k[0]], dim=-1)
    expected = sdpa(q[None], k, latent_kv[0], 0.2, None)
    torch.testing.assert_close(out[0, 0], expected[0], rtol=1e-5, atol=1e-5)


def test_paged_attention_decode_matches_sdpa():
    torch.manual_seed(7)
    kv_lens = [3, 29]
    keys, values, queries = requests(kv_lens, [1, 1])
    k_cache, v_cache, table = caches(keys, values, 2)
    out = torch.empty(2, HEADS, DIM)
    _npu_paged_attention(
        query=torch.cat(queries),
        key_cache=k_cache,
        value_cache=v_cache,
        num_kv_heads=KV_HEADS,
        num_heads=HEADS,
        scale_value=0.3,
        block_table=table,
        context_lens=torch.tensor(kv_lens, dtype=torch.int32),
        out=out,
    )
    expected = torch.cat([sdpa(q, k, v, 0.3, None) for q, k, v in zip(queries, keys, values)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def sglang_norm_mask(side: int, dtype: torch.dtype) -> torch.Tensor:
    """AscendAttnMaskBuilder.generate_attn_mask(side, "norm", dtype), written out."""
    value = torch.finfo(torch.float32).min if dtype == torch.float16 else 1
    return (
        torch.zeros(side, side)
        .masked_fill_(~torch.ones(side, side, dtype=torch.bool).tril_(), value)
        .to(dtype)
    )


def test_qlens_prefill_is_causal_after_the_cached_prefix():
    torch.manual_seed(8)
    kv_lens, q_lens = [140, 9], [12, 9]
    keys, values, queries = requests(kv_lens, q_lens)
    k_cache, v_cache, table = caches(keys, values, 2, block=128)
    out = torch.empty(21, HEADS * DIM)
    _npu_flash_attention_qlens(
        query=torch.cat(queries).reshape(21, -1),
        key_cache=k_cache,
        value_cache=v_cache,
        mask=sglang_norm_mask(256, torch.bfloat16),
        block_table=table,
        seq_len=torch.tensor(q_lens),
        context_lens=torch.tensor(kv_lens),
        scale_value=0.3,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        out=out,
    )
    expected = torch.cat(
        [sdpa(q, k, v, 0.3, kv - len(q)) for q, k, v, kv in zip(queries, keys, values, kv_lens)]
    )
    torch.testing.assert_close(out, expected.reshape(21, -1), rtol=1e-5, atol=1e-5)


def qlens_call(**change):
    keys, values, queries = requests([4], [4])
    k_cache, v_cache, table = caches(keys, values, 1, block=change.pop("block", 128))
    kwargs = dict(
        query=queries[0].reshape(4, -1),
        key_cache=k_cache,
        value_cache=v_cache,
        mask=sglang_norm_mask(64, torch.float16),
        block_table=table,
        seq_len=[4],
        context_lens=[4],
        scale_value=1.0,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        out=torch.empty(4, HEADS * DIM),
    )
    kwargs.update(change)
    _npu_flash_attention_qlens(**kwargs)


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"block": 16}, "key_cache"),
        ({"mask": torch.zeros(64, 64)}, "mask"),
        ({"alibi": torch.zeros(1)}, "alibi"),
    ],
)
def test_qlens_refuses_small_blocks_and_non_causal_masks(change, argument):
    with pytest.raises(NotImplementedError, match=argument):
        qlens_call(**change)


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"input_layout": "TND_NTD"}, "input_layout"),
        ({"input_layout": "BSND_BNSD"}, "input_layout"),
        ({"sparse_mode": 4}, "sparse_mode"),
        ({"pse_shift": torch.zeros(1)}, "pse_shift"),
        ({"sparse_mode": 0, "atten_mask": None, "next_tokens": 0}, "pre_tokens/next_tokens"),
        ({"atten_mask": torch.ones(2048, 2048, dtype=torch.bool).tril()}, "atten_mask"),
        ({"antiquant_mode": 1}, "antiquant_mode"),
        ({"key_antiquant_scale": torch.ones(1)}, "key_antiquant_scale"),
        ({"key": torch.randn(2, KV_HEADS, BLOCK, DIM)}, "key"),
    ],
)
def test_fia_forms_outside_the_modelled_subset_are_refused_by_name(change, argument):
    q = torch.randn(4, HEADS, DIM)
    cache = torch.randn(2, BLOCK, KV_HEADS * DIM)
    kwargs = dict(
        block_table=torch.zeros(1, 1, dtype=torch.int32),
        block_size=BLOCK,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="TND",
        sparse_mode=3,
        atten_mask=CAUSAL_2048,
        actual_seq_lengths=[4],
        actual_seq_lengths_kv=[4],
    )
    kwargs.update(change)
    key = kwargs.pop("key", cache)
    with pytest.raises(NotImplementedError, match=argument):
        npu_fused_infer_attention_score(q, key, cache, **kwargs)


def test_fia_v2_refuses_attention_sinks():
    q = torch.randn(1, 1, HEADS, DIM)
    cache = torch.randn(2, BLOCK, KV_HEADS * DIM)
    with pytest.raises(NotImplementedError, match="learnable_sink"):
        npu_fused_infer_attention_score_v2(
            q,
            cache,
            cache,
            num_query_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            input_layout="BSND",
            block_table=torch.zeros(1, 1, dtype=torch.int32),
            block_size=BLOCK,
            actual_seq_kvlen=[3],
            learnable_sink=torch.zeros(HEADS),
        )


def test_fia_v2_sliding_window_decode_is_refused_not_read_as_full_attention():
    """forward_decode with FIA on a sliding-window layer: one query per request ignores sparse_mode,
    but the window mask and band still apply; the reference does not model them."""
    q = torch.randn(1, 1, HEADS, DIM)
    cache = torch.randn(2, BLOCK, KV_HEADS * DIM)
    with pytest.raises(NotImplementedError, match="atten_mask"):
        npu_fused_infer_attention_score_v2(
            q,
            cache,
            cache,
            num_query_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            input_layout="BSND",
            block_table=torch.zeros(1, 1, dtype=torch.int32),
            block_size=BLOCK,
            actual_seq_qlen=[1],
            actual_seq_kvlen=[3],
            atten_mask=torch.zeros(1, 2048, dtype=torch.bool),
            sparse_mode=4,
            pre_tokens=8,
            next_tokens=0,
        )


def test_unpad_attention_is_unmasked_attention_within_each_sequence():
    """The vision encoder's attention: each packed sequence attends to itself only."""
    torch.manual_seed(9)
    lens = [3, 5]
    q, k, v = torch.randn(8, HEADS, DIM), torch.randn(8, KV_HEADS, DIM), torch.randn(8, KV_HEADS, DIM)
    out = torch.empty(8, HEADS, DIM)
    _npu_flash_attention_unpad(
        query=q,
        key=k,
        value=v,
        seq_len=torch.tensor(lens, dtype=torch.int32),
        scale_value=0.35,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        out=out,
    )
    expected = torch.cat([sdpa(q[:3], k[:3], v[:3], 0.35, None), sdpa(q[3:], k[3:], v[3:], 0.35, None)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_mla_prefill_over_new_tokens_and_prefix_merges_to_attention_over_both():
    """The MLA prefill with a cached prefix (forward_extend): FIA v2 TND without a cache over the
    new tokens (causal, lse returned), again over the gathered prefix (no mask), then
    npu_attention_update; the result is causal attention over prefix + new tokens."""
    torch.manual_seed(10)
    heads, nope, rope = 2, 6, 2
    prefix, new = [4, 0], [3, 2]  # request 1 has no prefix
    ends = torch.tensor(new).cumsum(0).tolist()
    q, qr = torch.randn(5, heads, nope), torch.randn(5, heads, rope)
    k, kr, v = torch.randn(5, heads, nope), torch.randn(5, heads, rope), torch.randn(5, heads, nope)
    pk, pkr, pv = torch.randn(4, heads, nope), torch.randn(4, heads, rope), torch.randn(4, heads, nope)
    common = dict(
        query=q,
        query_rope=qr,
        num_query_heads=heads,
        num_key_value_heads=heads,
        input_layout="TND",
        actual_seq_qlen=ends,
        softmax_scale=0.4,
        return_softmax_lse=True,
    )
    out_new, lse_new = npu_fused_infer_attention_score_v2(
        key=k,
        value=v,
        key_rope=kr,
        actual_seq_kvlen=ends,
        atten_mask=CAUSAL_2048,
        sparse_mode=3,
        next_tokens=0,
        **common,
    )
    out_pre, lse_pre = npu_fused_infer_attention_score_v2(
        key=pk,
        value=pv,
        key_rope=pkr,
        actual_seq_kvlen=torch.tensor(prefix).cumsum(0).tolist(),
        sparse_mode=0,
        **common,
    )
    assert lse_new.dtype == torch.float32 and lse_new.shape == (5, heads, 1)
    assert torch.isinf(lse_pre[3:]).all()  # no prefix: no key seen
    merged, _ = npu_attention_update(
        (lse_new.reshape(-1), lse_pre.reshape(-1)), (out_new.reshape(-1, nope), out_pre.reshape(-1, nope)), 0
    )
    full_q = torch.cat([q, qr], -1)
    expected = torch.cat(
        [
            sdpa(
                full_q[:3],
                torch.cat([torch.cat([pk, pkr], -1), torch.cat([k[:3], kr[:3]], -1)]),
                torch.cat([pv, v[:3]]),
                0.4,
                4,
            ),
            sdpa(full_q[3:], torch.cat([k[3:], kr[3:]], -1), v[3:], 0.4, 0),
        ]
    )
    torch.testing.assert_close(merged.reshape(5, heads, nope), expected, rtol=1e-5, atol=1e-5)


def test_fia_bsnd_without_a_cache_is_causal_attention_over_the_given_kv():
    """The MLA/equal-dims prefill per request: BSND, K/V given directly (no block_table)."""
    torch.manual_seed(11)
    q, k, v = (
        torch.randn(1, 6, HEADS, DIM),
        torch.randn(1, 9, KV_HEADS, DIM),
        torch.randn(1, 9, KV_HEADS, DIM),
    )
    out, _ = npu_fused_infer_attention_score(
        q,
        k,
        v,
        num_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        input_layout="BSND",
        atten_mask=CAUSAL_2048,
        sparse_mode=3,
        scale=0.3,
        next_tokens=0,
    )
    torch.testing.assert_close(out[0], sdpa(q[0], k[0], v[0], 0.3, 9 - 6), rtol=1e-5, atol=1e-5)
