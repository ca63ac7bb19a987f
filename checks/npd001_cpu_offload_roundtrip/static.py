"""NPD001 static probe: read with ``ast`` the ``get_cpu_copy``/``load_cpu_copy`` that every NPU
pool class of the deployment's families resolves to through its MRO, and require that they exist,
are not abstract stubs, read only attributes that building the class assigns or its classes
define (``npudoctor.static.poolclasses`` finds the classes, ``npudoctor.static.source`` follows their construction),
and index every buffer with the request's token slots through a view whose rows are token slots
(``layout``: the pool built on symbols for the decode role, FIA on or off, the model's head dims).
"""

from __future__ import annotations

import ast

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.poolclasses import OFFLOAD_METHODS, no_npu_pool, npu_pool_classes
from npudoctor.static.shapes import Sym, Tensor
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree

from .layout import OffloadEvaluator, addresses_tokens, describe, token_slots

FIA_ENV = "ASCEND_USE_FIA"


def static_probe(
    tree: SourceTree,
    facts: Facts,
    role: RoleFacts,
    roles: tuple[str, ...],
    families: list[str],
    assumptions: tuple[str, ...],
) -> Probe:
    """The verdict over every NPU pool class of ``families`` built for the decode ``role``;
    ``roles`` are the roles that offload."""
    evidence: list[Evidence] = []
    failing: list[str] = []
    misaddressed: list[str] = []
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
            if not any(status is Status.FAIL for status, _ in problems):
                try:
                    problems += _layout_problems(tree, cls, facts, role)
                except Exception as error:  # the evaluator met code it cannot run: cannot tell, never crash
                    problems.append(
                        (
                            Status.WARN,
                            Evidence(
                                expected=f"{cls.name}: buffer views npudoctor can evaluate",
                                observed=f"the static layout evaluation stopped: {type(error).__name__}: {error}",
                                location=Location(cls.relpath, cls.line, cls.name),
                            ),
                        )
                    )
            evidence.extend(e for _, e in problems)
            if not problems:
                evidence.append(_round_trip_ok(tree, cls, facts, role))
            elif any(status is Status.FAIL for status, _ in problems):
                failing.append(cls.name)
                if any("token slots" in e.expected for _, e in problems):
                    misaddressed.append(cls.name)
            else:
                uncertain.append(cls.name)

    if failing:
        status = Status.FAIL
        summary = f"{', '.join(failing)}: CPU offload/reload would " + (
            "copy other elements than the request's tokens, or raise, on the first retraction "
            "(the offload methods index a buffer view whose rows are not token slots)"
            if misaddressed
            else "raise on the first retraction (offload methods read attributes the pool never assigns)"
        )
    elif unrecognised or uncertain:
        status = Status.WARN
        summary = "cannot tell: " + "; ".join(
            (
                [f"no NPU {' or '.join(unrecognised).upper()} pool class found in this tree"]
                if unrecognised
                else []
            )
            + (
                [f"{', '.join(uncertain)}: bases outside sglang, or buffer views npudoctor cannot evaluate"]
                if uncertain
                else []
            )
        )
    else:
        status = Status.PASS
        summary = (
            "the NPU pools' offload methods read only attributes their construction assigns and index "
            "every buffer by token slot"
        )
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


def _round_trip_ok(tree: SourceTree, cls: ClassInfo, facts: Facts, role: RoleFacts) -> Evidence:
    mro = tree.mro(cls)
    resolved = [tree.lookup(mro, name) for name in OFFLOAD_METHODS]
    reads = sorted({a for m in resolved for a in tree.reads(cls, m) if "buffer" in a})
    first = resolved[0]
    return Evidence(
        expected=(
            f"{cls.name} offload methods read only attributes its construction assigns and index each "
            f"buffer through a view whose rows are token slots ({_conditions(facts, role)})"
        ),
        observed=(
            ", ".join(f"{m.qualname} ({m.where()})" for m in resolved)
            + (f" read {', '.join(reads)}, all assigned" if reads else " read no buffer attributes")
            + "; every view they index with the token slots has one token per row"
        ),
        location=Location(first.relpath, first.line, first.qualname),
    )


def layout_params(facts: Facts, role: RoleFacts) -> dict:
    """What the deployment decides about the pool's construction, as the live probe builds it
    (``livepools.build_pool``: the same heads, head dims and defaults without a model); one rank of
    one decode-context-parallel group, the main (not the draft) pool."""
    model = facts.model
    mla = bool(model and model.attention.is_mla)
    heads = 1 if mla else max(1, (model.num_kv_heads if model else 8) // max(1, role.tp_size))
    params: dict = {
        "head_num": Sym.const(heads),
        "head_dim": Sym.const(model.head_dim if model else 128),
        "v_head_dim": Sym.const(model.v_head_dim if model else 128),
        "kv_lora_rank": Sym.const(model.kv_lora_rank if model and model.kv_lora_rank else 512),
        "qk_rope_head_dim": Sym.const(model.qk_rope_head_dim if model and model.qk_rope_head_dim else 64),
        "index_head_dim": Sym.const(model.index_head_dim) if model and model.index_head_dim else None,
        "is_draft_worker": False,
        "dcp_size": Sym.const(1),
    }
    if role.kv_cache_dtype == "auto":
        params["is_quantized_kv_cache"] = False
    return params


def _consequence(view: Tensor, slots: Sym | None) -> str:
    """What torch does with such a view when sglang indexes it with token slots."""
    rows = view.shape[0]
    if slots is not None and rows.is_integral() and (slots / rows).is_integral():
        return (
            f" ({slots / rows} token slots per row: IndexError for a slot past the first rows, "
            "whole wrong rows below)"
        )
    return " (rows straddle tokens: torch refuses the view, RuntimeError, or copies other bytes)"


def _conditions(facts: Facts, role: RoleFacts) -> str:
    model = facts.model
    parts = [f"{role.name}: {FIA_ENV}={'1' if role.use_fia else '0'}"]
    if model and not model.attention.is_mla:
        parts.append(f"head_dim {model.head_dim}, v_head_dim {model.v_head_dim}")
    if model and model.index_head_dim:
        parts.append(f"indexer head dim {model.index_head_dim}")
    return ", ".join(parts)


def _layout_problems(
    tree: SourceTree, cls: ClassInfo, facts: Facts, role: RoleFacts
) -> list[tuple[Status, Evidence]]:
    """Every view the copy methods index with the token slots must have token slots as rows: FAIL
    with the indexing line where one does not, WARN where npudoctor cannot evaluate the view."""
    env = dict(role.env)
    env[FIA_ENV] = "1" if role.use_fia else "0"
    conditions = _conditions(facts, role)
    problems: list[tuple[Status, Evidence]] = []
    for name in OFFLOAD_METHODS:
        evaluator = OffloadEvaluator(tree, cls, env, layout_params(facts, role))
        evaluator.construct()
        method = evaluator.run_copy(name)
        if method is None:
            continue
        accesses = evaluator.accesses
        wrong = [a for a in accesses if isinstance(a.view, Tensor) and not addresses_tokens(a.view)]
        unknown = [a for a in accesses if not isinstance(a.view, Tensor)]
        for access in wrong:
            slots = token_slots(access.view)
            problems.append(
                (
                    Status.FAIL,
                    Evidence(
                        expected=(
                            f"{cls.name}.{name} indexes each buffer with the request's token slots through "
                            f"a view whose rows are token slots ({slots} per layer; {conditions})"
                        ),
                        observed=(
                            f"{method.qualname} ({method.where()}) indexes `{access.text}` ({access.where}) "
                            f"on a view of shape {describe(access.view)}"
                            + (f" (taken at {access.taken_at})" if access.taken_at else "")
                            + ": its rows are "
                            + (
                                f"{access.view.shape[0]}, not the {slots} token slots"
                                if slots
                                else "not token slots"
                            )
                            + _consequence(access.view, slots)
                        ),
                        location=Location(access.method.relpath, access.line, access.method.qualname),
                    ),
                )
            )
        if unknown or not accesses:
            where = unknown[0] if unknown else None
            problems.append(
                (
                    Status.WARN,
                    Evidence(
                        expected=f"{cls.name}.{name}: buffer views npudoctor can evaluate ({conditions})",
                        observed=(
                            f"`{where.text}` ({where.where}) indexes a value npudoctor cannot evaluate"
                            if where
                            else f"{method.qualname} ({method.where()}) indexes no buffer npudoctor can follow"
                        ),
                        location=Location(
                            method.relpath, where.line if where else method.line, method.qualname
                        ),
                    ),
                )
            )
    return problems


def _only_raises_not_implemented(method: FunctionRef) -> bool:
    body = [
        s for s in method.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"
