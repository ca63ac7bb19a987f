"""NPD005: every ``get_cpu_copy``/``load_cpu_copy`` override accepts, and passes on, the keywords its callers pass.

A PD decode server that runs short of KV cache retracts a request and offloads its KV to
host memory: the scheduler calls ``token_to_kv_pool_allocator.get_cpu_copy(indices, ...)``,
the allocator forwards to its pool (``self._kvcache.get_cpu_copy(...)``), composite pools
forward to their sub-pools. The keywords on that chain grow release by release
(``mamba_indices=`` from 0.5.11, ``req_pool_index=`` later) and every override must grow
with them: the allocator in 0.5.13 always passes ``mamba_indices=``, while the NPU pools'
new overrides were written as ``get_cpu_copy(self, indices)``, so Python raised
``TypeError: unexpected keyword argument 'mamba_indices'`` before a byte was copied and
the decode instance died at its first retraction. The same defect in the SWA pool and
allocator was fixed upstream by explicit parameters forwarded down the chain
(https://github.com/sgl-project/sglang/pull/24026).

Static probe (reads the source with ``ast``; sglang is never imported). The property:
every call of ``get_cpu_copy``/``load_cpu_copy`` under ``sglang/srt`` binds to every
override it can reach, and an override passes on the keywords it receives when the next
level would use them. The keyword set is read from the installed callers, never from a
list in npudoctor.

* **Calls.** Each call is recorded with its shape (positional count, keywords, spreads)
  and the class and method it is written in. What it reaches, by receiver:
  ``super().m(...)`` and ``Base.m(self, ...)`` reach exactly the method the caller's MRO
  gives; a receiver whose text names an allocator (``token_to_kv_pool_allocator``, in the
  scheduler) reaches every allocator override; any other receiver (``self._kvcache`` in
  an allocator, ``self.full_kv_pool`` in a composite pool, ...) reaches every KV-pool
  override. Coarse, hence sound: a keyword anyone passes to "a pool" must be taken by
  every pool that is not provably a component (below).
* **Overrides.** Definitions of the two methods in classes whose MRO contains
  ``KVCache`` (pools) or ``BaseTokenToKVPoolAllocator`` (allocators), found by
  inheritance wherever they live (``mem_cache/allocator.py`` became a package). Every
  class of the hierarchies resolves the methods to one of these definitions, so checking
  the definitions checks every class; the classes of the deployment's path are named.
* **Binding.** Each reaching call is bound to the override as CPython would bind it:
  unexpected keyword, too many positional arguments, missing required argument.
* **Forwarding.** An override that receives a keyword it accepts, never reads it and
  calls the next level has dropped it. On the deployment's path that is a ``fail`` when
  the next level on the path reads the keyword (what is copied changes: e.g. mamba state
  left behind) and a ``warn`` when it only accepts it. Elsewhere a drop is reported when
  the override is a one-statement forwarder (``return self._kvcache.m(...)``) or hands over
  with ``super()`` to a method that reads the keyword, ranked like a binding failure below.
  A composite that consumes a keyword itself reads it, and has not dropped it.
* **No false alarms.** A method whose body only raises (HiSparse and fused-draft pools:
  "does not support get_cpu_copy") refuses offload whatever it is passed: not a signature
  defect (NPD001 reports missing offload support on the NPU path). A class whose every
  use builds it into ``self.<attr>`` of another pool or allocator (directly, or as a
  ``<attr>_cls=`` argument of ``super().__init__`` that the base instantiates into
  ``self.<attr>``), and that nothing subclasses, registers or passes around, is a
  component: only calls on that attribute reach it (0.5.23's NVFP4 index-K pool).
* **Ranking.** The deployment's path is built level by level, the way a decode server
  runs a retraction: the scheduler calls the allocator the decode role builds on Ascend
  (the NPU paged allocator; ``SWATokenToKVPoolAllocator`` for sliding-window models);
  that allocator calls the pool it holds: the NPU pool class of the model's attention
  family (``npudoctor.static.poolclasses.npu_pool_classes``), or for hybrid linear-attention and
  sliding-window models the composite (``HybridLinearKVPool``, ``SWAKVPool``) whose
  attribute calls then reach the NPU pool; ``super()`` calls stay on their level. A
  binding failure is a ``fail`` when a call made on the path reaches the override on the
  path (the 0.5.13 defect: ``allocator/paged.py`` -> ``NPUMLATokenToKVPool``). It is a
  ``warn`` when the override belongs to a class the deployment builds but only calls made
  elsewhere fail (0.5.13 with Qwen3-Next: the NPU MHA pool sits under
  ``HybridLinearKVPool``, which calls it without keywords). Offenders in classes the
  deployment does not build (CUDA-only pools such as 0.5.12's ``NSATokenToKVPool``, the
  other attention family's NPU pool) are reported, marked "not on this deployment's NPU
  path", in the evidence and the summary, and never change the status.

* **Every call on the path** (``chain.py``). A retraction runs more than the two copy
  methods: the scheduler's offload functions (and their ``self`` helpers) ask the allocator for
  its pool and read flags on it (``get_kvcache().cpu_copy_carries_mamba``), composite pools
  call their sub-pools and mamba pool (``MambaPool`` is no KV pool), NPU pools call their own
  helpers (``_chunk_copy_npu_to_cpu``, ``_copy_indices_for_buffer``). The walk starts at the
  functions that call the allocator's copy methods, types each receiver by the path (allocator,
  ``self._kvcache`` -> pool, a composite's ``*kv_pool`` -> NPU sub-pool, ``*mamba_pool`` ->
  ``MambaPool``), resolves every call through the MRO of the class the deployment builds
  (``self.m``, ``super().m``, ``Base.m(self)``) and binds it: a call that does not bind, or a
  name no class of the MRO defines or assigns, is a ``fail`` with the caller's and the
  callee's file:line. (The copy methods' own overrides keep the judgement above.)

Live probe (imports the real sglang modules in the live child, behind the NPU simulation). The
static graph names the classes of the deployment's path and the scheduler's calls into the
allocator; the live probe builds that allocator over that pool on CPU with their real
constructors and the deployment's dimensions (the hybrid pool with its ``MambaPool`` shaped by
sglang's own config class of the model), and makes the scheduler's two calls with exactly the
keywords the installed callers pass (values of the kind a decode server's ``Req`` holds:
``mamba_indices`` None, or a real mamba slot for a hybrid model; ``req_pool_index`` 0).
Every level's offload methods are shadowed on the instance by a recorder while the calls run,
so the evidence says what each level received. A call that does not bind is a ``fail`` (the
sglang line that made it, the keyword, CPython's own message); a keyword dropped between
levels is a ``fail`` when the next level reads it, a ``warn`` when it only accepts it; the
offloaded slots must come back (a copy that raises for other reasons is NPD001's, reported,
not counted); a class that cannot be built on CPU is a ``warn`` with the reason. Both depths
judge the same roles and classes. The calls of the static walk (``chain.py``) are bound to the
imported classes' real signatures (``inspect.signature`` of what the real MRO resolves), so a
helper that the exercised chain never reached is judged live too.

Matters for roles that offload KV (a PD decode server: ``RoleFacts.can_offload_kv``);
otherwise ``skip``. With no deployment, a PD decode role with an MLA and an MHA model is
assumed and listed. A tree where no allocator caller, no pool override or no NPU pool is
recognised gives ``warn``, never a silent ``pass``.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.static.poolclasses import offload_scope
from npudoctor.target.discovery import Target


class OffloadSignatures(Check):
    """NPD005: ``get_cpu_copy``/``load_cpu_copy`` overrides accept and forward their callers' keywords."""

    id = "NPD005"
    kind = CheckKind.DEEP
    title = "get_cpu_copy/load_cpu_copy overrides accept the keywords their callers pass"
    upstream = ("https://github.com/sgl-project/sglang/pull/24026",)
    impact = Impact.RUNTIME_CRASH
    why = (
        "Callers pass keywords (mamba_indices=, req_pool_index=) through the allocator to the pool; "
        "an override with a narrower signature raises TypeError at the first retraction, and one "
        "that drops a keyword silently offloads the wrong state."
    )
    bites_when = (
        "PD decode role that retracts, with a pool or allocator whose offload override lacks a "
        "keyword the installed callers pass (or drops one the next level uses)."
    )
    how_to_fix = (
        "apply the npudoctor runtime override for NPD005 (accept and forward the keywords): "
        "npudoctor fix --apply --select NPD005"
    )

    def out_of_scope(self, facts: Facts) -> Probe | None:
        scope = _path_scope(facts)
        return scope if isinstance(scope, Probe) else None

    def static(self, target: Target, facts: Facts) -> Probe:
        """Bind every offload call to every override it can reach; rank offenders by the deployment's path."""
        from .static import OffloadGraph  # not loaded when the answer is cached

        return OffloadGraph(target.tree).probe(*_path_scope(facts))

    def live_imports(self) -> None:
        """Import the module of every class a decode server's offload path can hold (the static
        path's classes, for any deployment), while ``is_npu()`` is still False."""
        from .live import import_path_modules  # live only: never loaded at static depth

        import_path_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        """Build the deployment's allocator and pools on CPU, call ``get_cpu_copy``/``load_cpu_copy``
        through the real chain with the keywords the installed callers pass, and record what every
        level receives (see ``_LiveProbe``)."""
        from .live import _graph, _LiveProbe  # live only: never loaded at static depth

        return _LiveProbe(_graph(target.tree), facts).run(*_path_scope(facts))


def _path_scope(facts: Facts):
    """``(families, sliding, hybrid, roles, assumptions)`` of the offload path both depths
    judge, or the skip when no role of the deployment offloads KV to CPU."""
    roles, families, assumptions = offload_scope(facts)
    if not roles:
        return Probe(
            Status.SKIP,
            "no role of this deployment offloads KV to CPU: only a PD decode server retracts "
            "requests to host memory (get_cpu_copy/load_cpu_copy)",
        )
    sliding = bool(facts.model and facts.model.sliding_window)
    hybrid = bool(facts.model and facts.model.hybrid_linear_layers)
    return families, sliding, hybrid, roles, assumptions


CHECK = OffloadSignatures()
