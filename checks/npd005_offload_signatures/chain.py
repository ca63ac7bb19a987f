"""NPD005 over every call the offload path makes, not only the two copy methods: sglang#24026
changed what the offload path passes and calls below them too.

A retraction on a PD decode server runs more than ``get_cpu_copy``/``load_cpu_copy``: the
scheduler's offload functions (``Req.offload_kv_cache``/``load_kv_cache`` in 0.5.1x-0.5.2x)
ask the allocator for its pool (``get_kvcache()``) and read flags on it
(``cpu_copy_carries_mamba``), the allocator forwards to its pool, a composite pool translates
locations (``_mamba_translate``, ``translate_loc_from_full_to_swa``, ``_filter_swa_cpu_copy``)
and calls its sub-pools and its mamba pool, and the NPU pools call their own helpers
(``_chunk_copy_npu_to_cpu``, ``_get_cpu_offload_layer_buffers``, ``_copy_indices_for_buffer``).
Each of those calls must bind to the method the class the deployment builds resolves it to
(through that class's MRO, so an NPU subclass's override counts, and a helper an NPU
subclass redefines with another arity is caught), and every attribute read there must exist.

This module walks that call graph statically with ``npudoctor.static.walker.PathWalker`` (in
call order; ``_OffloadCalls`` is its visitor), from the installed source: the entry points are
the functions that call ``get_cpu_copy``/``load_cpu_copy`` on the allocator (and the ``self``
helpers they call), the receivers are typed by the deployment's path (``_Path``: the allocator
the decode role builds, the pool it holds in ``self._kvcache``, the NPU pools a composite
holds, the ``MambaPool`` a hybrid model adds), and every edge records the caller's
``file:line``, the callee's ``def`` as resolved, and the ``TypeError`` CPython would raise
binding it (``bind_errors``). The live probe binds the same edges to the imported classes'
real signatures (``bind_live``)."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from npudoctor.results import Evidence, Location
from npudoctor.static.classdefs import has_dynamic_attributes, instance_names
from npudoctor.static.poolclasses import OFFLOAD_METHODS
from npudoctor.static.signatures import CallShape, bind_errors, is_super_call, method_calls, self_attribute
from npudoctor.static.source import ClassInfo, FunctionRef, own_nodes
from npudoctor.static.walker import Frame, PathWalker, base_call, super_target

ENTRY, ALLOC, POOL, SUB, MAMBA = "scheduler", "allocator", "pool", "sub-pool", "mamba pool"
# How many calls deep below the scheduler's offload functions the walk follows.
_MAX_DEPTH = 6


@dataclass(eq=False)
class Edge:
    """One call on the offload path, with what the deployment's class resolves it to."""

    where: str  # caller's relpath:line
    caller: str  # Class.method (or function) making the call
    text: str  # the call as written
    method: str
    shape: CallShape | None  # None: an attribute read, not a call
    receiver: ClassInfo  # the class the deployment builds at the callee's level
    level: str
    callee: FunctionRef | None
    errors: list[str] = field(default_factory=list)
    how: str = "self"  # "self", "super", "Base", "attr"
    start: int = 0  # MRO position the lookup starts from (super()/Base.m(self))

    def callee_text(self) -> str:
        if self.callee is None:
            return f"{self.receiver.name}.{self.method} (not defined)"
        node = self.callee.node
        return f"{self.callee.qualname}({ast.unparse(node.args)}) ({self.callee.where()})"


@dataclass
class Chain:
    edges: list[Edge] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)  # the scheduler functions walked from
    unresolved: list[str] = field(default_factory=list)  # receivers the walk could not type

    def failing(self) -> list[Edge]:
        return [e for e in self.edges if e.errors]


def walk(graph, path, hybrid: bool, allocator_calls: bool = True) -> Chain:
    """Every call the offload path makes from the scheduler's offload functions down to the
    NPU pools, on the classes ``path`` names; with ``allocator_calls``, also every call the
    scheduler side makes on the allocator it holds (the retraction frees the request's slots,
    the resume allocates new ones: ``free``, ``free_segment``, ``alloc_extend``, ...), followed
    into the allocator's own methods as the deployment's allocator class resolves them."""
    chain = Chain()
    calls = _OffloadCalls(graph, path, hybrid, chain)
    for site in graph.sites:
        if site.family != "allocator" or site.scoped.function is None:
            continue
        calls.entry(site)
    if allocator_calls and path.allocators:
        calls.allocator_calls()
    return chain


# Receivers through which the scheduler side holds the deployment's token-to-KV allocator.
_HOLDER = "token_to_kv_pool_allocator"
# Where a retraction and its resume run on a PD decode server: the request's release and backup
# (managers/schedule_batch.py, mem_cache/common.py), the tree caches that free its slots
# (mem_cache/*_cache.py), the decode scheduler's resume that allocates new ones
# (disaggregation/decode.py). Only files that call the allocator by its holder's name are parsed.
_SCHEDULER_SIDE = re.compile(r"srt/(managers/schedule_batch|disaggregation/decode|mem_cache/[a-z_]+)\.py$")


class _OffloadCalls:
    """The visitor of the offload path's walk: types the receivers by the deployment's path and
    records every call (``Edge``) with what the deployment's class resolves it to. The walk runs in
    call order, so the edges come out in the order a retraction makes the calls."""

    def __init__(self, graph, path, hybrid: bool, chain: Chain):
        self.graph, self.path, self.hybrid, self.chain = graph, path, hybrid, chain
        self.tree = graph.tree
        self.walker = PathWalker(self.visit, max_depth=_MAX_DEPTH, in_call_order=True)
        self.entered: set[int] = set()
        self._mamba: list[ClassInfo] | None = None

    # ----- receivers -----------------------------------------------------------------------
    def mamba_classes(self) -> list[ClassInfo]:
        if self._mamba is None:
            self._mamba = list(self.tree.find_classes("MambaPool", under="srt")) if self.hybrid else []
        return self._mamba

    def attribute_classes(self, cls: ClassInfo, level: str, attr: str) -> tuple[list[ClassInfo], str] | None:
        """What ``self.<attr>`` holds in a ``cls`` of the path, at ``level``."""
        if level == ALLOC and attr == "_kvcache":
            return self.path.tops, POOL
        if "mamba" in attr and attr.endswith("pool"):
            return self.mamba_classes(), MAMBA
        if level == POOL and self.path.subs and attr.endswith("kv_pool"):
            return self.path.subs, SUB
        return None

    def entry_receiver(self, node: ast.expr) -> tuple[list[ClassInfo], str] | None:
        """The classes a receiver in a scheduler offload function holds on this path."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get_kvcache" and "alloc" in ast.unparse(node.func.value).lower():
                return self.path.tops, POOL
            return None
        text = ast.unparse(node).lower()
        if text.endswith("mamba_pool"):
            return self.mamba_classes(), MAMBA
        if "allocator" in text.rsplit(".", 1)[-1]:
            return self.path.allocators, ALLOC
        return None

    def has(self, cls: ClassInfo, name: str) -> bool:
        """An instance of ``cls`` has ``name``, or the source cannot tell that it lacks it."""
        return name in instance_names(self.tree, cls) or has_dynamic_attributes(self.tree, cls)

    # ----- the scheduler side's calls on the allocator it holds --------------------------------
    def allocator_calls(self) -> None:
        """Calls ``<...>.token_to_kv_pool_allocator.m(...)`` (and ``allocator.m(...)`` where a
        function's parameter ``allocator`` is annotated as a token-to-KV allocator) in the scheduler,
        disaggregation and cache code, of a method the path's allocator has, bound to it. A call
        under an ``isinstance``/``hasattr`` test of its receiver serves another allocator class:
        not judged (the test decides, not the signature)."""
        names = set()
        for cls in self.path.allocators:
            for klass in self.graph.mro(cls):
                names |= {m for m in klass.methods if not m.startswith("__")}
        names -= set(OFFLOAD_METHODS)  # the copy methods' calls are judged by the entry walk
        if not names:
            return
        wanted = "|".join(sorted(re.escape(n) for n in names))
        held = re.compile(
            rb"\b(?:" + _HOLDER.encode() + rb"|allocator)\s*\.\s*(?:" + wanted.encode() + rb")\s*\("
        )
        before, files = len(self.chain.edges), []
        for file in self.tree.files_containing("allocator", under="srt"):
            relpath = self.tree.relpath(file)
            if not _SCHEDULER_SIDE.search(relpath):
                continue
            data = self.tree.read(file)
            lines = sorted({data.count(b"\n", 0, m.start()) + 1 for m in held.finditer(data)})
            if not lines:
                continue  # parse only files that call the allocator by its holder's name
            module = self.tree.parse(file)
            if module is None:
                continue
            for scoped in _scoped_calls(module, names, lines):
                receiver = scoped.receiver_text
                if not (receiver == _HOLDER or receiver.endswith("." + _HOLDER)) and not (
                    receiver == "allocator" and _annotated_allocator(scoped.function)
                ):
                    continue
                if _guarded(scoped.function, scoped.call, receiver):
                    continue
                where = scoped.function.name if scoped.function is not None else "<module>"
                owner = f"{scoped.class_node.name}." if scoped.class_node is not None else ""
                self._follow(
                    self.call(
                        relpath, f"{owner}{where}", scoped.call, scoped.method, (self.path.allocators, ALLOC)
                    )
                )
                files.append(relpath)
        if len(self.chain.edges) > before:
            self.chain.entries.append(
                f"the release and resume code's calls on {_HOLDER} ({', '.join(dict.fromkeys(files))})"
            )

    # ----- the walk ------------------------------------------------------------------------
    def entry(self, site) -> None:
        function = site.scoped.function
        if id(function) in self.entered:
            return
        self.entered.add(id(function))
        owner = f"{site.caller.name}." if site.caller else ""
        self.chain.entries.append(f"{owner}{function.name} ({site.relpath}:{function.lineno})")
        functions = [function]
        if site.caller is not None:  # the caller's own helpers (Req._mamba_pool_needing_backup)
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "self"
                ):
                    helper = site.caller.methods.get(node.func.attr)
                    if helper is not None and helper not in functions:
                        functions.append(helper)
        for func in functions:
            name = f"{owner}{func.name}"
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    typed = self.entry_receiver(node.func.value)
                    if typed is not None:
                        self._follow(self.call(site.relpath, name, node, node.func.attr, typed))
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    value = node.value
                    if (
                        isinstance(value, ast.Call)
                        and isinstance(value.func, ast.Attribute)
                        and value.func.attr == "get_kvcache"
                        and not _is_called(func, node)
                    ):
                        typed = self.entry_receiver(value)
                        if typed is not None:
                            self.read(site.relpath, name, node, typed)

    def _follow(self, callees: Iterator[Frame]) -> None:
        """Walk what a call made outside the walk (an entry's, the scheduler side's) runs."""
        for callee in callees:
            self.walker.walk(replace(callee, depth=1))

    def call(self, relpath, caller, node: ast.Call, method, typed) -> Iterator[Frame]:
        classes, level = typed
        shape = CallShape.of(node)
        for cls in classes:
            ref = self.tree.lookup(self.graph.mro(cls), method)
            yield from self.record(relpath, caller, node, method, shape, cls, level, ref, "attr", 0)

    def read(self, relpath, caller, node: ast.Attribute, typed) -> None:
        classes, level = typed
        for cls in classes:
            edge = Edge(
                f"{relpath}:{node.lineno}",
                caller,
                ast.unparse(node),
                node.attr,
                None,
                cls,
                level,
                None,
                [] if self.has(cls, node.attr) else [f"'{cls.name}' object has no attribute '{node.attr}'"],
            )
            self.chain.edges.append(edge)

    def record(self, relpath, caller, node, method, shape, cls, level, ref, how, start) -> Iterator[Frame]:
        """Record the call as an edge; yield what it runs, to be walked next."""
        if ref is None:
            if self.has(cls, method):
                return  # a callable attribute, or a name the source cannot tell
            errors = [f"'{cls.name}' object has no attribute '{method}'"]
        else:
            bound = not _is_static(ref.node)
            errors = bind_errors(ref.node, shape, bound=bound)
        edge = Edge(
            f"{relpath}:{node.lineno}",
            caller,
            _short(node),
            method,
            shape,
            cls,
            level,
            ref,
            errors,
            how,
            start,
        )
        self.chain.edges.append(edge)
        if ref is not None:
            yield Frame(ref, cls, level)

    def visit(self, frame: Frame) -> Iterator[Frame]:
        """The calls ``frame``'s function makes when it runs on an instance of its class."""
        ref, cls, level = frame.function, frame.self_cls, frame.state
        caller = ref.qualname
        for node in _own_calls(ref.node):
            func = node.func
            receiver, method = func.value, func.attr
            if isinstance(receiver, ast.Name) and receiver.id == "self":
                target = self.tree.lookup(self.graph.mro(cls), method)
                yield from self.record(
                    ref.relpath, caller, node, method, CallShape.of(node), cls, level, target, "self", 0
                )
            elif is_super_call(receiver):
                found = super_target(self.tree, cls, ref, method)
                if found is not None:
                    target, start = found
                    yield from self.record(
                        ref.relpath,
                        caller,
                        node,
                        method,
                        CallShape.of(node),
                        cls,
                        level,
                        target,
                        "super",
                        start,
                    )
            elif (found := base_call(self.tree, cls, ref, node)) is not None:
                target, start = found
                yield from self.record(
                    ref.relpath,
                    caller,
                    node,
                    method,
                    CallShape.of(node, skip_first=True),
                    cls,
                    level,
                    target,
                    "Base",
                    start,
                )
            else:
                attr = self_attribute(receiver)
                if attr is None:
                    continue
                typed = self.attribute_classes(cls, level, attr)
                if typed is None:
                    if method in OFFLOAD_METHODS:
                        self.chain.unresolved.append(f"{ref.where(node.lineno)}: self.{attr}.{method}")
                    continue
                yield from self.call(ref.relpath, caller, node, method, typed)


def _scoped_calls(module: ast.Module, names: set[str], lines: list[int]):
    return method_calls(module, frozenset(names), lines)


def _annotated_allocator(function) -> bool:
    if function is None:
        return False
    for arg in (*function.args.args, *function.args.kwonlyargs):
        if arg.arg == "allocator" and arg.annotation is not None:
            return "Allocator" in ast.unparse(arg.annotation)
    return False


def _guarded(function, call: ast.Call, receiver: str) -> bool:
    """``call`` sits in a branch of an ``if`` (or conditional expression) whose test asks
    ``isinstance``/``hasattr``/``getattr`` of the receiver: it serves some allocator classes only."""
    if function is None:
        return False
    for node in ast.walk(function):
        if not isinstance(node, (ast.If, ast.IfExp)):
            continue
        test = ast.unparse(node.test)
        if receiver not in test or not any(k in test for k in ("isinstance(", "hasattr(", "getattr(")):
            continue
        branches = [node.body, node.orelse] if isinstance(node, ast.IfExp) else [*node.body, *node.orelse]
        for branch in branches:
            if any(inner is call for inner in ast.walk(branch)):
                return True
    return False


def _own_calls(func) -> list[ast.Call]:
    """Method calls in ``func``'s own body (not in nested functions or classes), in source order."""
    return [n for n in own_nodes(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def _is_called(func, attribute: ast.Attribute) -> bool:
    return any(isinstance(n, ast.Call) and n.func is attribute for n in ast.walk(func))


def _is_static(node) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod"))
        for d in getattr(node, "decorator_list", [])
    )


def _short(node: ast.Call) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 110 else f"{ast.unparse(node.func)}({CallShape.of(node).describe()})"


# ----- what the probes report ------------------------------------------------------------------
def edge_location(edge: Edge) -> Location:
    """The callee's ``def`` where there is one (what a fix changes), else the caller's line."""
    if edge.callee is not None:
        return Location(edge.callee.relpath, edge.callee.line, edge.callee.qualname)
    path, _, line = edge.where.rpartition(":")
    return Location(path, int(line), edge.caller)


def chain_finding(edge: Edge, error: str | None = None, live: str = "") -> tuple[Evidence, str, str]:
    """``(evidence, subject, kind)`` of a call on the offload path that does not bind (or reads
    a name the class does not have): the caller's file:line, the callee's def, CPython's error."""
    error = error or edge.errors[0]
    if edge.shape is None:
        expected = f"{edge.receiver.name} (the {edge.level} this deployment builds) has {edge.method}"
        observed = f"{edge.where} ({edge.caller}) reads {edge.text} -> AttributeError: {error}"
        kind = f"AttributeError ({edge.method})"
    else:
        expected = (
            f"{edge.receiver.name}.{edge.method} (the {edge.level} this deployment builds) accepts "
            f"what {edge.caller} passes ({edge.shape.describe()})"
        )
        observed = f"{edge.where} ({edge.caller}) calls {edge.text}, which {edge.receiver.name} resolves to {edge.callee_text()}"
        if edge.callee is None:
            observed += f" -> AttributeError: {error}"
            kind = f"AttributeError ({edge.method})"
        else:
            observed += f" -> TypeError: {error}"
            kind = f"TypeError ({edge.method})"
        observed += " on the first retraction"
    return Evidence(expected, observed + live, edge_location(edge)), edge.receiver.name, kind


def chain_evidence(chain: Chain, live: str = "") -> list[Evidence]:
    """One line for a chain that binds throughout: the calls it checked, from which entry points."""
    if not chain.edges:
        return []
    calls = list(dict.fromkeys(f"{e.receiver.name}.{e.method}" for e in chain.edges))
    first = chain.edges[0]
    path, _, line = first.where.rpartition(":")
    return [
        Evidence(
            expected=(
                "every call the offload path makes (scheduler -> allocator -> pool -> sub-pools, "
                "helpers included) binds to what the deployment's classes resolve it to"
            ),
            observed=(
                f"{len(chain.edges)} call(s) from {', '.join(chain.entries)} bind: {', '.join(calls)}" + live
            ),
            location=Location(path, int(line), first.caller),
        )
    ]


# ----- live: the same edges bound to the imported classes' real signatures -----------------------
def bind_live(edge: Edge) -> tuple[str | None, object]:
    """``(TypeError message or None, the function)`` binding ``edge``'s call to what the imported
    class the deployment builds resolves it to (its real MRO). Raises LookupError when the
    class is not loaded."""
    module = sys.modules.get(edge.receiver.module)
    cls = getattr(module, edge.receiver.name, None) if module is not None else None
    if not isinstance(cls, type):
        raise LookupError(f"{edge.receiver.name} is not loaded from {edge.receiver.module}")
    if edge.how in ("super", "Base"):
        mro = cls.__mro__
        names = [c.__name__ for c in mro]
        owner = edge.callee.owner.name if edge.callee and edge.callee.owner else None
        klass = mro[names.index(owner)] if owner in names else None
        function = vars(klass).get(edge.method) if klass is not None else None
    else:
        function = inspect.getattr_static(cls, edge.method, None)
    if function is None:
        # not on the class: an instance attribute its constructor assigns (static found the
        # assignment and made no error), or missing (static found none either)
        return (f"'{cls.__name__}' object has no attribute '{edge.method}'" if edge.errors else None), None
    if edge.shape is None:
        return None, function
    static = isinstance(function, (staticmethod, classmethod))
    raw = function.__func__ if static else function
    if not callable(raw):
        return None, function
    try:
        signature = inspect.signature(raw)
    except (TypeError, ValueError):
        return None, function
    positional = [object()] * edge.shape.positional
    keywords = {k: None for k in edge.shape.keywords}
    if edge.shape.star_args or edge.shape.star_kwargs:
        return None, raw
    try:
        if static and isinstance(function, staticmethod):
            signature.bind(*positional, **keywords)
        else:
            signature.bind(object(), *positional, **keywords)
    except TypeError as error:
        return f"{edge.method}() {error}", raw
    return None, raw
