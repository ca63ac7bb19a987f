"""Every NPU kernel that 0.5.23's dense (Llama/Qwen) path names (``torch_npu.npu_*``/``_npu_*``,
``torch.ops.npu.*``, and the sgl-kernel-npu functions it imports) has a CPU reference, or is a
known gap listed here with the reason; a kernel a new release adds on that path fails this test
until it gets one or joins the list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from npudoctor.live.npukernels import KERNELS, REFUSED, SGL_KERNEL_NPU

# The modules of the dense path's NPU code: attention backend, KV pool, NPU utils and graph runner,
# norms, activations, plain rotary embedding, sampler, the dense models.
DENSE_PATH = (
    "srt/hardware_backend/npu/attention/ascend_backend.py",
    "srt/hardware_backend/npu/memory_pool_npu.py",
    "srt/hardware_backend/npu/utils.py",
    "srt/hardware_backend/npu/graph_runner",
    "srt/layers/layernorm.py",
    "srt/layers/activation.py",
    "srt/layers/rotary_embedding/base.py",
    "srt/layers/rotary_embedding/utils.py",
    "srt/layers/sampler.py",
    "srt/models/llama.py",
    "srt/models/qwen2.py",
    "srt/models/qwen3.py",
)

# Kernels named in those modules on branches the dense path does not take, without a reference yet.
KNOWN_GAPS = {
    # DeepSeek-V3.2 sparse attention over a quantized KV cache (forward_sparse)
    "npu_kv_quant_sparse_flash_attention",
    # named in a comment of the backend's metadata; DeepSeek-V4's shared-KV sparse attention calls it
    "sparse_attn_sharedkv_metadata_host",
    # int8 KV cache quantization (the quantized KV pools); unquantized dtypes only so far
    "npu_dynamic_quant",
}

# sgl-kernel-npu functions imported there, on branches the dense path does not take
KNOWN_SGL_KERNEL_NPU_GAPS = {
    # attention sinks (gpt-oss) without ASCEND_USE_FIA
    "sgl_kernel_npu.attention.sinks_attention.attention_sinks_triton",
    "sgl_kernel_npu.attention.sinks_attention.attention_sinks_prefill_triton",
    # the DSpark speculative commit of valid KV prefixes
    "sgl_kernel_npu.mem_cache.kv_cache_store.store_kv_cache_prefix_valid_npu_triton",
    # Kimi K3's SituAndMul
    "sgl_kernel_npu.activation.situ.situ_and_mul",
}

# torch_npu.npu_* / torch_npu._npu_*, and every op registered under torch.ops.npu (sgl-kernel-npu adds some)
CALLED = re.compile(r"\btorch_npu\.(_?npu_\w+)|\btorch\.ops\.npu\.(\w+)")


def dense_path_files(sglang: Path) -> list[Path]:
    files = []
    for entry in DENSE_PATH:
        path = sglang / entry
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        assert found and all(f.is_file() for f in found), f"{entry} is not in this release"
        files += found
    return files


def kernels_named(sglang: Path) -> dict[str, list[str]]:
    """Each torch_npu / torch.ops.npu kernel named in the dense path's modules -> where."""
    found: dict[str, list[str]] = {}
    for file in dense_path_files(sglang):
        for number, line in enumerate(file.read_text().splitlines(), 1):
            for match in CALLED.finditer(line):
                name = match.group(1) or match.group(2)
                found.setdefault(name, []).append(f"{file.relative_to(sglang)}:{number}")
    return found


def sgl_kernel_npu_imported(sglang: Path) -> dict[str, list[str]]:
    """Each ``from sgl_kernel_npu.x import f`` in the dense path's modules: dotted name -> where."""
    found: dict[str, list[str]] = {}
    for file in dense_path_files(sglang):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sgl_kernel_npu"):
                for alias in node.names:
                    found.setdefault(f"{node.module}.{alias.name}", []).append(
                        f"{file.relative_to(sglang)}:{node.lineno}"
                    )
    return found


def test_every_kernel_on_the_0_5_23_dense_path_has_a_reference_or_is_a_known_gap(release):
    named = kernels_named(release("0.5.23") / "sglang")
    modelled = KERNELS.keys() - REFUSED
    missing = {
        name: where for name, where in named.items() if name not in modelled and name not in KNOWN_GAPS
    }
    assert not missing, f"NPU kernels on the dense path with no CPU reference: {missing}"
    # the grep itself works: the path's attention and norm kernels are among those it finds
    assert {"npu_fused_infer_attention_score", "_npu_paged_attention", "npu_rms_norm"} <= named.keys()


def test_every_sgl_kernel_npu_function_on_the_0_5_23_dense_path_has_a_reference_or_is_a_known_gap(release):
    imported = sgl_kernel_npu_imported(release("0.5.23") / "sglang")
    missing = {
        name: where
        for name, where in imported.items()
        if name not in SGL_KERNEL_NPU and name not in KNOWN_SGL_KERNEL_NPU_GAPS
    }
    assert not missing, f"sgl-kernel-npu functions on the dense path with no CPU reference: {missing}"
    assert "sgl_kernel_npu.norm.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope" in imported


def test_the_known_quantization_gaps_are_installed_to_refuse():
    assert {"npu_dynamic_quant", "npu_kv_quant_sparse_flash_attention"} <= REFUSED


def test_no_known_gap_has_a_reference():
    assert not KNOWN_GAPS & (KERNELS.keys() - REFUSED)
    assert not KNOWN_SGL_KERNEL_NPU_GAPS & SGL_KERNEL_NPU.keys()


def test_a_quantized_kernel_is_installed_but_refuses_by_saying_so():
    with pytest.raises(NotImplementedError, match="quantization"):
        KERNELS["npu_dynamic_quant"](torch.zeros(2, 2))


def test_the_simulated_runtime_installs_every_reference_under_its_name():
    """What sglang calls (``torch_npu.X``, ``torch.ops.npu.X``, FIA's ``.out``) is the reference."""
    import importlib

    from npudoctor.live import npusim

    with npusim.simulated_npu():
        standin = importlib.import_module("torch_npu")
        with npusim.npu_runtime():
            for name, kernel in KERNELS.items():
                assert getattr(standin, name) is kernel and getattr(torch.ops.npu, name) is kernel
            assert callable(standin.npu_fused_infer_attention_score.out)
