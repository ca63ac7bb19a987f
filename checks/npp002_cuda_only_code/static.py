"""NPP002's static probe: the import closure (``imports``) and the functions (``dispatch``) of each
role's NPU path, judged together."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.npupath import RolePath, role_paths
from npudoctor.static.source import SourceTree

from .dispatch import Reach, cuda_reaches, rope_head_sizes, transfer_to_npu_installed
from .imports import WHY_ABSENT, ImportFailure, Site, import_failures

# Modules every scheduler process imports whatever the deployment (the path's classes run in them)
PROCESS_MODULES = ("sglang.srt.managers.scheduler", "sglang.srt.model_executor.model_runner")


def probe(tree: SourceTree, facts: Facts) -> Probe:
    """Judge every role's path; see the check's docstring for the verdict."""
    paths = role_paths(tree, facts)
    roles = tuple(dict.fromkeys(p.name for p in paths))
    assumptions = sorted({a for p in paths for a in p.assumptions})
    if facts.model is None:
        assumptions.append("no model config given: the model's own modules were not followed")
    failures: dict[tuple[str, int], Evidence] = {}
    doubts: dict[tuple[str, int], tuple[Evidence, tuple[str, ...]]] = {}
    modules = 0
    sizes = rope_head_sizes(facts.model)

    def record(key: tuple[str, int], evidence: Evidence, conditions: tuple[str, ...]) -> None:
        if not conditions:
            failures.setdefault(key, evidence)
        else:
            doubts.setdefault(key, (evidence, conditions))

    for path in paths:
        visited: set[Path] = set()
        closure = import_failures(tree, import_roots(tree, path), visited)
        modules = max(modules, len(tree.memo.get("npp002.edges", {})))
        for failure in closure:
            key = (tree.relpath(failure.site.path), failure.site.line)
            record(key, _import_evidence(tree, failure, path), failure.conditions)
        seen = {(f.site.path, f.site.line) for f in closure}
        for reach in cuda_reaches(tree, path.frames, sizes):
            if reach.kind == "lazy":
                for failure in _lazy_failures(tree, reach, seen, visited):
                    key = (tree.relpath(failure.site.path), failure.site.line)
                    record(key, _import_evidence(tree, failure, path), failure.conditions)
            else:
                record((reach.function.relpath, reach.line), _reach_evidence(reach, path), reach.conditions)
    if not transfer_to_npu_installed(tree):
        assumptions.append(
            "this tree's model_runner does not install torch_npu's transfer_to_npu on NPU: every "
            'torch.cuda call, "cuda" device and nccl process group on the path is judged unmapped'
        )
    doubts = {k: v for k, v in doubts.items() if k not in failures}
    # behind a test of the model's head size, with no model given: the deployment would settle it
    unsettled = {
        k: e for k, (e, c) in doubts.items() if facts.model is None and any(map(_HEAD_SIZE.search, c))
    }
    others = [e for k, (e, _) in doubts.items() if k not in unsettled]
    if others:
        examples = "; ".join(
            f"{e.location} ({e.observed.partition('; only when ')[2] or 'conditional'})" for e in others[:3]
        )
        assumptions.append(
            f"not judged: {len(others)} CUDA-only import(s) or call(s) on the path run only under a condition "
            f"the source cannot settle (a feature the deployment would have to enable), e.g. {examples}"
        )
    if failures:
        evidence = tuple(failures.values())
        first = evidence[0]
        return Probe(
            Status.FAIL,
            f"{len(evidence)} CUDA-only import(s) or call(s) run on the NPU path, first: {first.location}: "
            f"{first.observed.split(';')[0]}",
            evidence,
            tuple(assumptions),
            roles,
        )
    if unsettled:
        evidence = tuple(unsettled.values())
        return Probe(
            Status.WARN,
            f"{len(evidence)} CUDA-only import(s) on the NPU path depend on the model's head size, and no model "
            f"config was given: run with the deployment's config.json; first: {evidence[0].location}",
            evidence,
            tuple(assumptions),
            roles,
        )
    functions = len({id(f.function.node) for p in paths for f in p.frames})
    return Probe(
        Status.PASS,
        f"no CUDA-only import in the {modules} module(s) the NPU path imports, and no CUDA-only call in "
        f"its {functions} function(s) that runs whatever the data",
        (),
        tuple(assumptions),
        roles,
    )


_HEAD_SIZE = re.compile(r"\b(head_size|head_dim|rotary_head_size)\b")


def import_roots(tree: SourceTree, path: RolePath) -> list[Path]:
    """The modules the role surely imports: those of the classes its path starts from (the model's
    first: sglang's model registry imports it; the attention backend, pools, allocator, graph
    runner) and the scheduler process's own (``PROCESS_MODULES``). Every other module of the path
    is imported by these at their top level (their closure) or by a function on the path (an
    ``import`` inside it: ``_lazy_failures``, under that function's conditions)."""
    roots: dict[Path, None] = {}
    for cls in path.roots:
        roots.setdefault(cls.path, None)
    for name in PROCESS_MODULES:
        module = tree.module_path(name)
        if module is not None:
            roots.setdefault(module, None)
    return list(roots)


def _lazy_failures(
    tree: SourceTree, reach: Reach, seen: set[tuple[Path, int]], visited: set[Path]
) -> list[ImportFailure]:
    """What importing the sglang module ``reach.what`` from inside a function on the path (a
    function-level import) runs into beyond the modules the role's closure has judged (``visited``),
    with the import's conditions and the function on the chain."""
    module = tree.module_path(reach.what)
    if module is None or module in visited:
        return []
    step = Site(reach.function.path, reach.line, f"(in {reach.function.qualname})")
    found = []
    for failure in import_failures(tree, [module], visited):
        if (failure.site.path, failure.site.line) in seen:
            continue
        seen.add((failure.site.path, failure.site.line))
        chain = (step, *failure.chain)
        found.append(replace(failure, chain=chain, conditions=(*reach.conditions, *failure.conditions)))
    return found


def _import_evidence(tree: SourceTree, failure: ImportFailure, path: RolePath) -> Evidence:
    site = failure.site
    where = tree.relpath(site.path)
    if not failure.package:
        return Evidence(
            expected="nothing at module level that an Ascend host runs needs a CUDA device",
            observed=(
                f"`{site.text}` runs at import of {where} on an Ascend host (no CUDA device): it raises there; "
                f"import chain: {_chain(tree, failure.chain, site)}"
            ),
            location=Location(where, site.line, "<module>"),
        )
    root = tree.module_name(next((s.path for s in failure.chain if not s.line and not s.text), failure.root))
    model = (
        " (the model registry then skips the module: the architecture is not supported)"
        if (".models." in root)
        else ""
    )
    if failure.conditions:
        model += (
            "; only when "
            + " and ".join(f"`{c}`" for c in failure.conditions)
            + " (not known from the source)"
        )
    return Evidence(
        expected=f"importing {root} ({path.name}) on an Ascend host imports only packages it has",
        observed=(
            f"`{site.text}` at module level, not guarded for NPU and in no try that catches ImportError: "
            f"{failure.package} is missing on an Ascend host ({WHY_ABSENT[failure.package]}), so importing "
            f"{root} raises ModuleNotFoundError{model}; import chain: {_chain(tree, failure.chain, site)}"
        ),
        location=Location(where, site.line, "<module>"),
    )


def _reach_evidence(reach: Reach, path: RolePath) -> Evidence:
    function = reach.function
    if reach.kind == "import":
        observed = (
            f"`{reach.what}` in {function.qualname}: {reach.package} is missing on an Ascend host "
            f"({WHY_ABSENT[reach.package]}): ModuleNotFoundError when it runs"
        )
        expected = f"{function.qualname}, on {path.name}'s NPU path, imports only packages an Ascend host has"
    elif reach.kind == "torch.cuda":
        observed = f"`{reach.what}` in {function.qualname}: torch.npu has no such function; it needs CUDA"
        expected = f"{function.qualname}, on {path.name}'s NPU path, calls no CUDA-only torch.cuda function"
    elif reach.kind == "nccl":
        observed = (
            f"`{reach.what}` in {function.qualname}: an NCCL process group, which an Ascend host cannot build"
        )
        expected = f"{function.qualname}, on {path.name}'s NPU path, builds process groups with the NPU backend (hccl)"
    else:
        observed = f"`{reach.what}` in {function.qualname}: a CUDA device handed to torch"
        expected = f"{function.qualname}, on {path.name}'s NPU path, puts tensors on the NPU"
    if reach.conditions:
        observed += (
            "; only when " + " and ".join(f"`{c}`" for c in reach.conditions) + " (not known from the source)"
        )
    return Evidence(
        expected=expected,
        observed=observed,
        location=Location(function.relpath, reach.line, function.qualname),
    )


def _chain(tree: SourceTree, chain: tuple[Site, ...], site: Site) -> str:
    steps = []
    for step in chain:
        where = tree.relpath(step.path)
        if step.line:
            text = step.text
            steps.append(f"{where}:{step.line}" + (f" {text}" if text.startswith("(in ") else ""))
        elif step.text == "(package)":
            steps.append(f"{where} (its package)")
        else:
            steps.append(where)
    steps.append(f"{tree.relpath(site.path)}:{site.line}")
    return " -> ".join(steps)
