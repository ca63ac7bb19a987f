"""NPD001 fix: CPU offload/reload of the NPU KV pools through flattened per-layer views.

Port of https://github.com/sgl-project/sglang/pull/25249 (sglang 0.5.13) for 0.5.7-0.5.12, and
npudoctor's own fix (no upstream pull request) for the NPU MHA pool of 0.5.14-0.5.23. Up to 0.5.12
the NPU pools had no offload methods of their own:

* ``NPUMLATokenToKVPool`` inherited ``MLATokenToKVPool.get_cpu_copy``/``load_cpu_copy``,
  which read ``self.kv_buffer``; the NPU MLA pool keeps ``k_buffer``/``v_buffer`` (and the
  NSA ``index_k_buffer``) instead, so the first retraction raised ``AttributeError``;
* ``NPUMHATokenToKVPool`` inherited ``MHATokenToKVPool``'s, which index the first
  dimension of each layer buffer by token; without FIA that dimension is the page, so
  the copy raised ``IndexError`` or copied whole pages.

From 0.5.14 on, ``NPUMHATokenToKVPool`` allocates its V buffer with ``v_head_dim`` per head
(``_create_buffers``), but its own ``get_cpu_copy``/``load_cpu_copy`` (from #25249) still view it
as ``(-1, head_num, head_dim)``: with ``v_head_dim != head_dim`` (MiMo-V2-Flash, 192/128, built on
NPU as a hybrid-SWA pool) the view either does not exist (RuntimeError at the first retraction)
or addresses other bytes than the token's. Still so in 0.5.23; the replacement below views each
buffer by its own last two dimensions, so V rows are ``head_num * v_head_dim`` wide.

The replacements copy every KV buffer of every layer (K, V and, when present, the
indexer K) through a ``(token slots, bytes of one token)`` view, in chunks of the pool's
``cpu_offloading_chunk_size``, between ``torch.npu.synchronize()`` calls, as upstream
does. They accept the keywords the installed callers pass to a KV pool
(``mamba_indices`` since 0.5.11): those concern hybrid pools, a plain KV pool has nothing
to do with them, and rejecting them is the NPD005 defect. Safety: ``safe``, the methods
it replaces could not offload the deployment's KV at all before (the fix is planned only where
the NPD001 check fails for the deployment). Installed where the code needs it (``installs``): the
NPU MLA pool's sites only where it inherits the generic methods that read ``kv_buffer``
(0.5.7-0.5.12); 0.5.14+ MLA overrides (DCP-local slots, FP8 records, indexer scales) stay.
"""

from __future__ import annotations

import ast
from typing import Any

from npudoctor.patching.fixbase import Fix, Safety
from npudoctor.static.source import FunctionNode

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


def _reads_kv_buffer(node: FunctionNode | None) -> bool:
    """Whether a copy method reads ``self.kv_buffer`` (the generic MLA pool's, never built on NPU)."""
    return node is not None and any(
        isinstance(n, ast.Attribute) and n.attr == "kv_buffer" for n in ast.walk(node)
    )


class CpuOffloadOverride(Fix):
    id = "NPD001"
    title = "NPU pools offload and reload their own K/V (and indexer) buffers"
    upstream = "https://github.com/sgl-project/sglang/pull/25249"
    own = (
        "the NPU MHA pool's offload views each buffer by its own row width (K head_dim, V v_head_dim), "
        "so a model with v_head_dim != head_dim round-trips, for 0.5.14-0.5.23"
    )
    safety = Safety.SAFE
    replaces = (
        f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy",
    )
    # The buffer layouts the replacements read: where each pool builds its buffers.
    anchors = (f"{POOLS}:NPUMLATokenToKVPool.__init__", f"{POOLS}:NPUMHATokenToKVPool._create_buffers")
    # scripts/fix_shapes.py NPD001 0.5.7 ... 0.5.12 0.5.14 ... 0.5.23 (0.5.13: nothing to fix)
    written_for = {
        "0.5.7, 0.5.8": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "2785bb7c296e15d6",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "e3aa72359b771b95",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "781ba059365f9aba",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "12b15c9fb3ee83fd",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "452c5ebad2c9e71e",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "fb050e0efc04c279",
        },
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
        "0.5.14": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "16ec5c22d7624bbf",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "9fcb4ffc1c802e4e",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "9757fab8ad76e325",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "318cf631efaf3474",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "0705f82021cf02d5",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "60b0f5cfd9fbedbe",
        },
        "0.5.15, 0.5.16, 0.5.17": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "0e8fa813fdb6c921",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "073733f6dd50ab00",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "9757fab8ad76e325",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "318cf631efaf3474",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "0705f82021cf02d5",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "60b0f5cfd9fbedbe",
        },
        "0.5.18, 0.5.19": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "0e8fa813fdb6c921",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "073733f6dd50ab00",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "9757fab8ad76e325",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "318cf631efaf3474",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "bd8ecf0f647ca766",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "60b0f5cfd9fbedbe",
        },
        "0.5.20": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "ffa5adbe4c83414e",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "9a3716443a78ac6c",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "61589774a3dc0225",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "9e6fbead7f97629a",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "d90b09bebe5fd184",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "c882944e92a45c2a",
        },
        "0.5.21": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "ffa5adbe4c83414e",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "9a3716443a78ac6c",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "61589774a3dc0225",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "9e6fbead7f97629a",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "5beb6d1ca20caa6c",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "7fb4a6cba1530419",
        },
        "0.5.22": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "1d3b1dfe2d635fe3",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "d8197460ca367409",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "61589774a3dc0225",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "9e6fbead7f97629a",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "ce2495f32e186121",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "7fb4a6cba1530419",
        },
        "0.5.23": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "1d3b1dfe2d635fe3",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "d8197460ca367409",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "61589774a3dc0225",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "9e6fbead7f97629a",
            f"{POOLS}:NPUMLATokenToKVPool.__init__": "8b8c947afff24215",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "7fb4a6cba1530419",
        },
    }

    def installs(self, functions: dict[str, FunctionNode | None]) -> tuple[str, ...]:
        mla = [site for site in self.replaces if ":NPUMLATokenToKVPool." in site]
        if any(_reads_kv_buffer(functions.get(site)) for site in mla):
            return self.replaces
        return tuple(site for site in self.replaces if site not in mla)

    def implementations(self) -> dict[str, Any]:
        return {
            site: get_cpu_copy if site.endswith("get_cpu_copy") else load_cpu_copy for site in self.replaces
        }


FIX = CpuOffloadOverride()
