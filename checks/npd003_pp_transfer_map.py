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
An MHA splitter that infers decode's draft layers from layer-count divisibility is right
for some stage splits and wrong for others: the static depth cannot tell, the live one can.

Live probe (``npudoctor.livetransfer``): for every prefill PP stage of the deployment,
with the stage's layers from sglang's own ``get_pp_indices``, build the real NPU pools
of both roles on CPU (the stage's layers; decode's whole model plus its draft layers),
assemble ``kv_args`` as ``_init_kv_manager`` does (with the installed
``setup_state_kv_args`` where the release has it), call the installed Ascend manager's
``send_kvcache`` for one request with a recording transfer engine, decode every recorded
(source, destination) address back to (layer, kind) and require a bijection of the
stage's buffers onto the same global layer and kind on decode.
"""

from __future__ import annotations

import ast
import gc
from dataclasses import dataclass, field

from npudoctor import livepools, livetransfer
from npudoctor.check import Check, Probe
from npudoctor.facts import AttentionKind, Facts, ModelFacts, RoleFacts
from npudoctor.livecode import code_location, exception_evidence, raising_location
from npudoctor.pools import pool_family
from npudoctor.results import Evidence, Location, Status
from npudoctor.source import ClassInfo, MethodRef, SourceTree
from npudoctor.target import Target

_LAYER_COUNT_HINTS = ("total_kv_layers", "hidden_kv_layers", "draft_kv_layers", "num_draft")
_SHOWN_PAIRS = 4  # wrong pairs quoted per stage

# With no model given, the live probe builds models of DeepSeek-V3.2's depth: 61 layers split
# unevenly by PP 2 (30 + 31), the split under which pointer arithmetic that assumes equal
# stages goes wrong. One KV head per rank for MHA: the mapping does not depend on heads.
_ASSUMED_MODELS = {
    "mla": ModelFacts(
        source="assumed (MLA with the NSA indexer, DeepSeek-V3.2 dimensions)",
        model_type=None,
        architectures=(),
        attention=AttentionKind.MLA_INDEXER,
        num_layers=61,
        num_heads=128,
        num_kv_heads=128,
        head_dim=192,
        v_head_dim=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        index_head_dim=128,
        index_n_heads=64,
        nextn_layers=1,
    ),
    "mha": ModelFacts(
        source="assumed (GQA, 61 layers, 1 KV head per rank)",
        model_type=None,
        architectures=(),
        attention=AttentionKind.GQA,
        num_layers=61,
        num_heads=8,
        num_kv_heads=1,
        head_dim=128,
        v_head_dim=128,
    ),
}


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

    def live_imports(self) -> None:
        livepools.import_pool_modules()
        livetransfer.import_transfer_modules()

    def live(self, target: Target, facts: Facts) -> Probe:
        """Run the installed ``send_kvcache`` for every prefill stage and check every pair."""
        scope = _scope(facts)
        if isinstance(scope, str):
            return Probe(Status.SKIP, scope)
        families, draft_layers, assumptions, roles = scope
        prefill, decode, role_notes = _live_roles(facts, draft_layers)
        if decode.pp_size not in (1, prefill.pp_size):
            return Probe(
                Status.WARN,
                f"cannot tell: decode pp_size {decode.pp_size} with prefill pp_size {prefill.pp_size} "
                "(sglang pairs a prefill stage with a decode of PP 1 or of the same PP size)",
                assumptions=assumptions,
                roles=roles,
            )
        outcomes = []
        notes = list(role_notes)
        for family in families:
            model = facts.model or _ASSUMED_MODELS[family]
            if prefill.pp_size > model.num_layers:  # the deployment's own model is checked on input
                return Probe(
                    Status.WARN,
                    f"cannot tell: prefill pp_size {prefill.pp_size} exceeds the {model.num_layers} layers of "
                    f"the {model.source} model assumed without a model config: give the deployment's config.json",
                    assumptions=assumptions,
                    roles=roles,
                )
            if facts.model is None:
                notes.append(f"live: {family.upper()} model {model.source}")
            outcomes.append(_live_family(family, model, prefill, decode))
        findings = [f for outcome in outcomes for f in outcome.findings]
        worst = max((s for s, _ in findings), key=lambda s: s.severity, default=Status.WARN)
        notes += [n for outcome in outcomes for n in outcome.notes]
        evidence = tuple(e for _, e in findings)
        return Probe(worst, _live_summary(worst, outcomes), evidence, assumptions + tuple(notes), roles)

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
    prefill, decode = facts.role("prefill"), facts.role("decode")
    if prefill is not None and prefill.pp_size == 1:
        return (
            "prefill pp_size 1: the prefill sends whole-model pointer lists; NPD003 concerns PP on "
            "the prefill side (send_kvcache's PP branch runs only there)"
        )
    if (
        prefill is not None
        and decode is not None
        and decode.pp_size == prefill.pp_size
        and not decode.draft_layers
    ):
        return (
            f"decode pp_size equals prefill pp_size ({prefill.pp_size}) without draft layers: each prefill "
            "stage sends to the decode stage that holds the same layers, pointer list for pointer list"
        )
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


def _live_roles(facts: Facts, draft_layers: int) -> tuple[RoleFacts, RoleFacts, list[str]]:
    """The prefill and decode roles to probe; a side the deployment does not describe is assumed
    as the static scope assumes it (prefill PP 2; decode PP 1, with the scope's draft layers)."""
    notes = []
    prefill = facts.role("prefill")
    if prefill is None:
        prefill = RoleFacts(name="prefill (assumed)", disaggregation_mode="prefill", pp_size=2)
        if facts.described:
            notes.append("live: no prefill role given: assumed prefill PP 2")
    decode = facts.role("decode")
    if decode is None:
        decode = RoleFacts(name="decode (assumed)", disaggregation_mode="decode", draft_layers=draft_layers)
        if facts.described:
            notes.append("live: no decode role given: assumed decode PP 1")
    return prefill, decode, notes


@dataclass
class _FamilyOutcome:
    """One pool family's live findings (one per prefill stage), notes and one-line summary."""

    findings: list[tuple[Status, Evidence]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    crashes: list[str] = field(default_factory=list)  # sglang's PD bootstrap exceptions, by type


def _live_family(family: str, model: ModelFacts, prefill: RoleFacts, decode: RoleFacts) -> _FamilyOutcome:
    kind = family.upper()
    cls = livetransfer.pool_class(family)
    if cls is None:
        evidence = Evidence(
            expected=f"an NPU {kind} KV pool class in sglang",
            observed="none is loaded from this release: its layout is not one npudoctor recognises",
        )
        return _FamilyOutcome([(Status.WARN, evidence)], summary=f"{kind}: no NPU pool class")
    kv_args_class, manager_class = livetransfer.kv_classes()
    ranges, split_at = livepools.in_role(
        prefill, lambda: livetransfer.stage_ranges(model.num_layers, prefill.pp_size)
    )
    stages = ", ".join(f"{start}-{end - 1}" for start, end in ranges)
    outcome = _FamilyOutcome(
        notes=[
            f"live {kind}: prefill stages (layers {stages}) from sglang's get_pp_indices"
            + (f" ({split_at.path}:{split_at.line})" if split_at else ""),
            _producer_note(),
        ]
    )
    probe = _StageProbe(cls, model, prefill, decode, kv_args_class, manager_class)
    results: list[str] = []
    try:
        if decode.pp_size == 1:  # decode registers the whole model (+ draft) once for every stage
            probe.decode_side = probe.side(decode, (0, model.num_layers), decode.draft_layers, 0)
        for stage, layers in enumerate(ranges):
            finding, result = probe.run(stage, layers)
            outcome.findings.append(finding)
            results.append(result)
    except Exception as error:  # sglang cannot build this deployment's pools or kv_args
        if not isinstance(error, livepools.CannotBuild) and raising_location(error) is None:
            raise  # npudoctor's own bug: an error result, not a finding
        outcome.findings.append((Status.WARN, _cannot_build(cls, error)))
        results.append("not built")
    finally:
        probe.decode_side = None
        gc.collect()
    outcome.findings.extend(probe.bootstrap_findings())
    outcome.crashes = sorted({type(error).__name__ for error in probe.bootstrap_errors.values()})
    outcome.summary = f"{kind} " + ", ".join(results)
    return outcome


def _cannot_build(cls: type, error: Exception) -> Evidence:
    expected = f"{cls.__name__} pools and kv_args for this deployment, as sglang builds them"
    if isinstance(error, livepools.CannotBuild):
        return Evidence(expected=expected, observed=str(error), location=code_location(cls, "__init__"))
    return exception_evidence(expected, error)


def _live_summary(worst: Status, outcomes: list[_FamilyOutcome]) -> str:
    text = "; ".join(outcome.summary for outcome in outcomes)
    crashes = sorted({c for outcome in outcomes for c in outcome.crashes})
    if crashes:
        text += (
            f"; note: sglang's PD bootstrap itself raised ({', '.join(crashes)}) before any "
            "transfer, a defect outside NPD003 (see evidence)"
        )
    if worst is Status.FAIL:
        return f"PP prefill stages send KV into other layers' or kinds' buffers on decode (live): {text}"
    if worst is Status.WARN:
        return f"cannot tell whether the PP pointer mapping is right (live): {text}"
    return f"every prefill PP stage's buffers land in the same layer and kind on decode (live): {text}"


class _StageProbe:
    """Builds each prefill stage (and, for decode PP > 1, the decode stage holding the same
    layers), sends one request through the installed mapping and judges the pairs. Pools of a
    stage are dropped before the next one is built, so a 61-layer model stays small."""

    def __init__(self, cls, model, prefill, decode, kv_args_class, manager_class):
        self.cls, self.model, self.prefill, self.decode = cls, model, prefill, decode
        self.kv_args_class, self.manager_class = kv_args_class, manager_class
        self.decode_side: livetransfer.Side | None = None
        self.bootstrap_errors: dict[str, BaseException] = {}  # first per role

    def bootstrap_findings(self) -> list[tuple[Status, Evidence]]:
        """sglang's PD bootstrap raising while it registers *state* buffers: reported as observed,
        but outside NPD003's property (state buffers do not go through ``send_kvcache``)."""
        findings = []
        for role, error in self.bootstrap_errors.items():
            raised = exception_evidence("", error)
            evidence = Evidence(
                expected=(
                    f"sglang's PD bootstrap ({role}: setup_state_kv_args) registers the pools' buffers; outside "
                    "NPD003, whose KV mapping was then probed with the pool reporting no state buffers"
                ),
                observed=f"{raised.observed}: this deployment's {role} fails before any transfer",
                location=raised.location,
            )
            findings.append((Status.PASS, evidence))
        return findings

    def side(self, role: RoleFacts, layers: tuple[int, int], draft_layers: int, stage: int):
        """One role's pools and kv_args, built in the role's environment."""
        built = livepools.in_role(
            role,
            lambda: livetransfer.build_side(
                self.cls, self.model, role, layers, draft_layers, self.kv_args_class, stage
            ),
        )
        for error in built.bootstrap_errors:
            self.bootstrap_errors.setdefault(role.name, error)
        return built

    def run(self, stage: int, layers: tuple[int, int]) -> tuple[tuple[Status, Evidence], str]:
        """The stage's finding and its one-line result."""
        label = f"stage {stage} (layers {layers[0]}-{layers[1] - 1})"
        decode_side = self.decode_side
        if decode_side is None:  # decode with the prefill's PP size: its last stage runs the draft
            last = stage == self.prefill.pp_size - 1
            decode_side = self.side(self.decode, layers, self.decode.draft_layers if last else 0, stage)
        stage_side = self.side(self.prefill, layers, 0, stage)
        is_mla = self.model.attention.is_mla
        manager = livetransfer.stand_in_manager(
            self.manager_class, stage_side.kv_args, self.prefill, stage, is_mla
        )
        try:
            mapping = livetransfer.send_one_request(manager, stage, stage_side, decode_side, self.prefill)
        except livetransfer.ShimGap as gap:
            evidence = Evidence(
                expected=f"{self.manager_class.__name__}.send_kvcache to run on npudoctor's stand-in manager",
                observed=f"it reads {gap}, which npudoctor does not set: a manager shape it does not know",
                location=code_location(self.manager_class, "send_kvcache"),
            )
            return (Status.WARN, evidence), f"{label}: not run"
        finally:
            del stage_side, decode_side, manager
            gc.collect()
        status, evidence, result = _stage_finding(mapping, self.model, self.decode, self.manager_class)
        return (status, evidence), f"{label}: {result}"


def _producer_note() -> str:
    setup = livetransfer.producer()
    if setup is None:
        return "live: no setup_state_kv_args in this release: kv_args as its _init_kv_manager fills them"
    where = code_location(setup)
    return "live: kv_args completed by sglang's setup_state_kv_args" + (
        f" ({where.path}:{where.line})" if where else ""
    )


def _stage_finding(
    mapping: livetransfer.StageMapping, model: ModelFacts, decode: RoleFacts, manager_class: type
) -> tuple[Status, Evidence, str]:
    """Expected vs observed for one stage, and a short outcome for the summary."""
    kinds = "/".join(dict.fromkeys(slot.kind for slot in mapping.buffers)) or "KV"
    stage = f"prefill stage {mapping.stage} (layers {mapping.start}-{mapping.end - 1})"
    draft = f" + {decode.draft_layers} draft layer(s)" if decode.draft_layers else ""
    expected = (
        f"{stage}: each of its {len(mapping.buffers)} {kinds} buffers written into the same layer "
        f"and kind on decode ({model.num_layers} layers{draft}), one to one"
    )
    splitter = mapping.splitter()
    location = splitter.location if splitter else code_location(manager_class, "send_kvcache")
    if splitter:
        via = f"; via {splitter.name} ({splitter.location.path}:{splitter.location.line})"
    else:
        via = (
            f"; {manager_class.__name__}.send_kvcache"
            + (f" ({location.path}:{location.line})" if location else "")
            + " called no PP pointer splitter"
        )
    if mapping.error is not None:
        raised = exception_evidence(expected, mapping.error)
        at = f" at {raised.location}" if raised.location else ""
        observed = f"{stage}: send_kvcache raised {raised.observed}{at}{via}"
        return Status.FAIL, Evidence(expected, observed, raised.location or location), "raised"
    total = len(mapping.buffers)
    if mapping.bijective:
        first, last = mapping.buffers[0], mapping.buffers[-1]
        observed = (
            f"{stage}: {total} of {total} pairs right, one decode buffer each "
            f"({first} -> {first} ... {last} -> {last}){via} (live, CPU)"
        )
        return Status.PASS, Evidence(expected, observed, location), f"{total} of {total} pairs right"
    problems = _mapping_problems(mapping)
    observed = f"{stage}: {'; '.join(problems)}{via} (live, CPU)"
    return Status.FAIL, Evidence(expected, observed, location), problems[0].split(":")[0]


def _mapping_problems(mapping: livetransfer.StageMapping) -> list[str]:
    """``30 of 60 pairs wrong: V0 -> K30, ...``, buffers never sent, decode buffers hit twice, ..."""
    problems = []
    wrong = mapping.wrong
    if wrong:
        shown = ", ".join(
            f"{source} -> {target if target is not None else 'no decode buffer'}"
            for source, target in wrong[:_SHOWN_PAIRS]
        )
        more = ", ..." if len(wrong) > _SHOWN_PAIRS else ""
        problems.append(f"{len({s for s, _ in wrong})} of {len(mapping.buffers)} pairs wrong: {shown}{more}")
    if mapping.missing:
        problems.append(f"{len(mapping.missing)} buffer(s) never sent (first: {mapping.missing[0]})")
    if mapping.shared_targets:
        problems.append(
            f"{len(mapping.shared_targets)} decode buffer(s) written from several stage buffers "
            f"(first: {mapping.shared_targets[0]})"
        )
    if mapping.overruns:
        problems.append(f"{mapping.overruns} block(s) run past the end of their buffer")
    if mapping.unknown_sources:
        problems.append(f"{mapping.unknown_sources} block(s) read from outside the stage's buffers")
    if not mapping.buffers:
        problems.append("the stage pool has no KV buffer npudoctor can locate")
    return problems


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
    if draft_layers and family == "mha" and findings[-1][0] is Status.PASS and not counts_layers:
        findings[-1] = (Status.WARN, _guessed_draft_layers(splitter, draft_layers))
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


def _guessed_draft_layers(splitter: MethodRef, draft_layers: int) -> Evidence:
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
        location=Location(splitter.relpath, splitter.line, splitter.qualname),
    )


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
