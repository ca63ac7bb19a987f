"""npu_top_k_top_p keeps exactly the tokens top-k then top-p (nucleus) keep, written here as the
usual descending-order definition rather than the document's ascending cumulative sum."""

from __future__ import annotations

import pytest
import torch

from npudoctor.live.npukernels.sampling import npu_top_k_top_p


def kept(logits: torch.Tensor, k: int, p: float) -> set[int]:
    """The k largest; of those, the smallest prefix (descending) whose probability reaches p."""
    order = torch.argsort(logits, descending=True)[:k]
    probs = torch.softmax(logits[order].double(), dim=0)
    chosen, total = set(), 0.0
    for index, prob in zip(order.tolist(), probs.tolist()):
        chosen.add(index)
        total += prob
        if total >= p:
            break
    return chosen


@pytest.mark.parametrize("k, p", [(1, 0.9), (5, 1.0), (10, 0.5), (50, 0.3), (3, 0.0)])
def test_top_k_then_top_p_keeps_the_nucleus_of_the_top_k(k, p):
    torch.manual_seed(k)
    logits = torch.randn(2, 50) * 3
    out = npu_top_k_top_p(logits, torch.tensor([p, p]), torch.tensor([k, k], dtype=torch.int32))
    for row in range(2):
        survivors = set(torch.nonzero(out[row] > float("-inf")).flatten().tolist())
        assert survivors == kept(logits[row], k, p)
        torch.testing.assert_close(out[row, sorted(survivors)], logits[row, sorted(survivors)])


@pytest.mark.parametrize(
    "p, k, argument",
    [
        (torch.tensor([0.5], dtype=torch.float16), torch.tensor([3], dtype=torch.int32), "p"),
        (torch.tensor([0.5]), torch.tensor([2000], dtype=torch.int32), "k"),
    ],
)
def test_arguments_outside_the_documented_domain_are_refused(p, k, argument):
    with pytest.raises(NotImplementedError, match=argument):
        npu_top_k_top_p(torch.randn(1, 3000), p, k)
