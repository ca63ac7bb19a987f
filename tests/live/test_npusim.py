"""The NPU simulation is installed only for a live run and leaves the interpreter as it found it."""

from __future__ import annotations

import importlib
import sys

import torch

from npudoctor.live import npusim


def test_standins_exist_only_inside_the_block():
    path_before = list(sys.path)
    with npusim.simulated_npu() as names:
        assert "torch_npu" in names
        triton = importlib.import_module("triton")
        language = importlib.import_module("triton.language")

        def kernel():
            return 1

        assert triton.jit(kernel) is kernel and triton.jit(do_not_specialize=["x"])(kernel) is kernel
        assert language.constexpr is not None
        assert importlib.import_module("torch_npu")
        assert not hasattr(torch, "npu"), "is_npu() must stay False while sglang imports"
    for name in ("torch_npu", "triton", "triton.language"):
        assert name not in sys.modules
    assert sys.path == path_before


def test_npu_runtime_is_scoped_to_the_probe_calls():
    cuda_sync = torch.cuda.synchronize
    with npusim.npu_runtime():
        torch.npu.synchronize()
        stream = torch.npu.current_stream()
        with torch.npu.stream(stream):
            stream.synchronize()
        torch.cuda.synchronize()  # the inherited base offload methods call it on a CPU host
    assert not hasattr(torch, "npu")
    assert torch.cuda.synchronize is cuda_sync


def test_nothing_is_simulated_where_a_real_npu_works(monkeypatch):
    monkeypatch.setattr(npusim, "real_npu_available", lambda: True)
    with npusim.simulated_npu() as names, npusim.npu_runtime():
        assert names == []
        assert "torch_npu" not in sys.modules and not hasattr(torch, "npu")


def test_no_real_npu_here():
    assert npusim.real_npu_available() is False


def test_reference_kernels_exist_only_around_the_probe_calls():
    ops_before = torch.ops.__dict__.get("npu")
    with npusim.simulated_npu():
        standin = importlib.import_module("torch_npu")
        importlib.import_module("sgl_kernel_npu.attention.sinks_attention")
        with npusim.npu_runtime():
            assert standin.npu_fused_infer_attention_score is torch.ops.npu.npu_fused_infer_attention_score
        assert not hasattr(standin, "npu_fused_infer_attention_score")
    assert torch.ops.__dict__.get("npu") is ops_before
    assert "sgl_kernel_npu" not in sys.modules
