"""CPU references of the kernels that only arrange device memory: storage-format casts, the dtype
cast and the L2 prefetch.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_format_cast.md``,
``（beta）torch_npu-npu_dtype_cast.md``, ``torch_npu-npu_prefetch.md``). A storage format (ND = 2,
FRACTAL_NZ = 29) is how the device arranges the bytes; the tensor's logical shape and values are
unchanged, so on the CPU a format cast is a copy (or nothing, in place). The prefetch loads weights
into the L2 cache ahead of a matmul and computes nothing.

Call sites: sglang ``srt/hardware_backend/npu/utils.py`` ``npu_format_cast`` (weights cast to NZ
after loading, 0.5.12-0.5.23), ``srt/layers/moe/ep_moe/layer.py`` (``npu_format_cast_``, 0.5.8),
``srt/hardware_backend/npu/cmo.py`` (``npu_prefetch`` of the next layer's weights), the NPU
quantization methods (``npu_dtype_cast``).
"""

from __future__ import annotations

from typing import Any

import torch

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given

_LOGICAL_FORMATS = {2: "ND", 29: "FRACTAL_NZ"}


def _format_code(op: str, acl_format: Any) -> int:
    code = int(getattr(acl_format, "value", acl_format))
    if code not in _LOGICAL_FORMATS:
        refuse(op, "acl_format", f"{code} (modelled: {_LOGICAL_FORMATS})")
    return code


def npu_format_cast(input: torch.Tensor, acl_format: Any, **unmodelled: Any) -> torch.Tensor:  # noqa: A002 - the documented name
    """``torch_npu.npu_format_cast`` to ND or FRACTAL_NZ: a copy with the same values. Other
    formats and the packed-dtype arguments (``customize_dtype``, ``input_dtype``) are refused."""
    refuse_given("npu_format_cast", unmodelled)
    _format_code("npu_format_cast", acl_format)
    return input.clone()


def npu_format_cast_(input: torch.Tensor, acl_format: Any) -> torch.Tensor:  # noqa: A002 - the documented name
    """``torch_npu.npu_format_cast_``: the in-place cast; the values stay, ``input`` is returned."""
    _format_code("npu_format_cast_", acl_format)
    return input


def npu_dtype_cast(input: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # noqa: A002 - the documented name
    """``torch_npu.npu_dtype_cast``: ``input`` converted to ``dtype``, as ``Tensor.to``."""
    return input.to(dtype)


def npu_prefetch(
    input: torch.Tensor, dependency: torch.Tensor | None, max_size: int, offset: int = 0
) -> None:  # noqa: A002
    """``torch_npu.npu_prefetch``: nothing to compute; the documented argument limits are kept
    (``max_size`` > 0, ``offset`` within the weight)."""
    if max_size <= 0:
        raise ValueError(f"npu_prefetch: max_size {max_size} must be > 0")
    if not 0 <= offset < max(1, input.numel() * input.element_size()):
        raise ValueError(f"npu_prefetch: offset {offset} outside the weight")


KERNELS = {
    "npu_format_cast": npu_format_cast,
    "npu_format_cast_": npu_format_cast_,
    "npu_dtype_cast": npu_dtype_cast,
    "npu_prefetch": npu_prefetch,
}
