"""NPD003's live probe: run sglang's real Ascend PD transfer-pointer mapping on CPU, one prefill
PP stage at a time, with the real pools of both roles and a recording transfer engine; decode every
address it would send back to (layer, kind) and judge whether the stage's buffers map one to one
onto the same global layer and kind on decode."""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import dataclasses
import gc
import importlib
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import kvargs, livepools, processstate
from npudoctor.live.locations import code_location, exception_evidence, raising_location, relative
from npudoctor.results import Evidence, Location, Status

UTILS_MODULE = kvargs.UTILS_MODULE
PP_MODULE = "sglang.srt.distributed.utils"
# Page indices one request occupies on each side: two contiguous runs, so the mapping is
# exercised with more than one transfer block per buffer.
PREFILL_PAGES = (0, 1, 3)
DECODE_PAGES = (2, 3, 1)
_SHOWN_PAIRS = 4  # wrong pairs quoted per stage


def import_transfer_modules() -> None:
    """The modules the probe calls into: disaggregation utils, the PP layer partition, and the
    ascend KV classes (``get_kv_class`` imports their module on first use; importing it here
    lets a runtime fix of it be in place, and reported, before the probes run). If that
    fails, the probe reports it when it asks for the classes."""
    importlib.import_module(UTILS_MODULE)
    importlib.import_module(PP_MODULE)
    with contextlib.suppress(Exception):
        kv_classes()


class ShimGap(Exception):
    """The probed code read something npudoctor's stand-in manager does not provide."""


class ProcessStateGap(Exception):
    """The probed code asked for process state a scheduler sets up and the probe does not."""


@dataclass(frozen=True, order=True)
class Slot:
    """One per-layer buffer: a global layer and a buffer kind (K, V, IK for the indexer K)."""

    layer: int
    kind: str
    draft: bool = False

    def __str__(self) -> str:
        return f"{self.kind}{self.layer}" + (" (draft)" if self.draft else "")


def buffer_kind(attribute: str) -> str:
    """``k_buffer``/``k_buffer_tensor`` -> K, ``v_buffer`` -> V, ``index_k_buffer`` -> IK."""
    if attribute.startswith("index_k"):
        return "IK"
    if attribute.startswith(("k_", "v_")):
        return attribute[0].upper()
    return attribute


class AddressBook:
    """The per-layer buffers of some pools by address range: decodes an address to its ``Slot``."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, Slot]] = []

    def register(self, pool: Any, first_layer: int, draft: bool = False) -> None:
        known = {(start, end) for start, end, _ in self._ranges}
        for attribute, layers in livepools.kv_buffers(pool).items():
            for index, tensor in enumerate(layers):
                start = tensor.data_ptr()
                span = (start, start + tensor.nbytes)
                if span not in known:  # an alias of a buffer already registered
                    known.add(span)
                    slot = Slot(first_layer + index, buffer_kind(attribute), draft)
                    self._ranges.append((*span, slot))
        self._ranges.sort()

    def find(self, address: int) -> tuple[Slot, int] | None:
        """The slot holding ``address`` and the bytes left in it from there."""
        index = bisect.bisect_right(self._ranges, (address, float("inf"))) - 1
        if index >= 0:
            start, end, slot = self._ranges[index]
            if start <= address < end:
                return slot, end - address
        return None

    def locate(self, address: int) -> Slot | None:
        found = self.find(address)
        return found[0] if found else None

    def slots(self) -> list[Slot]:
        return sorted(slot for _, _, slot in self._ranges)


class TransferRecorder:
    """Stands in for the Ascend transfer engine: records what ``_transfer_data`` hands it."""

    def __init__(self) -> None:
        self.blocks: list[tuple[int, int, int]] = []
        self._lock = threading.Lock()

    def batch_transfer_sync(self, session_id: str, src_addrs, dst_addrs, lengths) -> int:
        with self._lock:
            self.blocks.extend(zip(src_addrs, dst_addrs, lengths))
        return 0

    def transfer_sync(self, session_id: str, src_addr: int, dst_addr: int, length: int) -> int:
        """One block at a time: the engine interface of releases whose Ascend manager inherits
        the Mooncake ``send_kvcache`` (0.4.10)."""
        return self.batch_transfer_sync(session_id, [src_addr], [dst_addr], [length])


@dataclass
class Step:
    """An sglang function the transfer call went through."""

    name: str
    location: Location


@dataclass
class StageMapping:
    """What one prefill stage's ``send_kvcache`` sent, decoded to (layer, kind) on both sides."""

    stage: int
    start: int  # first global layer of the stage
    end: int  # exclusive
    # every KV buffer of the stage's pool, in the order sglang registers them (unregistered last)
    buffers: list[Slot] = field(default_factory=list)
    sent: dict[Slot, set[Slot | None]] = field(default_factory=dict)  # source -> destinations
    unknown_sources: int = 0  # blocks whose source lies in none of the stage's buffers
    overruns: int = 0  # blocks that run past the end of their source or destination buffer
    path: list[Step] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def wrong(self) -> list[tuple[Slot, Slot | None]]:
        """(source, destination) pairs that differ, in the stage's registration order."""
        order = {slot: index for index, slot in enumerate(self.buffers)}
        pairs = [(s, t) for s, targets in self.sent.items() for t in targets if t != s]
        return sorted(pairs, key=lambda pair: (order.get(pair[0], len(order)), pair[0], str(pair[1])))

    @property
    def missing(self) -> list[Slot]:
        return [slot for slot in self.buffers if slot not in self.sent]

    @property
    def shared_targets(self) -> list[Slot]:
        """Decode buffers written from more than one stage buffer."""
        seen: dict[Slot, int] = {}
        for targets in self.sent.values():
            for target in targets - {None}:
                seen[target] = seen.get(target, 0) + 1
        return sorted(slot for slot, count in seen.items() if count > 1)

    @property
    def bijective(self) -> bool:
        return (
            self.error is None
            and bool(self.buffers)
            and not self.wrong
            and not self.missing
            and not self.unknown_sources
            and not self.overruns
            and not self.shared_targets
        )

    def splitter(self) -> Step | None:
        """The pointer splitter sglang took (``get_*_ptrs_with_pp``), if any."""
        return next((step for step in self.path if "ptrs" in step.name), None)


@dataclass
class Side:
    """One role's registration for a transfer: its pools (kept alive while their addresses are
    in use), the address book of their buffers, and the assembled ``kv_args``."""

    pools: list[Any]
    book: AddressBook
    kv_args: Any
    bootstrap_errors: list[BaseException]
    model: ModelFacts | None = None  # the model the role serves


def stage_ranges(num_layers: int, pp_size: int) -> tuple[list[tuple[int, int]], Location | None]:
    """Each PP stage's ``(start_layer, end_layer)`` from sglang's ``get_pp_indices`` (call it in
    the role's environment: it reads ``SGLANG_PP_LAYER_PARTITION``), and where it is defined."""
    split = sys.modules[PP_MODULE].get_pp_indices
    ranges = [tuple(split(num_layers, rank, pp_size)) for rank in range(pp_size)]
    return ranges, code_location(split)


def pool_class(family: str) -> type | None:
    """The NPU pool class sglang's model runner builds for the family (``NPU`` + generic name)."""
    classes = livepools.npu_pool_classes(family)
    wanted = "NPU" + livepools.GENERIC_POOL[family]
    return next((c for c in classes if c.__name__ == wanted), classes[0] if classes else None)


def kv_classes() -> tuple[type, type]:
    """``(KVArgs class, manager class)`` sglang's ``get_kv_class`` picks for the ascend backend."""
    utils = sys.modules[UTILS_MODULE]
    backend = utils.TransferBackend.ASCEND
    return (
        utils.get_kv_class(backend, utils.KVClassType.KVARGS),
        utils.get_kv_class(backend, utils.KVClassType.MANAGER),
    )


def build_side(
    cls: type,
    model: ModelFacts,
    role: RoleFacts,
    layers: tuple[int, int],
    draft_layers: int,
    kv_args_class: type,
    stage: int,
) -> Side:
    """A role's pools for ``layers`` (plus a draft pool of ``draft_layers``, numbered after the
    model's layers) and its ``kv_args``, as the role's ``_init_kv_manager`` registers them."""
    main = livepools.build_pool(cls, model, role, layers_range=layers)
    draft = livepools.build_pool(cls, model, role, layers_range=(0, draft_layers)) if draft_layers else None
    book = AddressBook()
    book.register(main, main.start_layer)
    if draft is not None:
        book.register(draft, model.num_layers, draft=True)
    errors: list[BaseException] = []
    kv_args = assemble_kv_args(kv_args_class, main, draft, model, role, stage, errors)
    return Side([main, draft], book, kv_args, errors, model)


def assemble_kv_args(
    kv_args_class: type,
    pool: Any,
    draft_pool: Any,
    model: ModelFacts,
    role: RoleFacts,
    stage: int,
    errors: list[BaseException],
) -> Any:
    """``kv_args`` as ``_init_kv_manager`` fills them (``npudoctor.live.kvargs``), completed by sglang's
    own ``setup_state_kv_args`` where the release has it.

    That producer also registers the pools' *state* buffers, which travel by another path than
    ``send_kvcache``; if the pool cannot even report those (0.5.12's NPU MLA pool without an
    indexer raises ``TypeError``: NPD006's finding), the exception is kept in ``errors`` and the
    producer runs again with the pool reporting none, so the KV mapping can still be probed."""
    kv_args = kvargs.initial_kv_args(kv_args_class, pool, draft_pool, model, role, stage)
    setup = kvargs.state_producer()
    if setup is not None:
        try:
            setup(kv_args, pool, draft_pool, model.num_layers, req_to_token_pool=None)
        except Exception as error:
            if not _raised_in(error, "get_state_buf_infos"):
                raise
            errors.append(error)
            with _no_state_buffers(pool, draft_pool):
                setup(kv_args, pool, draft_pool, model.num_layers, req_to_token_pool=None)
    return kv_args


def _raised_in(error: BaseException, function: str) -> bool:
    return any(frame.name == function for frame in traceback.extract_tb(error.__traceback__))


@contextlib.contextmanager
def _no_state_buffers(*pools: Any) -> Iterator[None]:
    for pool in pools:
        if pool is not None:
            pool.get_state_buf_infos = lambda: ([], [], [])
    try:
        yield
    finally:
        for pool in pools:
            if pool is not None:
                del pool.get_state_buf_infos


def stand_in_manager(manager_class: type, kv_args: Any, role: RoleFacts, stage: int, is_mla: bool) -> Any:
    """The ascend manager without its ``__init__`` (which opens sockets and registers memory
    with the transfer engine): the attributes ``send_kvcache`` reads, set from the prefill
    role as ``CommonKVManager.__init__`` sets them, and a recording engine."""
    manager = object.__new__(manager_class)
    utils = sys.modules[UTILS_MODULE]
    values = {
        "kv_args": kv_args,
        "engine": TransferRecorder(),
        "disaggregation_mode": utils.DisaggregationMode.PREFILL,
        "pp_size": role.pp_size,
        "pp_rank": stage,
        "tp_size": role.tp_size,
        "attn_tp_size": max(1, role.tp_size // max(1, role.dp_size)),
        "is_mla_backend": is_mla,
        "is_hybrid_mla_backend": False,
        "enable_custom_mem_pool": False,  # sglang's default (--enable-custom-mem-pool off)
        "enable_staging": False,
    }
    for name, value in values.items():
        setattr(manager, name, value)
    return manager


def send_one_request(manager: Any, stage: int, prefill: Side, decode: Side, role: RoleFacts) -> StageMapping:
    """Call the installed ``send_kvcache`` for one request and decode every recorded block."""
    import numpy as np

    start, end = prefill.pools[0].start_layer, prefill.pools[0].start_layer + prefill.pools[0].layer_num
    mapping = StageMapping(stage, start, end)
    registered = [s for s in map(prefill.book.locate, manager.kv_args.kv_data_ptrs) if s is not None]
    mapping.buffers = list(dict.fromkeys(registered + prefill.book.slots()))
    recorder = manager.engine
    path: list[Step] = []

    def send() -> int:
        recorder.blocks.clear()
        path.clear()
        with (
            processstate.pipeline_stage(role, stage),
            concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor,
            _traced(path),
        ):
            return manager.send_kvcache(
                "npudoctor-session",
                np.array(PREFILL_PAGES, dtype=np.int32),
                list(decode.kv_args.kv_data_ptrs),
                np.array(DECODE_PAGES, dtype=np.int32),
                executor,
            )

    try:
        processstate.in_role(role, lambda: processstate.with_server_args(role, send, prefill.model))
    except AttributeError as error:
        if getattr(error, "obj", None) in (manager, recorder):
            raise ShimGap(f"{type(error.obj).__name__}.{error.name}") from error
        mapping.error = error
    except Exception as error:
        if processstate.needs_process_state(error):
            raise ProcessStateGap(f"{type(error).__name__}: {error}") from error
        mapping.error = error
    mapping.path = list({step.name: step for step in path}.values())
    _decode_blocks(mapping, recorder.blocks, prefill.book, decode.book)
    return mapping


def _decode_blocks(mapping: StageMapping, blocks, source_book: AddressBook, target_book: AddressBook) -> None:
    for source, target, length in blocks:
        found = source_book.find(source)
        if found is None:
            mapping.unknown_sources += 1
            continue
        slot, source_room = found
        landed = target_book.find(target)
        mapping.sent.setdefault(slot, set()).add(landed[0] if landed else None)
        if length > source_room or (landed is not None and length > landed[1]):
            mapping.overruns += 1


@contextlib.contextmanager
def _traced(path: list[Step]) -> Iterator[None]:
    """Record the sglang disaggregation functions called on this thread: the splitter taken."""

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        where = relative(code.co_filename)
        if where and "/disaggregation/" in where and not code.co_name.startswith("<"):
            name = getattr(code, "co_qualname", code.co_name)
            path.append(Step(name, Location(where, code.co_firstlineno, name)))
        elif str(frame.f_globals.get("__name__", "")).startswith("npudoctor.fixes."):  # a runtime fix
            module = frame.f_globals["__name__"]
            name = f"{code.co_name} (npudoctor fix {module.rsplit('.', 1)[-1]})"
            path.append(
                Step(
                    name,
                    Location(
                        f"npudoctor/fixes/{module.rsplit('.', 1)[-1]}.py", code.co_firstlineno, code.co_name
                    ),
                )
            )

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


def probe(
    models: dict[str, ModelFacts],
    assumed_models: bool,
    prefill: RoleFacts,
    decode: RoleFacts,
    role_notes: list[str],
    assumptions: tuple[str, ...],
    roles: tuple[str, ...],
) -> Probe:
    """Run the installed ``send_kvcache`` for every prefill stage of each family's model (the
    ``models`` are assumed ones when ``assumed_models``) and check every pair.

    The mapping is exercised for real, one prefill stage at a time:

    * the stage's layer range comes from sglang's own ``get_pp_indices`` (the partition the
      model's ``make_layers`` uses, honouring ``SGLANG_PP_LAYER_PARTITION``);
    * both sides' pools are the real sglang NPU pool classes, built small on CPU
      (``npudoctor.live.livepools``): the stage pool with its ``start_layer``/``end_layer``, the
      decode pool with every layer and, when decode runs a draft model, a draft pool whose
      pointers are appended, as ``_init_kv_manager`` in ``disaggregation/{prefill,decode}.py``
      does;
    * ``kv_args`` are assembled the way those ``_init_kv_manager`` do, with sglang's own
      ``get_kv_class`` for the classes and the installed ``setup_state_kv_args`` (0.5.12+) so
      ``kv_buf_groups`` and the layer counts come from sglang's own producer;
    * the manager is the class ``get_kv_class`` returns for the ascend backend, created
      without its networking ``__init__``; its transfer engine is a recorder of the
      ``batch_transfer_sync`` calls ``_transfer_data`` makes in every release;
    * every recorded source and destination address is decoded back to (layer, kind) by the
      address ranges of the pools' per-layer tensors, independently of the order in which
      sglang registers them.
    """
    outcomes = []
    notes = list(role_notes)
    for family, model in models.items():
        if prefill.pp_size > model.num_layers:  # the deployment's own model is checked on input
            return Probe(
                Status.WARN,
                f"cannot tell: prefill pp_size {prefill.pp_size} exceeds the {model.num_layers} layers of "
                f"the {model.source} model assumed without a model config: give the deployment's config.json",
                assumptions=assumptions,
                roles=roles,
            )
        if assumed_models:
            notes.append(f"live: {family.upper()} model {model.source}")
        mapped, refused = mapped_model(model, prefill)
        if mapped is None:
            return Probe(Status.WARN, f"cannot tell: {refused}", assumptions=assumptions, roles=roles)
        if mapped is not model:
            notes.append(f"live {family.upper()}: {refused}")
        outcomes.append(_live_family(family, mapped, prefill, decode))
    findings = [f for outcome in outcomes for f in outcome.findings]
    worst = max((s for s, _ in findings), key=lambda s: s.severity, default=Status.WARN)
    notes += [n for outcome in outcomes for n in outcome.notes]
    evidence = tuple(e for _, e in findings)
    return Probe(worst, _live_summary(worst, outcomes), evidence, assumptions + tuple(notes), roles)


PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"


def mapped_model(model: ModelFacts, prefill: RoleFacts) -> tuple[ModelFacts | None, str]:
    """The model whose PP mapping the probe runs, and a note when it is not ``model`` itself.

    Every layer of a stage is mapped by the same code, from the stage's ``start_layer`` and
    ``end_layer``: what decides the mapping is how the model splits into stages, not how many layers
    a stage has. A model of more than ``PROBED_LAYERS`` layers (the memory of the decode pool, which
    holds every layer, grows with them: 2,000 layers took 3.4 GB) is probed as one of at most that
    many split the same way by sglang's ``get_pp_indices``: as many stages, each of at least one
    layer, the same number of them one layer longer (the layer count modulo ``pp_size``, which
    ``get_pp_indices`` gives to the last stages). An explicit ``SGLANG_PP_LAYER_PARTITION`` fixes the
    split of every layer: that deployment is not probed (None and why: cannot tell)."""
    layers, pp = model.num_layers, prefill.pp_size
    if layers <= livepools.PROBED_LAYERS:
        return model, ""
    fewer = f"probes at most {livepools.PROBED_LAYERS} layers' PP mapping live"
    if prefill.env.get(PARTITION_ENV):
        return None, (
            f"{PARTITION_ENV} on prefill splits all {layers} layers of the model, and npudoctor {fewer}"
        )
    extra = layers % pp
    per_stage = (livepools.PROBED_LAYERS - extra) // pp
    if per_stage < 1:
        return None, f"prefill pp_size {pp} stages of a {layers}-layer model: npudoctor {fewer}"
    probed = per_stage * pp + extra
    return dataclasses.replace(model, num_layers=probed), (
        f"the mapping probed on a model of {probed} of its {layers} layers, split into the same {pp}"
        f" stage(s) by get_pp_indices ({extra} of them one layer longer, as with {layers}): every layer"
        f" of a stage is mapped by the same code, and npudoctor {fewer}"
    )


@dataclass
class _FamilyOutcome:
    """One pool family's live findings (one per prefill stage), notes and one-line summary."""

    findings: list[tuple[Status, Evidence]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""


def _live_family(family: str, model: ModelFacts, prefill: RoleFacts, decode: RoleFacts) -> _FamilyOutcome:
    kind = family.upper()
    cls = pool_class(family)
    if cls is None:
        evidence = Evidence(
            expected=f"an NPU {kind} KV pool class in sglang",
            observed="none is loaded from this release: its layout is not one npudoctor recognises",
        )
        return _FamilyOutcome([(Status.WARN, evidence)], summary=f"{kind}: no NPU pool class")
    kv_args_class, manager_class = kv_classes()
    ranges, split_at = processstate.in_role(prefill, lambda: stage_ranges(model.num_layers, prefill.pp_size))
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
    outcome.notes.extend(probe.bootstrap_notes())
    outcome.summary = f"{kind} " + ", ".join(results)
    return outcome


def _cannot_build(cls: type, error: Exception) -> Evidence:
    expected = f"{cls.__name__} pools and kv_args for this deployment, as sglang builds them"
    if isinstance(error, livepools.CannotBuild):
        return Evidence(expected=expected, observed=str(error), location=code_location(cls, "__init__"))
    return exception_evidence(expected, error)


def _live_summary(worst: Status, outcomes: list[_FamilyOutcome]) -> str:
    text = "; ".join(outcome.summary for outcome in outcomes)
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
        self.decode_side: Side | None = None
        self.bootstrap_errors: dict[str, BaseException] = {}  # first per role

    def bootstrap_notes(self) -> list[str]:
        """sglang's PD bootstrap raising while it registers *state* buffers (0.5.12's NPU MLA pool
        without an indexer) is NPD006's finding, not NPD003's: state buffers do not go through
        ``send_kvcache``. The KV mapping was probed with the pool reporting none; a note says so."""
        return [
            f"live: {role}: sglang's setup_state_kv_args raised {type(error).__name__} at "
            f"{exception_evidence('', error).location} (NPD006's finding); the KV mapping was probed "
            "with the pool reporting no state buffers"
            for role, error in self.bootstrap_errors.items()
        ]

    def side(self, role: RoleFacts, layers: tuple[int, int], draft_layers: int, stage: int):
        """One role's pools and kv_args, built in the role's environment."""
        built = processstate.in_role(
            role,
            lambda: build_side(self.cls, self.model, role, layers, draft_layers, self.kv_args_class, stage),
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
        manager = stand_in_manager(self.manager_class, stage_side.kv_args, self.prefill, stage, is_mla)
        try:
            mapping = send_one_request(manager, stage, stage_side, decode_side, self.prefill)
        except ShimGap as gap:
            evidence = Evidence(
                expected=f"{self.manager_class.__name__}.send_kvcache to run on npudoctor's stand-in manager",
                observed=f"it reads {gap}, which npudoctor does not set: a manager shape it does not know",
                location=code_location(self.manager_class, "send_kvcache"),
            )
            return (Status.WARN, evidence), f"{label}: not run"
        except ProcessStateGap as gap:
            evidence = Evidence(
                expected=f"{self.manager_class.__name__}.send_kvcache to run in npudoctor's role process",
                observed=f"it raised {gap}: scheduler-process state the probe does not set up",
                location=code_location(self.manager_class, "send_kvcache"),
            )
            return (Status.WARN, evidence), f"{label}: not run"
        finally:
            del stage_side, decode_side, manager
            gc.collect()
        status, evidence, result = _stage_finding(mapping, self.model, self.decode, self.manager_class)
        return (status, evidence), f"{label}: {result}"


def _producer_note() -> str:
    setup = kvargs.state_producer()
    if setup is None:
        return "live: no setup_state_kv_args in this release: kv_args as its _init_kv_manager fills them"
    where = code_location(setup)
    return "live: kv_args completed by sglang's setup_state_kv_args" + (
        f" ({where.path}:{where.line})" if where else ""
    )


def _stage_finding(
    mapping: StageMapping, model: ModelFacts, decode: RoleFacts, manager_class: type
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


def _mapping_problems(mapping: StageMapping) -> list[str]:
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
