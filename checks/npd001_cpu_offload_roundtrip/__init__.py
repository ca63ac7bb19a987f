"""NPD001: the KV cache of the deployment's NPU pool survives a CPU offload and reload.

A PD decode server that runs short of KV cache retracts requests and copies their KV
to host memory (``Req.offload_kv_cache`` -> allocator -> pool ``get_cpu_copy``), then
copies it back (``load_cpu_copy``). In sglang <= 0.5.12, ``NPUMLATokenToKVPool`` had no
offload methods of its own: it inherited ``MLATokenToKVPool.get_cpu_copy``, which reads
``self.kv_buffer``, an attribute the NPU pool never creates (it builds ``k_buffer``,
``v_buffer`` and the optional ``index_k_buffer``, and skips ``MLATokenToKVPool.__init__``).
The first retraction crashed the decode instance with ``AttributeError``
(https://github.com/sgl-project/sglang/pull/25249).

Siblings of the same property: the NPU MHA pool without ``ASCEND_USE_FIA`` keeps page-major
buffers ``(layers, pages, page_size, heads, dim)`` and up to 0.5.12 inherits
``MHATokenToKVPool.get_cpu_copy``, which indexes them with token slots (``IndexError``; the
Ascend pools of 0.4.10-0.5.6 the same, FIA or not); from 0.5.14 through 0.5.23 the NPU MHA
pool's own override views ``v_buffer`` with ``head_dim`` although it is allocated with
``v_head_dim`` (MiMo-V2-Flash, 192/128: ``RuntimeError`` or other bytes).

Static probe (the property, not the diff): for every NPU pool class of the
deployment's attention family, the ``get_cpu_copy``/``load_cpu_copy`` the class resolves
to through its MRO must not be an abstract stub, must read only attributes that building
that class assigns (following ``__init__``, ``super()`` and helper calls the way Python
runs them) or that its classes define, and must index every buffer with the request's token
slots through a view whose rows are token slots: the pool is built on symbols for the decode
role (its ``ASCEND_USE_FIA``, the model's heads and head dims; ``layout.py``), the copy methods
run with the token slots followed through slicing and helpers, and each indexed view's first
dimension is compared with its storage's token-slot count.

Live probe: build each NPU pool of the family for the decode role on CPU (the role's
layers, heads, head dims, page size; a few pages), fill every KV buffer with random
bits, ``get_cpu_copy`` a scattered set of token slots, ``load_cpu_copy`` it into other
slots, and compare every layer and buffer bit for bit. The first mismatch or the
exception is the evidence.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.static.poolclasses import offload_scope
from npudoctor.target.discovery import Target


class CpuOffloadRoundTrip(Check):
    id = "NPD001"
    kind = CheckKind.DEEP
    title = "KV cache CPU offload/reload round-trips on the NPU pool"
    upstream = ("https://github.com/sgl-project/sglang/pull/25249",)
    impact = Impact.RUNTIME_CRASH
    why = (
        "A PD decode server under KV-cache pressure retracts requests and offloads their KV to "
        "CPU. If the NPU pool's offload methods read buffers the pool never creates, or index its "
        "page-major buffers (or a V view of the wrong head dim) with token slots, the decode instance "
        "dies with AttributeError/IndexError/RuntimeError at its first retraction, hours after launch, "
        "or reloads other bytes than it saved."
    )
    bites_when = (
        "Disaggregated decode role (--disaggregation-mode decode) on Ascend, when the KV cache "
        "fills up and the scheduler retracts a request. MLA models (DeepSeek, GLM, Kimi) up to 0.5.12; "
        "MHA/GQA models without ASCEND_USE_FIA (page-major pool) up to 0.5.12; MHA with v_head_dim != "
        "head_dim (MiMo-V2-Flash) from 0.5.14 through 0.5.23; any NPU pool whose offload methods do not "
        "address its buffers by token."
    )
    how_to_fix = (
        "apply the npudoctor runtime override for NPD001 (the NPU pools copy per layer through "
        "flattened k/v/indexer views): npudoctor fix --apply --select NPD001"
    )

    def live_imports(self) -> None:
        from npudoctor.live import livepools  # live only: never loaded at static depth

        livepools.import_pool_modules()

    def out_of_scope(self, facts: Facts) -> Probe | None:
        roles, _, _ = offload_scope(facts)
        if roles:
            return None
        return Probe(
            Status.SKIP,
            "no role of this deployment offloads KV to CPU: only a PD decode server does "
            "(ScheduleBatch.release_req with disaggregation_mode == 'decode')",
        )

    def live(self, target: Target, facts: Facts) -> Probe:
        from .live import live_probe  # live only: never loaded at static depth

        roles, families, assumptions = offload_scope(facts)
        role = facts.role("decode") or RoleFacts(name="decode (assumed)", disaggregation_mode="decode")
        return live_probe(facts, role, roles, families, assumptions)

    def static(self, target: Target, facts: Facts) -> Probe:
        from .static import static_probe  # not loaded when the answer is cached

        role = facts.role("decode") or RoleFacts(name="decode (assumed)", disaggregation_mode="decode")
        return static_probe(target.tree, facts, role, *offload_scope(facts))


CHECK = CpuOffloadRoundTrip()
