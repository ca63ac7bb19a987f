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

Static probe (``static.py``): find the Ascend KV manager by inheritance, the PP branch of the
``send_kvcache`` it resolves to, and for the deployment's pool family the pointer
splitter that branch calls (through the MRO, incl. ``disaggregation/common``). The
splitter must be group-aware for MLA (slices each buffer group at the stage offset,
with the group count set by the producer), must split K/V halves with the stage offset
for MHA, and must know the decode model's layer count when decode has draft layers.
The MHA splitter of 0.5.10-0.5.23 (``CommonKVManager.get_mha_kv_ptrs_with_pp``) infers where
decode's V half starts from layer-count divisibility: right for some stage splits and wrong for
others (Llama-3-70B's 80 layers over PP 3 as 26 + 27 + 27; 61 over PP 2), with or without draft
layers. The static depth decides it from the layer arithmetic (``arithmetic.py``): the release's
own ``get_pp_indices`` and MHA splitter, taken from the source and run alone on the deployment's
layer count, PP sizes, decode draft layers and ``SGLANG_PP_LAYER_PARTITION``, paired as
``send_kvcache`` pairs them; a stage that maps a layer elsewhere fails with the line the splitter
sliced V at. Without a model config the assumed 61-layer models are checked.

Live probe (``live.py``): for every prefill PP stage of the deployment,
with the stage's layers from sglang's own ``get_pp_indices``, build the real NPU pools
of both roles on CPU (the stage's layers; decode's whole model plus its draft layers),
assemble ``kv_args`` as ``_init_kv_manager`` does (with the installed
``setup_state_kv_args`` where the release has it), call the installed Ascend manager's
``send_kvcache`` for one request with a recording transfer engine, decode every recorded
(source, destination) address back to (layer, kind) and require a bijection of the
stage's buffers onto the same global layer and kind on decode.
"""

from __future__ import annotations

import dataclasses

from npudoctor.deployment.facts import ASSUMED_GQA, ASSUMED_MLA_INDEXER, Facts, RoleFacts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact, Status
from npudoctor.static.poolclasses import pool_family
from npudoctor.target.discovery import Target

# With no model given, the live probe builds models of DeepSeek-V3.2's depth: 61 layers split
# unevenly by PP 2 (30 + 31), the split under which pointer arithmetic that assumes equal
# stages goes wrong. The GQA model is the shared one at that depth, with one KV head per rank:
# the mapping does not depend on heads.
_ASSUMED_MODELS = {
    "mla": ASSUMED_MLA_INDEXER,
    "mha": dataclasses.replace(
        ASSUMED_GQA,
        source="assumed (GQA, 61 layers, 1 KV head per rank)",
        num_layers=ASSUMED_MLA_INDEXER.num_layers,
        num_heads=8,
        num_kv_heads=1,
    ),
}


class PipelineTransferMap(Check):
    id = "NPD003"
    kind = CheckKind.DEEP
    title = "PD KV transfer with pipeline parallelism maps every layer to the same layer and kind"
    upstream = ("https://github.com/sgl-project/sglang/pull/23893",)
    impact = Impact.SILENT_WRONG_OUTPUT
    why = (
        "With PP on the prefill side, the Ascend transfer must slice the decode pointer list per "
        "buffer group; otherwise prefill stage layers land in the wrong layer or in the V buffer "
        "instead of K, and the model silently produces garbage."
    )
    bites_when = (
        "PD disaggregation with the ascend transfer backend and pp_size > 1 on the prefill (or "
        "decode) role; MLA models up to 0.5.11; MHA/GQA models whose PP layer split the MHA splitter "
        "misses (a stage's layer count not dividing the model's, e.g. 80 layers over PP 3) on every "
        "release through 0.5.23; decode with extra draft (MTP/EAGLE) layers."
    )
    how_to_fix = (
        "apply the npudoctor runtime override for NPD003 (group-aware PP pointer slicing up to 0.5.11, "
        "the MHA splitter sliced at the served model's layer count from 0.5.12; unsafe): "
        "npudoctor fix --apply --unsafe --select NPD003"
    )

    def live_imports(self) -> None:
        from npudoctor.live import livepools  # live only: never loaded at static depth

        from . import live as live_probe

        livepools.import_pool_modules()
        live_probe.import_transfer_modules()

    def out_of_scope(self, facts: Facts) -> Probe | None:
        scope = _scope(facts)
        return Probe(Status.SKIP, scope) if isinstance(scope, str) else None

    def live(self, target: Target, facts: Facts) -> Probe:
        """Run the installed ``send_kvcache`` for every prefill stage and check every pair."""
        from . import live as live_probe  # live only: never loaded at static depth

        families, draft_layers, assumptions, roles = _scope(facts)
        prefill, decode, role_notes = _live_roles(facts, draft_layers)
        if decode.pp_size not in (1, prefill.pp_size):
            return Probe(
                Status.WARN,
                f"cannot tell: decode pp_size {decode.pp_size} with prefill pp_size {prefill.pp_size} "
                "(sglang pairs a prefill stage with a decode of PP 1 or of the same PP size)",
                assumptions=assumptions,
                roles=roles,
            )
        models = {family: facts.model or _ASSUMED_MODELS[family] for family in families}
        return live_probe.probe(models, facts.model is None, prefill, decode, role_notes, assumptions, roles)

    def static(self, target: Target, facts: Facts) -> Probe:
        from . import static as static_probe  # not loaded when the answer is cached
        from .arithmetic import Split

        families, draft_layers, assumptions, roles = _scope(facts)
        prefill, decode, _ = _live_roles(facts, draft_layers)
        splits = {
            family: Split(
                num_layers=model.num_layers,
                prefill_pp=prefill.pp_size,
                decode_pp=decode.pp_size,
                draft_layers=decode.draft_layers,
                env=dict(prefill.env),
                model=model.source,
            )
            for family in families
            for model in [facts.model or _ASSUMED_MODELS[family]]
        }
        return static_probe.probe(target.tree, families, draft_layers, assumptions, roles, splits)


def _families(facts: Facts) -> list[str]:
    scope = _scope(facts)
    return [] if isinstance(scope, str) else scope[0]


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


CHECK = PipelineTransferMap()
