"""NPP002: nothing CUDA-only is reachable on the deployment's NPU path: no module it imports needs a
package an Ascend host lacks, and no function on it calls CUDA-only code.

sglang keeps every device's code in one tree and picks at import and at call time with ``if
_is_cuda:``-style guards. A guard forgotten on one import line is enough to stop a deployment on
Ascend before it serves a token: ``BailingMoeV2_5ForCausalLM``'s module imports
``vllm._custom_ops`` at module level on NPU (``models/bailing_moe_linear.py``, 0.5.9 .. 0.5.22), the
GLM-4.7-Flash module imported ``sgl_kernel.dsv3_router_gemm`` unguarded in 0.5.10
(``models/glm4_moe_lite.py:23``, Ascend/sglang#324), and the rotary embedding imported vllm inside
``__init__`` on NPU for head sizes outside 64/128/256/512, which broke Qwen3-VL's vision tower
(https://github.com/sgl-project/sglang/pull/17453, fixed by
https://github.com/sgl-project/sglang/pull/17478). sglang's model registry swallows the
``ImportError`` of a model module, so the first two show as "architecture not supported"; an
unguarded import anywhere else stops the scheduler process.

**What an Ascend host lacks** (``npudoctor.static.npuguards.ABSENT_ON_ASCEND``; ``WHY_ABSENT`` in
``imports.py`` gives each): sglang's Ascend install is ``pip install sglang[srt_npu]`` from
``pyproject_other.toml`` (later ``pyproject_npu.toml``), whose dependencies carry none of the CUDA
wheel's kernel packages, plus torch (CPU build) with torch_npu, triton-ascend, and sgl-kernel-npu
(``sgl_kernel_npu``, and the NPU ``deep_ep``). Missing there: ``sgl_kernel`` (sglang-kernel),
``flashinfer``, ``deep_gemm``, ``flash_attn`` (and ``flash_attn_interface``), ``flash_mla``,
``cutlass`` (nvidia-cutlass-dsl), ``cuda`` (cuda-python), ``nvshmem``, ``quack``, ``humming``,
``tilelang``, ``triton_kernels``, ``fast_hadamard_transform``, the ROCm kernels (``aiter``,
``wave_lang``, ``petit_kernel``, ``mori``), and ``vllm``, which no sglang install requires. Not in
the set, because an Ascend host has them: ``deep_ep``, ``triton``, ``tvm_ffi`` (apache-tvm-ffi is a
dependency of xgrammar, which the Ascend install requires), and everything CPU-only. A module this
CI host lacks but an Ascend host has is never a finding: the probe reads the source only.

**(a) The import closure** (``imports.py``). The roots are the modules the role surely imports: those
of the classes its path starts from (``npudoctor.static.npupath``: the model's, which sglang's model
registry imports, the attention backend's, the pools', the allocator's, the graph runner's) and the
scheduler process's own (``scheduler``, ``model_runner``); a module a function on the path imports
inside its body is followed from that import, under that function's conditions. Importing a module runs its package ``__init__`` files and its
module-level imports on the branches an Ascend host takes (``npuguards.guarded_statements``;
``TYPE_CHECKING`` blocks never run; a test such as ``if ENABLE_JIT_DEEPGEMM:`` is settled when the
name is bound to a call of an sglang function whose every return on NPU agrees); each sglang
module imported (absolute, relative, ``import sglang.x``, and the submodule a ``from package import
name`` loads) is followed in turn. An import of a missing package that no ``try ... except
ImportError`` (or ``Exception``) catches is a ``fail`` at its file:line, with the chain of imports
from the root. So is a module-level ``torch.cuda.get_device_capability()``-style call that an
Ascend host certainly runs (not behind ``is_nvidia and ...``).

**(b) The functions on the path** (``dispatch.py``), read on the branches an Ascend host may take:
an ``import`` of a missing package inside a function; and, judged against what the release installs
at start-up (every scheduler process of 0.5.8 .. 0.5.23 imports ``model_runner``, which runs
``init_npu_backend()`` on NPU and so torch_npu's ``transfer_to_npu``: ``torch.cuda.*`` becomes
``torch.npu.*``, a ``"cuda"`` device becomes ``"npu"`` in the torch factories and ``.to()``, and
``nccl`` becomes ``hccl`` in ``init_process_group``), a ``torch.cuda.<f>`` that ``torch.npu`` lacks,
a ``"cuda"`` device handed to a torch function that is not rewritten, and ``backend="nccl"`` in
``new_group`` and the other process-group calls. Without ``transfer_to_npu`` (a tree that does not
install it), every ``torch.cuda`` call but ``is_available``/``device_count``, every ``"cuda"`` device
and every nccl group is judged. Harmless: ``torch.cuda.is_available()`` (it answers on Ascend:
False without ``transfer_to_npu``, ``torch.npu.is_available()`` with it).

**Verdict**: ``fail`` with the file:line (and the import chain or the function) when something
CUDA-only runs on an Ascend host whatever the data: a module-level import on imports that surely
run; in a function, one outside every condition the source cannot settle, in a constructor, or in a
function that a call on the path makes unconditionally from one that surely runs (a reach only
called under ``if should_use_mega_moe(...)`` is not). What runs only under a condition the source
cannot settle (a CUDA feature the deployment would have to enable: mega MoE, the SP fused GEMM, an
AWQ checkpoint) is listed in the result's assumptions as not judged: every DeepSeek path has a dozen
of these, and a ``warn`` on each would say nothing about the deployment. ``warn`` when an import
depends on the model's head size and no model config was given (the deployment would settle it);
``pass`` otherwise. With no deployment, one server with the NPU defaults is assumed (``npupath``)
and, with no model, the model's own modules are not followed: the result says so.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact
from npudoctor.target.discovery import Target


class CudaOnlyCode(Check):
    """NPP002: nothing CUDA-only is imported or called on the deployment's NPU path."""

    id = "NPP002"
    kind = CheckKind.PROPERTY  # not in the default selection: it walks the whole NPU path
    title = "Nothing CUDA-only is imported or called on the deployment's NPU path"
    upstream = (
        "https://github.com/sgl-project/sglang/pull/17453",
        "https://github.com/sgl-project/sglang/pull/17478",
        "https://github.com/Ascend/sglang/pull/324",
    )
    impact = Impact.STARTUP_CRASH
    why = (
        "A module-level import of a CUDA-only package (sgl_kernel, vllm, flashinfer, deep_gemm ...) that "
        "no NPU guard or try/except covers stops the server on every Ascend host at start-up; a model "
        "module that fails to import makes its architecture 'not supported'."
    )
    bites_when = (
        "Any deployment whose NPU path (the model, attention backend, KV pool, allocator, graph runner, "
        "PD transfer, and the modules they import) imports or calls CUDA-only code."
    )
    how_to_fix = (
        "upgrade to a release where the import is guarded, or (for vllm only) keep an importable vllm "
        "package in the environment"
    )
    runtime_fix = False

    def static(self, target: Target, facts: Facts) -> Probe:
        """Follow the path's module imports and read its functions (see the module docstring)."""
        from .static import probe  # not loaded when the answer is cached

        return probe(target.tree, facts)


CHECK = CudaOnlyCode()
