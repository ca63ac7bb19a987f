"""NPD004: the NPU FIA context-parallel attention path reads only fields its CP metadata defines,
and splits a batch of several requests correctly.

Why it matters: a prefill server with context parallelism (``--attn-cp-size`` > 1,
``--enable-prefill-context-parallel``) on Ascend with ``ASCEND_USE_FIA=1`` runs the
attention of non-MLA models (Qwen3, Qwen3-MoE, Llama) through
``AscendAttnBackend.do_cp_attn_fia``. That function reads the per-batch CP layout from
``forward_batch.attn_cp_metadata``. When upstream made ``ContextParallelMetadata`` describe a
batch of several requests (per-request ``*_list`` fields, ``total_q_prev_tokens``, ``bs``), it
removed the scalar fields ``actual_seq_q_prev``/``actual_seq_q_next``/``kv_len_prev``/
``kv_len_next`` that ``do_cp_attn_fia`` read, and ``do_cp_attn_fia`` still split q with
``torch.chunk(q, 2)``, a midpoint split that is only right for one request. The first CP
prefill raised ``AttributeError``; past that, two requests in a batch would get wrong
attention. The fix splits q at ``cp_meta.total_q_prev_tokens`` and passes
``np.cumsum(cp_meta.actual_seq_q_*_list).tolist()`` / ``kv_len_*_list``
(https://github.com/sgl-project/sglang/pull/26705). The metadata change and the fix landed in
the same release (0.5.13), so no release on PyPI ships the defect; a source checkout or an
image built from the main branch between the two pull requests does.

Static probe (the property, not the diff), ``ast`` over the target's files only:

1. Find the FIA CP attention functions by name (``do_cp_attn_fia``, wherever they live), and
   the ``if`` tests around each call to them: in every release that has one, the only caller is
   ``forward_extend`` under ``if not self.use_mla`` / ``if is_cp_mode`` / ``if self.use_fia``
   (``self.use_fia`` is ``ASCEND_USE_FIA``; without it, CP on that path raises
   NotImplementedError). These tests, read from the installed code, decide which roles the
   check applies to.
2. Find every CP metadata class: classes named ``*ContextParallelMetadata`` and their
   subclasses, anywhere in the tree, and the fields that hold one (class-body annotations such
   as ``ForwardBatch.attn_cp_metadata: Optional[ContextParallelMetadata]``). The classes that
   can reach a field are its declared type and that type's subclasses.
3. Walk the path from each entry: the function itself, the methods it calls on ``self``, the
   functions it calls by name, and methods called on objects whose type the code declares
   (``cp_strategy = get_cp_strategy()`` -> ``ContextParallelStrategy`` and its subclasses'
   ``run_attention``), following every call that passes the batch or the metadata. In each
   function, a metadata value is ``<x>.attn_cp_metadata``, ``getattr(<x>, "attn_cp_metadata")``,
   a local alias of one (``cp_meta = forward_batch.attn_cp_metadata``), a parameter a caller
   passed one to, or a parameter annotated with a metadata class. Inside a CP strategy class,
   the metadata is the class that strategy builds.
4. Every attribute read on a metadata value must be defined by a class that can reach it
   (dataclass fields and class variables over the MRO, methods and properties, ``self``
   attributes its methods assign). ``getattr`` with a default and ``hasattr``-guarded names
   are not required reads.
5. A fixed split of the query (``torch.chunk(q, 2)``, ``q.chunk(2)``, ``tensor_split``,
   ``q[: q.shape[0] // 2]``) on the path fails when the metadata describes several requests
   (a ``bs`` field or per-request length lists ``*len*_list``/``*seq*_list``) and no admission
   gate (``can_cp_split``) limits CP batches to one request.

A release with no FIA CP path passes, saying so. A CP path whose metadata classes cannot be
found, or whose calls cannot be followed, is a ``warn``, never a silent pass.

Live probe (``npudoctor.livecp``), for the same roles as the static one: build the CP
metadata of a batch of two requests of different lengths (one after a cached prefix) with
sglang's own preparation, called as the release calls it (the model's
``prepare_context_parallel_metadata(...)`` call and the ``if`` tests around it, e.g.
``can_cp_split``; the CP strategy's ``prepare_cp_forward``); where the release admits one
request per CP batch (0.5.11/0.5.12 ``can_cp_split``), observe that refusal and use one
request. For each CP rank, run the installed ``do_cp_attn_fia`` on that rank's zigzag share
of q against a paged KV cache holding every request's full sequence, with the deployment's
per-rank heads, head dims and page size, on CPU (the FIA kernel is npudoctor's CPU
reference), and compare every output row with full causal attention computed
independently. A read of a field the metadata does not define (``AttributeError`` on the
metadata) or any wrong row is a ``fail`` with the first differing request, token and head;
what npudoctor cannot set up or the kernel reference does not model is a ``warn``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
import sys
from dataclasses import dataclass, field

from npudoctor import livecp
from npudoctor.check import Check, Probe
from npudoctor.dataflow import (
    FunctionRef,
    aliases,
    annotation_classes,
    annotation_names,
    bind_arguments,
    calls_to,
    enclosing_tests,
    functions_named,
    imported_module,
    instance_attributes,
    is_external_name,
    lookup,
    module_function,
    name_classes,
    nested_function,
    resolve_class,
    return_classes,
    self_attribute_classes,
    subclasses,
)
from npudoctor.facts import Facts, RoleFacts, role_facts
from npudoctor.results import Evidence, Location, Status
from npudoctor.source import ClassInfo, SourceTree
from npudoctor.target import Target

# The FIA context-parallel attention functions of the NPU backend, found by name.
ENTRY_POINTS = ("do_cp_attn_fia",)
# CP metadata classes are found by this name suffix, then by inheritance.
METADATA_SUFFIX = "ContextParallelMetadata"
# The batch field that holds the CP metadata; used as-is when no declaration is found.
DEFAULT_FIELD = "attn_cp_metadata"
# CP admission gates that may limit a CP batch to one request.
BATCH_GATES = ("can_cp_split",)
# Fields that make the metadata describe several requests: a batch size, per-request length lists.
PER_REQUEST_FIELD = re.compile(r"^(bs|batch_size)$|^\w*(len|seq)\w*_list$")
QUERY_PARAMETERS = ("q", "query")
SPLIT_FUNCTIONS = ("chunk", "tensor_split")
MAX_DEPTH = 6  # calls followed from an entry
MAX_FUNCTIONS = 96  # functions visited per entry

_SUFFIX = METADATA_SUFFIX.encode()
# Cheap byte filters before parsing: a file that declares a metadata class, or a field typed with one.
_DECLARES_METADATA_CLASS = re.compile(rb"class\s+\w*" + _SUFFIX + rb"\b|class\s+\w+\s*\([^)]*" + _SUFFIX)
_DECLARES_METADATA_FIELD = re.compile(rb"^[ \t]+\w+[ \t]*:[^\n=]*" + _SUFFIX, re.M)

Classes = tuple[ClassInfo, ...]


class ContextParallelMetadataFields(Check):
    id = "NPD004"
    title = "NPU FIA context-parallel attention reads only fields its metadata defines"
    upstream = ("https://github.com/sgl-project/sglang/pull/26705",)
    fixed_in = "0.5.13"
    why = (
        "The FIA context-parallel prefill path (do_cp_attn_fia) read scalar fields that were removed "
        "from ContextParallelMetadata when it learned to describe several requests, and split q with "
        "torch.chunk(q, 2): AttributeError at the first CP prefill, and wrong attention for a batch of "
        "more than one request once that is fixed."
    )
    bites_when = (
        "A prefill (or colocated) server on Ascend with context parallelism (--attn-cp-size > 1, "
        "--enable-prefill-context-parallel) and ASCEND_USE_FIA=1, serving a non-MLA model (MHA/GQA: "
        "Qwen3, Qwen3-MoE, Llama): AscendAttnBackend.forward_extend calls do_cp_attn_fia only under "
        "`if not self.use_mla`, `if is_cp_mode` and `if self.use_fia` (without FIA, CP on that path "
        "raises NotImplementedError). The midpoint split bites with two or more requests in a CP batch."
    )
    how_to_fix = (
        "Use sglang 0.5.13 or later (do_cp_attn_fia splits q at cp_meta.total_q_prev_tokens and passes "
        "the per-request *_list lengths), or apply the npudoctor runtime override for NPD004."
    )

    def static(self, target: Target, facts: Facts) -> Probe:
        """Walk the FIA CP attention path of the target's source and test every metadata read."""
        roles, assumptions, reason = _cp_roles(facts)
        if reason:
            return Probe(Status.SKIP, reason, assumptions=assumptions)
        tree = target.tree
        entries = [f for name in ENTRY_POINTS for f in functions_named(tree, name, under="srt")]
        if not entries:
            return _no_entry(tree, roles, assumptions)

        gate = _call_conditions(tree)
        roles, more, reason = _apply_conditions(facts, roles, gate)
        assumptions += more
        if reason:
            return Probe(Status.SKIP, reason, assumptions=assumptions)

        metadata = MetadataModel.find(tree)
        if not metadata.classes:
            first = entries[0]
            return Probe(
                Status.WARN,
                f"cannot tell: {first.qualname} exists but no CP metadata class was found in this tree",
                (
                    Evidence(
                        expected=f"a class named *{METADATA_SUFFIX} (or a subclass of one) that "
                        f"{first.qualname} reads its CP layout from",
                        observed="none found under sglang/: this release's layout is not one npudoctor recognises",
                        location=Location(first.relpath, first.line, first.qualname),
                    ),
                ),
                assumptions,
                roles,
            )

        evidence: list[Evidence] = []
        statuses: list[Status] = []
        for entry in entries:
            walk = PathWalk(tree, metadata)
            walk.run(entry)
            status, found = _judge(tree, metadata, entry, walk)
            statuses.append(status)
            evidence.extend(found)
        evidence.extend(metadata.notes)

        if Status.FAIL in statuses:
            status = Status.FAIL
            missing = sorted({_field_of(e) for e in evidence if _field_of(e)})
            parts = []
            if missing:
                parts.append(
                    f"reads CP metadata fields no metadata class that reaches it defines ({', '.join(missing)}): "
                    "AttributeError at the first CP prefill"
                )
            if any(e.expected.startswith(_SPLIT_EXPECTED) for e in evidence):
                parts.append("splits q at a fixed midpoint: wrong attention for a batch of several requests")
            summary = "the FIA context-parallel attention path " + "; ".join(parts)
        elif Status.WARN in statuses:
            status = Status.WARN
            summary = "cannot tell whether the FIA context-parallel path reads only defined metadata fields"
        else:
            status = Status.PASS
            summary = (
                "the FIA context-parallel attention path reads only fields its CP metadata classes define"
            )
        return Probe(status, summary, tuple(evidence), assumptions, roles)

    def live_imports(self) -> None:
        livecp.import_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        """Run the installed FIA CP attention on CPU, on every CP rank, for a batch of several
        requests with metadata from sglang's own preparation, and compare with causal attention."""
        roles, assumptions, reason = _cp_roles(facts)
        if reason:
            return Probe(Status.SKIP, reason, assumptions=assumptions)
        tree = target.tree
        entries = [f for name in ENTRY_POINTS for f in functions_named(tree, name, under="srt")]
        if not entries:
            return _live_without_entry(tree, roles, assumptions)
        roles, more, reason = _apply_conditions(facts, roles, _call_conditions(tree))
        assumptions += more
        if reason:
            return Probe(Status.SKIP, reason, assumptions=assumptions)
        live_roles, more = _live_roles(facts, roles)
        assumptions += more
        preparations = livecp.find_preparations(tree, facts.model)
        if not preparations:
            return Probe(
                Status.WARN,
                "cannot tell live: no CP metadata preparation of this release was found",
                (
                    Evidence(
                        expected=f"sglang's CP metadata preparation ({livecp.MODEL_PREPARATION} called from "
                        f"the model, or {livecp.STRATEGY_PREPARATION}) to build a batch's metadata",
                        observed="none found under sglang/srt for this model: nothing to run the CP path with",
                    ),
                ),
                assumptions,
                roles,
            )
        verdicts: list[LiveVerdict] = []
        for role in live_roles:
            dims = livecp.attention_dims(facts.model, role)
            for entry in entries:
                try:
                    backend, function = livecp.backend_method(entry)
                except (livecp.CannotProbe, ImportError) as reason:
                    verdicts.append(LiveVerdict(Status.WARN, _cannot_run(entry, str(reason))))
                    continue
                for preparation in preparations:
                    run = livecp.run_preparation(backend, entry.name, preparation, role, dims)
                    verdicts.append(_judge_live(run, role, dims, entry, function))
        return _live_probe(verdicts, entries[0], assumptions, roles)


# ----- deployment scope ------------------------------------------------------------------
def _cp_roles(facts: Facts) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """Roles that run a CP prefill, what had to be assumed, and a skip reason if there are none."""
    if not facts.described:
        return (
            ("prefill (assumed)",),
            (
                "no deployment given: assumed a prefill server with context parallelism "
                "(attn_cp_size > 1), ASCEND_USE_FIA=1 and a non-MLA model, the conditions under "
                "which do_cp_attn_fia runs",
            ),
            "",
        )
    if not facts.roles:
        return (
            ("prefill (assumed)",),
            ("no server args given: assumed a prefill server with context parallelism and ASCEND_USE_FIA=1",),
            "",
        )
    roles = tuple(
        r.name for r in facts.roles if r.uses_context_parallel and r.disaggregation_mode != "decode"
    )
    if roles:
        return roles, (), ""
    decode_cp = [r.name for r in facts.roles if r.uses_context_parallel]
    reason = (
        "no prefill-side role uses context parallelism (attn_cp_size > 1 or "
        "enable_prefill_context_parallel): the CP attention path runs only in a CP extend (prefill)"
    )
    if decode_cp:
        reason += f"; {', '.join(decode_cp)} is a decode server, which runs no CP prefill"
    return (), (), reason


@dataclass
class CallConditions:
    """What the ``if`` tests around the calls to the entry functions require."""

    callers: list[str] = field(default_factory=list)
    fia: Location | None = None  # every call is under a positive ``use_fia`` test
    non_mla: Location | None = None  # every call is under ``not self.use_mla``
    non_fia_raises: bool = False  # the else branch of the FIA test raises NotImplementedError


def _call_conditions(tree: SourceTree) -> CallConditions:
    found = CallConditions()
    fia, non_mla = [], []
    calls = [c for name in ENTRY_POINTS for c in calls_to(tree, name, under="srt")]
    for caller, call in calls:
        found.callers.append(f"{caller.qualname} ({caller.where(call.lineno)})")
        tests = enclosing_tests(caller.node, call)
        fia_test = mla_test = None
        for node, taken in tests:
            text = ast.unparse(node.test)
            negated = text.startswith("not ")
            if "use_fia" in text and taken != negated:
                fia_test = node
                orelse = node.orelse if taken else node.body
                found.non_fia_raises |= any(
                    isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s) for s in orelse
                )
            if "use_mla" in text and taken == negated:
                mla_test = node
        fia.append(Location(caller.relpath, fia_test.lineno, caller.qualname) if fia_test else None)
        non_mla.append(Location(caller.relpath, mla_test.lineno, caller.qualname) if mla_test else None)
    if calls and all(fia):
        found.fia = fia[0]
    if calls and all(non_mla):
        found.non_mla = non_mla[0]
    return found


def _apply_conditions(
    facts: Facts, roles: tuple[str, ...], gate: CallConditions
) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    assumptions: list[str] = []
    if not gate.callers:
        assumptions.append(
            f"no call to {'/'.join(ENTRY_POINTS)} found: applied only the context-parallel condition"
        )
    if not facts.described:
        return roles, tuple(assumptions), ""
    if gate.non_mla is not None:
        if facts.model is not None and facts.model.attention.is_mla:
            return (
                (),
                tuple(assumptions),
                f"the model uses MLA ({facts.model.attention.value}): the Ascend backend calls "
                f"{ENTRY_POINTS[0]} only for non-MLA models (`not self.use_mla` at {gate.non_mla.path}:"
                f"{gate.non_mla.line}); MLA CP prefill takes another path",
            )
        if facts.model is None:
            assumptions.append(
                f"no model config given: assumed a non-MLA model, the only kind {ENTRY_POINTS[0]} serves"
            )
    if gate.fia is not None and facts.roles:
        with_fia = tuple(r.name for r in facts.roles if r.name in roles and r.use_fia)
        if not with_fia:
            raises = (
                "; without FIA the Ascend backend raises NotImplementedError for CP attention instead "
                "(a limitation, not this defect)"
                if gate.non_fia_raises
                else ""
            )
            return (
                (),
                tuple(assumptions),
                f"{', '.join(roles)} uses context parallelism without ASCEND_USE_FIA=1: {ENTRY_POINTS[0]} "
                f"is called only under `self.use_fia` ({gate.fia.path}:{gate.fia.line}){raises}",
            )
        roles = with_fia
    return roles, tuple(assumptions), ""


# ----- live probe -------------------------------------------------------------------------
# The role assumed with no server args: the smallest real CP prefill (attention TP 1 x CP 2).
ASSUMED_SERVER_ARGS = {
    "disaggregation_mode": "prefill",
    "tp_size": 2,
    "attn_cp_size": 2,
    "enable_prefill_context_parallel": True,
    "prefill_cp_mode": "in-seq-split",
}


@dataclass(frozen=True)
class LiveVerdict:
    """One (role, entry, preparation) run judged: its status, its evidence, a summary part."""

    status: Status
    evidence: Evidence
    summary: str = ""
    ran: bool = False  # the CP path ran for a batch (pass or fail), not only set-up trouble


def _live_roles(facts: Facts, names: tuple[str, ...]) -> tuple[list[RoleFacts], tuple[str, ...]]:
    """The deployment's roles the static scope kept, or the assumed CP prefill role."""
    described = [r for r in facts.roles if r.name in names]
    if described:
        return described, ()
    role = role_facts("prefill (assumed)", ASSUMED_SERVER_ARGS, {"ASCEND_USE_FIA": "1"}, facts.model)
    dims = livecp.attention_dims(facts.model, role)
    model = (
        ""
        if facts.model
        else f"; no model: {dims.q_heads} q heads / {dims.kv_heads} KV heads x {dims.head_dim}"
    )
    return [role], (
        f"live: ran the assumed prefill role with tp_size {role.tp_size}, attn_cp_size {role.attn_cp_size} "
        f"(in-seq-split), page size {role.page_size}, ASCEND_USE_FIA=1{model}",
    )


def _live_without_entry(tree: SourceTree, roles: tuple[str, ...], assumptions: tuple[str, ...]) -> Probe:
    """No FIA CP function in the source: confirm on the imported NPU backend classes."""
    probe = _no_entry(tree, roles, assumptions)
    if probe.status is not Status.PASS:
        return probe
    loaded = [
        cls
        for name, module in list(sys.modules.items())
        if name.startswith("sglang.") and "npu" in name
        for cls in vars(module).values()
        if isinstance(cls, type) and cls.__module__ == name and "Backend" in cls.__name__
    ]
    having = [c for c in loaded if any(hasattr(c, e) for e in ENTRY_POINTS)]
    if having:
        return Probe(
            Status.WARN,
            f"static and live see different code: {having[0].__name__} has {'/'.join(ENTRY_POINTS)} once imported",
            probe.evidence,
            assumptions,
            roles,
        )
    names = ", ".join(sorted({c.__name__ for c in loaded})) or "none"
    observed = (
        probe.evidence[0].observed + f"; live: the imported NPU backend classes ({names}) have none either"
    )
    return Probe(
        Status.PASS,
        probe.summary,
        (dataclasses.replace(probe.evidence[0], observed=observed),),
        assumptions,
        roles,
    )


def _cannot_run(entry: FunctionRef, reason: str, location: Location | None = None) -> Evidence:
    return Evidence(
        expected=f"to run the installed {entry.qualname} on CPU",
        observed=f"could not (live): {reason}",
        location=location or Location(entry.relpath, entry.line, entry.qualname),
    )


def _batch_text(run: livecp.PreparationRun, dims: livecp.AttentionDims) -> str:
    ranks = ", ".join(str(r) for r in range(dims.cp_size))
    return f"batch of {livecp.describe(run.batch)}, CP ranks {ranks} of {dims.cp_size}, {dims}"


def _refusal_text(run: livecp.PreparationRun) -> str:
    if not run.refused_several:
        return ""
    gates = "; ".join(f"`{c.text}` ({c.location.path}:{c.location.line})" for c in run.refused_several)
    return (
        f". {gates} refused a batch of {len(livecp.SEVERAL)} requests (live): this release admits one "
        f"request per CP batch, so the batch probed is one request"
    )


def _judge_live(
    run: livecp.PreparationRun,
    role: RoleFacts,
    dims: livecp.AttentionDims,
    entry: FunctionRef,
    function: object,
) -> LiveVerdict:
    """A run's ranks -> pass (every row right), fail (a wrong row or a defect exception) or warn."""
    preparation = run.preparation
    if run.not_reached:
        gates = "; ".join(f"`{c.text}` ({c.location.path}:{c.location.line})" for c in run.not_reached)
        return LiveVerdict(
            Status.SKIP,
            Evidence(
                expected=f"{preparation} to build CP metadata for role {role.name}",
                observed=f"not used for this role (live): {gates} is false even for one request",
                location=preparation.location,
            ),
        )
    where = f"role {role.name}, metadata from {preparation}, {_batch_text(run, dims)}"
    failed = [r for r in run.ranks if r.mismatch is not None or r.failure is not None]
    if not failed:
        worst = max(r.max_error for r in run.ranks)
        rows = sum(r.rows for r in run.ranks)
        return LiveVerdict(
            Status.PASS,
            Evidence(
                expected=f"{entry.qualname} gives every request, zigzag block and head the output of full causal "
                f"attention over the request's whole sequence (max abs error <= {livecp.TOLERANCE:g}; float32 "
                "inputs, float64 reference)",
                observed=f"live, CPU: {where}: every output row of every rank matches; max abs error {worst:.1e} "
                f"over {rows} rows" + _refusal_text(run),
                location=livecp.code_location(function),
            ),
            f"batch of {len(run.batch)} request{'s' if len(run.batch) > 1 else ''}"
            + (", the most the release admits per CP batch" if run.refused_several else "")
            + f", max abs error {worst:.1e}",
            ran=True,
        )
    first = failed[0]
    also = [r.rank for r in failed[1:]]
    also_text = f"; {'rank' if len(also) == 1 else 'ranks'} {', '.join(map(str, also))} too" if also else ""
    if first.mismatch is not None:
        return _mismatch_verdict(run, first, entry, function, where, also_text)
    failure = first.failure
    defect = failure.stage == "attention" and (
        failure.on_metadata or failure.kind not in ("AttributeError", "NotImplementedError", "CannotProbe")
    )
    if not defect:
        return LiveVerdict(
            Status.WARN,
            _cannot_run(
                entry,
                f"{failure} during the {failure.stage} (CP rank {first.rank}; {where}){also_text}",
                failure.location,
            ),
            f"cannot tell: {failure.kind} during the {failure.stage}",
        )
    what = (
        f"reads only fields the CP metadata built by {preparation.name} defines"
        if failure.on_metadata
        else "runs for this batch"
    )
    return LiveVerdict(
        Status.FAIL,
        Evidence(
            expected=f"{entry.qualname} {what}",
            observed=f"{failure} (live, CPU, CP rank {first.rank}; {where}){also_text}",
            location=failure.location,
        ),
        f"{failure.kind}: {failure.message}",
        ran=True,
    )


def _mismatch_verdict(
    run: livecp.PreparationRun,
    rank: livecp.RankResult,
    entry: FunctionRef,
    function: object,
    where: str,
    also_text: str,
) -> LiveVerdict:
    m = rank.mismatch
    request = run.batch[m.request]
    return LiveVerdict(
        Status.FAIL,
        Evidence(
            expected=f"request {m.request} ({request}) on CP rank {rank.rank}, zigzag block {m.block}, token at "
            f"position {m.position}, head {m.head}: {m.expected:.6f}, as full causal attention gives",
            observed=f"{entry.qualname} gave {m.got:.6f} (live, CPU); {m.wrong_rows} of {m.rows} rows of that "
            f"rank differ by more than {livecp.TOLERANCE:g} (max abs error {rank.max_error:.3g}); {where}"
            + also_text
            + _refusal_text(run),
            location=livecp.code_location(function),
        ),
        f"wrong attention for request {m.request} on CP rank {rank.rank} (max abs error {rank.max_error:.3g})",
        ran=True,
    )


def _live_probe(
    verdicts: list[LiveVerdict], entry: FunctionRef, assumptions: tuple[str, ...], roles: tuple[str, ...]
) -> Probe:
    evidence = tuple(v.evidence for v in verdicts)
    statuses = {v.status for v in verdicts}
    if Status.FAIL in statuses:
        parts = list(dict.fromkeys(v.summary for v in verdicts if v.status is Status.FAIL))
        return Probe(
            Status.FAIL,
            f"live: the FIA context-parallel attention path fails for a CP batch: {'; '.join(parts)}",
            evidence,
            assumptions,
            roles,
        )
    if Status.WARN in statuses or not any(v.ran for v in verdicts):
        parts = [v.summary for v in verdicts if v.status is Status.WARN] or [
            "no CP metadata preparation admitted a batch for this deployment"
        ]
        return Probe(
            Status.WARN, f"cannot tell live: {'; '.join(dict.fromkeys(parts))}", evidence, assumptions, roles
        )
    parts = list(dict.fromkeys(v.summary for v in verdicts if v.status is Status.PASS))
    return Probe(
        Status.PASS,
        f"live: {entry.qualname} computes full causal attention on every CP rank ({'; '.join(parts)})",
        evidence,
        assumptions,
        roles,
    )


def _no_entry(tree: SourceTree, roles: tuple[str, ...], assumptions: tuple[str, ...]) -> Probe:
    """No FIA CP function: either the path predates CP on NPU (pass) or it moved (warn)."""
    npu_cp = [
        path
        for path in tree.files_containing(DEFAULT_FIELD, under="srt")
        if any(part in tree.relpath(path).lower() for part in ("npu", "ascend"))
    ]
    if npu_cp:
        where = ", ".join(tree.relpath(p) for p in npu_cp[:3])
        return Probe(
            Status.WARN,
            f"cannot tell: the NPU code handles CP metadata but has no {'/'.join(ENTRY_POINTS)}",
            (
                Evidence(
                    expected=f"the FIA context-parallel attention function ({'/'.join(ENTRY_POINTS)}) in the NPU backend",
                    observed=f"not found, while {where} read{'s' if len(npu_cp) == 1 else ''} {DEFAULT_FIELD}: "
                    "this release's layout is not one npudoctor recognises",
                    location=Location(tree.relpath(npu_cp[0]), 1),
                ),
            ),
            assumptions,
            roles,
        )
    return Probe(
        Status.PASS,
        "this release has no FIA context-parallel attention path: nothing can read missing CP metadata",
        (
            Evidence(
                expected=f"{'/'.join(ENTRY_POINTS)} to read only fields its CP metadata defines",
                observed=f"no {'/'.join(ENTRY_POINTS)} in this release, and no NPU/Ascend file reads "
                f"{DEFAULT_FIELD}: the code path does not exist",
            ),
        ),
        assumptions,
        roles,
    )


# ----- metadata classes ------------------------------------------------------------------
@dataclass
class MetadataModel:
    """The CP metadata classes of a tree and the fields that can hold them."""

    tree: SourceTree
    classes: list[ClassInfo]
    fields: dict[str, Classes]  # field name -> classes that can be stored in it
    declarations: dict[str, list[str]]  # field name -> "Owner.field (path:line)"
    owners: set[str]  # snake_case names of the classes declaring the fields (forward_batch)
    notes: list[Evidence] = field(default_factory=list)

    @classmethod
    def find(cls, tree: SourceTree) -> MetadataModel:
        files = tree.files_containing(METADATA_SUFFIX)
        named = [
            klass
            for path in files
            if _DECLARES_METADATA_CLASS.search(tree.read(path))
            for klass in tree.classes_in(path)
            if klass.name.endswith(METADATA_SUFFIX)
        ]
        classes = list(named)
        for klass in named:
            classes.extend(c for c in subclasses(tree, klass) if c not in classes)
        model = cls(tree, classes, {}, {}, set())
        if not classes:
            return model
        names = {c.name for c in classes}
        for path in files:
            if not _DECLARES_METADATA_FIELD.search(tree.read(path)):
                continue
            for owner in tree.classes_in(path):
                for stmt in owner.node.body:
                    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                        continue
                    mentioned = [n.rpartition(".")[2] for n in annotation_names(stmt.annotation)]
                    if not any(n.endswith(METADATA_SUFFIX) or n in names for n in mentioned):
                        continue
                    declared = [c for c in annotation_classes(tree, path, stmt.annotation) if c in classes]
                    if not declared:
                        continue
                    name = stmt.target.id
                    reach = list(model.fields.get(name, ()))
                    for klass in declared:
                        reach.extend(c for c in (klass, *subclasses(tree, klass)) if c not in reach)
                    model.fields[name] = tuple(reach)
                    model.declarations.setdefault(name, []).append(
                        f"{owner.name}.{name}: {ast.unparse(stmt.annotation)} ({tree.relpath(path)}:{stmt.lineno})"
                    )
                    model.owners.add(_snake(owner.name))
        if DEFAULT_FIELD not in model.fields:
            model.fields[DEFAULT_FIELD] = tuple(classes)
            model.notes.append(
                Evidence(
                    expected=f"a declared type for the batch field {DEFAULT_FIELD}",
                    observed=f"no class-body annotation of {DEFAULT_FIELD} naming a CP metadata class: "
                    f"checked its reads against every CP metadata class in the tree "
                    f"({', '.join(c.name for c in classes)})",
                )
            )
        if not model.owners:
            model.owners.add("forward_batch")
        return model

    def attributes(self, klass: ClassInfo) -> set[str]:
        return instance_attributes(self.tree, klass)

    def defines(self, classes: Classes, name: str) -> bool:
        return any(name in self.attributes(c) for c in classes)

    def per_request_fields(self, classes: Classes) -> list[str]:
        names: set[str] = set()
        for klass in classes:
            names |= {n for n in self.attributes(klass) if PER_REQUEST_FIELD.match(n)}
        return sorted(names)


# ----- the path walk ---------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    function: FunctionRef
    line: int
    text: str  # e.g. "cp_meta.kv_len_prev"
    attr: str
    classes: Classes


@dataclass(frozen=True)
class Split:
    function: FunctionRef
    line: int
    text: str


@dataclass
class PathWalk:
    """The functions on one entry's CP path and what they do with the metadata and the query."""

    tree: SourceTree
    metadata: MetadataModel
    functions: list[FunctionRef] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    splits: list[Split] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)
    delegations: list[str] = field(default_factory=list)

    def run(self, entry: FunctionRef) -> None:
        stack: list[tuple[FunctionRef, ClassInfo | None, dict[str, Classes], frozenset[str], int]] = [
            (entry, entry.owner, {}, frozenset(), 0)
        ]
        seen: set[tuple] = set()
        while stack and len(self.functions) < MAX_FUNCTIONS:
            ref, self_cls, seeds, carriers, depth = stack.pop()
            key = (id(ref.node), id(self_cls), tuple(sorted(seeds)), carriers)
            if key in seen:
                continue
            seen.add(key)
            self.functions.append(ref)
            for callee, callee_self, callee_seeds, callee_carriers in self._visit(
                ref, self_cls, seeds, carriers
            ):
                if depth < MAX_DEPTH:
                    stack.append((callee, callee_self, callee_seeds, callee_carriers, depth + 1))

    def _visit(
        self,
        ref: FunctionRef,
        self_cls: ClassInfo | None,
        seeds: dict[str, Classes],
        carriers: frozenset[str],
    ):
        tree, metadata = self.tree, self.metadata
        narrowed = self._built_by(self_cls)
        params = ref.parameters
        seeds = dict(seeds)
        for param in params:
            declared = tuple(
                c for c in annotation_classes(tree, ref.path, param.annotation) if c in metadata.classes
            )
            if declared and param.arg not in seeds:
                seeds[param.arg] = tuple({c: None for k in declared for c in (k, *subclasses(tree, k))})
        carriers = set(carriers) | {
            p.arg
            for p in params
            if p.arg in metadata.owners
            or any(_snake(n.rpartition(".")[2]) in metadata.owners for n in annotation_names(p.annotation))
        }

        def narrow(classes: Classes) -> Classes:
            if narrowed:
                kept = tuple(c for c in classes if c in narrowed)
                if kept:
                    return kept
            return classes

        def value_of(expr: ast.expr, known: dict[str, object]) -> Classes | None:
            if isinstance(expr, ast.Attribute) and expr.attr in metadata.fields:
                return narrow(metadata.fields[expr.attr])
            if isinstance(expr, ast.Name) and expr.id in known:
                return known[expr.id]  # type: ignore[return-value]
            if (
                isinstance(expr, ast.Call)
                and isinstance(expr.func, ast.Name)
                and expr.func.id == "getattr"
                and len(expr.args) >= 2
                and isinstance(expr.args[1], ast.Constant)
                and expr.args[1].value in metadata.fields
            ):
                return narrow(metadata.fields[expr.args[1].value])
            return None

        known = aliases(ref.node, seeds, value_of)
        guarded: set[str] = set()
        for node in ast.walk(ref.node):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and value_of(node.args[0], known) is not None
            ):
                if node.func.id == "hasattr" or len(node.args) > 2:
                    guarded.add(node.args[1].value)
                else:
                    self.reads.append(
                        Read(
                            ref,
                            node.lineno,
                            ast.unparse(node),
                            node.args[1].value,
                            value_of(node.args[0], known),
                        )
                    )
        for node in ast.walk(ref.node):
            if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
                held = value_of(node.value, known)
                if held is None:
                    continue
                if isinstance(node.ctx, ast.Load):
                    if node.attr not in guarded:
                        self.reads.append(Read(ref, node.lineno, ast.unparse(node), node.attr, held))
                else:
                    self.stored.add(node.attr)
        self.splits.extend(_query_splits(ref))

        for node in ast.walk(ref.node):
            if not isinstance(node, ast.Call):
                continue
            passed = [
                a
                for a in [*node.args, *(k.value for k in node.keywords)]
                if value_of(a, known) is not None or (isinstance(a, ast.Name) and a.id in carriers)
            ]
            if not passed:
                continue
            targets = self._resolve(ref, self_cls, node)
            if targets is None:
                self.unresolved.append(f"{ast.unparse(node.func)}(...) at {ref.where(node.lineno)}")
                continue
            for callee, callee_self, bound_receiver in targets:
                if callee.owner is not None and callee.owner is not ref.owner:
                    self.delegations.append(f"{ast.unparse(node.func)} -> {callee}")
                binding = bind_arguments(callee, node, bound_receiver)
                callee_seeds = {}
                callee_carriers = set()
                for param, arg in binding.items():
                    held = value_of(arg, known)
                    if held is not None:
                        callee_seeds[param] = held
                    elif isinstance(arg, ast.Name) and arg.id in carriers:
                        callee_carriers.add(param)
                yield callee, callee_self, callee_seeds, frozenset(callee_carriers)

    def _built_by(self, self_cls: ClassInfo | None) -> set[ClassInfo]:
        """The metadata classes a strategy class builds (any method of its MRO that returns one)."""
        if self_cls is None:
            return set()
        tree, names = self.tree, {c.name for c in self.metadata.classes}
        built: set[ClassInfo] = set()
        for name in sorted({m for klass in tree.mro(self_cls) for m in klass.methods}):
            method = lookup(tree, self_cls, name)
            returned = annotation_names(method.node.returns) + [
                ast.unparse(n.value.func)
                for n in ast.walk(method.node)
                if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)
            ]
            if not any(r.rpartition(".")[2] in names for r in returned):
                continue
            for klass in return_classes(method):
                if klass in self.metadata.classes:
                    built |= {klass, *subclasses(tree, klass)}
        return built

    def _resolve(self, ref: FunctionRef, self_cls: ClassInfo | None, call: ast.Call):
        """Functions ``call`` may run, as [(function, its self class, receiver bound)]; [] for code
        outside the tree (torch, numpy, builtins, loggers) and constructors; None when it cannot
        be told."""
        tree, func = self.tree, call.func
        if isinstance(func, ast.Name):
            scope = ref
            while scope is not None:  # a closure defined in this function or an enclosing one
                inner = nested_function(scope, func.id)
                if inner is not None:
                    return [(inner, self_cls, False)]
                scope = scope.outer
            found = module_function(tree, ref.path, func.id)
            if found is not None:
                return [(found, None, False)]
            if (
                is_external_name(tree, ref.path, func.id)
                or resolve_class(tree, ref.path, func.id) is not None
            ):
                return []
            return None
        if not isinstance(func, ast.Attribute):
            return None
        receiver, method = func.value, func.attr
        if _is_name(receiver, "self") and self_cls is not None:
            found = lookup(tree, self_cls, method)
            return None if found is None else [(found, self_cls, True)]
        if (
            isinstance(receiver, ast.Call)
            and _is_name(receiver.func, "super")
            and self_cls is not None
            and ref.owner is not None
        ):
            found = lookup(tree, self_cls, method, after=ref.owner)
            return None if found is None else [(found, self_cls, True)]
        root = receiver
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id != "self" and is_external_name(tree, ref.path, root.id):
            return []
        if isinstance(receiver, ast.Name):
            module = imported_module(tree, ref.path, receiver.id)
            if module is not None:
                found = module_function(tree, module, method)
                return None if found is None else [(found, None, False)]
            classes = name_classes(ref, receiver.id)
        elif (
            isinstance(receiver, ast.Attribute) and _is_name(receiver.value, "self") and self_cls is not None
        ):
            classes = self_attribute_classes(tree, self_cls, receiver.attr)
        else:
            classes = []
        targets = []
        for klass in classes:  # virtual dispatch: the declared class and every subclass in the tree
            for impl in (klass, *subclasses(tree, klass)):
                found = lookup(tree, impl, method)
                if found is not None:
                    targets.append((found, impl, True))
        return targets or None


def _query_splits(ref: FunctionRef) -> list[Split]:
    """Fixed-count splits of the query: ``torch.chunk(q, 2)``, ``q.chunk(2)``, ``q[: q.shape[0] // 2]``."""
    query = {p.arg for p in ref.parameters if p.arg in QUERY_PARAMETERS}
    if not query:
        return []

    def mentions(expr: ast.AST, names: set[str]) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))

    known = aliases(
        ref.node,
        dict.fromkeys(query, True),
        lambda e, k: (
            True if isinstance(e, (ast.Call, ast.Attribute, ast.Subscript)) and mentions(e, set(k)) else None
        ),
    )
    names = set(known)
    found = []
    for node in ast.walk(ref.node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SPLIT_FUNCTIONS
        ):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id in names:  # q.chunk(2)
                count = node.args[0] if node.args else _keyword(node, "chunks", "sections")
            elif (
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in names
            ):  # torch.chunk(q, 2)
                count = node.args[1] if len(node.args) > 1 else _keyword(node, "chunks", "sections")
            else:
                continue
            if isinstance(count, ast.Constant) and isinstance(count.value, int) and count.value >= 2:
                found.append(Split(ref, node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in names
            and isinstance(node.slice, ast.Slice)
        ):
            for bound in (node.slice.lower, node.slice.upper):
                if (
                    isinstance(bound, ast.BinOp)
                    and isinstance(bound.op, ast.FloorDiv)
                    and isinstance(bound.right, ast.Constant)
                    and bound.right.value == 2
                    and mentions(bound.left, names)
                ):
                    found.append(Split(ref, node.lineno, ast.unparse(node)))
    return found


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _keyword(call: ast.Call, *names: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg in names), None)


# ----- verdict ---------------------------------------------------------------------------
_SPLIT_EXPECTED = "q split per request"


def _judge(
    tree: SourceTree, metadata: MetadataModel, entry: FunctionRef, walk: PathWalk
) -> tuple[Status, list[Evidence]]:
    """Status and evidence for one entry's path: FAIL for reads no reaching class defines and for
    a midpoint split of a multi-request batch, WARN where the path could not be fully analysed."""
    evidence: list[Evidence] = []
    failed = uncertain = False
    sites: set[tuple] = set()
    for read in walk.reads:
        site = (read.attr, read.function.path, read.line)
        if site in sites or read.attr in walk.stored or metadata.defines(read.classes, read.attr):
            continue
        sites.add(site)
        external = sorted({b for c in read.classes for b in tree.external_bases(c)})
        at = Location(read.function.relpath, read.line, read.function.qualname)
        if external:
            uncertain = True
            evidence.append(
                Evidence(
                    expected=f"`{read.attr}` defined by {', '.join(c.name for c in read.classes)}",
                    observed=f"{read.function.qualname} reads {read.text} at {read.function.where(read.line)}; "
                    f"those classes do not define it, but they derive from bases outside sglang "
                    f"({', '.join(external)}) that may",
                    location=at,
                )
            )
            continue
        failed = True
        via = "" if read.function is entry else f" (on the CP path of {entry.qualname})"
        evidence.append(
            Evidence(
                expected=f"`{read.attr}` defined by the CP metadata class that reaches {read.function.qualname}: "
                + ", ".join(str(c) for c in read.classes),
                observed=f"{read.function.qualname}{via} reads {read.text} at {read.function.where(read.line)}, "
                f"but no CP metadata class that can reach it defines `{read.attr}`"
                f"{_similar(metadata, read)}: AttributeError at the first CP prefill",
                location=at,
            )
        )

    reaching = tuple({c: None for r in walk.reads for c in r.classes}) or metadata.fields.get(
        DEFAULT_FIELD, ()
    )
    per_request = metadata.per_request_fields(reaching)
    gate, gate_function = _batch_of_one_gate(tree)
    if per_request and gate is None:
        admits = (
            f"{gate_function.qualname} ({gate_function.where()}) does not limit a CP batch to one request"
            if gate_function is not None
            else "no CP admission gate limits a batch to one request"
        )
        for split in walk.splits:
            failed = True
            evidence.append(
                Evidence(
                    expected=f"{_SPLIT_EXPECTED}: the metadata describes several requests "
                    f"({', '.join(per_request)} on {', '.join(c.name for c in reaching)}), so the boundary "
                    "between q's prev and next halves is the sum of the per-request prev lengths",
                    observed=f"{split.function.qualname} splits q with {split.text} at "
                    f"{split.function.where(split.line)}: a fixed midpoint split, right only for a batch of "
                    f"one request; {admits}",
                    location=Location(split.function.relpath, split.line, split.function.qualname),
                )
            )

    if walk.unresolved:
        uncertain = True
        evidence.append(
            Evidence(
                expected="every call on the CP path that passes the batch or the CP metadata to be followed",
                observed=f"{entry.qualname}'s CP path passes them to "
                + "; ".join(walk.unresolved[:4])
                + ", which npudoctor cannot resolve: what runs there was not checked",
                location=Location(entry.relpath, entry.line, entry.qualname),
            )
        )
    if failed:
        return Status.FAIL, evidence
    if uncertain:
        return Status.WARN, evidence
    return Status.PASS, [_pass_evidence(entry, walk, per_request, gate)]


def _similar(metadata: MetadataModel, read: Read) -> str:
    defined = sorted(set().union(*(metadata.attributes(c) for c in read.classes)))
    near = [n for n in defined if n.startswith(read.attr)] or difflib.get_close_matches(
        read.attr, defined, n=4
    )
    return f" (it has {', '.join(near)})" if near else ""


def _pass_evidence(
    entry: FunctionRef, walk: PathWalk, per_request: list[str], gate: Location | None
) -> Evidence:
    by_function: dict[int, tuple[FunctionRef, dict[str, Read]]] = {id(entry.node): (entry, {})}
    for read in walk.reads:
        _, reads = by_function.setdefault(id(read.function.node), (read.function, {}))
        reads.setdefault(read.text, read)
    parts = []
    for function, reads in by_function.values():
        if reads:
            listed = ", ".join(f"{r.text} ({function.relpath}:{r.line})" for r in reads.values())
            parts.append(f"{function} reads {listed}")
        elif function is entry:
            parts.append(f"{entry} reads no CP metadata field itself")
    delegations = list(dict.fromkeys(walk.delegations))
    if delegations:
        parts.insert(1, f"it calls {'; '.join(delegations[:4])}")
    observed = "; ".join(parts)
    classes = tuple({c: None for r in walk.reads for c in r.classes})
    if classes:
        observed += f"; all defined by {', '.join(str(c) for c in classes)}"
    for split in walk.splits:
        why = (
            f"{gate.symbol} ({gate.path}:{gate.line}) admits only CP batches of one request"
            if gate is not None
            else "the metadata carries no per-request lengths: one request per CP batch"
        )
        observed += f". {split.text} at {split.function.where(split.line)} splits q at its midpoint, right here: {why}"
    if not walk.splits and per_request:
        observed += (
            f". No fixed split of q on the path; the metadata carries per-request {', '.join(per_request)}"
        )
    return Evidence(
        expected=f"every field {entry.qualname}'s CP path reads is defined by the CP metadata class that reaches it",
        observed=observed,
        location=Location(entry.relpath, entry.line, entry.qualname),
    )


def _batch_of_one_gate(tree: SourceTree) -> tuple[Location | None, FunctionRef | None]:
    """Where a CP admission gate requires a batch of exactly one request (if one does), and the gate."""
    gates = [f for name in BATCH_GATES for f in functions_named(tree, name, under="srt")]
    for function in gates:
        for node in ast.walk(function.node):
            if (
                isinstance(node, ast.Compare)
                and len(node.ops) == 1
                and isinstance(node.ops[0], ast.Eq)
                and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value == 1
                and re.search(r"shape\[0\]|len\(|\bbs\b|batch_size", ast.unparse(node.left))
            ):
                return Location(function.relpath, node.lineno, function.qualname), function
    return None, (gates[0] if gates else None)


def _field_of(evidence: Evidence) -> str | None:
    match = re.match(r"`(\w+)` defined by the CP metadata class", evidence.expected)
    return match.group(1) if match else None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


CHECK = ContextParallelMetadataFields()
