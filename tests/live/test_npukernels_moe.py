"""The MoE routing references, chained as sglang's NPU MoE path chains them (gating, init
routing, grouped matmul per expert, finalize), equal a plain per-token mixture of experts."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.moe import (
    npu_grouped_matmul,
    npu_moe_compute_expert_tokens,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_gating_top_k_softmax,
    npu_moe_init_routing,
    npu_moe_init_routing_v2,
)

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 7, 6, 5, 4, 2


def plain_moe(x, topk_ids, topk_weights, w_up, w_down):
    """Each token: sum over its experts of weight * ((x @ w_up[e]) @ w_down[e])."""
    out = torch.zeros(x.shape[0], w_down.shape[-1])
    for i in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[i, k])
            out[i] += topk_weights[i, k] * (x[i] @ w_up[e] @ w_down[e])
    return out


@pytest.fixture
def layer():
    torch.manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN)
    logits = torch.randn(TOKENS, EXPERTS)
    return x, logits, torch.randn(EXPERTS, HIDDEN, INTER), torch.randn(EXPERTS, INTER, HIDDEN)


def test_gating_top_k_softmax_picks_the_largest_softmax_probabilities(layer):
    _, logits, _, _ = layer
    weights, ids, rows = npu_moe_gating_top_k_softmax(logits, k=TOP_K)
    probs = logits.softmax(-1)
    expected = probs.topk(TOP_K, dim=-1)
    torch.testing.assert_close(weights, expected.values)
    assert torch.equal(ids.long(), expected.indices) and ids.dtype == torch.int32
    assert torch.equal(rows, torch.arange(TOKENS * TOP_K, dtype=torch.int32).reshape(TOP_K, TOKENS).T)


def test_v1_chain_init_routing_grouped_matmul_finalize_is_the_plain_mixture(layer):
    """NPUMoEInitRouting_v1 + GroupedMatmul (cumsum groups) + finalize drop_pad_mode 0."""
    x, logits, w_up, w_down = layer
    weights, ids, row_idx = npu_moe_gating_top_k_softmax(logits, k=TOP_K)
    expanded_x, expanded_row_idx, expanded_expert_idx = npu_moe_init_routing(x, row_idx, ids, TOKENS)
    ends = npu_moe_compute_expert_tokens(expanded_expert_idx, EXPERTS).long()
    hidden = npu_grouped_matmul(
        [expanded_x], [w_up], split_item=2, group_type=0, group_list=ends, group_list_type=0
    )[0]
    down = npu_grouped_matmul(
        [hidden], [w_down], split_item=2, group_type=0, group_list=ends, group_list_type=0
    )[0]
    out = npu_moe_finalize_routing(down, None, None, None, weights, expanded_row_idx, ids)
    torch.testing.assert_close(out, plain_moe(x, ids, weights, w_up, w_down), rtol=1e-4, atol=1e-4)


def test_v2_chain_with_counts_and_row_order_finalize_is_the_plain_mixture(layer):
    """ascend_tp's NPUMoEInitRouting_v2 (counts) + GroupedMatmul (group_list_type 1) + finalize 2."""
    x, logits, w_up, w_down = layer
    weights, ids, _ = npu_moe_gating_top_k_softmax(logits, k=TOP_K)
    expanded_x, expanded_row_idx, counts, _ = npu_moe_init_routing_v2(
        x,
        ids,
        active_num=TOKENS * TOP_K,
        expert_num=EXPERTS,
        expert_tokens_num_type=1,
        expert_tokens_num_flag=True,
        active_expert_range=[0, EXPERTS],
        quant_mode=-1,
    )
    assert counts.tolist() == torch.bincount(ids.flatten().long(), minlength=EXPERTS).tolist()
    hidden = npu_grouped_matmul(
        [expanded_x], [w_up], split_item=2, group_type=0, group_list=counts, group_list_type=1
    )[0]
    down = npu_grouped_matmul(
        [hidden], [w_down], split_item=2, group_type=0, group_list=counts, group_list_type=1
    )[0]
    out = npu_moe_finalize_routing(
        down,
        skip1=None,
        skip2=None,
        bias=None,
        scales=weights,
        expanded_src_to_dst_row=expanded_row_idx,
        export_for_source_row=ids,
        drop_pad_mode=2,
    )
    torch.testing.assert_close(out, plain_moe(x, ids, weights, w_up, w_down), rtol=1e-4, atol=1e-4)


def test_a_finalize_order_that_does_not_match_the_routing_changes_the_answer(layer):
    x, logits, w_up, w_down = layer
    weights, ids, _ = npu_moe_gating_top_k_softmax(logits, k=TOP_K)
    expanded_x, expanded_row_idx, _, _ = npu_moe_init_routing_v2(x, ids, expert_num=EXPERTS)
    rows = torch.randn(expanded_x.shape[0], HIDDEN)
    row_order = npu_moe_finalize_routing(
        rows, None, None, None, weights, expanded_row_idx, ids, drop_pad_mode=2
    )
    column_order = npu_moe_finalize_routing(
        rows, None, None, None, weights, expanded_row_idx, ids, drop_pad_mode=0
    )
    assert not torch.allclose(row_order, column_order)


def test_grouped_gating_with_bias_and_sigmoid_follows_the_documented_listing():
    """DeepSeek-style routing: sigmoid scores, correction bias for the choice only, best groups."""
    torch.manual_seed(1)
    x, bias = torch.randn(3, 8), torch.randn(8)
    y, ids, _ = npu_moe_gating_top_k(
        x, 2, bias=bias, k_group=2, group_count=4, group_select_mode=1, norm_type=1, routed_scaling_factor=2.5
    )
    for row in range(3):
        scores = torch.sigmoid(x[row]) + bias
        groups = scores.reshape(4, 2).sum(-1)  # top-2 sum of a group of two
        best = set(groups.argsort(descending=True)[:2].tolist())
        allowed = [e for e in range(8) if e // 2 in best]
        chosen = sorted(allowed, key=lambda e: -scores[e])[:2]
        assert ids[row].tolist() == chosen
        picked = torch.sigmoid(x[row])[chosen]
        torch.testing.assert_close(y[row], picked / picked.sum() * 2.5)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: npu_moe_gating_top_k(torch.randn(2, 8), 2, renorm=1), "renorm"),
        (
            lambda: npu_moe_gating_top_k_softmax(
                torch.randn(2, 8), finished=torch.zeros(2, dtype=torch.bool), k=2
            ),
            "finished",
        ),
        (
            lambda: npu_moe_init_routing_v2(
                torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int32), expert_num=4, quant_mode=1
            ),
            "quant_mode",
        ),
        (
            lambda: npu_moe_init_routing_v2(
                torch.randn(2, 4),
                torch.zeros(2, 1, dtype=torch.int32),
                expert_num=4,
                active_expert_range=[0, 2],
            ),
            "active_expert_range",
        ),
        (
            lambda: npu_grouped_matmul(
                [torch.randn(2, 4)],
                [torch.randn(1, 4, 3)],
                split_item=2,
                group_type=0,
                group_list=torch.tensor([2]),
                antiquant_scale=[torch.ones(1)],
            ),
            "antiquant_scale",
        ),
        (
            lambda: npu_moe_finalize_routing(
                torch.randn(2, 4), None, None, None, None, torch.arange(2), None, drop_pad_mode=1
            ),
            "drop_pad_mode",
        ),
    ],
)
def test_unmodelled_forms_are_refused_by_name(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
