"""NPD001 live probe: build each NPU pool class of the deployment's families for the decode role on
CPU (``npudoctor.live.livepools``: the role's layers, heads, head dims, page size; a few pages), fill
every KV buffer with random bits, ``get_cpu_copy`` scattered token slots, ``load_cpu_copy`` them
into other slots and compare every layer and buffer bit for bit.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import livepools, processstate
from npudoctor.live.locations import code_location, exception_evidence
from npudoctor.results import Evidence, Status


def live_probe(
    facts: Facts,
    role: RoleFacts,
    roles: tuple[str, ...],
    families: list[str],
    assumptions: tuple[str, ...],
) -> Probe:
    """The live verdict: round-trip every NPU pool class of ``families`` built for ``role``."""
    evidence: list[Evidence] = []
    failing: list[str] = []
    unbuilt: list[str] = []
    for family in families:
        classes = livepools.npu_pool_classes(family)
        if not classes:
            return livepools.no_pool_loaded(family, assumptions, roles)
        for cls in classes:
            problem = processstate.in_role(role, lambda cls=cls: _round_trip(cls, facts, role))
            if isinstance(problem, livepools.CannotBuild):  # not built: cannot tell, never a pass
                unbuilt.append(cls.__name__)
                evidence.append(
                    Evidence(
                        expected=f"a {cls.__name__} for this deployment",
                        observed=str(problem),
                        location=code_location(cls, "__init__"),
                    )
                )
            elif problem is None:
                evidence.append(
                    Evidence(
                        expected=f"{cls.__name__}: KV of the offloaded slots comes back bit for bit",
                        observed=(
                            f"{cls.__name__} (live, CPU): every layer and buffer round-tripped"
                            + livepools.sampled_note(facts.model)
                        ),
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
    if unbuilt:
        return Probe(
            Status.WARN,
            f"cannot tell: {', '.join(unbuilt)} not built on CPU for this deployment",
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


def _round_trip(cls: type, facts: Facts, role: RoleFacts) -> Evidence | livepools.CannotBuild | None:
    """Offload scattered slots and reload them elsewhere; None when every bit came back, the
    reason when the pool cannot be built for this deployment."""
    import torch

    try:
        pool = livepools.build_pool(cls, livepools.probed_model(facts.model), role)
    except livepools.CannotBuild as reason:
        return reason
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
