"""NPD001: the KV cache of the deployment's NPU pool survives a CPU offload and reload.

A PD decode server that runs short of KV cache retracts requests and copies their KV
to host memory (``Req.offload_kv_cache`` -> allocator -> pool ``get_cpu_copy``), then
copies it back (``load_cpu_copy``). In sglang <= 0.5.12, ``NPUMLATokenToKVPool`` had no
offload methods of its own: it inherited ``MLATokenToKVPool.get_cpu_copy``, which reads
``self.kv_buffer``, an attribute the NPU pool never creates (it builds ``k_buffer``,
``v_buffer`` and the optional ``index_k_buffer``, and skips ``MLATokenToKVPool.__init__``).
The first retraction crashed the decode instance with ``AttributeError``
(https://github.com/sgl-project/sglang/pull/25249).

Static probe (the property, not the diff): for every NPU pool class of the
deployment's attention family, the ``get_cpu_copy``/``load_cpu_copy`` the class resolves
to through its MRO must not be an abstract stub and must read only attributes that
building that class assigns (following ``__init__``, ``super()`` and helper calls the
way Python runs them) or that its classes define.

Live probe: build each NPU pool of the family for the decode role on CPU (the role's
layers, heads, head dims, page size; a few pages), fill every KV buffer with random
bits, ``get_cpu_copy`` a scattered set of token slots, ``load_cpu_copy`` it into other
slots, and compare every layer and buffer bit for bit. The first mismatch or the
exception is the evidence.
"""

from __future__ import annotations

import ast

from npudoctor import livepools
from npudoctor.check import Check, Probe
from npudoctor.facts import Facts, RoleFacts
from npudoctor.livecode import code_location, exception_evidence
from npudoctor.pools import npu_pool_classes, offload_scope
from npudoctor.results import Evidence, Location, Status
from npudoctor.source import ClassInfo, MethodRef, SourceTree
from npudoctor.target import Target

OFFLOAD_METHODS = ("get_cpu_copy", "load_cpu_copy")


class CpuOffloadRoundTrip(Check):
    id = "NPD001"
    title = "KV cache CPU offload/reload round-trips on the NPU pool"
    upstream = ("https://github.com/sgl-project/sglang/pull/25249",)
    fixed_in = "0.5.13"
    why = (
        "A PD decode server under KV-cache pressure retracts requests and offloads their KV to "
        "CPU. If the NPU pool's offload methods read buffers the pool never creates, the decode "
        "instance dies with AttributeError at its first retraction, hours after launch."
    )
    bites_when = (
        "Disaggregated decode role (--disaggregation-mode decode) on Ascend, when the KV cache "
        "fills up and the scheduler retracts a request. MLA models (DeepSeek, GLM, Kimi) in the "
        "known releases; any NPU pool whose offload methods do not match its buffers."
    )
    how_to_fix = (
        "Upgrade sglang to a release whose NPU pools override get_cpu_copy/load_cpu_copy, or "
        "apply the npudoctor runtime override for NPD001 (copies per layer through flattened "
        "k/v/indexer views)."
    )

    def live_imports(self) -> None:
        livepools.import_pool_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        roles, families, assumptions = offload_scope(facts)
        if not roles:
            return Probe(
                Status.SKIP, "no role of this deployment offloads KV to CPU (only a PD decode server does)"
            )
        role = facts.role("decode") or RoleFacts(name="decode (assumed)", disaggregation_mode="decode")
        evidence: list[Evidence] = []
        failing: list[str] = []
        for family in families:
            classes = livepools.npu_pool_classes(family)
            if not classes:
                return Probe(
                    Status.WARN,
                    f"no NPU {family.upper()} pool class is loaded from sglang",
                    assumptions=assumptions,
                    roles=roles,
                )
            for cls in classes:
                problem = livepools.in_role(role, lambda cls=cls: _round_trip(cls, facts, role))
                if problem is None:
                    evidence.append(
                        Evidence(
                            expected=f"{cls.__name__}: KV of the offloaded slots comes back bit for bit",
                            observed=f"{cls.__name__} (live, CPU): every layer and buffer round-tripped",
                            location=code_location(cls, "get_cpu_copy"),
                        )
                    )
                else:
                    failing.append(cls.__name__)
                    evidence.append(problem)
        if failing:
            return Probe(
                Status.FAIL,
                f"{', '.join(failing)}: CPU offload/reload does not round-trip",
                tuple(evidence),
                assumptions,
                roles,
            )
        return Probe(
            Status.PASS,
            "the NPU pools' CPU offload/reload round-trips every layer and buffer",
            tuple(evidence),
            assumptions,
            roles,
        )

    def static(self, target: Target, facts: Facts) -> Probe:
        roles, families, assumptions = offload_scope(facts)
        if not roles:
            return Probe(
                Status.SKIP,
                "no role of this deployment offloads KV to CPU: only a PD decode server does "
                "(ScheduleBatch.release_req with disaggregation_mode == 'decode')",
            )
        tree = target.tree
        evidence: list[Evidence] = []
        failing: list[str] = []
        uncertain: list[str] = []
        unrecognised: list[str] = []
        for family in families:
            classes = npu_pool_classes(tree, family)
            if not classes:
                unrecognised.append(family)
                evidence.append(
                    Evidence(
                        expected=f"an NPU subclass of the generic {family.upper()} KV pool under sglang/srt",
                        observed="none found: this release's layout is not one npudoctor recognises",
                    )
                )
                continue
            for cls in classes:
                problems = _offload_problems(tree, cls)
                evidence.extend(e for _, e in problems)
                if not problems:
                    evidence.append(_round_trip_ok(tree, cls))
                elif any(status is Status.FAIL for status, _ in problems):
                    failing.append(cls.name)
                else:
                    uncertain.append(cls.name)

        if failing:
            status = Status.FAIL
            summary = (
                f"{', '.join(failing)}: CPU offload/reload would raise on the first retraction "
                "(offload methods read attributes the pool never assigns)"
            )
        elif unrecognised or uncertain:
            status = Status.WARN
            summary = "cannot tell: " + "; ".join(
                (
                    [f"no NPU {' or '.join(unrecognised).upper()} pool class found in this tree"]
                    if unrecognised
                    else []
                )
                + ([f"{', '.join(uncertain)} inherit from classes outside sglang"] if uncertain else [])
            )
        else:
            status = Status.PASS
            summary = "the NPU pools' offload methods read only attributes their construction assigns"
        return Probe(status, summary, tuple(evidence), assumptions, roles)


def _offload_problems(tree: SourceTree, cls: ClassInfo) -> list[tuple[Status, Evidence]]:
    """Why ``cls`` cannot round-trip: FAIL for certain defects, WARN where a base outside sglang may hide one."""
    mro = tree.mro(cls)
    assigned = tree.construction_assignments(cls)
    defined = set().union(*(c.class_attributes for c in mro))
    external = tree.external_bases(cls)
    problems = []
    for name in OFFLOAD_METHODS:
        method = tree.lookup(mro, name)
        if method is None:
            problems.append(
                (
                    Status.FAIL,
                    Evidence(
                        expected=f"{cls.name}.{name} to exist",
                        observed=f"no {name} anywhere in the MRO {' -> '.join(c.name for c in mro)}",
                        location=Location(cls.relpath, cls.line, cls.name),
                    ),
                )
            )
            continue
        if _only_raises_not_implemented(method):
            problems.append(
                (
                    Status.FAIL,
                    Evidence(
                        expected=f"{cls.name}.{name} to copy the pool's KV buffers",
                        observed=f"{cls.name}.{name} resolves to {method.qualname}, which raises NotImplementedError",
                        location=Location(method.relpath, method.line, method.qualname),
                    ),
                )
            )
            continue
        missing = [
            use
            for attr, use in tree.reads(cls, method).items()
            if attr not in assigned and attr not in defined
        ]
        if missing:
            first = missing[0]
            built = sorted(a for a in assigned if "buffer" in a) or sorted(assigned)[:8]
            caveat = f"; bases outside sglang ({', '.join(external)}) may define it" if external else ""
            problems.append(
                (
                    Status.WARN if external else Status.FAIL,
                    Evidence(
                        expected=f"{method.qualname} (used by {cls.name}) reads only attributes a {cls.name} has",
                        observed=(
                            f"{cls.name}.{name} resolves to {method.qualname} ({method.where()}), which reads "
                            + ", ".join(f"self.{u.name} ({u.where()})" for u in missing)
                            + f"; building {cls.name} ({cls.relpath}:{cls.line}) never assigns "
                            + ("it" if len(missing) == 1 else "them")
                            + f" (it assigns {', '.join(built)})"
                            + caveat
                        ),
                        location=Location(first.method.relpath, first.line, method.qualname),
                    ),
                )
            )
    return problems


def _round_trip_ok(tree: SourceTree, cls: ClassInfo) -> Evidence:
    mro = tree.mro(cls)
    resolved = [tree.lookup(mro, name) for name in OFFLOAD_METHODS]
    reads = sorted({a for m in resolved for a in tree.reads(cls, m) if "buffer" in a})
    first = resolved[0]
    return Evidence(
        expected=f"{cls.name} offload methods read only attributes its construction assigns",
        observed=(
            ", ".join(f"{m.qualname} ({m.where()})" for m in resolved)
            + (f" read {', '.join(reads)}, all assigned" if reads else " read no buffer attributes")
        ),
        location=Location(first.relpath, first.line, first.qualname),
    )


def _round_trip(cls: type, facts: Facts, role: RoleFacts) -> Evidence | None:
    """Offload scattered slots and reload them elsewhere; None when every bit came back."""
    import torch

    try:
        pool = livepools.build_pool(cls, facts.model, role)
    except livepools.CannotBuild as reason:
        return Evidence(
            expected=f"a {cls.__name__} for this deployment",
            observed=str(reason),
            location=code_location(cls, "__init__"),
        )
    buffers = livepools.kv_buffers(pool)
    tokens = pool.size + pool.page_size
    generator = torch.Generator().manual_seed(0)
    for layers in buffers.values():
        for layer in layers:
            rows = livepools.token_rows(layer, tokens)
            rows.copy_(
                torch.randint(-(2**15), 2**15, rows.shape, dtype=torch.int32, generator=generator).to(
                    rows.dtype
                )
            )
    page = pool.page_size
    source = torch.tensor([page + 1, page + 5, 2 * page, 2 * page + 3, 3 * page - 1], dtype=torch.int64)
    target = torch.tensor([3 * page + 2, page + 7, 2 * page + 9, 4 * page - 1, page + 2], dtype=torch.int64)
    before = {
        name: [livepools.token_rows(t, tokens)[source].clone() for t in layers]
        for name, layers in buffers.items()
    }
    get, load = pool.get_cpu_copy, pool.load_cpu_copy
    try:
        saved = get(source)
        load(saved, target)
    except Exception as error:
        return exception_evidence(
            f"{cls.__name__}.get_cpu_copy/load_cpu_copy to offload and reload the KV cache", error
        )
    for name, layers in buffers.items():
        for index, layer in enumerate(layers):
            after = livepools.token_rows(layer, tokens)[target]
            wrong = (after != before[name][index]).any(dim=1).nonzero()
            if len(wrong):
                slot = int(wrong[0])
                return Evidence(
                    expected=f"{cls.__name__}.{name} layer {index} slot {int(target[slot])}: the bits of slot {int(source[slot])}",
                    observed=(
                        f"got other bits in {len(wrong)} of {len(target)} reloaded slots of that layer "
                        f"(first: slot {int(target[slot])}, bytes {before[name][index][slot][:4].tolist()}... "
                        f"expected, {after[slot][:4].tolist()}... found)"
                    ),
                    location=code_location(cls, "load_cpu_copy"),
                )
    return None


def _only_raises_not_implemented(method: MethodRef) -> bool:
    body = [
        s for s in method.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"


CHECK = CpuOffloadRoundTrip()
