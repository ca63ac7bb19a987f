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

The property covers, beyond ``do_cp_attn_fia``, every NPU reader of CP metadata on the
prefill path the deployment takes: for its attention family (MHA/GQA with FIA, MLA, MLA with the
DSA/NSA indexer) and the CP strategy it selects (``--cp-strategy`` zigzag/interleave, or the legacy
``--prefill-cp-mode``). The entries are the NPU functions that name a CP metadata field or ask for
the CP strategy (the attention backend's CP functions, the KV all-gather/save helper, the MLA/DSA
CP code, the NPU indexer) and that no other such reader calls; the family of a reader is what its
name says (``do_cp_attn_fia``: MHA/GQA; ``dsa``/``nsa``/``indexer``/``sparse``/``balance``: MLA
with the indexer; DeepSeek-V4's backend only when no model is given), and calls under
``self.use_mla`` tests or under an ``enable_*`` switch the role does not set are not followed.
Reads of the batch's CP metadata are checked against the class the deployment's preparation
builds: the selected strategy's (``ZigzagCPStrategy`` builds ``ZigzagContextParallelMetadata``)
where the model runs CP-v2 (``CP_V2_DEFAULT_MODEL_CLASSES``, ``SGLANG_ENABLE_CP_V2``), else the
model-level ``ContextParallelMetadata``, whatever the batch field's declaration says. A call on the
path into a function that always raises fails too, naming the call and the ``raise``
(``npudoctor.static.walker.AlwaysRaises``: every path through the callee ends in a ``raise`` or in
a call to such a function): a strategy step its class does not implement, or the KV all-gather
0.5.20-0.5.22 left as a stub (``_cp_allgather_and_save_kv_npu`` calls
``layers/utils/cp_utils.cp_all_gather_rerange_kv_cache``, whose body is ``_deprecated_platform_cp()``,
which raises ``ValueError``: the first CP prefill of an MHA/GQA model dies there, before the FIA
attention; 0.5.19 has the real gather, 0.5.23 gathers through the CP strategy's
``materialize_full_kv``; no npudoctor fix). The live probe, which runs that gather, also sees
0.5.16-0.5.19 fail there for a CP-v2 model (Qwen3-MoE): their CP-v2 preparation pads each rank to
a physical length, and the legacy gather splits the padded rows by the logical lengths
(``RuntimeError`` at the first CP prefill whose ranks are not already equal and aligned; a size
mismatch, which the static probe cannot see). Sibling found this way: Qwen3-MoE with ``--cp-strategy interleave`` fails on every release that has the flag
(0.5.14-0.5.23; tests/data/known.yaml ``cp_strategies``): no npudoctor fix, use zigzag. The live
probe runs the FIA (MHA/GQA) CP attention, also for the interleave strategy (rows from the
strategy's own ``shard_hidden_states``); the MLA families are judged from the source (their live
probe says it cannot tell).

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

Live probe (``live.py``), for the same roles as the static one: build the CP
metadata of a batch of two requests of different lengths (one after a cached prefix) with
sglang's own preparation, called as the release calls it (the model's
``prepare_context_parallel_metadata(...)`` call and the ``if`` tests around it, e.g.
``can_cp_split``; the CP strategy's ``prepare_cp_forward``); where the release admits one
request per CP batch (0.5.11/0.5.12 ``can_cp_split``), observe that refusal and use one
request. For each CP rank, run one whole CP prefill attention layer of the installed sglang from
where the backend receives that rank's zigzag share of q, k and v (``AscendAttnBackend.forward``):
the release's own K/V all-gather and save into its NPU KV pool, whose cache holds only the cached
prefixes (garbage where the new tokens go), then ``do_cp_attn_fia``, with the deployment's per-rank
heads, head dims and page size, on CPU (the NPU kernels are npudoctor's CPU references; the
attention-CP all-gather is simulated across the ranks, which run in this process), and compare
every output row with full causal attention computed independently. An exception sglang's own code
raises (a ``raise`` on the path, e.g. 0.5.20-0.5.22's stub all-gather; a read of a field the
metadata does not define) or any wrong row is a ``fail`` with the raising file:line and the calls
that led there, or the first differing request, token and head; what npudoctor cannot set up or
its kernel references and simulated group do not model is a ``warn``.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from npudoctor.deployment.facts import AttentionKind, Facts, RoleFacts, role_facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Evidence, Impact, Location, Status
from npudoctor.static.dataflow import calls_to, enclosing_tests, functions_named
from npudoctor.static.source import FunctionRef, SourceTree
from npudoctor.target.discovery import Target

if TYPE_CHECKING:
    from .static import PathScope

# The probes are imported where they are used: a static check never loads the live probe's own
# code, and an answer from the static-result cache loads neither (the scope reads both).

# The FIA context-parallel attention functions of the NPU backend, found by name.
ENTRY_POINTS = ("do_cp_attn_fia",)


class ContextParallelMetadataFields(Check):
    id = "NPD004"
    kind = CheckKind.DEEP
    title = "NPU FIA context-parallel attention reads only fields its metadata defines"
    upstream = ("https://github.com/sgl-project/sglang/pull/26705",)
    impact = Impact.RUNTIME_CRASH
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
        "apply the npudoctor runtime override for NPD004 where it fits (do_cp_attn_fia splits q at "
        "cp_meta.total_q_prev_tokens and passes the per-request *_list lengths; unsafe): npudoctor fix --apply "
        "--unsafe --select NPD004; for a CP strategy whose path fails (interleave with an MHA/GQA model) "
        "there is no fix: launch with --cp-strategy zigzag"
    )

    def out_of_scope(self, facts: Facts) -> Probe | None:
        _, assumptions, reason = _cp_roles(facts)
        return Probe(Status.SKIP, reason, assumptions=assumptions) if reason else None

    def static(self, target: Target, facts: Facts) -> Probe:
        """Walk the NPU CP prefill path of the deployment's attention family (every NPU reader of CP
        metadata: the FIA CP attention, the KV all-gather/save helper, the MLA/DSA CP code, the NPU
        indexer, and the CP strategy methods they call) and test every metadata read on it."""
        from . import static as static_probe

        scope = _scope(target.tree, facts)
        if isinstance(scope, Probe):
            return scope
        entries, roles, assumptions, path = scope
        found = static_probe.probe(target.tree, entries, roles, assumptions, path)
        if found.status is not Status.FAIL or not path.strategy:
            return found
        # a strategy-specific failure: say which other CP strategy of the release passes, if one does
        for other in static_probe.LEGACY_CP_MODES.values():
            if other == path.strategy:
                continue
            alternative = dataclasses.replace(path, strategy=other)
            if (
                static_probe.probe(target.tree, entries, roles, assumptions, alternative).status
                is Status.PASS
            ):
                return dataclasses.replace(
                    found,
                    summary=f"{found.summary}; with --cp-strategy {other} the same path reads only fields "
                    "its metadata defines",
                )
        return found

    def live_imports(self) -> None:
        from . import live as live_probe

        live_probe.import_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        """Run one whole CP prefill attention layer of the installed sglang on CPU (K/V all-gather and
        save, then the FIA CP attention), on every CP rank, for a batch of several requests with
        metadata from sglang's own preparation, and compare with causal attention."""
        from . import live as live_probe
        from . import static as static_probe

        scope = _scope(target.tree, facts)
        if isinstance(scope, Probe):
            return live_probe.without_entry(scope, ENTRY_POINTS)
        entries, roles, assumptions, path = scope
        fia = [e for e in entries if e.name in ENTRY_POINTS]
        if path.family not in (None, static_probe.MHA) or not fia:
            return _not_modelled_live(path, entries, roles, assumptions)
        live_roles, more = _live_roles(facts, roles)
        assumptions += more
        return live_probe.probe(target.tree, facts.model, fia, live_roles, roles, assumptions)


def _not_modelled_live(
    path: PathScope,
    entries: list[FunctionRef],
    roles: tuple[str, ...],
    assumptions: tuple[str, ...],
) -> Probe:
    """The live probe runs the FIA (MHA/GQA) CP attention; other families' CP paths are judged from
    the source alone (the one-verdict rule then keeps the static verdict)."""
    first = entries[0]
    return Probe(
        Status.WARN,
        f"cannot tell live: npudoctor runs the FIA (MHA/GQA) CP attention on CPU, not the {path.label} "
        "CP path; its metadata reads were checked statically",
        (
            Evidence(
                expected=f"a CPU run of the {path.label} CP prefill path",
                observed=f"not modelled live: {', '.join(e.qualname for e in entries[:6])} read statically only",
                location=Location(first.relpath, first.line, first.qualname),
            ),
        ),
        assumptions,
        roles,
    )


# ----- deployment scope ------------------------------------------------------------------
def _scope(
    tree: SourceTree, facts: Facts
) -> Probe | tuple[list[FunctionRef], tuple[str, ...], tuple[str, ...]]:
    """The entry functions, the roles whose CP path runs them and what had to be assumed; or the
    verdict where no path is run: a skip, or ``_no_entry``'s when the source has no entry function."""
    from . import static as static_probe

    roles, assumptions, reason = _cp_roles(facts)
    if reason:
        return Probe(Status.SKIP, reason, assumptions=assumptions)
    path = _path_scope(facts, roles)
    fia = [f for name in ENTRY_POINTS for f in functions_named(tree, name, under="srt")]
    readers = [r for r in static_probe.npu_readers(tree) if path.runs(r)]
    entries = [*fia, *(r for r in readers if r.name not in ENTRY_POINTS)] if path.runs_fia else readers
    if not entries or (path.family == static_probe.MHA and not fia):
        return _no_entry(tree, roles, assumptions)

    if path.runs_fia:
        gate = _call_conditions(tree)
        roles, more, reason = _apply_conditions(facts, roles, gate)
        assumptions += more
        if reason:
            return Probe(Status.SKIP, reason, assumptions=assumptions)
    return entries, roles, assumptions, path


def _path_scope(facts: Facts, roles: tuple[str, ...]) -> PathScope:
    """The deployment's attention family, CP strategy and server arguments (what the walk follows)."""
    from . import static as static_probe

    model = facts.model if facts.described else None
    family = None
    if model is not None:
        family = {
            AttentionKind.MLA: static_probe.MLA,
            AttentionKind.MLA_INDEXER: static_probe.MLA_INDEXER,
        }.get(model.attention, static_probe.MHA)
    described = [r for r in facts.roles if r.name in roles]
    if not described:
        # the assumed role (ASSUMED_SERVER_ARGS, ASCEND_USE_FIA=1) and, with no model, the family the
        # assumptions name: a non-MLA model, whose CP prefill runs do_cp_attn_fia
        assumed = _assumed_role(facts)
        return static_probe.PathScope(
            family or static_probe.MHA,
            static_probe.cp_strategy_name(assumed),
            {**assumed.server_args, **dict.fromkeys(CP_SWITCHES, True)},
            model.architectures if model is not None else (),
            dict(assumed.env),
        )
    role = described[0]
    server_args = dict(role.server_args)
    # every name a release gives the switch that turns the CP prefill on
    server_args.update(dict.fromkeys(CP_SWITCHES, True))
    return static_probe.PathScope(
        family,
        static_probe.cp_strategy_name(role),
        server_args,
        model.architectures if model is not None else (),
        dict(role.env),
    )


# The names releases give the prefill-CP switch (0.5.10-0.5.19, 0.5.14+, the NSA variant).
CP_SWITCHES = ("enable_prefill_context_parallel", "enable_prefill_cp", "enable_nsa_prefill_context_parallel")


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
    if gate.non_mla is not None and facts.model is None:
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


# The role the live probe assumes with no server args: the smallest real CP prefill (attention TP 1 x CP 2).
ASSUMED_SERVER_ARGS = {
    "disaggregation_mode": "prefill",
    "tp_size": 2,
    "attn_cp_size": 2,
    "enable_prefill_context_parallel": True,
    "prefill_cp_mode": "in-seq-split",
}


def _assumed_role(facts: Facts) -> RoleFacts:
    return role_facts("prefill (assumed)", ASSUMED_SERVER_ARGS, {"ASCEND_USE_FIA": "1"}, facts.model)


def _live_roles(facts: Facts, names: tuple[str, ...]) -> tuple[list[RoleFacts], tuple[str, ...]]:
    """The deployment's roles the static scope kept, or the assumed CP prefill role."""
    from npudoctor.live.forwardpass import attention_dims

    described = [r for r in facts.roles if r.name in names]
    if described:
        return described, ()
    role = role_facts("prefill (assumed)", ASSUMED_SERVER_ARGS, {"ASCEND_USE_FIA": "1"}, facts.model)
    dims = attention_dims(facts.model, role)
    model = (
        ""
        if facts.model
        else f"; no model: {dims.q_heads} q heads / {dims.kv_heads} KV heads x {dims.head_dim}"
    )
    return [role], (
        f"live: ran the assumed prefill role with tp_size {role.tp_size}, attn_cp_size {role.attn_cp_size} "
        f"(in-seq-split), page size {role.page_size}, ASCEND_USE_FIA=1{model}",
    )


def _no_entry(tree: SourceTree, roles: tuple[str, ...], assumptions: tuple[str, ...]) -> Probe:
    """No FIA CP function: either the path predates CP on NPU (pass) or it moved (warn)."""
    from .static import DEFAULT_FIELD

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


CHECK = ContextParallelMetadataFields()
