"""NPD001 fix: CPU offload/reload of the NPU KV pools through flattened per-layer views.

Port of https://github.com/sgl-project/sglang/pull/25249 (sglang 0.5.13). Up to 0.5.12
the NPU pools had no offload methods of their own:

* ``NPUMLATokenToKVPool`` inherited ``MLATokenToKVPool.get_cpu_copy``/``load_cpu_copy``,
  which read ``self.kv_buffer``; the NPU MLA pool keeps ``k_buffer``/``v_buffer`` (and the
  NSA ``index_k_buffer``) instead, so the first retraction raised ``AttributeError``;
* ``NPUMHATokenToKVPool`` inherited ``MHATokenToKVPool``'s, which index the first
  dimension of each layer buffer by token; without FIA that dimension is the page, so
  the copy raised ``IndexError`` or copied whole pages.

The replacements copy every KV buffer of every layer (K, V and, when present, the
indexer K) through a ``(token slots, bytes of one token)`` view, in chunks of the pool's
``cpu_offloading_chunk_size``, between ``torch.npu.synchronize()`` calls, as upstream
does. They accept the keywords the installed callers pass to a KV pool
(``mamba_indices`` since 0.5.11): those concern hybrid pools, a plain KV pool has nothing
to do with them, and rejecting them is the NPD005 defect. Safety: ``safe``, the methods
it replaces could not offload at all before.
"""

from __future__ import annotations

from typing import Any

from npudoctor.fix import Fix, Safety

POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"
_BUFFERS = ("k_buffer", "v_buffer", "index_k_buffer")


def get_cpu_copy(self, indices, mamba_indices=None, **other_pool_keywords) -> list:
    """Per layer, per chunk of ``indices``: the CPU copies of that layer's K, V (, indexer K) slots."""
    import torch

    torch.npu.synchronize()
    chunk = self.cpu_offloading_chunk_size
    copies = []
    for layer in _layers(self):
        copies.append(
            [[rows[indices[i : i + chunk]].to("cpu", non_blocking=True) for rows in layer]
             for i in range(0, len(indices), chunk)]
        )  # fmt: skip
    torch.npu.synchronize()
    return copies


def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, **other_pool_keywords) -> None:
    """Write what ``get_cpu_copy`` returned back into the slots ``indices``."""
    import torch

    torch.npu.synchronize()
    chunk = self.cpu_offloading_chunk_size
    for layer, saved in zip(_layers(self), kv_cache_cpu, strict=True):
        for i in range(0, len(indices), chunk):
            slots = indices[i : i + chunk]
            for rows, cpu in zip(layer, saved[i // chunk], strict=True):
                if cpu.shape[0] != len(slots):
                    raise ValueError(f"CPU copy holds {cpu.shape[0]} slots, reload asks for {len(slots)}")
                rows[slots] = cpu.to(rows.device, non_blocking=True)
    torch.npu.synchronize()


def _layers(pool: Any) -> list[list[Any]]:
    """Each layer's KV buffers as ``(token slots, one token)`` views, whatever the layout:
    ``(pages, page_size, heads, dim)`` without FIA, ``(tokens, 1, heads, dim)`` with it."""
    present = [getattr(pool, name) for name in _BUFFERS if getattr(pool, name, None) is not None]
    return [
        [buffer[layer].view(-1, buffer[layer].shape[-2] * buffer[layer].shape[-1]) for buffer in present]
        for layer in range(pool.layer_num)
    ]


class CpuOffloadOverride(Fix):
    id = "NPD001"
    title = "NPU pools offload and reload their own K/V (and indexer) buffers"
    upstream = "https://github.com/sgl-project/sglang/pull/25249"
    safety = Safety.SAFE
    replaces = (
        f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy",
    )
    # The buffer layouts the replacements read: where each pool builds its buffers.
    anchors = (f"{POOLS}:NPUMLATokenToKVPool.__init__", f"{POOLS}:NPUMHATokenToKVPool._create_buffers")
    # scripts/fix_shapes.py NPD001 0.5.9 0.5.10 0.5.11 0.5.12
    written_for = {
        "0.5.9, 0.5.10": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "2785bb7c296e15d6",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "e3aa72359b771b95",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "781ba059365f9aba",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "12b15c9fb3ee83fd",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "0705f82021cf02d5",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "fb050e0efc04c279",
        },
        "0.5.11, 0.5.12": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "336922e1360df621",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "1ae77e16cecf448e",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "bd329c81fed64480",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "c38865a6ae2f1ccc",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "0705f82021cf02d5",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "fb050e0efc04c279",
        },
    }

    def implementations(self) -> dict[str, Any]:
        return {
            site: get_cpu_copy if site.endswith("get_cpu_copy") else load_cpu_copy for site in self.replaces
        }


FIX = CpuOffloadOverride()
