"""The KV-cache writes put each token in the slot the documents say: block slot // block_size,
offset slot % block_size, and nothing else changes."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.kvcache import (
    _npu_reshape_and_cache,
    npu_scatter_nd_update_,
    npu_scatter_pa_kv_cache,
)

BLOCKS, BLOCK, HEADS, DIM = 4, 8, 2, 3


def expected_after(cache: torch.Tensor, tokens: torch.Tensor, slots: list[int]) -> torch.Tensor:
    out = cache.clone()
    for t, s in enumerate(slots):
        out[s // BLOCK, s % BLOCK] = tokens[t]
    return out


def test_reshape_and_cache_writes_each_token_to_its_slot():
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(BLOCKS, BLOCK, HEADS, DIM), torch.randn(BLOCKS, BLOCK, HEADS, DIM)
    k, v, slots = torch.randn(3, HEADS, DIM), torch.randn(3, HEADS, DIM), [9, 0, 31]
    want_k, want_v = expected_after(k_cache, k, slots), expected_after(v_cache, v, slots)
    _npu_reshape_and_cache(
        key=k,
        value=v,
        key_cache=k_cache,
        value_cache=v_cache,
        slot_indices=torch.tensor(slots, dtype=torch.int32),
    )
    torch.testing.assert_close(k_cache, want_k)
    torch.testing.assert_close(v_cache, want_v)


def test_scatter_pa_kv_cache_in_norm_mode_is_the_same_write():
    torch.manual_seed(1)
    k_cache, v_cache = torch.randn(BLOCKS, BLOCK, HEADS, DIM), torch.randn(BLOCKS, BLOCK, HEADS, DIM)
    k, v, slots = torch.randn(2, HEADS, DIM), torch.randn(2, HEADS, DIM), [17, 3]
    want_k = expected_after(k_cache, k, slots)
    npu_scatter_pa_kv_cache(k, v, k_cache, v_cache, torch.tensor(slots), cache_mode="Norm")
    torch.testing.assert_close(k_cache, want_k)


def test_scatter_nd_update_writes_rows_in_place():
    buffer = torch.zeros(6, HEADS, DIM)
    rows = torch.randn(2, HEADS, DIM)
    assert npu_scatter_nd_update_(buffer, torch.tensor([[4], [1]]), rows) is buffer
    torch.testing.assert_close(buffer[[4, 1]], rows)
    assert buffer[[0, 2, 3, 5]].abs().sum() == 0


def test_a_slot_outside_the_cache_is_an_error():
    cache = torch.zeros(BLOCKS, BLOCK, HEADS, DIM)
    with pytest.raises(IndexError):
        _npu_reshape_and_cache(
            key=torch.zeros(1, HEADS, DIM),
            value=torch.zeros(1, HEADS, DIM),
            key_cache=cache,
            value_cache=cache.clone(),
            slot_indices=torch.tensor([BLOCKS * BLOCK]),
        )


@pytest.mark.parametrize(
    "change, argument",
    [({"cache_mode": "PA_NZ"}, "cache_mode"), ({"seq_lens": torch.tensor([1])}, "seq_lens")],
)
def test_scatter_pa_kv_cache_refuses_nz_and_compression(change, argument):
    cache = torch.zeros(BLOCKS, BLOCK, HEADS, DIM)
    kwargs = {"cache_mode": "Norm", **change}
    with pytest.raises(NotImplementedError, match=argument):
        npu_scatter_pa_kv_cache(
            torch.zeros(1, HEADS, DIM),
            torch.zeros(1, HEADS, DIM),
            cache,
            cache.clone(),
            torch.tensor([0]),
            **kwargs,
        )
