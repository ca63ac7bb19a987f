"""CPU reference of the sampling filter sglang's Ascend sampler calls.

Document followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_top_k_top_p.md``).

Call site: sglang ``srt/layers/sampler.py`` ``top_k_top_p_min_p_sampling_from_logits_ascend``
(0.5.16-0.5.23), when every request's top_k is in [1, 1024].
"""

from __future__ import annotations

import torch

from npudoctor.live.npukernels.unmodelled import refuse

_TOP_K_MAX = 1024  # the document: k in [1, 1024] and <= logits.size(1)


def npu_top_k_top_p(logits: torch.Tensor, p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_top_k_top_p``, as the document computes it: sort each row ascending
    (stable); values below the ``k[b]``-th largest become -inf; softmax of the rest; positions
    whose ascending cumulative probability is ``<= 1 - p[b]`` become -inf, the largest always
    kept; the result is scattered back to the original order, in ``logits``' dtype.

    ``logits (B, V)``, ``p (B,)`` in ``logits``' dtype, ``k (B,)`` int32 within [1, min(1024, V)];
    other forms are refused (the document does not say what the kernel does with them)."""
    op = "npu_top_k_top_p"
    if logits.dim() != 2 or p.shape != (logits.shape[0],) or k.shape != (logits.shape[0],):
        raise ValueError(
            f"{op}: logits {tuple(logits.shape)}, p {tuple(p.shape)}, k {tuple(k.shape)} are not (B, V), (B,), (B,)"
        )
    if p.dtype != logits.dtype:
        refuse(op, "p", f"dtype {p.dtype}, the document requires logits' dtype {logits.dtype}")
    if k.numel() and (int(k.min()) < 1 or int(k.max()) > min(_TOP_K_MAX, logits.shape[1])):
        refuse(op, "k", f"values {k.tolist()} outside [1, {min(_TOP_K_MAX, logits.shape[1])}]")
    sorted_values, sorted_indices = torch.sort(logits.float(), dim=-1, stable=True)
    vocab = logits.shape[1]
    threshold = sorted_values.gather(1, (vocab - k.long())[:, None])
    sorted_values = sorted_values.masked_fill(sorted_values < threshold, float("-inf"))
    cumulative = sorted_values.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = cumulative <= (1 - p.float())[:, None]
    top_p_mask[:, -1] = False
    sorted_values = sorted_values.masked_fill(top_p_mask, float("-inf"))
    out = torch.empty_like(sorted_values).scatter_(1, sorted_indices, sorted_values)
    return out.to(logits.dtype)


KERNELS = {"npu_top_k_top_p": npu_top_k_top_p}
