"""CPU references of the Ascend kernels that sglang's NPU paths call, one module per op family.

The dry run and the live probes run sglang's real glue code around an NPU kernel (argument
preparation, splitting, concatenation); only the kernel itself is replaced, by a plain PyTorch
implementation of its documented semantics for the argument forms those paths use. Anything outside
that subset raises ``NotImplementedError`` naming the argument (``unmodelled.refuse``), so a run
never passes on a kernel call the reference does not model; the quantization kernels are installed
only to refuse (``REFUSED``). Arguments that break the documented contract of a form the reference
does model (shapes that disagree, a slot or block outside the cache, lengths that do not split the
tokens) raise ``ValueError``/``IndexError`` instead: that is a misuse of the kernel by its caller,
which the kernel would reject or misread. Each module's docstring names the
document it follows and the sglang call sites it was written for.

``npudoctor.live.npusim.npu_runtime`` installs ``KERNELS`` on the stand-in ``torch_npu`` and as
``torch.ops.npu`` for the duration of the calls. ``SGL_KERNEL_NPU`` holds the references of the
sgl-kernel-npu (Triton) functions sglang calls, by the dotted name sglang imports them from
(``sgl_kernel_npu.norm.l1_norm.l1_norm``), for the stand-in ``sgl_kernel_npu`` package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npudoctor.live.npukernels import (
    attention,
    devicememory,
    kvcache,
    mla,
    moe,
    nonlinearity,
    norm,
    quant,
    rope,
    sampling,
    sparseattention,
)

_FAMILIES = (
    attention,
    kvcache,
    norm,
    rope,
    nonlinearity,
    sampling,
    devicememory,
    moe,
    mla,
    sparseattention,
    quant,
)


def _merged(table: str) -> dict[str, Callable[..., Any]]:
    """The families' ``table`` dicts in one; a name two families define is an error."""
    kernels: dict[str, Callable[..., Any]] = {}
    for family in _FAMILIES:
        for name, kernel in getattr(family, table, {}).items():
            if name in kernels:
                raise RuntimeError(f"two references for {name}: {family.__name__} and another family")
            kernels[name] = kernel
    return kernels


KERNELS: dict[str, Callable[..., Any]] = _merged("KERNELS")
SGL_KERNEL_NPU: dict[str, Callable[..., Any]] = _merged("SGL_KERNEL_NPU")
# names in KERNELS whose reference only refuses (quantization): installed, never computed
REFUSED: frozenset[str] = frozenset(quant.QUANTIZED_KERNELS)
