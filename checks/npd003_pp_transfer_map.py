"""NPD003: with pipeline parallelism, every prefill layer's buffers land in the same layer and kind on decode.

A PD prefill stage registers pointer lists grouped by buffer kind: MLA pools
``[K_0..K_n, V_0..V_n(, IK_0..IK_n)]`` (NPU MLA keeps the latent and rope parts, and the
NSA indexer, in separate buffers), MHA pools ``[K..., V...]``. With PP, a stage holds
only its layers while decode (usually PP 1) holds all of them, plus draft layers with
MTP. The Ascend ``send_kvcache`` must therefore slice the decode list per group at the
stage's ``prefill_start_layer``. sglang <= 0.5.11 did not: 0.5.9 had no PP handling at
all (stage pointer ``i`` -> decode pointer ``i``), 0.5.11 sent MLA lists through the MHA
splitter, so prefill stage layers were written into other layers' or other kinds'
buffers and decode silently produced garbage (https://github.com/sgl-project/sglang/pull/23893).

Static probe: find the Ascend KV manager by inheritance, the PP branch of the
``send_kvcache`` it resolves to, and for the deployment's pool family the pointer
splitter that branch calls (through the MRO, incl. ``disaggregation/common``). The
splitter must be group-aware for MLA (slices each buffer group at the stage offset,
with the group count set by the producer), must split K/V halves with the stage offset
for MHA, and must know the decode model's layer count when decode has draft layers.
The live depth runs the real mapping for every stage.
"""

from __future__ import annotations

import ast

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts, RoleFacts
from npudoctor.pools import pool_family
from npudoctor.results import Evidence, Location, Status
from npudoctor.source import ClassInfo, MethodRef, SourceTree
from npudoctor.target import Target

_LAYER_COUNT_HINTS = ("total_kv_layers", "hidden_kv_layers", "draft_kv_layers", "num_draft")


class PipelineTransferMap(Check):
    id = "NPD003"
    title = "PD KV transfer with pipeline parallelism maps every layer to the same layer and kind"
    upstream = ("https://github.com/sgl-project/sglang/pull/23893",)
    fixed_in = "0.5.12"
    why = (
        "With PP on the prefill side, the Ascend transfer must slice the decode pointer list per "
        "buffer group; otherwise prefill stage layers land in the wrong layer or in the V buffer "
        "instead of K, and the model silently produces garbage."
    )
    bites_when = (
        "PD disaggregation with the ascend transfer backend and pp_size > 1 on the prefill (or "
        "decode) role; MLA models in the known releases; decode with extra draft (MTP) layers."
    )
    how_to_fix = (
        "Upgrade sglang, or apply the npudoctor runtime override for NPD003 (group-aware PP pointer slicing)."
    )

    def static(self, target: Target, facts: Facts) -> Probe:
        scope = _scope(facts)
        if isinstance(scope, str):
            return Probe(Status.SKIP, scope)
        families, draft_layers, assumptions, roles = scope
        tree = target.tree
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
            findings.extend(_family_findings(tree, cls, send, family, draft_layers))
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


def _scope(facts: Facts):
    """(families, decode draft layers, assumptions, roles), or the reason the check does not apply."""
    if not facts.described:
        return (
            ["mla", "mha"],
            1,
            (
                "no deployment given: assumed PD with prefill PP 2, decode PP 1 with a draft layer, "
                "the ascend transfer backend, MLA and MHA models",
            ),
            ("prefill (assumed)", "decode (assumed)"),
        )
    pd_roles = [r for r in facts.roles if r.disaggregation_mode in ("prefill", "decode")]
    if not pd_roles:
        return "not a PD disaggregated deployment: no KV cache is transferred"
    if not any(r.pp_size > 1 for r in pd_roles):
        return "no PD role uses pipeline parallelism (pp_size 1): stage pointer lists are the whole model"
    others = {r.transfer_backend for r in pd_roles if r.transfer_backend not in (None, "ascend")}
    if others:
        return f"transfer backend {', '.join(sorted(others))}: NPD003 concerns the ascend transfer engine"
    assumptions: list[str] = []
    if any(r.transfer_backend is None for r in pd_roles):
        assumptions.append("disaggregation_transfer_backend not given: assumed ascend")
    families = ["mla", "mha"]
    if facts.model is None:
        assumptions.append("no model config given: checked MLA and MHA pointer layouts")
    else:
        families = [pool_family(facts.model.attention)]
    decode: RoleFacts | None = facts.role("decode")
    draft = decode.draft_layers if decode else 0
    return families, draft, tuple(assumptions), tuple(r.name for r in pd_roles)


def _ascend_manager(tree: SourceTree) -> tuple[ClassInfo, MethodRef] | None:
    for path in tree.files_containing("send_kvcache", under="srt/disaggregation"):
        if "ascend" not in tree.relpath(path).lower():
            continue
        for cls in tree.classes_in(path):
            send = tree.lookup(tree.mro(cls), "send_kvcache")
            if send is not None and "ascend" in send.relpath.lower():
                return cls, send
    return None


def _family_findings(
    tree, cls, send: MethodRef, family: str, draft_layers: int
) -> list[tuple[Status, Evidence]]:
    kind = "MLA" if family == "mla" else "MHA"
    pp_branches = [
        n for n in ast.walk(send.node) if isinstance(n, ast.If) and "pp_size" in ast.unparse(n.test)
    ]
    # several PP branches (e.g. a hybrid-MLA fast path): the one that slices pointer lists
    pp_branch = next(
        (b for b in pp_branches if _splitter_calls(b.body)), pp_branches[0] if pp_branches else None
    )
    if pp_branch is None:
        return [
            (
                Status.FAIL,
                Evidence(
                    expected=f"{send.qualname} to map each PP stage's layers onto the decode layers they belong to",
                    observed=(
                        f"{send.qualname} ({send.where()}) has no pipeline-parallel handling: "
                        "the stage's pointer i goes to dst_kv_ptrs[i], i.e. decode layer i - prefill_start_layer"
                    ),
                    location=Location(send.relpath, send.line, send.qualname),
                ),
            )
        ]
    calls = _splitter_calls(_family_branch(pp_branch, family))
    if not calls:
        return [
            (
                Status.WARN,
                Evidence(
                    expected=f"the PP branch of {send.qualname} to call a pointer splitter for {kind} pools",
                    observed=f"unrecognised PP branch at {send.relpath}:{pp_branch.lineno}: no self.*ptrs* call",
                    location=Location(send.relpath, pp_branch.lineno, send.qualname),
                ),
            )
        ]
    call = calls[0]
    splitter = tree.lookup(tree.mro(cls), call.func.attr)
    branch_at = f"{send.relpath}:{pp_branch.lineno}"
    call_at = f"{send.relpath}:{call.lineno}"
    if splitter is None:
        return [
            (
                Status.WARN,
                Evidence(
                    expected=f"{cls.name}.{call.func.attr} to exist",
                    observed=f"{call.func.attr} (called at {call_at}): not found in the MRO of {cls.name}",
                    location=Location(send.relpath, call.lineno, send.qualname),
                ),
            )
        ]
    where = Location(send.relpath, pp_branch.lineno, send.qualname)
    returns = _returned_arity(splitter)
    text = ast.unparse(splitter.node)
    findings: list[tuple[Status, Evidence]] = []
    if family == "mla":
        if returns == 5:
            findings.append(
                (
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
            )
        elif "kv_buf_groups" not in text:
            findings.append(
                (
                    Status.FAIL,
                    Evidence(
                        expected="MLA pointer lists sliced per buffer group (K, V, indexer K) at prefill_start_layer",
                        observed=(
                            f"{splitter.qualname} ({splitter.where()}, called at {call_at}) slices the decode list "
                            "once for all groups: V/indexer pointers of later stages land in other layers"
                        ),
                        location=Location(splitter.relpath, splitter.line, splitter.qualname),
                    ),
                )
            )
        else:
            producer = _assignment_site(tree, "kv_buf_groups")
            if producer is None:
                findings.append(
                    (
                        Status.WARN,
                        Evidence(
                            expected="kv_args.kv_buf_groups set by the code that registers the pointer lists",
                            observed=f"{splitter.qualname} reads kv_buf_groups, but nothing under sglang/srt assigns it (default 1)",
                            location=Location(splitter.relpath, splitter.line, splitter.qualname),
                        ),
                    )
                )
            else:
                findings.append(
                    (
                        Status.PASS,
                        Evidence(
                            expected="MLA pointer lists sliced per buffer group at prefill_start_layer",
                            observed=(
                                f"pp_size > 1 ({branch_at}) uses {splitter.qualname} ({splitter.where()}), which "
                                f"slices each of kv_buf_groups groups (set at {producer})"
                            ),
                            location=Location(splitter.relpath, splitter.line, splitter.qualname),
                        ),
                    )
                )
    else:
        if returns == 5 and "prefill_start_layer" in text:
            findings.append(
                (
                    Status.PASS,
                    Evidence(
                        expected="MHA pointer lists split into K and V halves, each sliced at prefill_start_layer",
                        observed=f"pp_size > 1 ({branch_at}) uses {splitter.qualname} ({splitter.where()})",
                        location=Location(splitter.relpath, splitter.line, splitter.qualname),
                    ),
                )
            )
        else:
            findings.append(
                (
                    Status.FAIL,
                    Evidence(
                        expected="MHA pointer lists split into K and V halves, each sliced at prefill_start_layer",
                        observed=(
                            f"pp_size > 1 ({branch_at}) sends MHA pools through {splitter.qualname} "
                            f"({splitter.where()}), which does not split K and V"
                        ),
                        location=where,
                    ),
                )
            )
    counts_layers = any(hint in text for hint in _LAYER_COUNT_HINTS)
    if draft_layers and family == "mla" and findings[-1][0] is not Status.FAIL and not counts_layers:
        findings.append(
            (
                Status.FAIL,
                Evidence(
                    expected=f"decode's {draft_layers} draft layer(s) skipped when slicing per group",
                    observed=(
                        f"{splitter.qualname} ({splitter.where()}) takes the decode layer count from the "
                        "pointer list length, which includes draft layers: later groups shift"
                    ),
                    location=Location(splitter.relpath, splitter.line, splitter.qualname),
                ),
            )
        )
    return findings


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


def _returned_arity(method: MethodRef) -> int | None:
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


CHECK = PipelineTransferMap()
