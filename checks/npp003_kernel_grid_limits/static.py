"""NPP003's static probe: every Triton launch on each role's NPU path, its grid at the role's most
tokens per forward, against Ascend's 65535 (see the check's docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from npudoctor.deployment.facts import Facts, ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.intervals import Env
from npudoctor.static.npupath import RolePath, role_paths
from npudoctor.static.source import SourceTree

from .grids import LIMIT, Grid, Launch, fmt, grid_of, launches, phase, replay
from .tokens import Budget, role_budget


@dataclass
class Finding:
    status: Status
    launch: Launch
    grid: Grid
    tokens: int
    phase: str
    keep_under: int | None = None
    reason: str = ""


def probe(tree: SourceTree, facts: Facts) -> Probe:
    """Judge every role's NPU path (``npupath.role_paths``)."""
    return probe_paths(tree, facts, role_paths(tree, facts))


def probe_paths(tree: SourceTree, facts: Facts, paths: list[RolePath]) -> Probe:
    """Judge the functions of the given role paths."""
    evidence: list[Evidence] = []
    assumptions: list[str] = []
    summaries: list[str] = []
    worst = Status.PASS
    counted = 0
    for path in paths:
        budget = role_budget(tree, path.role, facts.model)
        findings, evaluated = judge_path(tree, path, facts.model, budget)
        counted += evaluated
        assumptions += [f"{path.name}: {note}" for note in budget.notes + path.assumptions]
        for finding in findings:
            evidence.append(_evidence(path, budget, finding))
            if finding.status is Status.FAIL:
                worst = Status.FAIL
            elif worst is Status.PASS:
                worst = Status.WARN
        fails = [f for f in findings if f.status is Status.FAIL]
        warns = [f for f in findings if f.status is Status.WARN]
        if fails:
            first = fails[0]
            summaries.append(
                f"{path.name}: {len(fails)} Triton grid(s) exceed {LIMIT} at {first.tokens} tokens per forward "
                f"({first.launch.kernel.ref.name}, grid {first.grid.text}); "
                f"{budget.flag_for(first.keep_under or 1, first.phase)} keeps it under"
            )
        elif warns:
            summaries.append(
                f"{path.name}: {len(warns)} Triton grid(s) scale with tokens and cannot be evaluated"
            )
        else:
            summaries.append(
                f"{path.name}: every Triton grid on the NPU path stays within {LIMIT} at up to "
                f"{budget.largest} tokens per forward"
            )
    if counted == 0 and worst is Status.PASS:
        assumptions.append("no Triton launch whose grid follows the token count was found on the path")
    return Probe(
        worst,
        "; ".join(summaries),
        tuple(evidence),
        tuple(dict.fromkeys(assumptions)),
        tuple(p.name for p in paths),
    )


def judge_path(
    tree: SourceTree, path: RolePath, model: ModelFacts | None, budget: Budget
) -> tuple[list[Finding], int]:
    """The findings of one role (one per launch site, the worst context kept) and how many launches
    whose grid follows the token count were evaluated."""
    by_site: dict[tuple, Finding] = {}
    evaluated = 0
    seen: set[tuple] = set()
    memo: dict = {}
    for frame in path.frames:
        for launch in launches(frame):
            key = (id(launch.frame.function.node), id(launch.frame.self_cls), id(launch.call))
            key += tuple(id(s.call) for s in launch.steps)
            if key in seen:
                continue
            seen.add(key)
            finding = _judge(tree, path.role, model, budget, launch, memo)
            if finding is None:
                continue
            evaluated += 1
            if finding.status is Status.PASS:
                continue
            entry = launch.steps[0] if launch.steps else None
            site = (launch.function.path, launch.call.lineno, id(entry.call) if entry else None)
            current = by_site.get(site)
            if current is None or _rank(finding) > _rank(current):
                by_site[site] = finding
    return list(by_site.values()), evaluated


def _rank(finding: Finding) -> tuple:
    return (finding.status is Status.FAIL, finding.grid.product.lo)


def environment(
    tree: SourceTree, role: RoleFacts | None, model: ModelFacts | None, tokens: int, memo: dict
) -> Env:
    tp = role.tp_size if role is not None else 1
    dp = role.dp_size if role is not None and role.server_args.get("enable_dp_attention") else 1
    cp = role.attn_cp_size if role is not None else 1
    attn_tp = max(tp // max(dp, 1) // max(cp, 1), 1)
    config = dict(model.hf_config) if model is not None else {}
    env = Env(tree, config, tp, attn_tp, dp, tokens)
    # what does not follow the tokens is kept per tree and deployment numbers, across probes
    shared = tree.memo.setdefault("npp003.values", {}).setdefault(
        (repr(sorted(config.items())), tp, attn_tp, dp), {}
    )
    env.memo["instance"] = shared.setdefault("instance", {})
    env.memo["module"] = shared.setdefault("module", {})
    return env


def _judge(tree, role, model, budget: Budget, launch: Launch, memo: dict) -> Finding | None:
    when = phase(launch)
    tokens = budget.phase_tokens(when)
    if tokens <= 0:
        return None

    def at(count: int) -> Grid | None:
        scope, _why = replay(launch, environment(tree, role, model, count, memo))
        return None if scope is None else grid_of(launch, scope)

    grid = at(tokens)
    if grid is None or not grid.resolved or not grid.product.tok:
        return None
    if grid.product.lo > LIMIT:
        if launch.ambiguous:
            return Finding(Status.WARN, launch, grid, tokens, when, reason=launch.ambiguous)
        return Finding(Status.FAIL, launch, grid, tokens, when, _largest_under(at, tokens))
    # a dimension that follows the tokens but cannot be evaluated (cdiv(x.numel(), BLOCK)): cannot
    # tell; the other dimensions are taken at their lower bound (heads, blocks: at least 1)
    if any(d.tok and d.hi > LIMIT and not d.exact for d in grid.dims) and grid.product.hi > LIMIT:
        return Finding(
            Status.WARN, launch, grid, tokens, when, reason="a dimension that follows the tokens is not known"
        )
    partial = any(not d.exact for d in grid.dims)
    return Finding(Status.PASS, launch, grid, tokens, when, reason="partial" if partial else "")


def _largest_under(at, tokens: int) -> int:
    low, high = 0, tokens  # at(low) fits (no tokens, no rows), at(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        grid = at(middle)
        if grid is not None and grid.resolved and grid.product.lo > LIMIT:
            high = middle
        else:
            low = middle
    return low


def _evidence(path: RolePath, budget: Budget, finding: Finding) -> Evidence:
    launch, grid = finding.launch, finding.grid
    kernel = launch.kernel.ref
    dims = ", ".join(fmt(d) for d in grid.dims)
    chain = [f"{launch.frame.function.qualname} ({launch.frame.function.where()})"]
    chain += [f"{s.callee.qualname} ({s.caller.where(s.call.lineno)})" for s in launch.steps]
    phase_text = {"decode": "decode", "graph": "graph-replayed decode"}.get(
        finding.phase, "prefill or decode"
    )
    expected = (
        f"the product of the grid dimensions of every Triton launch stays <= {LIMIT} (Ascend coreDim is 16 "
        f"bits) for the {finding.tokens} tokens one {phase_text} forward of {path.name} may carry"
    )
    observed = (
        f"{kernel.name} ({kernel.where()}) is launched at {launch.function.where(launch.call.lineno)} with grid "
        f"{grid.text}: ({dims}), product "
        f"{fmt(grid.product)} at {finding.tokens} tokens; reached from {' -> '.join(chain)}"
    )
    if finding.status is Status.FAIL and finding.keep_under is not None:
        observed += (
            f"; it fits up to {finding.keep_under} tokens per forward: "
            f"{budget.flag_for(finding.keep_under, finding.phase)}"
        )
    if finding.reason:
        observed += f"; cannot tell: {finding.reason}"
    if grid.notes:
        observed += f" ({'; '.join(grid.notes)})"
    # where the path enters the Triton code: the first call on the way (the launch itself when the
    # path's function launches it)
    if launch.steps:
        step = launch.steps[0]
        location = Location(step.caller.relpath, step.call.lineno, step.caller.qualname)
    else:
        location = Location(launch.function.relpath, launch.call.lineno, launch.function.qualname)
    return Evidence(expected, observed, location)
