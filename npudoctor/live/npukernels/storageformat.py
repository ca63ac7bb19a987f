"""CPU reference of the storage-format cast sglang applies to NPU weights.

Document followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_format_cast.md``): the cast returns a new
tensor in the target storage format (ND = 2, FRACTAL_NZ = 29) without replacing the input. The
format is how the device arranges the bytes; the tensor's logical shape and values are unchanged,
so on the CPU the reference is a copy.

Call site: sglang ``srt/hardware_backend/npu/utils.py`` ``npu_format_cast`` (weights cast to NZ
after loading, 0.5.12-0.5.23).
"""

from __future__ import annotations

from typing import Any

import torch

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given

_LOGICAL_FORMATS = {2: "ND", 29: "FRACTAL_NZ"}


def npu_format_cast(input: torch.Tensor, acl_format: Any, **unmodelled: Any) -> torch.Tensor:  # noqa: A002 - the documented name
    """``torch_npu.npu_format_cast`` to ND or FRACTAL_NZ: a copy with the same values. Other
    formats and the packed-dtype arguments (``customize_dtype``, ``input_dtype``) are refused."""
    op = "npu_format_cast"
    refuse_given(op, unmodelled)
    code = int(getattr(acl_format, "value", acl_format))
    if code not in _LOGICAL_FORMATS:
        refuse(op, "acl_format", f"{code} (modelled: {_LOGICAL_FORMATS})")
    return input.clone()


KERNELS = {"npu_format_cast": npu_format_cast}
