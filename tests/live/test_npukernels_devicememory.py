"""The memory-arrangement kernels keep the values, as their documents say, and refuse formats
they do not model."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.devicememory import (
    npu_dtype_cast,
    npu_format_cast,
    npu_format_cast_,
    npu_prefetch,
)

FRACTAL_NZ, ND, NC1HWC0 = 29, 2, 3


def test_a_format_cast_returns_a_new_tensor_with_the_same_values():
    w = torch.randn(32, 16)
    cast = npu_format_cast(w, FRACTAL_NZ)
    assert cast is not w and torch.equal(cast, w)
    assert npu_format_cast_(w, ND) is w


def test_dtype_cast_converts_like_to():
    x = torch.randn(4, 4)
    assert torch.equal(npu_dtype_cast(x, torch.bfloat16), x.bfloat16())


def test_prefetch_computes_nothing_but_keeps_its_limits():
    w = torch.randn(8)
    before = w.clone()
    npu_prefetch(w, None, 1 << 20)
    assert torch.equal(w, before)
    with pytest.raises(ValueError, match="max_size"):
        npu_prefetch(w, None, 0)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: npu_format_cast(torch.randn(2, 2), NC1HWC0), "acl_format"),
        (
            lambda: npu_format_cast(torch.randn(2, 2), FRACTAL_NZ, customize_dtype=torch.int8),
            "customize_dtype",
        ),
    ],
)
def test_unmodelled_formats_are_refused_by_name(call, argument):
    with pytest.raises(NotImplementedError, match=argument):
        call()
