"""The quantization kernels sglang's NPU paths call: named, and refused.

The references model unquantized bfloat16/float16/float32 computation only. These kernels
(torch_npu's quantize/dequantize, quantized matmuls and fused quantizing MoE ops, per the torch_npu
custom-API reference in Ascend/op-plugin) are installed under their names so that sglang's
``hasattr(torch_npu, ...)`` checks see what an Ascend host has, and a call says plainly that the
simulation does not model quantization, instead of failing on a missing attribute.

Call sites: sglang ``srt/hardware_backend/npu/quantization/`` (W8A8, W4A8, MXFP8/FP4 linear and MoE
methods), ``memory_pool_npu.py`` (int8 KV), ``distributed/parallel_state.py`` (quantized
all-gather), 0.5.4-0.5.23.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from npudoctor.live.npukernels.unmodelled import refuse

QUANTIZED_KERNELS = (
    "npu_convert_weight_to_int4pack",
    "npu_convert_weight_to_int",
    "npu_dequant_swiglu_quant",
    "npu_dual_level_quant_matmul",
    "npu_dynamic_block_quant",
    "npu_dynamic_dual_level_mx_quant",
    "npu_dynamic_mx_quant",
    "npu_dynamic_quant",
    "npu_grouped_matmul_swiglu_quant_v2",
    "npu_kv_quant_sparse_flash_attention",
    "npu_moe_init_routing_quant",
    "npu_quant_lightning_indexer",
    "npu_quant_matmul",
    "npu_quantize",
    "npu_trans_quant_param",
    "npu_transpose_quant_batchmatmul",
    "npu_weight_quant_batchmatmul",
    "swiglu_group_quant",  # sgl-kernel-npu, registered under torch.ops.npu
)


def _refusing(name: str) -> Callable[..., NoReturn]:
    def quantized_kernel(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(name, "quantization", "quantized kernels are not modelled (unquantized bf16/fp16/fp32 only)")

    quantized_kernel.__name__ = quantized_kernel.__qualname__ = name
    quantized_kernel.__doc__ = f"``torch_npu.{name}``: refused, see the module docstring."
    return quantized_kernel


KERNELS = {name: _refusing(name) for name in QUANTIZED_KERNELS}
