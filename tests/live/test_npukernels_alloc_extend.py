"""sgl-kernel-npu's ``torch.ops.npu.alloc_extend`` (the paged allocation of 0.5.4's NPU allocator)
against the Triton allocation kernel's reference it must agree with."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels import SGL_KERNEL_NPU
from npudoctor.live.npukernels.kvcache import alloc_extend


def test_alloc_extend_is_reachable_as_sglang_calls_it():
    assert SGL_KERNEL_NPU["torch.ops.npu.alloc_extend"] is alloc_extend


def test_alloc_extend_op_is_the_triton_allocation_and_counts_new_pages():
    from npudoctor.live.tritonkernels import alloc_extend_kernel

    prefix_lens, seq_lens = torch.tensor([0, 5, 8]), torch.tensor([6, 14, 9])
    last_loc = torch.tensor([-1, 4 * 9 + 0, 4 * 10 + 3])
    free_pages = torch.tensor([3, 1, 7, 2, 5, 6])
    got, values = torch.zeros(16, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, 4, got, values)
    expected = torch.zeros(16, dtype=torch.int64)
    alloc_extend_kernel((3,), prefix_lens, seq_lens, last_loc, free_pages, expected, 0, 4, 16)
    assert got.tolist() == expected.tolist()
    assert int(values[0]) == 2 + 2 + 1  # pages 0-1 | 2-3 after the prefix's page | one more
    with pytest.raises(ValueError, match="int64"):
        alloc_extend(prefix_lens.int(), seq_lens, last_loc, free_pages, 4, got, values)
