"""The deployment's whole NPU path, read from the source: the classes a role builds on Ascend and
the functions they run, with the branches an Ascend host cannot take left out.

The deep checks each follow one path (NPD001 the retraction's CPU copy, NPD005 the offload calls,
NPD004 the CP prefill). The generic properties (``checks/npp00*``) ask one question of *every*
function a deployment runs on an NPU: does each attribute read resolve on the class built
(sglang#25249: ``NPUMLATokenToKVPool`` read ``self.kv_buffer`` it never defines), does each call
bind, is anything CUDA-only reachable (sglang#17453: a Qwen3 multimodal model imported vllm on
NPU), does a Triton grid that scales with tokens stay under Ascend's 65535 (sglang#23815). They
share this walk, so they judge the same path.

* **Roots** (``_root_classes``), per role: the model classes of the architectures in config.json;
  the attention backend the ascend backend builds (``AscendAttnBackend``, and for hybrid linear-
  attention models the NPU hybrid and GDN backends, or the generic ones releases before them ran on
  NPU); the NPU KV pool of the model's attention
  family (``poolclasses.npu_pool_classes``), the NPU paged allocator; the NPU graph runner unless
  ``--disable-cuda-graph``; the Ascend PD transfer classes for a PD role. All are found by name
  wherever a release keeps them; a root the release lacks is recorded in ``skipped``.
* **What they build**: the classes constructed on the way (``Class(...)`` in a constructor and in
  the ``lambda`` or closure it hands ``make_layers``; a class-valued parameter default, also one a
  subclass hands on; every class of a module-level table indexed there), transitively; an NPU-dead
  branch builds nothing.
* **What runs**: from each class's ``__init__`` and ``forward`` (``forward_npu`` when the class
  has one: sglang's platform dispatch runs it on NPU) and the methods the runtime calls on each
  root (``_ENTRY_METHODS``: attention, KV writes, allocation, graph capture and replay, the CPU copy
  of a role that retracts), the calls that run on NPU (``reachable_calls``) are
  followed through ``walker.CallResolver``, ``self.<module>(...)`` into that module's forward, and
  constructors into ``__init__``; at most ``MAX_DEPTH`` calls deep and ``MAX_FUNCTIONS`` functions.
* **Whether it always runs**: a frame's ``state`` is True when every call from its entry down to
  it sits outside any condition the source cannot decide (``unconditional_nodes``), so a property
  can tell "runs whenever the entry runs" from "runs if the data says so".
* **What an Ascend host cannot run** is left out: the other device's twins (``forward_cuda``,
  ``forward_hip``, ...), every branch ``npuguards.value_on_npu`` proves false on NPU, and what
  follows a statement that surely leaves its block there (``npuguards.ends_block``: the import
  after ``if not is_cuda(): return None``). What follows a statement that may return early is
  reached but not unconditional (``npuguards.may_return``).

The walk is flow-insensitive and over-approximates (every call of a function reached is taken as
made, a virtual call reaches every class the role builds that implements it), which is the sound
direction for a property that must not pass a crash; each property's triage over the wheels
(``tests/data/properties/``, ``scripts/property_triage.py``) is what keeps it free of false alarms.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.static.classdefs import attribute_classes
from npudoctor.static.dataflow import files_declaring_base as tree_files_declaring_base
from npudoctor.static.npuguards import catches, ends_block, may_return, until_end, value_on_npu
from npudoctor.static.poolclasses import GENERIC_POOL, npu_pool_classes, pool_family
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import CallResolver, Frame, PathWalker, method_on

MAX_DEPTH = 4
MAX_FUNCTIONS = 4000
MAX_BUILT_CLASSES = 600

# twins sglang's platform dispatch runs on other devices only
OTHER_DEVICE_METHOD = re.compile(r"(forward|_forward)_(cuda|hip|cpu|xpu|musa|hpu|mps|aiter|flashinfer)\w*")
# What the runtime calls on each root for every deployment of its kind (besides ``__init__`` and
# ``forward``): the model runner's attention calls (model_executor/model_runner.py,
# layers/radix_attention.py), the scheduler's KV allocation (managers/schedule_batch.py), the
# attention backends' KV writes and reads, the graph runner's capture and replay, and, for a role
# that retracts to host memory (a PD decode server), the CPU copy of the offload path
# (sglang#25249). A public method of a root that only another device's backend or an optional
# feature calls (``move_kv_cache``, ``get_raw_kv_buffer`` ...) is not an entry: the walk reaches it
# only if something on the path calls it.
_ENTRY_METHODS = {
    "attention": (
        "init_forward_metadata",
        "forward_extend",
        "forward_decode",
        "init_cuda_graph_state",
        "init_forward_metadata_capture_cuda_graph",
        "init_forward_metadata_replay_cuda_graph",
    ),
    "hybrid": ("init_forward_metadata", "forward_extend", "forward_decode"),
    "pool": ("set_kv_buffer", "get_key_buffer", "get_value_buffer", "get_kv_buffer"),
    "allocator": ("alloc", "free", "alloc_extend", "alloc_decode"),
    # replay/can_run through 0.5.20; the model runner calls can_run_graph/execute from 0.5.21
    # (model_executor/model_runner.py in 0.5.23)
    "graph": ("capture", "replay", "can_run", "can_run_graph", "execute"),
    "transfer": (),
    "model": ("load_weights",),
}
_OFFLOAD_METHODS = ("get_cpu_copy", "load_cpu_copy")
_KIND_OF = {
    "attention backend": "attention",
    "hybrid attention backend": "hybrid",
    "allocator": "allocator",
    "graph runner": "graph",
    "PD transfer": "transfer",
}
_ROOT_NAMES = {
    "attention": ("AscendAttnBackend",),
    "hybrid": ("AscendHybridLinearAttnBackend", "AscendGDNAttnBackend"),
    # before the Ascend hybrid backends (0.5.16), the generic ones ran on NPU
    # (layers/attention/attention_registry.py attn_backend_wrapper in 0.5.9: GDNAttnBackend)
    "hybrid-generic": ("HybridLinearAttnBackend", "GDNAttnBackend"),
    "allocator": ("NPUPagedTokenToKVPoolAllocator", "AscendPagedTokenToKVPoolAllocator"),
    "graph": ("NPUGraphRunner",),
    "transfer": ("AscendKVManager", "AscendKVSender", "AscendKVReceiver", "AscendTransferEngine"),
}


@dataclass
class RolePath:
    """One role's NPU path: the classes it builds, the functions it runs (each with the class it
    runs on), their modules, and what was left out and why."""

    role: RoleFacts | None
    name: str
    roots: list[ClassInfo] = field(default_factory=list)
    root_kinds: dict[int, str] = field(default_factory=dict)  # id(root) -> its kind in _ENTRY_METHODS
    classes: list[ClassInfo] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    modules: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


def role_paths(tree: SourceTree, facts: Facts) -> list[RolePath]:
    """The NPU path of every role of the deployment (memoised per tree and deployment). With no
    roles described, one server is assumed; with no model, the backend, both pool families, the
    allocator and the graph runner are walked, and the assumption is recorded."""
    memo = tree.memo.setdefault("npupath", {})
    key = repr(facts.to_dict())
    if key not in memo:
        roles: list[RoleFacts | None] = list(facts.roles) or [None]
        memo[key] = [_build(tree, facts, role) for role in roles]
    return memo[key]


def reachable_calls(frame: Frame) -> Iterator[ast.Call]:
    """The calls of a function that run on NPU: its own calls (lambdas included, nested
    functions not), outside every branch ``npuguards`` proves false on NPU."""
    for node in live_nodes(frame.function):
        if isinstance(node, ast.Call):
            yield node


def live_nodes(ref: FunctionRef) -> list[ast.AST]:
    """The nodes of a function body an Ascend host can run, in source order (memoised per tree):
    ``if``/``elif``/``else`` and conditional expressions are entered only on the sides
    ``value_on_npu`` does not prove false; a block ends at a statement that surely leaves it on NPU
    (``ends_block``: the code after ``if not is_cuda(): return`` is dead); nested functions and
    classes are not entered (a closure runs when it is called, and the walk follows that call)."""
    memo = ref.tree.memo.setdefault("npupath.live", {})
    key = id(ref.node)
    if key not in memo:
        tree, path = ref.tree, ref.path

        def cut(block: list[ast.stmt]) -> list[ast.stmt]:
            return until_end(
                block, lambda stmt: ends_block(stmt, lambda test: value_on_npu(tree, path, test))
            )

        found: list[ast.AST] = []
        stack: list[ast.AST] = list(cut(ref.node.body))
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            found.append(node)
            if isinstance(node, (ast.If, ast.IfExp)):
                stack.append(node.test)
                value = value_on_npu(tree, path, node.test)
                if value is not False:
                    stack.extend(cut(node.body) if isinstance(node.body, list) else [node.body])
                if value is not True:
                    stack.extend(cut(node.orelse) if isinstance(node.orelse, list) else [node.orelse])
                continue
            stack.extend(_children(node, cut))
        found.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        memo[key] = found
    return memo[key]


def unconditional_nodes(function: FunctionRef) -> list[ast.AST]:
    """The nodes of ``function`` that run every time it runs on NPU: outside ``if``/``while``
    bodies whose test is not known on NPU (a test known true or false keeps or drops its side),
    conditional expressions, the later operands of ``and``/``or``, exception handlers, ``try``
    bodies that catch ``AttributeError``, and what follows a statement that may return early
    (``may_return``); nested functions and classes are not entered."""
    memo = function.tree.memo.setdefault("npupath.unconditional", {})
    if id(function.node) in memo:
        return memo[id(function.node)]
    found: list[ast.AST] = []
    tree, path = function.tree, function.path

    def test_value(test: ast.expr) -> bool | None:
        return value_on_npu(tree, path, test)

    def cut(block: list[ast.stmt]) -> list[ast.stmt]:
        return until_end(block, lambda stmt: may_return(stmt, test_value) or ends_block(stmt, test_value))

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            visit(node.test)
            value = test_value(node.test)
            body = cut(node.body) if isinstance(node.body, list) else [node.body]
            orelse = cut(node.orelse) if isinstance(node.orelse, list) else [node.orelse]
            if value is True and not isinstance(node, ast.While):
                for child in body:
                    visit(child)
            elif value is False:
                for child in orelse:
                    visit(child)
            return
        if isinstance(node, ast.BoolOp):
            visit(node.values[0])
            return
        if isinstance(node, ast.Try):
            if not any(catches(h, "AttributeError") for h in node.handlers):
                for child in cut(node.body):
                    visit(child)
            for child in cut(node.finalbody):
                visit(child)
            return
        found.append(node)
        for child in _children(node, cut):
            visit(child)

    for stmt in cut(function.node.body):
        visit(stmt)
    memo[id(function.node)] = found
    return found


def _children(node: ast.AST, cut: Callable[[list[ast.stmt]], list[ast.stmt]]) -> Iterator[ast.AST]:
    """The child nodes of ``node`` (as ``ast.iter_child_nodes``), each statement list ``cut``."""
    for _, value in ast.iter_fields(node):
        if isinstance(value, list):
            items = cut(value) if value and isinstance(value[0], ast.stmt) else value
            yield from (item for item in items if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST):
            yield value


# ----- building one role's path -------------------------------------------------------------------
def _build(tree: SourceTree, facts: Facts, role: RoleFacts | None) -> RolePath:
    name = role.name if role is not None else "server (assumed)"
    path = RolePath(role, name)
    if role is None:
        path.assumptions.append("no roles given: assumed one server with the NPU defaults")
    path.roots = _root_classes(tree, facts, role, path)
    walked = tree.memo.setdefault("npupath.walked", {})
    key = (tuple(id(c) for c in path.roots), role is None or role.can_offload_kv)
    if key in walked:  # another role that builds the same classes (PD prefill and decode)
        path.classes, path.frames, path.modules = walked[key]
        return path
    built_memo = tree.memo.setdefault("npupath.built", {})
    if key[0] not in built_memo:
        built_memo[key[0]] = _built_classes(tree, path.roots)
    path.classes = built_memo[key[0]]
    built = {id(c) for c in path.classes}
    built_files = frozenset(str(c.path) for c in path.classes)
    resolver = CallResolver(
        tree, implementations=lambda klass: _npu_implementations(tree, klass, built, built_files)
    )
    frames: list[Frame] = []

    def visit(frame: Frame) -> Iterator[Frame]:
        frames.append(frame)
        always = {id(n) for n in unconditional_nodes(frame.function)} if frame.state else set()
        for call in reachable_calls(frame):
            unconditional = id(call) in always
            for callee in _callees(tree, resolver, frame, call, built):
                yield replace(callee, state=unconditional, key=unconditional)

    walker = PathWalker(visit, max_depth=MAX_DEPTH, max_functions=MAX_FUNCTIONS)
    offloads = role is None or role.can_offload_kv
    for cls in path.classes:
        for method in _entry_methods(tree, cls, path.root_kinds.get(id(cls)), offloads):
            walker.walk(Frame(method, cls, state=True, key=True))
    path.frames = frames
    modules = {f.function.path: None for f in frames}
    for cls in path.classes:
        modules.setdefault(cls.path, None)
    path.modules = list(modules)
    walked[key] = path.classes, path.frames, path.modules
    return path


def _root_classes(tree: SourceTree, facts: Facts, role: RoleFacts | None, path: RolePath) -> list[ClassInfo]:
    model = facts.model
    roots: list[ClassInfo] = []

    def named(kind: str, *names: str, required: bool = True) -> None:
        found = [c for n in names for c in tree.find_classes(n, under="srt")]
        if not found and required:
            path.skipped.append(f"{kind}: no class {' / '.join(names)} in this release")
        add(_KIND_OF[kind], found)

    def add(kind: str, classes: list[ClassInfo]) -> None:
        for cls in classes:
            path.root_kinds.setdefault(id(cls), kind)
        roots.extend(classes)

    if model is None:
        path.assumptions.append("no model config given: walked the NPU pools of both attention families")
    else:
        for arch in model.architectures:
            found = tree.find_classes(arch, under="srt/models")
            if not found:
                path.skipped.append(f"model: no class {arch} under sglang/srt/models in this release")
            add("model", found[:1])
    backend = role.attention_backend if role is not None else "ascend"
    if backend == "ascend":
        named("attention backend", *_ROOT_NAMES["attention"])
        if model is not None and model.hybrid_linear_layers:
            before = len(roots)
            named("hybrid attention backend", *_ROOT_NAMES["hybrid"], required=False)
            if len(roots) == before:
                named("hybrid attention backend", *_ROOT_NAMES["hybrid-generic"])
    families = [pool_family(model.attention)] if model is not None else ["mla", "mha"]
    for family in families:
        pools = npu_pool_classes(tree, family)
        exact = [
            c for c in pools if c.name in (f"NPU{GENERIC_POOL[family]}", f"Ascend{GENERIC_POOL[family]}")
        ]
        add("pool", exact or pools)
        if not pools:
            path.skipped.append(f"KV pool: no NPU subclass of {GENERIC_POOL[family]} in this release")
    named("allocator", *_ROOT_NAMES["allocator"])
    args = role.server_args if role is not None else {}
    if not args.get("disable_cuda_graph"):
        named("graph runner", *_ROOT_NAMES["graph"])
    if (
        role is not None
        and role.disaggregation_mode in ("prefill", "decode")
        and (role.transfer_backend in (None, "ascend"))
    ):
        named("PD transfer", *_ROOT_NAMES["transfer"], required=False)
    unique = {id(c): c for c in roots}
    return list(unique.values())


def _built_classes(tree: SourceTree, roots: list[ClassInfo]) -> list[ClassInfo]:
    """The roots and every class their constructors build on NPU, transitively (breadth first):
    in ``__init__`` itself and in the closures it defines (the ``get_layer`` it hands
    ``make_layers``), through a class-valued parameter default (``language_model_cls=...``) and a
    module-level table of classes (``ALL_DECODER_LAYER_TYPES[kind](...)``: every class in it)."""
    built: dict[int, ClassInfo] = {id(c): c for c in roots}
    queue = list(roots)
    while queue and len(built) < MAX_BUILT_CLASSES:
        cls = queue.pop(0)
        for klass in tree.mro(cls):
            init = klass.methods.get("__init__")
            if init is None:
                continue
            ref = FunctionRef.method(klass, init)
            scopes = [ref] + [
                FunctionRef(node, ref.path, tree, outer=ref)
                for node in ast.walk(init)
                if node is not init and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            for scope in scopes:
                for node in live_nodes(scope):
                    if not isinstance(node, ast.Call):
                        continue
                    for made in _constructed_classes(tree, scope, node, tree.mro(cls)):
                        if id(made) not in built:
                            built[id(made)] = made
                            queue.append(made)
    return list(built.values())


def _constructed(tree: SourceTree, ref: FunctionRef, call: ast.Call) -> ClassInfo | None:
    func = call.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else ast.unparse(func)
        if isinstance(func, ast.Attribute)
        else ""
    )
    if not name or not name.rpartition(".")[2][:1].isupper():
        return None
    return tree.resolve_name(ref.path, name)


def _constructed_classes(
    tree: SourceTree, ref: FunctionRef, call: ast.Call, mro: list[ClassInfo]
) -> list[ClassInfo]:
    """The classes a call in a constructor may build: a class named directly; a parameter whose
    default is a class, in this ``__init__`` or in a subclass's of the built class's MRO that hands
    it on (``Qwen3_5MoeForConditionalGeneration(language_model_cls=Qwen3_5MoeForCausalLM)`` into
    ``Qwen3VLForConditionalGeneration.__init__``); a local bound to an entry of a module-level dict
    of classes."""
    made = _constructed(tree, ref, call)
    if made is not None:
        return [made]
    func = call.func
    if not isinstance(func, ast.Name):
        return []
    scope: FunctionRef | None = ref
    while scope is not None:
        if func.id in {a.arg for a in scope.parameters}:
            found = []
            for klass in mro:
                init = klass.methods.get("__init__")
                default = _parameter_default(init, func.id) if init is not None else None
                if isinstance(default, (ast.Name, ast.Attribute)):
                    named = tree.resolve_name(klass.path, ast.unparse(default))
                    if named is not None and named not in found:
                        found.append(named)
            return found
        for node in ast.walk(scope.node):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == func.id for t in node.targets)
                and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.value, ast.Name)
            ):
                return _classes_in_table(tree, ref.path, node.value.value.id)
        scope = scope.outer
    return []


def _parameter_default(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.expr | None:
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults) :], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    return defaults.get(name)


def _classes_in_table(tree: SourceTree, path: Path, name: str) -> list[ClassInfo]:
    """The classes a module-level ``name = {key: Class, ...}`` of ``path`` holds."""
    module = tree.parse(path)
    for stmt in module.body if module is not None else []:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
            and isinstance(stmt.value, ast.Dict)
        ):
            found = [
                tree.resolve_name(path, ast.unparse(v))
                for v in stmt.value.values
                if isinstance(v, (ast.Name, ast.Attribute))
            ]
            return [c for c in found if c is not None]
    return []


def _dispatched_on_npu(tree: SourceTree, targets: list, built: set[int]) -> list:
    """Of a virtual call's implementations (the declared class and every subclass in the tree), the
    ones an NPU deployment runs: those of classes it builds, else the NPU/Ascend ones, else the
    declared class's own. Following every subclass would walk every quantisation method and
    CUDA backend of the release; none of them runs here. sglang's separate diffusion runtime
    (``sglang/multimodal_gen``) is never on an srt deployment's path."""
    targets = [t for t in targets if "/multimodal_gen/" not in str(t[0].path)]
    if len({id(t[1]) for t in targets}) <= 1:
        return targets
    for keep in (
        lambda t: t[1] is not None and id(t[1]) in built,
        lambda t: t[1] is not None and _is_npu_class(tree, t[1]),
    ):
        chosen = [t for t in targets if keep(t)]
        if chosen:
            return chosen
    return targets[:1]


def _npu_implementations(
    tree: SourceTree, klass: ClassInfo, built: set[int], built_files: frozenset[str]
) -> list[ClassInfo]:
    """The classes a call on a receiver declared as ``klass`` runs on in an NPU deployment: those
    of ``klass`` and its subclasses the role builds, else its NPU/Ascend subclasses, else ``klass``
    itself. Only files that can hold such a subclass are parsed (an NPU/Ascend path, or the file of
    a class the role builds): following every subclass parsed hundreds of CUDA backends and
    quantisation methods of a release, none of which an NPU deployment runs."""
    memo = tree.memo.setdefault("npupath.implementations", {})
    key = (id(klass), built_files)
    if key not in memo:
        index = tree_files_declaring_base(tree)
        candidates: list[ClassInfo] = []
        seen: set[int] = set()
        frontier = [klass]
        while frontier:
            parent = frontier.pop()
            for path in index.get(parent.name, ()):
                rel = path.lower()
                if "npu" not in rel and "ascend" not in rel and path not in built_files:
                    continue
                for cls in tree.classes_in(Path(path)):
                    if id(cls) not in seen and cls is not klass and klass in tree.mro(cls):
                        seen.add(id(cls))
                        candidates.append(cls)
                        frontier.append(cls)
        chosen = [c for c in (klass, *candidates) if id(c) in built]
        memo[key] = chosen or [c for c in candidates if _is_npu_class(tree, c)] or [klass]
    return memo[key]


def _is_npu_class(tree: SourceTree, cls: ClassInfo) -> bool:
    rel = tree.relpath(cls.path).lower()
    return cls.name.startswith(("NPU", "Ascend", "Npu")) or "/npu/" in rel or "ascend" in rel


def _entry_methods(
    tree: SourceTree, cls: ClassInfo, kind: str | None, offloads: bool
) -> Iterator[FunctionRef]:
    names = ["__init__", "forward_npu" if method_on(tree, cls, "forward_npu") else "forward"]
    if kind is not None:
        names += _ENTRY_METHODS[kind]
        if offloads and kind in ("pool", "allocator"):
            names += _OFFLOAD_METHODS
    for method in dict.fromkeys(names):
        found = method_on(tree, cls, method)
        if found is not None:
            yield found


def _callees(
    tree: SourceTree, resolver: CallResolver, frame: Frame, call: ast.Call, built: set[int]
) -> Iterator[Frame]:
    func = call.func
    if isinstance(func, ast.Attribute) and OTHER_DEVICE_METHOD.fullmatch(func.attr):
        return
    try:
        targets = resolver.resolve(frame.function, frame.self_cls, call)
    except (RecursionError, ValueError):
        targets = None
    if targets:
        for function, self_cls, _bound in _dispatched_on_npu(tree, targets, built):
            yield Frame(function, self_cls)
        return
    # self.<module>(...): nn.Module.__call__ runs the module's forward (forward_npu on NPU)
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and frame.self_cls is not None
    ):
        for klass in attribute_classes(tree, frame.self_cls, func.attr):
            for method in ("forward_npu", "forward"):
                found = method_on(tree, klass, method)
                if found is not None:
                    yield Frame(found, klass)
                    break
        return
    made = _constructed(tree, frame.function, call)
    if made is not None:
        init = method_on(tree, made, "__init__")
        if init is not None:
            yield Frame(init, made)
