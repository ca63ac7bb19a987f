"""CPU references of the kernels that write the KV cache of sglang's NPU memory pools.

Documents followed: the torch_npu custom-API reference in Ascend/op-plugin
(``docs/zh/custom_APIs/torch_npu/torch_npu-npu_scatter_nd_update_.md``,
``torch_npu-npu_scatter_pa_kv_cache.md``); ``torch_npu._npu_reshape_and_cache`` is the ATB
ReshapeAndCache op, with no public page: its semantics are those of sglang's own portable write
(``buffer.view(-1, heads, dim)[loc] = k``) that it replaces.

Call sites: sglang ``srt/hardware_backend/npu/memory_pool_npu.py`` (0.5.12-0.5.23;
``srt/mem_cache/memory_pool.py`` before) ``NPUMHATokenToKVPool.set_kv_buffer`` (reshape_and_cache by
default, scatter_pa_kv_cache or scatter_nd_update_ with FIA) and the MLA/DSA pools'
``set_kv_buffer`` / ``set_index_k_buffer`` (scatter_nd_update_).
"""

from __future__ import annotations

from typing import Any

import torch

from npudoctor.live.npukernels.unmodelled import refuse, refuse_given


def _checked_slots(op: str, slots: torch.Tensor, capacity: int, count: int) -> torch.Tensor:
    slots = slots.reshape(-1).long()
    if slots.numel() != count:
        raise ValueError(f"{op}: {slots.numel()} slots for {count} tokens")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
        raise IndexError(f"{op}: slot out of range for a cache of {capacity} token slots")
    return slots


def npu_scatter_nd_update_(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_scatter_nd_update_`` (ScatterNdUpdate, in place): ``indices`` of shape
    ``(N, K)`` address the first ``K`` dims of ``self``, and ``self[indices[i]] = updates[i]``;
    ``updates`` has shape ``(N, *self.shape[K:])``. Returns ``self``. Out-of-range indices raise, as
    the kernel does not write them anywhere sensible."""
    if indices.dim() != 2:
        refuse("npu_scatter_nd_update_", "indices", f"shape {tuple(indices.shape)}, not (N, K)")
    count, depth = indices.shape
    if depth > self.dim() or tuple(updates.shape) != (count, *self.shape[depth:]):
        raise ValueError(
            f"npu_scatter_nd_update_: updates of shape {tuple(updates.shape)} for indices "
            f"{tuple(indices.shape)} into {tuple(self.shape)}"
        )
    index = tuple(indices.long().unbind(dim=1))
    for dim, positions in enumerate(index):
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.shape[dim]):
            raise IndexError(
                f"npu_scatter_nd_update_: index out of range for dim {dim} of size {self.shape[dim]}"
            )
    self[index] = updates.to(self.dtype)
    return self


def _npu_reshape_and_cache(
    *,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
    **unmodelled: Any,
) -> None:
    """``torch_npu._npu_reshape_and_cache`` (ATB ReshapeAndCache, ND caches): token ``t``'s
    ``key (T, N, D)`` / ``value (T, N, Dv)`` go to slot ``s = slot_indices[t]`` of the paged caches
    ``(blocks, block_size, N, D)``, i.e. block ``s // block_size`` at ``s % block_size``."""
    op = "_npu_reshape_and_cache"
    refuse_given(op, unmodelled)
    for name, tokens, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if cache.dim() != 4:
            refuse(op, f"{name}_cache", f"shape {tuple(cache.shape)}, modelled (blocks, block_size, N, D)")
        rows = tokens.reshape(tokens.shape[0], -1)
        if rows.shape[1] != cache.shape[2] * cache.shape[3]:
            raise ValueError(
                f"{op}: {name} of shape {tuple(tokens.shape)} does not fit {name}_cache {tuple(cache.shape)}"
            )
        flat = cache.view(-1, cache.shape[2], cache.shape[3])
        slots = _checked_slots(op, slot_indices, flat.shape[0], tokens.shape[0])
        flat[slots] = rows.reshape(-1, cache.shape[2], cache.shape[3]).to(cache.dtype)


def npu_scatter_pa_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    compress_lens: torch.Tensor | None = None,
    compress_seq_offsets: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    cache_mode: str | None = "PA_NZ",
) -> None:
    """``torch_npu.npu_scatter_pa_kv_cache``, scenario one with ``cache_mode="Norm"`` (ND caches,
    what sglang passes): ``key (T, N, D)`` / ``value (T, N, Dv)`` written in place to slot
    ``slot_mapping[t]`` of ``key_cache``/``value_cache`` ``(blocks, block_size, N, D)``. The NZ
    layout (the default ``"PA_NZ"``) and the compressed scenario two are refused."""
    op = "npu_scatter_pa_kv_cache"
    refuse_given(
        op,
        {"compress_lens": compress_lens, "compress_seq_offsets": compress_seq_offsets, "seq_lens": seq_lens},
    )
    if cache_mode not in (None, "Norm"):
        refuse(op, "cache_mode", f"{cache_mode!r} (modelled: 'Norm', the ND layout)")
    if key.dim() != 3:
        refuse(op, "key", f"shape {tuple(key.shape)}, modelled (T, N, D) (scenario one)")
    _npu_reshape_and_cache(
        key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_indices=slot_mapping
    )


KERNELS = {
    "npu_scatter_nd_update_": npu_scatter_nd_update_,
    "_npu_reshape_and_cache": _npu_reshape_and_cache,
    "npu_scatter_pa_kv_cache": npu_scatter_pa_kv_cache,
}


def alloc_extend(
    pre_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    out_indices: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """sgl-kernel-npu's ``torch.ops.npu.alloc_extend`` (``csrc/pytorch_extensions.cpp``: ``alloc_extend(
    Tensor pre_lens, Tensor seq_lens, Tensor last_loc, Tensor free_pages, int page_size, Tensor(a!)
    out_indices, Tensor(b!) values)``; ``csrc/alloc_extend``, sgl-project/sgl-kernel-npu f425bdf):
    the paged allocation of an extend batch, the semantics of the Triton ``alloc_extend_kernel``
    (``tritonkernels.alloc_extend_kernel``, one place for it) and of sglang's own fallback
    ``alloc_extend_kernel_ascend`` (0.5.4 ``mem_cache/allocator_ascend.py``); ``values[0]`` receives
    the number of new pages taken. The host code accepts int64 tensors only and raises otherwise."""
    from npudoctor.live.tritonkernels import alloc_extend_kernel

    if any(t.dtype != torch.int64 for t in (pre_lens, seq_lens, last_loc, free_pages, out_indices)):
        raise ValueError("alloc_extend: Only support int64 input dtype")
    alloc_extend_kernel(
        (pre_lens.shape[0],),
        pre_lens,
        seq_lens,
        last_loc,
        free_pages,
        out_indices,
        0,
        page_size,
        out_indices.shape[0],
    )
    new_pages = -(-seq_lens // page_size) - (-(-pre_lens // page_size))
    values.view(-1)[0] = int(new_pages.sum())


# sgl-kernel-npu's ops registered as ``torch.ops.npu.<name>`` (its csrc), by the name sglang calls
SGL_KERNEL_NPU = {"torch.ops.npu.alloc_extend": alloc_extend}
