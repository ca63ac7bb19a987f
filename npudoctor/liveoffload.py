"""Drive a decode server's real KV offload chain on CPU and record what every level receives.

When a PD decode server retracts a request it calls
``token_to_kv_pool_allocator.get_cpu_copy(indices, <keywords>)``; the allocator calls its
pool (``self._kvcache``), a composite pool (``HybridLinearKVPool``, ``SWAKVPool``) calls its
sub-pools. A keyword is lost or refused somewhere on that chain in some releases
(https://github.com/sgl-project/sglang/pull/24026: the SWA pool and allocator lacked
``mamba_indices``; 0.5.13's NPU pools did too). This module answers, for real objects:
which method ran at each level, which keywords it received, from which sglang line, and
whether Python could bind them. It records by shadowing each instance's offload methods
with a recorder for the duration of the calls (``recording``), never by editing classes,
so ``super()`` hand-overs inside a level run untouched.

The questions of the property (is a refused keyword a TypeError on the first retraction,
does a dropped keyword matter to the next level) belong to the check (NPD005).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from npudoctor.facts import ModelFacts, RoleFacts
from npudoctor.livepools import CannotBuild, construct
from npudoctor.results import Location
from npudoctor.signatures import names_read

OFFLOAD_METHODS = ("get_cpu_copy", "load_cpu_copy")
# How deep below the allocator the recorder looks for objects with offload methods:
# allocator -> pool -> sub-pool (-> a sub-pool's own component).
_MAX_DEPTH = 4
# The messages CPython raises when a call does not bind (the callee never ran a line).
_BINDING = re.compile(
    r"got an unexpected keyword argument '(?P<unexpected>\w+)'"
    r"|got multiple values for argument '(?P<multiple>\w+)'"
    r"|missing \d+ required (?:positional |keyword-only )?arguments?: (?P<missing>.+)"
    r"|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ (?:was|were) given"
)


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
        return function_location(self.function)

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

    from npudoctor.livepools import build_pool

    config = model_config(model)
    cache_params = _with_attention_tp(role.tp_size, lambda: config.mamba2_cache_params)
    full_layers = [int(i) for i in config.full_attention_layer_ids]
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
    from pathlib import Path

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
    runtime = sys.modules.get("sglang.srt.runtime_context")
    values: dict[str, Any] = {}
    try:
        while True:
            try:
                if runtime is None or not hasattr(runtime, "get_parallel"):
                    return read()
                with runtime.get_parallel().override(**values):
                    return read()
            except (ValueError, RuntimeError) as error:
                name = _unpublished_parallel_name(error)
                if name is None or name in values or len(values) > 16:
                    raise
                values[name] = _parallel_value(name, tp_size)
    except Exception as error:
        raise CannotBuild(
            f"the model's mamba state shape needs sglang's parallel state: {type(error).__name__}: {error}"
        ) from error
    finally:
        if saved is not None:
            module.get_attention_tp_size = saved


def _unpublished_parallel_name(error: BaseException) -> str | None:
    """The parallel value sglang's runtime context was asked for and does not have: named in the
    message, or the ``name`` its reader was called with."""
    named = re.search(r"parallel (?:name|width) '(\w+)'", str(error))
    if named:
        return named.group(1)
    if "not published" not in str(error):
        return None
    frames = list(traceback.walk_tb(error.__traceback__))
    for frame, _ in reversed(frames):
        if frame.f_code.co_name == "_read" and isinstance(frame.f_locals.get("name"), str):
            return frame.f_locals["name"]
    return None


def _parallel_value(name: str, tp_size: int) -> Any:
    """This single rank's view: attention TP is the role's TP size, switches off, ranks 0, other widths 1."""
    if name in ("tp_size", "attn_tp_size"):
        return tp_size
    if name.startswith(("enable_", "use_")):
        return False
    return 0 if "rank" in name else 1


def mamba_slot(pool: Any) -> Any:
    """A request's mamba slot in ``pool``'s mamba pool, allocated the way the scheduler does
    (``Req.mamba_pool_idx``: one element of what ``MambaPool.alloc`` returns); None without one."""
    mamba = getattr(pool, "mamba_pool", None)
    if mamba is None:
        return None
    import torch

    allocated = mamba.alloc(1) if hasattr(mamba, "alloc") else None
    return allocated[0] if allocated is not None and len(allocated) else torch.tensor(1)


# ----- what a function does with a keyword ------------------------------------------------
def accepts(function: Callable[..., Any], keyword: str) -> bool:
    """Python would bind ``keyword=`` to ``function``: a named parameter or ``**kwargs``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return True  # a builtin or C function: nothing to tell
    named = parameters.get(keyword)
    if named is not None:
        return named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY)
    return any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def reads(function: Callable[..., Any], keyword: str) -> bool | None:
    """The function's body uses the value of ``keyword=`` (the parameter, or the ``**kwargs``
    dict that would hold it); None when its source cannot be read."""
    node = _function_node(function)
    if node is None:
        return None
    arguments = node.args
    named = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    if keyword in named:
        local = keyword
    elif arguments.kwarg is not None:
        local = arguments.kwarg.arg
    else:
        return False
    return local in names_read(node)


def _function_node(function: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    try:
        module = ast.parse(source)
    except SyntaxError:
        return None
    node = module.body[0] if module.body else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def signature_of(function: Callable[..., Any]) -> str:
    name = getattr(function, "__name__", "?")
    try:
        return f"{name}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return f"{name}(...)"


# ----- where things are, in sglang's own terms --------------------------------------------------
def sglang_location(filename: str, line: int, symbol: str = "") -> Location | None:
    """``sglang/...`` relative to the directory holding the package; None outside sglang."""
    marker = "/sglang/"
    if marker not in filename:
        return None
    return Location(filename[filename.rindex(marker) + 1 :], line, symbol)


def function_location(function: Callable[..., Any]) -> Location | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return sglang_location(code.co_filename, code.co_firstlineno, getattr(function, "__qualname__", ""))


def frame_location(frame: Any) -> Location | None:
    code = frame.f_code
    return sglang_location(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))


def raising_location(error: BaseException) -> Location | None:
    """The last sglang frame the exception passed through: for a call that did not bind,
    the line that made the call."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/sglang/" in f.filename]
    if not frames:
        return None
    last = frames[-1]
    return sglang_location(last.filename, last.lineno or 0, last.name)


def binding_keyword(error: BaseException) -> tuple[bool, str | None]:
    """Whether ``error`` is CPython refusing to bind a call, and the keyword it names, if any."""
    if not isinstance(error, TypeError):
        return False, None
    match = _BINDING.search(str(error))
    if match is None:
        return False, None
    keyword = match.group("unexpected") or match.group("multiple")
    return True, keyword


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

        from npudoctor.livepools import kv_buffers, token_rows

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
