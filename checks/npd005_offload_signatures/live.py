"""NPD005's live probe: the deployment's allocator built over its pools on CPU with their real
constructors, called through the real offload chain with exactly the keywords the installed
callers pass (the static graph names the classes and the calls), and judged by what every level
received: which method ran at each level, which keywords it received, from which sglang line, and
whether Python could bind them. It records by shadowing each instance's offload methods with a
recorder for the duration of the calls (``recording``), never by editing classes, so ``super()``
hand-overs inside a level run untouched."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npudoctor.deployment.facts import Facts, ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import processstate
from npudoctor.live.calls import accepts, binding_keyword, reads, signature_of
from npudoctor.live.livepools import CannotBuild, construct
from npudoctor.live.locations import code_location, frame_location, raising_location
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.source import ClassInfo, SourceTree

from .chain import Chain, bind_live, chain_evidence, chain_finding, edge_location, walk
from .static import ALLOCATOR, OFFLOAD_METHODS, OffloadGraph, _describe, _Finding, _Path, _Site

# How deep below the allocator the recorder looks for objects with offload methods:
# allocator -> pool -> sub-pool (-> a sub-pool's own component).
_MAX_DEPTH = 4


@dataclass
class LevelCall:
    """One call of an offload method on one object of the chain, as it happened."""

    index: int
    parent: int | None  # the recorded call this one ran inside (None: the scheduler's call)
    owner: type  # the class of the instance called
    method: str
    function: Callable[..., Any]  # the function the call resolved to (through the MRO)
    positional: int
    keywords: dict[str, Any]
    caller: (
        Location | None
    )  # the sglang line that made the call (None: npudoctor, standing in for the scheduler)
    bind_error: str | None = None  # the call did not bind: the function never ran
    children: list[int] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.owner.__name__}.{self.method}"

    @property
    def resolved(self) -> str:
        """``Owner.m`` or ``Owner.m -> Definer.m`` when the class inherits it."""
        defined = getattr(self.function, "__qualname__", self.qualname)
        return self.qualname if defined == self.qualname else f"{self.qualname} -> {defined}"

    def location(self) -> Location | None:
        return code_location(self.function)

    def received(self) -> str:
        """``mamba_indices=None, req_pool_index=0`` (or ``no keywords``)."""
        if not self.keywords:
            return "no keywords"
        return ", ".join(f"{k}={describe_value(v)}" for k, v in self.keywords.items())


@contextlib.contextmanager
def recording(root: Any) -> Iterator[list[LevelCall]]:
    """Record every offload call on ``root`` and the objects below it while the block runs.

    Each object's ``get_cpu_copy``/``load_cpu_copy`` is shadowed on the instance by a
    recorder that notes the call (caller line, keywords, whether it binds) and then calls
    the real bound method with the same arguments; the shadows are removed afterwards.
    """
    calls: list[LevelCall] = []
    stack: list[int] = []
    shadowed: list[tuple[Any, str, bool, Any]] = []
    for obj in offload_objects(root):
        state = vars(obj)
        for name in OFFLOAD_METHODS:
            bound = getattr(obj, name, None)
            if not inspect.ismethod(bound):
                continue
            shadowed.append((obj, name, name in state, state.get(name)))
            state[name] = _recorder(obj, name, bound, calls, stack)
    try:
        yield calls
    finally:
        for obj, name, had, previous in reversed(shadowed):
            if had:
                vars(obj)[name] = previous
            else:
                vars(obj).pop(name, None)


def _recorder(
    obj: Any, name: str, bound: Any, calls: list[LevelCall], stack: list[int]
) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        call = LevelCall(
            index=len(calls),
            parent=stack[-1] if stack else None,
            owner=type(obj),
            method=name,
            function=bound.__func__,
            positional=len(args),
            keywords=dict(kwargs),
            caller=frame_location(sys._getframe(1)),
        )
        try:
            inspect.signature(bound).bind(*args, **kwargs)
        except TypeError as error:
            call.bind_error = str(error)
        if call.parent is not None:
            calls[call.parent].children.append(call.index)
        calls.append(call)
        stack.append(call.index)
        try:
            return bound(*args, **kwargs)
        finally:
            stack.pop()

    return record


def offload_objects(root: Any) -> list[Any]:
    """``root`` and the objects its attributes hold (breadth first, a few levels deep) that have
    offload methods: an allocator, its pool, a composite pool's sub-pools, a mamba pool."""
    found: list[Any] = []
    seen: set[int] = set()
    level = [root]
    for _ in range(_MAX_DEPTH):
        below = []
        for obj in level:
            if id(obj) in seen or isinstance(obj, type) or not hasattr(obj, "__dict__"):
                continue
            seen.add(id(obj))
            if any(inspect.ismethod(getattr(obj, m, None)) for m in OFFLOAD_METHODS):
                found.append(obj)
                below.extend(v for v in vars(obj).values() if _may_hold_offload(v))
        level = below
    return found


def _may_hold_offload(value: Any) -> bool:
    return not isinstance(value, type) and any(hasattr(type(value), m) for m in OFFLOAD_METHODS)


def build_allocator(cls: type, pool: Any, role: RoleFacts) -> Any:
    """An instance of allocator ``cls`` over ``pool`` on CPU, its constructor bound by signature
    the way the model runner builds it (``need_sort`` for PD roles)."""
    return construct(
        cls,
        {
            "size": pool.size,
            "size_swa": pool.size,
            "page_size": pool.page_size,
            "dtype": getattr(pool, "dtype", None),
            "device": "cpu",
            "kvcache": pool,
            "need_sort": role.disaggregation_mode in ("decode", "prefill"),
        },
    )


# Mamba state slots of a hybrid pool built here: a request's slot and the spare one.
MAMBA_SLOTS = 2


def build_hybrid_linear_pool(cls: type, npu_cls: type, model: ModelFacts | None, role: RoleFacts) -> Any:
    """A hybrid linear-attention pool (``HybridLinearKVPool``: full-attention KV + mamba state) for a
    model such as Qwen3-Next, as a decode server on Ascend builds it: its ``MambaPool`` shaped by
    sglang's own config class of the model (``mamba2_cache_params``) for this role's attention TP
    size, and the NPU pool of the full-attention layers below it. The constructor picks that NPU
    pool only when ``is_npu()`` held at import, which it does not here, so the NPU pool is passed
    in (``full_kv_pool=``, 0.5.2x) or put in its place."""
    import dataclasses

    from npudoctor.live import livepools
    from npudoctor.live.livepools import build_pool

    config = model_config(model)
    cache_params = _with_attention_tp(role.tp_size, lambda: config.mamba2_cache_params)
    full_layers = [int(i) for i in config.full_attention_layer_ids]
    layers = len(full_layers) + len(cache_params.layers)
    if layers > livepools.PROBED_LAYERS:  # its layers' ids are the config's: not cut to a sample
        raise CannotBuild(
            f"a hybrid pool of {layers} layers: npudoctor builds hybrid pools of at most"
            f" {livepools.PROBED_LAYERS} layers on CPU (every real hybrid model's: Qwen3-Next has 48)"
        )
    mamba_cls = getattr(sys.modules[cls.__module__], "MambaPool", None)
    if not isinstance(mamba_cls, type):
        raise CannotBuild(f"no MambaPool beside {cls.__name__} in {cls.__module__}")
    mamba = construct(
        mamba_cls,
        {
            "size": MAMBA_SLOTS,
            "spec_state_size": MAMBA_SLOTS,
            "cache_params": cache_params,
            "mamba_layer_ids": list(cache_params.layers),
            "device": "cpu",
            "enable_memory_saver": False,
        },
    )
    full_model = dataclasses.replace(model, num_layers=len(full_layers)) if model else None
    full = build_pool(npu_cls, full_model, role)
    pool = construct(
        cls,
        {
            "size": full.size,
            "dtype": full.dtype,
            "page_size": full.page_size,
            "head_num": full.head_num,
            "head_dim": full.head_dim,
            "full_attention_layer_ids": full_layers,
            "enable_kvcache_transpose": False,
            "device": "cpu",
            "mamba_pool": mamba,
            "full_kv_pool": full,
            "full_kv_pool_class": npu_cls,
            "start_layer": 0,
        },
    )
    if not isinstance(pool.full_kv_pool, npu_cls):
        pool.full_kv_pool = full
    return pool


def model_config(model: ModelFacts | None) -> Any:
    """sglang's own config class for the model's ``model_type``, built from its config.json
    (read as JSON, nothing executed)."""
    import json

    if model is None or not Path(model.source).is_file():
        raise CannotBuild("the model's config.json is not given, and a hybrid pool is shaped by it")
    data = json.loads(Path(model.source).read_text())
    configs = sys.modules.get("sglang.srt.configs")
    found = (
        [
            value
            for value in vars(configs).values()
            if isinstance(value, type) and getattr(value, "model_type", None) == data.get("model_type")
        ]
        if configs
        else []
    )
    if not found:
        raise CannotBuild(f"sglang defines no config class for model_type {data.get('model_type')!r}")
    return found[0](**data)


def _with_attention_tp(tp_size: int, read: Callable[[], Any]) -> Any:
    """``read()`` as this role's process would answer it: sglang's attention-TP size is the role's
    TP size (the process groups that normally answer it are never built here). Up to 0.5.1x that
    is ``dp_attention.get_attention_tp_size``; 0.5.2x reads a runtime parallel context, given
    each value it asks for (``_parallel_value``) as a scoped override."""
    module = sys.modules.get("sglang.srt.layers.dp_attention")
    saved = getattr(module, "get_attention_tp_size", None)
    if saved is not None:
        module.get_attention_tp_size = lambda: tp_size
    try:
        return processstate.with_parallel(read, default=functools.partial(_parallel_value, tp_size=tp_size))
    except Exception as error:
        raise CannotBuild(
            f"the model's mamba state shape needs sglang's parallel state: {type(error).__name__}: {error}"
        ) from error
    finally:
        if saved is not None:
            module.get_attention_tp_size = saved


def _parallel_value(name: str, tp_size: int) -> Any:
    """This single rank's view: attention TP is the role's TP size, switches off, ranks 0, other widths 1."""
    if name in ("tp_size", "attn_tp_size"):
        return tp_size
    if name.startswith(("enable_", "use_")):
        return False
    return processstate.single_rank(name)


def mamba_slot(pool: Any) -> Any:
    """A request's mamba slot in ``pool``'s mamba pool, allocated the way the scheduler does
    (``Req.mamba_pool_idx``: one element of what ``MambaPool.alloc`` returns); None without one."""
    mamba = getattr(pool, "mamba_pool", None)
    if mamba is None:
        return None
    import torch

    allocated = mamba.alloc(1) if hasattr(mamba, "alloc") else None
    return allocated[0] if allocated is not None and len(allocated) else torch.tensor(1)


def describe_value(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"tensor({value.item()})" if len(shape) == 0 else f"tensor{list(shape)}"
    return repr(value)


# ----- a light round trip: do the offloaded slots come back? ---------------------------------
def host_copy(payload: Any) -> Any:
    """``payload`` with every tensor in it (through lists, tuples and dicts) cloned.

    On an NPU, ``get_cpu_copy``'s ``.to("cpu")`` always copies device memory to the host; on a
    CPU it returns the tensor itself, and an index by a 0-d tensor (a request's mamba slot) is a
    view of the live buffer. Cloning restores the device/host boundary the code relies on."""
    import torch

    if isinstance(payload, torch.Tensor):
        return payload.clone()
    if isinstance(payload, list):
        return [host_copy(v) for v in payload]
    if isinstance(payload, tuple):
        copied = [host_copy(v) for v in payload]
        return type(payload)(*copied) if hasattr(payload, "_fields") else tuple(copied)
    if isinstance(payload, dict):
        return {k: host_copy(v) for k, v in payload.items()}
    return payload


@dataclass
class SlotSnapshot:
    """The raw bits of a few token slots in every per-layer KV buffer of the chain's pools, and of
    the request's mamba slot where a pool holds mamba state."""

    slots: Any  # int64 tensor of token slots
    mamba_slot: Any = None
    rows: dict[tuple[str, str, int], Any] = field(default_factory=dict)  # (pool, buffer, layer) -> bits

    @classmethod
    def take(cls, root: Any, slots: Any, mamba_slot: Any = None, seed: int = 0) -> SlotSnapshot:
        """Fill the slots with random bits in every buffer below ``root`` and remember them."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        snapshot = cls(slots, mamba_slot)
        for _, rows, index in snapshot._rows(root):
            shape = rows[index].shape
            rows[index] = torch.randint(-(2**15), 2**15, shape, generator=generator).to(rows.dtype)
        # read back only after every buffer was filled: pools keep aliases (per-layer views of one
        # tensor, k_buffer beside k_buffer_tensor), and the last write to shared memory wins
        for key, rows, index in snapshot._rows(root):
            snapshot.rows[key] = rows[index].clone()
        return snapshot

    def scramble(self, root: Any) -> None:
        """Overwrite the slots with zeros (what the next user of those slots would do); idempotent,
        so aliased buffers end up zero too."""
        for _, rows, index in self._rows(root):
            rows[index] = 0

    def mismatch(self, root: Any) -> str | None:
        """None when every slot of every buffer holds its remembered bits again."""
        for key, rows, index in self._rows(root):
            wrong = (rows[index] != self.rows[key]).reshape(len(index), -1).any(dim=1).nonzero()
            if len(wrong):
                pool, buffer, layer = key
                where = f"layer {layer}" if layer >= 0 else "every layer"
                return (
                    f"{pool}.{buffer} {where}: {len(wrong)} of {len(index)} reloaded slots hold "
                    f"other bits (first: slot {int(index[int(wrong[0])])})"
                )
        return None

    @property
    def buffers(self) -> int:
        return len({(pool, buffer) for pool, buffer, _ in self.rows})

    def _rows(self, root: Any) -> Iterator[tuple[tuple[str, str, int], Any, Any]]:
        """(key, a view whose first dimension is the slot, the slots) for every buffer below ``root``."""
        import torch

        from npudoctor.live.livepools import kv_buffers, token_rows

        mamba = None if self.mamba_slot is None else torch.tensor([int(self.mamba_slot)])
        for obj in offload_objects(root):
            owner = type(obj).__name__
            cache = getattr(obj, "mamba_cache", None)
            if cache is not None and mamba is not None:
                for name in ("temporal", "conv"):
                    value = getattr(cache, name, None)
                    tensors = value if isinstance(value, (list, tuple)) else [value]
                    for i, tensor in enumerate(t for t in tensors if isinstance(t, torch.Tensor)):
                        yield (owner, f"mamba_cache.{name}[{i}]", -1), tensor.transpose(0, 1), mamba
            if not hasattr(obj, "layer_num") or not hasattr(obj, "size"):
                continue
            tokens = obj.size + getattr(obj, "page_size", 1)
            for name, layers in kv_buffers(obj).items():
                for index, layer in enumerate(layers):
                    yield (owner, name, index), token_rows(layer, tokens), self.slots


# ----- the live probe ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _graph(tree: SourceTree) -> OffloadGraph:
    """One static graph per tree and child: ``live_imports`` and ``live`` ask the same questions."""
    return OffloadGraph(tree)


# Token slots offloaded and reloaded, as (page, offset) pairs: a few, across page boundaries,
# never slot 0 (sglang's padding slot).
_SLOTS = ((1, 1), (1, -1), (2, 0), (3, 3))
# The positional arguments the scheduler passes: (indices,) and (the offloaded copy, indices).
_POSITIONAL = {"get_cpu_copy": 1, "load_cpu_copy": 2}
_LIVE = " (live, CPU)"
_LIVE_BOUND = " (live: bound to the imported class's real signature)"


@dataclass
class _Entry:
    """What the installed scheduler passes to the allocator for one method: the keywords, with
    the values a decode server has there (``values``), and where it says so."""

    site: _Site
    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    unexercised: str = ""  # why the call could not be made as written (an unknown positional shape)

    @property
    def method(self) -> str:
        return self.site.method

    def location(self) -> Location:
        return Location(self.site.relpath, self.site.scoped.line, self._caller_name())

    def _caller_name(self) -> str:
        function = self.site.scoped.function
        if function is None:
            return ""
        return f"{self.site.caller.name}.{function.name}" if self.site.caller else function.name

    def describe(self) -> str:
        keywords = ", ".join(f"{k}=" for k in self.values) or "no keywords"
        return f"{self.site.where()} ({self._caller_name()}) passes {keywords}"


@dataclass
class _Run:
    """One call of the scheduler's into the allocator, and what every level received."""

    entry: _Entry
    calls: list  # LevelCall, in call order
    error: BaseException | None = None
    result: Any = None
    payload_note: str = ""  # where load_cpu_copy's payload came from, when get_cpu_copy raised


class _LiveProbe:
    """The live half of NPD005 for one deployment: the static graph names the classes and the
    installed callers' keywords; real objects built on CPU say what happens when they are called.

    For every allocator of the deployment's path and every pool it can hold (the NPU pool of the
    model's attention family; a composite with the NPU pool below for hybrid and sliding-window
    models), the allocator is built over the pool with their real constructors, a few token
    slots are filled with random bits, and the scheduler's two calls are made with exactly the
    keywords of the installed callers: ``get_cpu_copy``, the slots overwritten, ``load_cpu_copy``.
    Every level's offload methods are shadowed on the instance by a recorder for the duration
    (``recording``), so the evidence shows what each level received.

    * A call that does not bind is a ``fail``: the first retraction raises ``TypeError`` there.
    * A keyword a level received, does not use itself and did not pass to the next level, which
      accepts it, was dropped: ``fail`` when the next level reads it (what it copies changes),
      ``warn`` when it only accepts it.
    * The slots must come back; a copy that raises for another reason after every keyword was
      delivered is NPD001's property (the round trip) and is reported, not counted; a copy that
      returns but brings other bits back is a ``warn`` (a signature-only pass must not hide it).
    * A class of the path that cannot be built on CPU is a ``warn`` with the reason.
    """

    def __init__(self, graph: OffloadGraph, facts: Facts):
        self.graph = graph
        self.facts = facts
        self.role = facts.role("decode") or RoleFacts(name="decode (assumed)", disaggregation_mode="decode")

    def run(
        self,
        families: list[str],
        sliding: bool,
        hybrid: bool,
        roles: tuple[str, ...],
        assumptions: tuple[str, ...],
    ) -> Probe:
        path = self.graph.path(families, sliding, hybrid)
        unrecognised = self.graph.unrecognised(families, path)
        findings: list[_Finding] = []
        passed: list[Evidence] = []
        notes: list[Evidence] = []
        chains: list[str] = []
        for allocator, top, sub in self._scenarios(path):
            chain = " -> ".join(c.name for c in (allocator, top, sub) if c is not None)
            chains.append(chain)
            outcome = processstate.in_role(
                self.role, lambda a=allocator, t=top, s=sub: self._scenario(a, t, s)
            )
            findings += outcome[0]
            passed += outcome[1]
            notes += outcome[2]
        chain = walk(self.graph, path, hybrid)
        chain_failures, chain_notes = self._bind_chain(chain)
        findings += chain_failures
        notes += chain_notes
        findings.sort(key=lambda f: -f.status.severity)
        failing = [f for f in findings if f.status is Status.FAIL]
        warning = [f for f in findings if f.status is Status.WARN]
        if failing:
            status = Status.FAIL
            summary = f"{_describe(failing)} at the first retraction, live on CPU through {'; '.join(chains)}"
        elif warning or unrecognised or not chains:
            status = Status.WARN
            parts = [text for text, _ in unrecognised]
            parts += [f"live on CPU: {_describe(warning)}"] if warning else []
            summary = "; ".join(parts) or "no offload chain of this deployment could be exercised"
        else:
            status = Status.PASS
            keywords = sorted({k for e in self._entries(None) for k in e.values})
            delivered = f"the keywords the installed callers pass ({', '.join(k + '=' for k in keywords)})"
            if not keywords:
                delivered = "the installed callers' calls (they pass no keywords)"
            if notes:
                summary = (
                    f"live on CPU: {delivered} bind at every level they reach of {'; '.join(chains)}; "
                    "the copy itself raised before the end (see the evidence: NPD001's property, "
                    "not a signature defect)"
                )
            else:
                summary = f"live on CPU: {delivered} bind and reach every level of {'; '.join(chains)}"
        evidence = [f.evidence for f in failing + warning] + [e for _, e in unrecognised] + notes + passed
        if not chain_failures:
            evidence += chain_evidence(chain, " (live: bound to the imported classes' signatures)")
        return Probe(status, summary, tuple(evidence), assumptions, roles)

    def _bind_chain(self, chain: Chain) -> tuple[list[_Finding], list[Evidence]]:
        """Every call of the static offload-path graph (``chain.walk``) bound to the real signature
        the imported class the deployment builds resolves it to; the copy methods' own overrides
        are exercised for real above."""
        judged = {id(o.node) for o in self.graph.overrides}
        findings, notes = [], []
        for edge in chain.edges:
            if edge.method in OFFLOAD_METHODS and edge.callee is not None and id(edge.callee.node) in judged:
                continue
            try:
                error, _ = bind_live(edge)
            except LookupError as reason:
                notes.append(
                    Evidence(
                        f"{edge.where}: {edge.text} bound to the imported {edge.receiver.name}",
                        f"not verified live: {reason}",
                        edge_location(edge),
                    )
                )
                continue
            if error is not None:
                evidence, subject, kind = chain_finding(edge, error, _LIVE_BOUND)
                findings.append(_Finding(Status.FAIL, evidence, subject, kind))
        return findings, notes

    # ----- what to build ---------------------------------------------------------------------------
    def _scenarios(self, path: _Path) -> list[tuple[ClassInfo, ClassInfo, ClassInfo | None]]:
        """(allocator, pool it holds, NPU pool below a composite) for every combination of the path."""
        found = []
        for allocator in path.allocators:
            for top in path.tops:
                for sub in path.subs or [None]:
                    found.append((allocator, top, sub))
        return found

    def _scenario(
        self, allocator_info: ClassInfo, top_info: ClassInfo, sub_info: ClassInfo | None
    ) -> tuple[list[_Finding], list[Evidence], list[Evidence]]:
        from npudoctor.live import livepools

        try:
            top = self._build_pool(top_info, sub_info)
            allocator = build_allocator(_live_class(allocator_info), top, self.role)
        except livepools.CannotBuild as reason:
            return [self._cannot_build(allocator_info, top_info, sub_info, str(reason))], [], []
        runs, mismatch, snapshot = self._exercise(allocator, top, self._mamba_index(top))
        findings, passed, notes = [], [], []
        for run in runs:
            found, note = self._judge(run)
            findings += found
            notes += note
            if not found:
                passed.append(self._delivered(run))
        if mismatch is not None:
            findings.append(self._mismatch(allocator, mismatch))
        elif not notes and not any(r.error for r in runs):
            passed.append(self._round_trip_ok(allocator, snapshot))
        findings += self._unreached(runs, sub_info)
        findings += self._refused_elsewhere(runs, sub_info)
        return findings, passed, notes

    def _build_pool(self, top: ClassInfo, sub: ClassInfo | None) -> Any:
        from npudoctor.live import livepools

        if sub is not None:
            return self._build_composite(top, sub)
        return livepools.build_pool(_live_class(top), livepools.probed_model(self.facts.model), self.role)

    def _build_composite(self, top: ClassInfo, sub: ClassInfo) -> Any:
        """The composite pool with the NPU pool below it; only the hybrid linear-attention pool
        (mamba state beside full-attention KV) is built on CPU so far."""
        from npudoctor.live import livepools

        cls, npu = _live_class(top), _live_class(sub)
        if "mamba_pool" in inspect.signature(cls.__init__).parameters:
            return build_hybrid_linear_pool(cls, npu, self.facts.model, self.role)
        raise livepools.CannotBuild(
            f"{top.name} (holding {sub.name}) needs the model's sliding-window layer split, "
            "which npudoctor does not build on CPU yet"
        )

    def _mamba_index(self, top: Any) -> Any:
        """The request's mamba slot where the pool holds mamba state (hybrid models), else None:
        ``Req.mamba_pool_idx`` is None for every other model."""
        return mamba_slot(top)

    # ----- the calls -----------------------------------------------------------------------------
    def _entries(self, mamba_index: Any) -> list[_Entry]:
        """The scheduler's calls into the allocator, from the installed source, one per distinct
        keyword set; the values are what a decode server's ``Req`` holds there."""
        entries, seen = [], set()
        for site in self.graph.sites:
            if site.family != ALLOCATOR:
                continue
            key = (site.method, site.shape.keywords)
            if key in seen:
                continue
            seen.add(key)
            values, notes, unexercised = {}, [], ""
            expected = _POSITIONAL[site.method]
            if site.shape.star_args or site.shape.positional != expected:
                unexercised = (
                    f"{site.describe()} passes {site.shape.describe()}; npudoctor makes this call with "
                    f"{expected} positional argument{'s' if expected > 1 else ''} (indices"
                    f"{', preceded by the offloaded copy' if expected > 1 else ''})"
                )
            for keyword in site.scoped.call.keywords:
                if keyword.arg is None:
                    notes.append(f"{site.where()} also spreads **{ast.unparse(keyword.value)}: not exercised")
                    continue
                values[keyword.arg], note = _keyword_value(
                    keyword.arg, ast.unparse(keyword.value), mamba_index
                )
                notes += [note] if note else []
            entries.append(_Entry(site, values, notes, unexercised))
        return entries

    def _exercise(self, allocator: Any, top: Any, mamba_index: Any) -> tuple[list[_Run], str | None, Any]:
        """The scheduler's get_cpu_copy, the slots overwritten, its load_cpu_copy; per keyword set."""
        import torch

        page = top.page_size
        slots = torch.tensor([p * page + (o if o >= 0 else page + o) for p, o in _SLOTS], dtype=torch.int64)
        slots = slots[(slots > 0) & (slots < top.size)]
        entries = self._entries(mamba_index)
        gets = [e for e in entries if e.method == "get_cpu_copy"]
        loads = [e for e in entries if e.method == "load_cpu_copy"]
        runs: list[_Run] = []
        mismatch, snapshot = None, None
        for index in range(max(len(gets), len(loads))):
            snapshot = SlotSnapshot.take(allocator, slots, mamba_index, seed=index)
            saved = None
            if gets:
                get = _call(allocator, gets[index % len(gets)], (slots,))
                runs.append(get)
                saved = host_copy(get.result)
                if get.error is not None:
                    saved, note = _payload_without_keywords(top, slots)
                    get.payload_note = note
            snapshot.scramble(allocator)
            if loads:
                load = _call(allocator, loads[index % len(loads)], (saved, slots))
                runs.append(load)
                if load.error is None and not any(r.error for r in runs) and mismatch is None:
                    mismatch = snapshot.mismatch(allocator)
        return runs, mismatch, snapshot

    # ----- judging what happened ------------------------------------------------------------------
    def _judge(self, run: _Run) -> tuple[list[_Finding], list[Evidence]]:
        findings = [self._refused(run, c) for c in run.calls if c.bind_error]
        binding, keyword = binding_keyword(run.error) if run.error else (False, None)
        if binding and not findings:  # refused by a call the recorder does not see (a super() hand-over)
            findings.append(self._refused_unrecorded(run, keyword))
        findings += self._drops(run)
        if run.entry.unexercised:
            evidence = Evidence(
                f"{run.entry.method} called the way the installed scheduler calls it",
                f"{run.entry.unexercised}: the live call differs from the installed one{_LIVE}",
                run.entry.location(),
            )
            findings.append(_Finding(Status.WARN, evidence, run.entry.method, "caller shape not recognised"))
        notes = []
        if run.error is not None and not binding:
            notes.append(self._copy_raised(run))
        return findings, notes

    def _refused(self, run: _Run, call) -> _Finding:
        refused = [k for k in call.keywords if not accepts(call.function, k)]
        error = str(run.error) if run.error is not None else call.bind_error
        caller = call.caller or run.entry.location()
        by = f"{caller.path}:{caller.line} ({caller.symbol})" if call.caller else run.entry.describe()
        where = call.location()
        observed = (
            f"{by} calls {call.resolved} "
            + (f"({where.path}:{where.line}: def {signature_of(call.function)}) " if where else "")
            + f"with {call.received()} -> TypeError: {error}; raised at {caller.path}:{caller.line}"
            + run.payload_note
            + _LIVE
        )
        expected = f"{call.resolved} accepts what its caller passes" + (
            f", including {', '.join(k + '=' for k in refused)}" if refused else ""
        )
        kind = f"TypeError ({', '.join(k + '=' for k in refused)})" if refused else "TypeError"
        return _Finding(Status.FAIL, Evidence(expected, observed, caller), call.owner.__name__, kind)

    def _refused_unrecorded(self, run: _Run, keyword: str | None) -> _Finding:
        where = raising_location(run.error) or run.entry.location()
        last = run.calls[-1] if run.calls else None
        subject = last.owner.__name__ if last else run.entry.method
        observed = (
            f"{run.entry.describe()}; {where.path}:{where.line} ({where.symbol}) raised "
            f"TypeError: {run.error}{_LIVE}"
        )
        expected = f"every {run.entry.method} on the chain accepts the keywords passed down to it"
        kind = f"TypeError ({keyword}=)" if keyword else "TypeError"
        return _Finding(Status.FAIL, Evidence(expected, observed, where), subject, kind)

    def _drops(self, run: _Run) -> list[_Finding]:
        """Keywords a level received and neither used nor passed on, while the next level accepts them."""
        findings = []
        for call in run.calls:
            if call.parent is None or call.bind_error:
                continue
            parent = run.calls[call.parent]
            for keyword in parent.keywords:
                if keyword in call.keywords or not accepts(call.function, keyword):
                    continue
                if reads(parent.function, keyword) is not False:
                    continue  # the parent consumes it itself (a composite), or its source is unreadable
                findings.append(self._drop(run, parent, call, keyword))
        return findings

    def _drop(self, run: _Run, parent, call, keyword: str) -> _Finding:
        used = reads(call.function, keyword)
        status = Status.FAIL if used else Status.WARN
        where = call.caller or parent.location()
        why = (
            f"{call.resolved} reads {keyword}, so what it copies changes"
            if used
            else f"{call.resolved} accepts {keyword} and ignores it today"
        )
        observed = (
            f"{parent.resolved} received {parent.received()} ({run.entry.site.where()}), never reads "
            f"{keyword}, and at {where.path}:{where.line} called {call.resolved} with {call.received()}: "
            f"{keyword}= dropped; {why}{_LIVE}"
        )
        evidence = Evidence(f"{parent.resolved} passes {keyword}= on to {call.resolved}", observed, where)
        note = "" if used else "the next level ignores it today"
        return _Finding(status, evidence, parent.owner.__name__, f"drops {keyword}=", note)

    def _copy_raised(self, run: _Run) -> Evidence:
        where = raising_location(run.error)
        levels = "; ".join(f"{c.resolved} received {c.received()}" for c in run.calls)
        observed = (
            f"{run.entry.describe()}; every level bound its call ({levels}), then the copy itself raised "
            f"{type(run.error).__name__}: {run.error}"
            + (f" at {where.path}:{where.line}" if where else "")
            + run.payload_note
            + ": the CPU round trip is NPD001's property, not a signature defect"
            + _LIVE
        )
        return Evidence(
            f"{run.entry.method} through the real chain with the installed callers' keywords", observed, where
        )

    def _delivered(self, run: _Run) -> Evidence:
        levels = "; ".join(
            f"{c.resolved}"
            + (f" ({c.location().path}:{c.location().line})" if c.location() else "")
            + f" received {c.received()}"
            for c in run.calls
        )
        notes = "".join(f"; {n}" for n in run.entry.notes)
        return Evidence(
            expected=f"{run.entry.method}: every level receives the keywords its caller passes",
            observed=f"{run.entry.describe()}; delivered at each level: {levels}{notes}{_LIVE}"
            + _sampled(self.facts.model),
            location=run.entry.location(),
        )

    def _round_trip_ok(self, allocator: Any, snapshot: Any) -> Evidence:
        name = type(allocator).__name__
        mamba = f" and mamba slot {int(snapshot.mamba_slot)}" if snapshot.mamba_slot is not None else ""
        return Evidence(
            expected=f"{name}: the offloaded token slots come back after get_cpu_copy/load_cpu_copy",
            observed=(
                f"{len(snapshot.slots)} token slots{mamba} of {snapshot.buffers} buffer(s), every layer, "
                f"offloaded, overwritten and reloaded through {name}: every bit came back{_LIVE}"
                + _sampled(self.facts.model)
            ),
        )

    def _mismatch(self, allocator: Any, mismatch: str) -> _Finding:
        name = type(allocator).__name__
        evidence = Evidence(
            expected=f"{name}: the offloaded token slots come back after get_cpu_copy/load_cpu_copy",
            observed=f"every call bound, but {mismatch}: the chain returns without copying what it was asked{_LIVE}",
        )
        return _Finding(Status.WARN, evidence, name, "slots do not come back")

    def _unreached(self, runs: list[_Run], sub: ClassInfo | None) -> list[_Finding]:
        """A composite's sub-pool the chain never reached, although no level raised: its keywords are
        unverified. (A level that raised, e.g. a composite without offload support, is reported.)"""
        if sub is None or any(c.owner.__name__ == sub.name for r in runs for c in r.calls):
            return []
        if any(r.error is not None for r in runs):
            return []
        evidence = Evidence(
            expected=f"the offload calls reach {sub.name} below the composite pool",
            observed=f"no call reached {sub.name}: its keywords could not be verified{_LIVE}",
        )
        return [_Finding(Status.WARN, evidence, sub.name, "not reached")]

    def _refused_elsewhere(self, runs: list[_Run], sub: ClassInfo | None) -> list[_Finding]:
        """The NPU pool below a composite is called by the composite, without keywords, so it binds
        here; but it is an allocator's pool elsewhere, and the allocator passes keywords. Bind
        those to its real signature too: where they do not bind, it is a ``warn`` (a class this
        deployment builds, refusing calls this deployment does not make), as the static depth says."""
        if sub is None:
            return []
        findings = []
        for run in runs:
            handed = [c for c in run.calls if c.parent is not None and run.calls[c.parent].parent is None]
            below = [c for c in run.calls if c.owner.__name__ == sub.name]
            if not handed or not below:
                continue
            top, call = handed[0], below[0]
            refused = [k for k in top.keywords if not accepts(call.function, k)]
            if not refused:
                continue
            where, by = call.location(), top.caller
            observed = (
                f"{call.resolved} ({where.path}:{where.line}: def {signature_of(call.function)}) "
                f"has no {', '.join(k + '=' for k in refused)}, which {by.path}:{by.line} ({by.symbol}) "
                f"passes to the pool an allocator holds; here {top.qualname} holds it and called it with "
                f"{call.received()}, so this deployment's retraction binds{_LIVE}"
                if where and by
                else f"{call.resolved} has no {', '.join(k + '=' for k in refused)}{_LIVE}"
            )
            evidence = Evidence(
                f"{call.resolved} accepts the keywords allocators pass to their pool", observed, where
            )
            findings.append(
                _Finding(
                    Status.WARN,
                    evidence,
                    sub.name,
                    f"TypeError ({', '.join(k + '=' for k in refused)})",
                    "not on the calls this deployment makes",
                )
            )
        return findings[:1] + [f for f in findings[1:] if f.kind != findings[0].kind]

    def _cannot_build(
        self, allocator: ClassInfo, top: ClassInfo, sub: ClassInfo | None, reason: str
    ) -> _Finding:
        chain = " -> ".join(c.name for c in (allocator, top, sub) if c is not None)
        evidence = Evidence(
            expected=f"{chain} built on CPU with this deployment's dimensions",
            observed=f"cannot build it: {reason}; its keywords are not verified live",
            location=Location(top.relpath, top.line, top.name),
        )
        return _Finding(Status.WARN, evidence, top.name, "not built on CPU")


def _live_class(info: ClassInfo) -> type:
    """The loaded class the static graph names (its module was imported by ``live_imports``)."""
    module = sys.modules.get(info.module)
    cls = getattr(module, info.name, None) if module is not None else None
    if not isinstance(cls, type):
        raise CannotBuild(f"{info.name} is not loaded from {info.module}")
    return cls


def _call(allocator: Any, entry: _Entry, positional: tuple) -> _Run:
    """``allocator.<method>(*positional, **entry.values)`` with every level recorded."""
    run = _Run(entry, [])
    with recording(allocator) as calls:
        try:
            run.result = getattr(allocator, entry.method)(*positional, **entry.values)
        except Exception as error:  # the evidence: what the first retraction would raise
            run.error = error
    run.calls = list(calls)
    return run


def _payload_without_keywords(pool: Any, slots: Any) -> tuple[Any, str]:
    """A payload for load_cpu_copy when the chain's get_cpu_copy raised: the pool's own copy of the
    slots, called as the allocator's oldest callers did (no keywords)."""
    try:
        return pool.get_cpu_copy(slots), (
            f"; load_cpu_copy's payload came from {type(pool).__name__}.get_cpu_copy(indices) without keywords"
        )
    except Exception as error:
        return None, (
            f"; load_cpu_copy ran with no payload ({type(pool).__name__}.get_cpu_copy raised "
            f"{type(error).__name__} without keywords too)"
        )


def _keyword_value(name: str, expression: str, mamba_index: Any) -> tuple[Any, str]:
    """The value a decode server passes for ``name=<expression>``: the request's mamba slot
    (None unless the model has mamba state), its row in the request-to-token pool (0 here), or
    None for a keyword npudoctor has no value for (said in the evidence)."""
    text = f"{name} {expression}".lower()
    if "mamba" in text:
        return mamba_index, ""
    if "req_pool" in text:
        return 0, ""
    return None, f"{name}={expression}: no value known to npudoctor, passed None"


def import_path_modules() -> None:
    """NPD005's ``live_imports``: the modules of the static path's classes, for any deployment."""
    from npudoctor.live import livepools

    livepools.import_pool_modules()
    graph = _graph(processstate.imported_tree())
    for sliding, hybrid in ((False, False), (True, True)):
        for cls in graph.path(["mla", "mha"], sliding, hybrid).classes():
            importlib.import_module(cls.module)


def _sampled(model: ModelFacts | None) -> str:
    from npudoctor.live import livepools

    return livepools.sampled_note(model)
