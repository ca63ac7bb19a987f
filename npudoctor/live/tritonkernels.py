"""CPU references of the Triton kernels (triton-ascend, sgl-kernel-npu's) the dry run's paths launch.

On an Ascend host these kernels are compiled by triton-ascend; here a launch ``kernel[grid](...)``
runs the reference of the kernel's documented semantics instead (``ascendsim.TritonKernel``), keyed
by the kernel's module and name. A kernel without a reference is a simulation gap, never skipped.
Each reference takes the launch grid first, then the kernel's arguments as sglang passes them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch


def alloc_extend_kernel(
    grid: Any,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    bs_upper: int,
    page_size: int,
    max_num_extend_tokens: int,
) -> None:
    """sgl-kernel-npu ``mem_cache/allocator.py::alloc_extend_kernel`` (one program per request),
    the semantics of sglang's own ``alloc_extend_kernel`` / ``alloc_extend_naive``
    (``srt/mem_cache/allocator``): request ``i`` extends from ``prefix_lens[i]`` to ``seq_lens[i]``;
    its tokens first fill the page its prefix ends in (slots after ``last_loc[i]``), then take new
    pages from ``free_pages`` in order (request by request: the pages of earlier requests first);
    ``out_indices`` receives the slots of every extended token, request after request."""
    position = 0
    next_page = 0
    for i in range(prefix_lens.shape[0]):
        prefix, seq, last = int(prefix_lens[i]), int(seq_lens[i]), int(last_loc[i])
        ceil_prefix = -(-prefix // page_size) * page_size
        first_pages = next_page
        for token in range(prefix, seq):
            if token < ceil_prefix:
                slot = last + 1 + (token - prefix)
            else:
                offset = token - ceil_prefix
                slot = int(free_pages[first_pages + offset // page_size]) * page_size + offset % page_size
            out_indices[position] = slot
            position += 1
        if seq > ceil_prefix:
            next_page += -(-(seq - ceil_prefix) // page_size)


def write_req_to_token_pool_triton(
    grid: Any,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_pointers: torch.Tensor,
    pre_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    req_to_token_stride: int,
) -> None:
    """sglang ``kernels/ops/memory/common.py::write_req_to_token_pool_triton`` (0.5.23; the same
    kernel as ``mem_cache/common.py`` earlier), one program per request: request ``i``'s row of the
    request-to-token table gets its prefix's KV slots (``pre_lens[i]`` int64 values read from the
    address ``prefix_pointers[i]``: the prefix tensor's ``data_ptr``, a host address on this
    simulated device) and then its extended tokens' slots from ``out_cache_loc``, which holds the
    requests' extensions one after another."""
    start = 0
    for i in range(req_pool_indices.shape[0]):
        row = req_to_token.view(-1)[int(req_pool_indices[i]) * req_to_token_stride :]
        pre, seq = int(pre_lens[i]), int(seq_lens[i])
        if pre:
            address = int(prefix_pointers[i].item()) & ((1 << 64) - 1)
            prefix = torch.frombuffer((ctypes.c_int64 * pre).from_address(address), dtype=torch.int64)
            row[:pre] = prefix.to(row.dtype)
        row[pre:seq] = out_cache_loc[start : start + seq - pre].to(row.dtype)
        start += int(extend_lens[i])


def compute_position_kernel(
    grid: Any,
    positions: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    has_prefix: bool,
) -> None:
    """sglang ``compute_position_kernel`` (``kernels/ops/attention/position.py`` in 0.5.23,
    ``srt/model_executor/forward_batch_info.py`` before; the same source), one program per request
    of the launch grid ``(batch_size,)``: request ``i``'s extended tokens, stored one request after
    another from ``extend_start_loc[i] = sum(extend_seq_lens[:i])``, get the positions
    ``prefix_len + 0 .. prefix_len + extend_seq_lens[i] - 1`` (``prefix_len`` is
    ``extend_prefix_lens[i]`` when ``has_prefix``, else 0)."""
    programs = _one_dimensional(grid, "compute_position_kernel")
    start = 0
    for i in range(programs):
        prefix = int(extend_prefix_lens[i]) if has_prefix else 0
        length = int(extend_seq_lens[i])
        positions[start : start + length] = torch.arange(prefix, prefix + length, dtype=positions.dtype)
        extend_start_loc[i] = start
        start += length


def _one_dimensional(grid: Any, kernel: str) -> int:
    """The number of programs of a launch over a one-dimensional grid ``(n,)``, the form sglang
    launches these kernels with; any other grid is outside what the reference models."""
    if not (isinstance(grid, tuple) and len(grid) == 1):
        raise NotImplementedError(f"CPU reference of {kernel}: grid {grid!r}, not (n,)")
    return int(grid[0])


# kernel (its module and name, as the path imports it) -> reference
TRITON_KERNELS: dict[str, Callable[..., Any]] = {
    "sgl_kernel_npu.mem_cache.allocator.alloc_extend_kernel": alloc_extend_kernel,
    "sglang.kernels.ops.memory.common.write_req_to_token_pool_triton": write_req_to_token_pool_triton,
    "sglang.srt.mem_cache.common.write_req_to_token_pool_triton": write_req_to_token_pool_triton,
    "sglang.kernels.ops.attention.position.compute_position_kernel": compute_position_kernel,
    "sglang.srt.model_executor.forward_batch_info.compute_position_kernel": compute_position_kernel,
}
