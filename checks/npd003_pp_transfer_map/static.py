"""NPD003's static probe: find the Ascend KV manager and the ``send_kvcache`` it resolves to, the
pipeline-parallel branch of that method and, for each pool family, the pointer splitter the branch
calls (through the MRO), and judge the splitter by its shape without importing sglang."""

from __future__ import annotations

import ast

from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree

from . import arithmetic
from .arithmetic import CannotEvaluate, Split

_LAYER_COUNT_HINTS = ("total_kv_layers", "hidden_kv_layers", "draft_kv_layers", "num_draft")


def probe(
    tree: SourceTree,
    families: list[str],
    draft_layers: int,
    assumptions: tuple[str, ...],
    roles: tuple[str, ...],
    splits: dict[str, Split] | None = None,
) -> Probe:
    """The static verdict for the pool families in scope, decode having ``draft_layers``; an MHA
    splitter is run on the family's layer arithmetic in ``splits`` (see ``arithmetic``)."""
    manager = _ascend_manager(tree)
    if manager is None:
        return Probe(
            Status.WARN,
            "cannot tell: no Ascend KV manager with send_kvcache found under sglang/srt/disaggregation",
            (
                Evidence(
                    expected="an Ascend KV manager class defining send_kvcache",
                    observed="none found: this release's layout is not one npudoctor recognises",
                ),
            ),
            assumptions,
            roles,
        )
    cls, send = manager
    findings: list[tuple[Status, Evidence]] = []
    for family in families:
        split = (splits or {}).get(family)
        findings.extend(_family_findings(tree, cls, send, family, draft_layers, split))
    worst = max((s for s, _ in findings), key=lambda s: s.severity, default=Status.PASS)
    evidence = tuple(e for _, e in findings)
    if worst is Status.FAIL:
        summary = "PP prefill stages would write KV into other layers' or kinds' buffers on decode"
    elif worst is Status.WARN:
        summary = "cannot tell whether the PP pointer mapping is right: " + "; ".join(
            e.observed.split(":")[0] for s, e in findings if s is Status.WARN
        )
    else:
        summary = "the Ascend PP transfer path slices every buffer group at the stage's start layer"
    return Probe(worst, summary, evidence, assumptions, roles)


def _ascend_manager(tree: SourceTree) -> tuple[ClassInfo, FunctionRef] | None:
    for path in tree.files_containing("send_kvcache", under="srt/disaggregation"):
        if "ascend" not in tree.relpath(path).lower():
            continue
        for cls in tree.classes_in(path):
            send = tree.lookup(tree.mro(cls), "send_kvcache")
            if send is not None and "ascend" in send.relpath.lower():
                return cls, send
    return None


def _family_findings(
    tree, cls, send: FunctionRef, family: str, draft_layers: int, split: Split | None = None
) -> list[tuple[Status, Evidence]]:
    pp_branch = _pp_branch(send)
    if pp_branch is None:
        return [(Status.FAIL, _no_pp_handling(send))]
    calls = _splitter_calls(_family_branch(pp_branch, family))
    if not calls:
        return [(Status.WARN, _unrecognised_pp_branch(send, pp_branch, family))]
    call = calls[0]
    splitter = tree.lookup(tree.mro(cls), call.func.attr)
    call_at = f"{send.relpath}:{call.lineno}"
    if splitter is None:
        return [(Status.WARN, _missing_splitter(cls, send, call, call_at))]
    branch_at = f"{send.relpath}:{pp_branch.lineno}"
    where = _location(send, pp_branch.lineno)
    text = ast.unparse(splitter.node)
    if family == "mla":
        finding = _mla_splitter_finding(tree, splitter, text, branch_at, call_at, where)
    else:
        finding = _mha_splitter_finding(splitter, text, branch_at, where)
        if finding[0] is Status.PASS and split is not None:
            return _mha_arithmetic(tree, splitter, split, call_at)
    return _with_draft_layers(finding, family, splitter, text, draft_layers)


def _pp_branch(send: FunctionRef) -> ast.If | None:
    """The ``if ...pp_size...`` branch of ``send_kvcache``, if any."""
    pp_branches = [
        n for n in ast.walk(send.node) if isinstance(n, ast.If) and "pp_size" in ast.unparse(n.test)
    ]
    # several PP branches (e.g. a hybrid-MLA fast path): the one that slices pointer lists
    return next((b for b in pp_branches if _splitter_calls(b.body)), pp_branches[0] if pp_branches else None)


def _no_pp_handling(send: FunctionRef) -> Evidence:
    return Evidence(
        expected=f"{send.qualname} to map each PP stage's layers onto the decode layers they belong to",
        observed=(
            f"{send.qualname} ({send.where()}) has no pipeline-parallel handling: "
            "the stage's pointer i goes to dst_kv_ptrs[i], i.e. decode layer i - prefill_start_layer"
        ),
        location=_location(send),
    )


def _unrecognised_pp_branch(send: FunctionRef, pp_branch: ast.If, family: str) -> Evidence:
    kind = "MLA" if family == "mla" else "MHA"
    return Evidence(
        expected=f"the PP branch of {send.qualname} to call a pointer splitter for {kind} pools",
        observed=f"unrecognised PP branch at {send.relpath}:{pp_branch.lineno}: no self.*ptrs* call",
        location=_location(send, pp_branch.lineno),
    )


def _missing_splitter(cls: ClassInfo, send: FunctionRef, call: ast.Call, call_at: str) -> Evidence:
    return Evidence(
        expected=f"{cls.name}.{call.func.attr} to exist",
        observed=f"{call.func.attr} (called at {call_at}): not found in the MRO of {cls.name}",
        location=_location(send, call.lineno),
    )


def _mla_splitter_finding(
    tree: SourceTree, splitter: FunctionRef, text: str, branch_at: str, call_at: str, where: Location
) -> tuple[Status, Evidence]:
    """An MLA splitter must slice each buffer group at the stage offset, with the group count
    set by the code that registers the pointer lists."""
    if _returned_arity(splitter) == 5:
        return (
            Status.FAIL,
            Evidence(
                expected="MLA pointer lists [K..., V...(, IK...)] sliced per buffer group at prefill_start_layer",
                observed=(
                    f"pp_size > 1 ({branch_at}) sends MLA pools through the MHA splitter "
                    f"{splitter.qualname} ({splitter.where()}, called at {call_at}), which halves the list "
                    "into K/V and guesses draft layers from layer-count divisibility"
                ),
                location=where,
            ),
        )
    if "kv_buf_groups" not in text:
        return (
            Status.FAIL,
            Evidence(
                expected="MLA pointer lists sliced per buffer group (K, V, indexer K) at prefill_start_layer",
                observed=(
                    f"{splitter.qualname} ({splitter.where()}, called at {call_at}) slices the decode list "
                    "once for all groups: V/indexer pointers of later stages land in other layers"
                ),
                location=_location(splitter),
            ),
        )
    producer = _assignment_site(tree, "kv_buf_groups")
    if producer is None:
        return (
            Status.WARN,
            Evidence(
                expected="kv_args.kv_buf_groups set by the code that registers the pointer lists",
                observed=f"{splitter.qualname} reads kv_buf_groups, but nothing under sglang/srt assigns it (default 1)",
                location=_location(splitter),
            ),
        )
    return (
        Status.PASS,
        Evidence(
            expected="MLA pointer lists sliced per buffer group at prefill_start_layer",
            observed=(
                f"pp_size > 1 ({branch_at}) uses {splitter.qualname} ({splitter.where()}), which "
                f"slices each of kv_buf_groups groups (set at {producer})"
            ),
            location=_location(splitter),
        ),
    )


def _mha_splitter_finding(
    splitter: FunctionRef, text: str, branch_at: str, where: Location
) -> tuple[Status, Evidence]:
    """An MHA splitter must split the list into K and V halves and slice each at the stage offset."""
    expected = "MHA pointer lists split into K and V halves, each sliced at prefill_start_layer"
    if _returned_arity(splitter) == 5 and "prefill_start_layer" in text:
        observed = f"pp_size > 1 ({branch_at}) uses {splitter.qualname} ({splitter.where()})"
        return Status.PASS, Evidence(expected=expected, observed=observed, location=_location(splitter))
    observed = (
        f"pp_size > 1 ({branch_at}) sends MHA pools through {splitter.qualname} "
        f"({splitter.where()}), which does not split K and V"
    )
    return Status.FAIL, Evidence(expected=expected, observed=observed, location=where)


def _mha_arithmetic(
    tree: SourceTree, splitter: FunctionRef, split: Split, call_at: str
) -> list[tuple[Status, Evidence]]:
    """Per prefill stage: the release's MHA splitter run on the deployment's layer split (the
    stage's layers from the release's ``get_pp_indices``); fail where a K/V buffer would land in
    another layer or kind on decode, or ``send_kvcache`` would raise."""
    if split.decode_pp not in (1, split.prefill_pp):
        return [(Status.WARN, Evidence(
            expected="a decode of PP 1 or of the prefill's PP size (the pairings sglang supports)",
            observed=f"cannot tell: decode pp_size {split.decode_pp} with prefill pp_size {split.prefill_pp}",
            location=_location(splitter),
        ))]  # fmt: skip
    try:
        ranges, partition_at = arithmetic.stage_ranges(tree, split)
        outcomes = [
            arithmetic.mha_stage(splitter, split, stage, *layers) for stage, layers in enumerate(ranges)
        ]
    except CannotEvaluate as error:
        return [(Status.WARN, Evidence(
            expected="the MHA splitter's layer arithmetic evaluated for the deployment's PP split",
            observed=f"cannot tell: {error} ({splitter.qualname}, {splitter.where()})",
            location=_location(splitter),
        ))]  # fmt: skip
    draft = f" + {split.draft_layers} draft layer(s)" if split.draft_layers else ""
    decode = "decode PP 1" if split.decode_pp == 1 else f"decode PP {split.decode_pp}"
    findings = []
    for outcome in outcomes:
        stage = f"prefill stage {outcome.stage} (layers {outcome.start}-{outcome.end - 1})"
        expected = (
            f"{stage}: each of its {outcome.buffers} K/V buffers written into the same layer and kind on "
            f"{decode} ({split.num_layers} layers{draft}), one to one"
        )
        line = arithmetic.assignment_line(splitter, outcome, "dst_v_ptrs")
        taken = f"{splitter.relpath}:{line}" if line else splitter.where()
        how = (
            f"{splitter.qualname} ({splitter.where()}, called at {call_at}) on the split from "
            f"get_pp_indices ({partition_at}) of {split.num_layers} layers over PP {split.prefill_pp}; "
            f"V destinations from {taken} (static, evaluated)"
        )
        location = Location(splitter.relpath, line or splitter.line, splitter.qualname)
        if outcome.right:
            observed = f"{stage}: {outcome.buffers} of {outcome.buffers} pairs right; {how}"
            findings.append((Status.PASS, Evidence(expected, observed, location)))
            continue
        problems = []
        if outcome.wrong:
            shown = ", ".join(f"{s} -> {t}" for s, t in outcome.wrong[:4])
            more = ", ..." if len(outcome.wrong) > 4 else ""
            problems.append(f"{len(outcome.wrong)} of {outcome.buffers} pairs wrong: {shown}{more}")
        if outcome.raised:
            problems.append(f"send_kvcache would raise {outcome.raised}")
        elif outcome.unsent:
            problems.append(f"{outcome.unsent} buffer(s) never sent")
        if not problems:
            problems.append("decode buffers written from several stage buffers")
        observed = f"{stage}: {'; '.join(problems)}; {how}"
        findings.append((Status.FAIL, Evidence(expected, observed, location)))
    return findings


def _with_draft_layers(
    finding: tuple[Status, Evidence], family: str, splitter: FunctionRef, text: str, draft_layers: int
) -> list[tuple[Status, Evidence]]:
    """The family's finding, judged again when decode has draft layers the splitter may not
    know of (it reads none of the layer counts the producer sets)."""
    if not draft_layers or any(hint in text for hint in _LAYER_COUNT_HINTS):
        return [finding]
    if family == "mha" and finding[0] is Status.PASS:
        return [(Status.WARN, _guessed_draft_layers(splitter, draft_layers))]
    if family == "mla" and finding[0] is not Status.FAIL:
        return [finding, (Status.FAIL, _shifted_draft_layers(splitter, draft_layers))]
    return [finding]


def _guessed_draft_layers(splitter: FunctionRef, draft_layers: int) -> Evidence:
    """An MHA splitter that knows no layer count infers decode's draft layers from the pointer
    counts (``dst_layers % stage_layers``): right for some PP layer splits, wrong for others
    (an uneven split, e.g. 61 layers as 30 + 31). The arithmetic depends on the split, which
    the static depth does not compute; the live depth runs it."""
    return Evidence(
        expected=f"decode's {draft_layers} draft layer(s) skipped when the MHA K/V halves are sliced",
        observed=(
            f"{splitter.qualname} infers decode's draft layers from layer-count divisibility: it knows "
            f"no layer count ({splitter.where()}), so the slices are right or wrong depending on the "
            "PP layer split, which the static depth does not compute"
        ),
        location=_location(splitter),
    )


def _shifted_draft_layers(splitter: FunctionRef, draft_layers: int) -> Evidence:
    """An MLA splitter that knows no layer count takes decode's from the pointer list length,
    which counts the draft layers too: every group after the first is sliced too late."""
    return Evidence(
        expected=f"decode's {draft_layers} draft layer(s) skipped when slicing per group",
        observed=(
            f"{splitter.qualname} ({splitter.where()}) takes the decode layer count from the "
            "pointer list length, which includes draft layers: later groups shift"
        ),
        location=_location(splitter),
    )


def _location(method: FunctionRef, line: int | None = None) -> Location:
    """``method`` as a location: its definition, or ``line`` inside it."""
    return Location(method.relpath, method.line if line is None else line, method.qualname)


def _splitter_calls(body: list[ast.stmt]) -> list[ast.Call]:
    """``self.*ptrs*(...)`` calls: the pointer splitters (get_mla_kv_ptrs_with_pp and kin)."""
    return [
        c
        for node in body
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id == "self"
        and "ptrs" in c.func.attr
    ]


def _family_branch(pp_branch: ast.If, family: str) -> list[ast.stmt]:
    """The statements of the PP branch that the family runs (split on an ``is_mla...`` test if any)."""
    for node in pp_branch.body:
        if isinstance(node, ast.If) and "mla" in ast.unparse(node.test).lower():
            negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
            return node.body if (family == "mla") != negated else node.orelse
    return pp_branch.body


def _returned_arity(method: FunctionRef) -> int | None:
    for node in ast.walk(method.node):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            return len(node.value.elts)
    return None


def _assignment_site(tree: SourceTree, attribute: str) -> str | None:
    for path in tree.files_containing(f".{attribute} =", under="srt"):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == attribute for t in targets):
                    return f"{tree.relpath(path)}:{node.lineno}"
    return None
