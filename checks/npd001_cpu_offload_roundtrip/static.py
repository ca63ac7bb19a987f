"""NPD001 static probe: read with ``ast`` the ``get_cpu_copy``/``load_cpu_copy`` that every NPU
pool class of the deployment's families resolves to through its MRO, and require that they exist,
are not abstract stubs, and read only attributes that building the class assigns or its classes
define (``npudoctor.pools`` finds the classes, ``npudoctor.source`` follows their construction).
"""

from __future__ import annotations

import ast

from npudoctor.check import Probe
from npudoctor.pools import OFFLOAD_METHODS, no_npu_pool, npu_pool_classes
from npudoctor.results import Evidence, Location, Status
from npudoctor.source import ClassInfo, FunctionRef, SourceTree


def static_probe(
    tree: SourceTree, roles: tuple[str, ...], families: list[str], assumptions: tuple[str, ...]
) -> Probe:
    """The verdict over every NPU pool class of ``families``; ``roles`` are the roles that offload."""
    evidence: list[Evidence] = []
    failing: list[str] = []
    uncertain: list[str] = []
    unrecognised: list[str] = []
    for family in families:
        classes = npu_pool_classes(tree, family)
        if not classes:
            unrecognised.append(family)
            evidence.append(no_npu_pool(family))
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


def _only_raises_not_implemented(method: FunctionRef) -> bool:
    body = [
        s for s in method.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"
