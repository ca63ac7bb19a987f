"""The dry run's Ascend op references against independent computations on small inputs: torch's own
attention (SDPA per request), the textbook RMSNorm / SwiGLU / rotary formulas, a dense per-token
MoE; and the argument forms they do not model refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudoctor.live import npukernels_dryrun as ops

torch.manual_seed(0)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def test_rms_norm_and_fused_residual_add():
    x, residual, weight = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    y, rstd = ops.npu_rms_norm(x, weight, 1e-5)
    assert torch.allclose(y, rms(x, weight, 1e-5), atol=1e-5)
    assert torch.allclose(rstd, 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5), atol=1e-5)
    y, _, added = ops.npu_add_rms_norm(residual, x, weight, 1e-5)
    assert torch.allclose(added, residual + x)
    assert torch.allclose(y, rms(residual + x, weight, 1e-5), atol=1e-5)


def test_swiglu_is_silu_of_the_first_half_times_the_second():
    x = torch.randn(3, 10)
    assert torch.allclose(ops.npu_swiglu(x), F.silu(x[:, :5]) * x[:, 5:], atol=1e-6)
    with pytest.raises(ValueError):
        ops.npu_swiglu(torch.randn(3, 7))


def rotated_by_angle(x: torch.Tensor, angle: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotary embedding as a complex rotation of (x_i, x_{i + d/2}) (NeoX) or (x_2i, x_2i+1) pairs."""
    half = x.shape[-1] // 2
    first, second = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
    pairs = torch.complex(first, second)
    turned = pairs * torch.polar(torch.ones_like(angle), angle)
    if neox:
        return torch.cat((turned.real, turned.imag), dim=-1)
    return torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)


def cos_sin_cache(positions: int, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inverse = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    angle = torch.arange(positions).float()[:, None] * inverse[None, :]
    return torch.cat((angle.cos(), angle.sin()), dim=-1), angle


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_mrope_rope_mode_rotates_each_heads_rotary_part(mode):
    cache, angle = cos_sin_cache(20, 8)
    positions = torch.tensor([3, 0, 19, 7])
    query, key = torch.randn(4, 3 * 12), torch.randn(4, 1 * 12)
    q, k = ops.npu_mrope(positions, query, key, cache, 12, mrope_section=[0, 0, 0], rotary_mode=mode)
    for given, got in ((query, q), (key, k)):
        heads = given.reshape(4, -1, 12)
        expected = torch.cat(
            (rotated_by_angle(heads[..., :8], angle[positions][:, None, :], mode == "half"), heads[..., 8:]),
            dim=-1,
        )
        assert torch.allclose(got.reshape(4, -1, 12), expected, atol=1e-5)
    with pytest.raises(NotImplementedError, match="rope mode"):
        ops.npu_mrope(positions.expand(3, 4), query, key, cache, 12, mrope_section=[2, 1, 1])


@pytest.mark.parametrize("neox", [True, False])
def test_split_qkv_rmsnorm_rope_normalises_and_rotates_q_and_k_copies_v(neox):
    tokens, head_dim, q_heads, kv_heads = 3, 16, 4, 2
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim)
    _, angle = cos_sin_cache(10, head_dim)
    positions = torch.tensor([1, 4, 9])
    theta = angle[positions]  # (T, head_dim / 2)
    # sglang's layout (RotaryEmbedding.get_cos_sin_with_position): each half repeated, (T, 1, 1, D)
    cos = theta.cos().repeat(1, 2).view(tokens, 1, 1, head_dim)
    sin = theta.sin().repeat(1, 2).view(tokens, 1, 1, head_dim)
    q_weight, k_weight = torch.randn(head_dim), torch.randn(head_dim)
    q, k, v = ops.split_qkv_rmsnorm_rope(
        qkv,
        sin,
        cos,
        q_heads * head_dim,
        kv_heads * head_dim,
        head_dim,
        1e-6,
        q_weight,
        k_weight,
        is_neox_style=neox,
    )
    parts = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    for given, weight, got in ((parts[0], q_weight, q), (parts[1], k_weight, k)):
        normalised = rms(given.reshape(tokens, -1, head_dim), weight, 1e-6)
        expected = rotated_by_angle(normalised, theta[:, None, :], neox)
        assert torch.allclose(got.reshape(tokens, -1, head_dim), expected, atol=1e-4)
    assert torch.equal(v, parts[2])


def paged_cache(kv: list[torch.Tensor], block_size: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's (L, H, D) KV into a (blocks, block_size, H, D) cache, blocks in reverse order."""
    heads, dim = kv[0].shape[1:]
    cache = torch.zeros(blocks, block_size, heads, dim)
    table = torch.zeros(len(kv), blocks, dtype=torch.int32)
    free = list(range(blocks - 1, -1, -1))
    for b, tokens in enumerate(kv):
        for j in range(-(-tokens.shape[0] // block_size)):
            block = free.pop(0)
            table[b, j] = block
            chunk = tokens[j * block_size : (j + 1) * block_size]
            cache[block, : chunk.shape[0]] = chunk
    return cache, table


def sdpa_end_aligned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """(n, H, D) queries that are the last n of (L, Hkv, D) keys, causal; GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n, length = q.shape[0], k.shape[0]
    mask = torch.arange(length)[None, :] <= (length - n + torch.arange(n))[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def test_flash_attention_qlens_is_causal_attention_over_prefix_and_new_tokens():
    heads, kv_heads, dim, block = 4, 2, 8, 4
    kv_lens, q_lens = [9, 3, 6], [4, 3, 1]
    keys = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    values = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    key_cache, table = paged_cache(keys, block, 8)
    value_cache, _ = paged_cache(values, block, 8)
    query = torch.randn(sum(q_lens), heads, dim)
    out = torch.empty(sum(q_lens), heads * dim)
    ops._npu_flash_attention_qlens(
        query.reshape(-1, heads * dim),
        key_cache,
        value_cache,
        table,
        torch.ones(1),
        torch.tensor(q_lens, dtype=torch.int32),
        torch.tensor(kv_lens, dtype=torch.int32),
        kv_heads,
        heads,
        0.3,
        out,
    )
    start = 0
    for n, k, v in zip(q_lens, keys, values):
        expected = sdpa_end_aligned(query[start : start + n], k, v, 0.3)
        assert torch.allclose(out[start : start + n].view(n, heads, dim), expected, atol=1e-5)
        start += n


def test_paged_attention_decodes_one_token_per_request_over_its_whole_kv():
    heads, kv_heads, dim, block = 4, 1, 8, 2
    kv_lens = [5, 1, 4]
    keys = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    values = [torch.randn(n, kv_heads, dim) for n in kv_lens]
    key_cache, table = paged_cache(keys, block, 8)
    value_cache, _ = paged_cache(values, block, 8)
    query = torch.randn(3, heads, dim)
    out = torch.empty(3, heads, dim)
    ops._npu_paged_attention(
        query,
        key_cache,
        value_cache,
        kv_heads,
        heads,
        0.5,
        table,
        torch.tensor(kv_lens, dtype=torch.int32),
        out,
    )
    for b, (k, v) in enumerate(zip(keys, values)):
        assert torch.allclose(out[b : b + 1], sdpa_end_aligned(query[b : b + 1], k, v, 0.5), atol=1e-5)


def test_reshape_and_cache_writes_each_token_to_its_slot():
    key, value = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    key_cache, value_cache = torch.zeros(4, 2, 2, 4), torch.zeros(4, 2, 2, 4)
    ops._npu_reshape_and_cache(
        key, value, key_cache, value_cache, torch.tensor([5, 0, -1], dtype=torch.int32)
    )
    assert torch.equal(key_cache[2, 1], key[0]) and torch.equal(value_cache[0, 0], value[1])
    assert int((key_cache != 0).any(-1).any(-1).sum()) == 2  # the negative slot wrote nothing
    with pytest.raises(TypeError, match="int32"):
        ops._npu_reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([5, 0, 1]))


def dense_mixture(x, logits, w13, w2, top_k):
    """Each token's output: its top-k experts' SwiGLU MLPs, weighted by the renormalised softmax."""
    probabilities = torch.softmax(logits, -1)
    expected = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        top = probabilities[t].topk(top_k)
        for p, e in zip(top.values / top.values.sum(), top.indices):
            gate, value = (x[t] @ w13[e]).chunk(2)
            expected[t] += p * ((F.silu(gate) * value) @ w2[e])
    return expected


def test_moe_routing_chain_equals_a_dense_per_token_mixture():
    """gating top-k -> l1 renormalise -> init routing v2 -> grouped matmul (gate/up) -> swiglu ->
    grouped matmul (down) -> finalize (row-major, sglang's drop_pad_mode=2): each token's output is
    the weighted sum of its chosen experts' MLPs."""
    tokens, hidden, inter, experts, top_k = 6, 8, 4, 7, 4
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(experts, hidden, 2 * inter), torch.randn(experts, inter, hidden)
    logits = torch.randn(tokens, experts)
    weights, chosen, _ = ops.npu_moe_gating_top_k_softmax(logits, k=top_k)
    weights = ops.l1_norm(weights)
    expanded, row_idx, counts, _ = ops.npu_moe_init_routing_v2(
        x,
        chosen,
        active_num=tokens * top_k,
        expert_num=experts,
        expert_tokens_num_type=1,
        expert_tokens_num_flag=True,
        active_expert_range=[0, experts],
        quant_mode=-1,
    )
    up = ops.npu_grouped_matmul(
        [expanded], [w13], split_item=2, group_type=0, group_list=counts, group_list_type=1
    )[0]
    down = ops.npu_grouped_matmul(
        [ops.npu_swiglu(up)], [w2], split_item=2, group_type=0, group_list=counts.cumsum(0), group_list_type=0
    )[0]
    out = ops.npu_moe_finalize_routing(down, None, None, None, weights, row_idx, chosen, drop_pad_mode=2)

    expected = dense_mixture(x, logits, w13, w2, top_k)
    assert torch.allclose(out, expected, atol=1e-4)
    # the row layout matters: the choice-major reading (drop_pad_mode=0) mixes other rows
    other = ops.npu_moe_finalize_routing(down, None, None, None, weights, row_idx, chosen, drop_pad_mode=0)
    assert not torch.allclose(other, expected, atol=1e-4)


def test_moe_v1_routing_chain_equals_a_dense_per_token_mixture():
    """0.5.4's chain: init routing (v1, choice-major row_idx) -> compute expert tokens (running
    ends) -> grouped matmuls (group_list_type=0) -> finalize (drop_pad_mode=0)."""
    tokens, hidden, inter, experts, top_k = 5, 8, 4, 6, 2
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(experts, hidden, 2 * inter), torch.randn(experts, inter, hidden)
    logits = torch.randn(tokens, experts)
    weights, chosen, _ = ops.npu_moe_gating_top_k_softmax(logits, k=top_k)
    weights = weights / weights.sum(-1, keepdim=True)
    row_idx = torch.arange(tokens * top_k, dtype=torch.int32).view(top_k, -1).permute(1, 0).contiguous()
    expanded, expanded_row_idx, sorted_experts = ops.npu_moe_init_routing(x, row_idx, chosen, tokens)
    ends = ops.npu_moe_compute_expert_tokens(sorted_experts, experts).to(torch.int64)
    up = ops.npu_grouped_matmul(
        [expanded], [w13], split_item=2, group_type=0, group_list=ends, group_list_type=0
    )[0]
    down = ops.npu_grouped_matmul(
        [ops.npu_swiglu(up)], [w2], split_item=2, group_type=0, group_list=ends, group_list_type=0
    )[0]
    out = ops.npu_moe_finalize_routing(down, None, None, None, weights, expanded_row_idx, chosen)
    assert torch.allclose(out, dense_mixture(x, logits, w13, w2, top_k), atol=1e-4)


def test_alloc_extend_op_is_the_triton_allocation_and_counts_new_pages():
    from npudoctor.live.tritonkernels import alloc_extend_kernel

    prefix_lens, seq_lens = torch.tensor([0, 5, 8]), torch.tensor([6, 14, 9])
    last_loc = torch.tensor([-1, 4 * 9 + 0, 4 * 10 + 3])
    free_pages = torch.tensor([3, 1, 7, 2, 5, 6])
    got, values = torch.zeros(16, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    ops.alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, 4, got, values)
    expected = torch.zeros(16, dtype=torch.int64)
    alloc_extend_kernel((3,), prefix_lens, seq_lens, last_loc, free_pages, expected, 0, 4, 16)
    assert got.tolist() == expected.tolist()
    assert int(values[0]) == 2 + 2 + 1  # pages 0-1 | 2-3 after the prefix's page | one more
    with pytest.raises(ValueError, match="int64"):
        ops.alloc_extend(prefix_lens.int(), seq_lens, last_loc, free_pages, 4, got, values)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (
            lambda: ops.npu_moe_init_routing_v2(
                torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int32), quant_mode=1
            ),
            "quant_mode",
        ),
        (
            lambda: ops.npu_moe_gating_top_k_softmax(
                torch.randn(2, 4), torch.zeros(2, dtype=torch.bool), k=1
            ),
            "finished",
        ),
        (
            lambda: ops.npu_grouped_matmul(
                [torch.randn(2, 4)],
                [torch.randn(1, 4, 3)],
                scale=[torch.ones(1)],
                split_item=2,
                group_type=0,
                group_list=torch.tensor([2]),
            ),
            "scale",
        ),
        (
            lambda: ops.npu_moe_finalize_routing(
                torch.randn(2, 4), None, None, None, torch.ones(2, 1), torch.arange(2), None, 1
            ),
            "drop_pad_mode",
        ),
        (lambda: ops.l1_norm(torch.randn(4, 6)[:, :4]), "contiguous"),
    ],
)
def test_forms_not_modelled_are_refused(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
