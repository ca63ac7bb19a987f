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

from npudoctor.facts import RoleFacts
from npudoctor.livepools import CannotBuild
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
    known: dict[str, Any] = {
        "size": pool.size,
        "size_swa": pool.size,
        "page_size": pool.page_size,
        "dtype": getattr(pool, "dtype", None),
        "device": "cpu",
        "kvcache": pool,
        "need_sort": role.disaggregation_mode in ("decode", "prefill"),
    }
    kwargs = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in known:
            kwargs[name] = known[name]
        elif parameter.default is inspect.Parameter.empty:
            raise CannotBuild(f"{cls.__name__}.__init__ needs {name!r}, which npudoctor cannot derive")
    return cls(**kwargs)


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
        return f"tensor{list(shape)}"
    return repr(value)


# ----- a light round trip: do the offloaded slots come back? ---------------------------------
@dataclass
class SlotSnapshot:
    """The raw bits of a few token slots in every per-layer KV buffer of the chain's pools."""

    slots: Any  # int64 tensor of token slots
    rows: dict[tuple[str, str, int], Any] = field(default_factory=dict)  # (pool, buffer, layer) -> bits

    @classmethod
    def take(cls, root: Any, slots: Any, seed: int = 0) -> SlotSnapshot:
        """Fill the slots with random bits in every buffer below ``root`` and remember them."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        snapshot = cls(slots)
        for _, rows in _slot_rows(root):
            noise = torch.randint(-(2**15), 2**15, (len(slots), rows.shape[1]), generator=generator)
            rows[slots] = noise.to(rows.dtype)
        # read back only after every buffer was filled: pools keep aliases (per-layer views of one
        # tensor, k_buffer beside k_buffer_tensor), and the last write to shared memory wins
        for key, rows in _slot_rows(root):
            snapshot.rows[key] = rows[slots].clone()
        return snapshot

    def scramble(self, root: Any) -> None:
        """Overwrite the slots with zeros (what the next user of those slots would do); idempotent,
        so aliased buffers end up zero too."""
        for _, rows in _slot_rows(root):
            rows[self.slots] = 0

    def mismatch(self, root: Any) -> str | None:
        """None when every slot of every layer holds its remembered bits again."""
        for key, rows in _slot_rows(root):
            wrong = (rows[self.slots] != self.rows[key]).any(dim=1).nonzero()
            if len(wrong):
                pool, buffer, layer = key
                return (
                    f"{pool}.{buffer} layer {layer}: {len(wrong)} of {len(self.slots)} reloaded slots hold "
                    f"other bits (first: slot {int(self.slots[int(wrong[0])])})"
                )
        return None

    @property
    def buffers(self) -> int:
        return len({(pool, buffer) for pool, buffer, _ in self.rows})


def _slot_rows(root: Any) -> Iterator[tuple[tuple[str, str, int], Any]]:
    from npudoctor.livepools import kv_buffers, token_rows

    for obj in offload_objects(root):
        if not hasattr(obj, "layer_num") or not hasattr(obj, "size"):
            continue
        tokens = obj.size + getattr(obj, "page_size", 1)
        for name, layers in kv_buffers(obj).items():
            for index, layer in enumerate(layers):
                yield (type(obj).__name__, name, index), token_rows(layer, tokens)
