"""NPD005 fix: the NPU KV pools' offload overrides accept the keywords their allocator passes.

Port of https://github.com/sgl-project/sglang/pull/24026's rule (offload overrides take their
callers' keywords as explicit parameters and pass them down) to the NPU pools, as upstream
applied it to them in two steps. A PD decode server retracting a request calls
``token_to_kv_pool_allocator.get_cpu_copy(indices, mamba_indices=...)`` and later
``load_cpu_copy(...)``; the NPU allocator (``NPUPagedTokenToKVPoolAllocator``, whose methods
are ``PagedTokenToKVPoolAllocator``'s in ``mem_cache/allocator/paged.py``) forwards them to
its pool as ``self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)``. sglang
0.5.13 gave the NPU pools offload overrides of their own (sglang#25249) written as
``get_cpu_copy(self, indices)`` / ``load_cpu_copy(self, kv_cache_cpu, indices)``, so Python
raised ``TypeError: ... unexpected keyword argument 'mamba_indices'`` before a byte was copied
and the decode instance died at its first retraction:

* 0.5.13: ``NPUMHATokenToKVPool`` and ``NPUMLATokenToKVPool`` both refuse it;
* 0.5.14: ``NPUMHATokenToKVPool`` takes ``mamba_indices=None`` (the same body), the MLA
  pool still refuses it (DeepSeek/GLM/Kimi decode dies, Qwen3 decode works);
* 0.5.15: both take it.

Upstream's fix is the signature alone: the same bodies with ``mamba_indices=None`` added and
not read. A plain KV pool is the bottom of the chain: the mamba state belongs to the hybrid
pool above it (``HybridLinearKVPool``), which copies it itself and calls its NPU sub-pool
without keywords. So each replacement here is that widened signature around the installed
method itself (``calls_original``): it calls the original with the token indices (and the
payload, for ``load_cpu_copy``), which keeps that release's copy through flattened
per-layer views exactly as it is, chunking and ``torch.npu.synchronize()`` included.

The keywords: the replacements take explicit parameters for what the installed callers
pass to a pool, read from the code (``installs``), not assumed: the allocator methods that
forward to the pool are anchors, so their calls are part of the shape, and every shape this
fix was written for passes exactly ``mamba_indices=`` (``req_pool_index=`` arrives in later
releases, with code of another shape, which is refused). Which pools are replaced is read
from the code as well: a site is installed only where the allocator's call does not bind to
the installed method (0.5.13: both pools; 0.5.14: the MLA pool only), so a release where
some sites are already right keeps them untouched. ``DSATokenToKVPool`` (0.5.13) refuses the
keyword too, but it is a CUDA pool that no Ascend deployment builds: not replaced.

Safety: ``safe``. It only widens a signature: every call that bound before runs the same
code with the same arguments; the calls it admits raised ``TypeError`` before.
"""

from __future__ import annotations

import ast
from typing import Any

from npudoctor.patching.fixbase import Fix, FunctionNode, Safety, calls_original
from npudoctor.static.poolclasses import OFFLOAD_METHODS
from npudoctor.static.signatures import CallShape, bind_errors

POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"
ALLOCATOR = "sglang.srt.hardware_backend.npu.allocator_npu"
CALLER = f"{ALLOCATOR}:NPUPagedTokenToKVPoolAllocator"  # the pool's caller on a decode server


@calls_original
def get_cpu_copy(original, self, indices, mamba_indices=None):
    """The installed copy of the token slots ``indices``. ``mamba_indices`` is the request's
    mamba slot, which only a hybrid pool above this one copies (as sglang 0.5.15 does)."""
    return original(indices)


@calls_original
def load_cpu_copy(original, self, kv_cache_cpu, indices, mamba_indices=None):
    """The installed reload of ``kv_cache_cpu`` into ``indices``; ``mamba_indices`` as above."""
    return original(kv_cache_cpu, indices)


REPLACEMENTS = {"get_cpu_copy": get_cpu_copy, "load_cpu_copy": load_cpu_copy}


class OffloadSignaturesOverride(Fix):
    id = "NPD005"
    title = "NPU KV pools accept the keywords the allocator passes to get_cpu_copy/load_cpu_copy"
    upstream = "https://github.com/sgl-project/sglang/pull/24026"
    safety = Safety.SAFE
    # Each installed only where the allocator's call does not bind (``installs``): 0.5.13 all
    # four, 0.5.14 the MLA pool's two.
    replaces = (
        f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy",
        f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy",
    )
    # The calls the replacements must bind: what the NPU allocator passes to its pool.
    anchors = tuple(f"{CALLER}.{method}" for method in OFFLOAD_METHODS)
    # scripts/fix_shapes.py NPD005 0.5.13 0.5.14
    written_for = {
        "0.5.13": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "16ec5c22d7624bbf",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "9fcb4ffc1c802e4e",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "6f10ed829fe628a0",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "8b70e62ee9e556e0",
            f"{CALLER}.get_cpu_copy": "faa7d01badfd27ed",
            f"{CALLER}.load_cpu_copy": "42a78d5328dacaf5",
        },
        "0.5.14": {
            f"{POOLS}:NPUMLATokenToKVPool.get_cpu_copy": "16ec5c22d7624bbf",
            f"{POOLS}:NPUMLATokenToKVPool.load_cpu_copy": "9fcb4ffc1c802e4e",
            f"{POOLS}:NPUMHATokenToKVPool.get_cpu_copy": "9757fab8ad76e325",
            f"{POOLS}:NPUMHATokenToKVPool.load_cpu_copy": "318cf631efaf3474",
            f"{CALLER}.get_cpu_copy": "faa7d01badfd27ed",
            f"{CALLER}.load_cpu_copy": "42a78d5328dacaf5",
        },
    }

    def implementations(self) -> dict[str, Any]:
        return {site: REPLACEMENTS[site.rpartition(".")[2]] for site in self.replaces}

    def installs(self, functions: dict[str, FunctionNode | None]) -> tuple[str, ...]:
        """The pool methods that the allocator's forwarding call does not bind to."""
        return tuple(
            site
            for site in self.replaces
            if functions.get(site) is not None
            and any(bind_errors(functions[site], shape) for shape in caller_calls(functions, site))
        )


def caller_calls(functions: dict[str, FunctionNode | None], site: str) -> list[CallShape]:
    """The shapes of the calls the anchored allocator method makes of the same method on its pool."""
    method = site.rpartition(".")[2]
    caller = functions.get(f"{CALLER}.{method}")
    if caller is None:
        return []
    return [
        CallShape.of(node)
        for node in ast.walk(caller)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
    ]


FIX = OffloadSignaturesOverride()
