"""Which definitions a call on an Ascend host's path reaches, and whether it binds to each: the
call binder of the static toolkit.

A property over calls (NPP004: every call binds to what it reaches) and any analysis that follows
one call to the code it runs ask the same two questions, answered here for one role's path (the
classes it builds). ``CallBinder.callees(frame, call)`` says which definitions one call reaches
on an Ascend host, each with the shape the definition receives and whether the receiver fills its
first parameter; ``CallBinder.judge(frame, call)`` binds the call to each of them as CPython would
(``signatures.bind_errors``). What a call reaches:

* names, ``self.m()``, ``super().m()``, ``Base.m(self)``, ``Class.m()``, module attributes and
  typed receivers, through ``walker.CallResolver``; a virtual call on a typed receiver reaches
  only the classes the role builds (``built``): the rest of the hierarchy is not on the path;
* ``self.<attr>(...)`` where the attribute holds a module the role builds: ``nn.Module.__call__``
  runs its ``forward`` (or the class's ``__call__``);
* ``Class(...)``: its ``__init__``, where the source settles which one runs (no decorator,
  metaclass, ``__new__`` or external base before it);
* through the platform dispatch of sglang's ops (``MultiPlatformOp``/``CustomOp``/``BaseFusedOp``:
  a ``forward(self, *args, **kwargs)`` in a class with ``forward_native``): ``forward_npu`` as
  the class resolves it, else ``forward_native``; and through pure forwarders
  (``def forward_npu(self, *args, **kwargs): return self.forward_native(*args, **kwargs)``).

Where the source cannot settle it, nothing is claimed: a decorator that may change the signature,
a method shadowed by an instance attribute of the same name, a local name that holds a callable,
a definition written twice (one per platform) whose live copies disagree, an ``@overload`` stub.
A ``*spread`` of a local assigned from a call whose every ``return`` is a tuple of one length, or
spread into a ``*_core*`` function whose ``*_prepare*`` partner returns such a tuple, counts as
that many positional arguments (Ascend/sglang#135, DeepSeek-V3.2 on NPU: ``forward_dsa_core_npu()
missing 1 required positional argument: 'v'``, called as ``forward_dsa_core_npu(self,
*inner_state)`` with what ``forward_dsa_prepare_npu`` returned); any other spread gets the benefit
of the doubt.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, replace

from npudoctor.static.dataflow import annotation_classes, module_function
from npudoctor.static.npuguards import value_on_npu
from npudoctor.static.npupath import live_nodes
from npudoctor.static.signatures import CallShape, bind_errors
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree, flatten_conditional
from npudoctor.static.walker import CallResolver, Frame, method_on

# decorators that leave a function's signature as written (by their last dotted name)
SIGNATURE_KEEPING = frozenset(
    {
        "abstractmethod",
        "override",
        "no_grad",
        "inference_mode",
        "compile",
        "lru_cache",
        "cache",
        "disable",  # torch._dynamo.disable / torch.compiler.disable
        "contextmanager",
        "asynccontextmanager",
        "wraps",
        "ignore",  # torch.jit.ignore
        "unused",
        "synchronized",
        "deprecated",
        "final",
        "annotate",  # nvtx.annotate
        "record_function",
    }
)
# the other devices' twins of an NPU method, by the NPU method's name
OTHER_DEVICE = re.compile(r"(forward|_forward)_(cuda|hip|cpu|xpu|musa|hpu|mps|aiter|flashinfer)\w*")
_MODULE_BASES = re.compile(r"(torch\.)?(nn\.)?Module")
MAX_FORWARDS = 4
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Callee:
    """One definition a call reaches: the function, the class it runs on, the shape it receives,
    whether the receiver fills its first parameter, and how it was reached (for the evidence)."""

    function: FunctionRef | None  # None: an alternative whose definition the source cannot settle
    self_cls: ClassInfo | None
    shape: CallShape
    bound: bool
    via: str = ""
    passed: tuple[FunctionRef, ...] = ()  # the dispatchers and forwarders on the way
    module: bool = False  # ``self.<attr>(...)``: a module called, its forward runs

    @property
    def chain(self) -> tuple[FunctionRef, ...]:
        """Every definition the call runs on the way to ``function``, ``function`` last."""
        return (*self.passed, self.function) if self.function is not None else self.passed


@dataclass(frozen=True)
class Mismatch:
    """A call that does not bind to a definition it reaches."""

    caller: FunctionRef
    call: ast.Call
    callee: Callee
    errors: tuple[str, ...]

    @property
    def line(self) -> int:
        return self.call.lineno


class CallBinder:
    """Resolves and binds the calls of one role's path. ``built``: the classes the role builds."""

    def __init__(self, tree: SourceTree, built: list[ClassInfo], resolver: CallResolver | None = None):
        self.tree = tree
        self.built = {id(c): c for c in built}
        self._built_key = frozenset(self.built)
        # a call on a receiver declared as a class runs on the classes of the role that derive from it
        self.resolver = resolver or CallResolver(tree, implementations=self.built_implementations)
        self._held: dict[tuple[int, str], list[ClassInfo]] = {}  # (class id, attribute) -> built classes

    def built_implementations(self, klass: ClassInfo) -> list[ClassInfo]:
        """The classes the role builds that are ``klass`` or derive from it."""
        memo = self.__dict__.setdefault("_implementations", {})
        if id(klass) not in memo:
            memo[id(klass)] = [b for b in self.built.values() if b is klass or klass in self.tree.mro(b)]
        return memo[id(klass)]

    # ----- judging -------------------------------------------------------------------------------
    def judge(self, frame: Frame, call: ast.Call, callees: list[Callee] | None = None) -> list[Mismatch]:
        """The mismatches of one call: the receiver holds one of the callees (alternatives: the
        classes a typed receiver may be), so the call is claimed to fail only when it fails on every
        one of them, and none is a definition the source cannot settle."""
        callees = self.callees(frame, call) if callees is None else callees
        if not callees or any(c.function is None for c in callees):
            return []
        found = []
        for callee in callees:
            errors = self.bind(callee)
            if not errors:
                return []
            found.append(Mismatch(frame.function, call, callee, tuple(errors)))
        return found

    def bind(self, callee: Callee) -> list[str]:
        """CPython's complaints binding ``callee.shape`` to the definition, or to every live copy of
        it when the source defines it more than once (a complaint only if every copy complains)."""
        copies = definitions(callee.function)
        if not copies:
            return []
        complaints = [bind_errors(node, callee.shape, bound=callee.bound) for node in copies]
        return complaints[0] if all(complaints) else []

    # ----- what a call reaches -------------------------------------------------------------------
    def callees(self, frame: Frame, call: ast.Call) -> list[Callee]:
        """What ``call`` in ``frame`` reaches (memoised per tree, for the roles that build the same
        classes)."""
        memo = self.tree.memo.setdefault("binding.callees", {})
        key = (self._built_key, id(call), id(frame.self_cls), id(frame.function.node))
        if key not in memo:
            memo[key] = self._callees(frame, call)
        return memo[key]

    def _callees(self, frame: Frame, call: ast.Call) -> list[Callee]:
        func = call.func
        if isinstance(func, ast.Attribute) and OTHER_DEVICE.fullmatch(func.attr):
            return []
        if isinstance(func, ast.Name) and is_local(frame.function, func.id):
            return []
        if (
            isinstance(func, ast.Name)
            and func.id in _BUILTINS
            and func.id not in module_names(frame.function)
        ):
            return []
        shape = self.shape(frame, call)
        direct = self._resolved(frame, call, shape)
        if direct is not None:
            return direct
        module = self._module_call(frame, call, shape)
        if module is not None:
            return module
        held = self._attribute_call(frame, call, shape)
        if held is not None:
            return held
        return self._constructor(frame, call, shape)

    def _resolved(self, frame: Frame, call: ast.Call, shape: CallShape) -> list[Callee] | None:
        targets = self._super_with_class(frame, call)
        if targets is None:
            try:
                targets = self.resolver.resolve(frame.function, frame.self_cls, call)
            except (RecursionError, ValueError):
                return []
        if targets is None:
            return None
        func = call.func
        receiver = func.value if isinstance(func, ast.Attribute) else None
        exact = receiver is None or _is_name(receiver, "self", "cls") or _is_super(receiver)
        found = []
        for function, self_cls, bound in targets:
            # Class.method(...): the resolver's answer for a class named by the receiver
            class_receiver = (
                isinstance(receiver, ast.Name) and self_cls is not None and self_cls.name == receiver.id
            )
            if (
                not exact
                and not class_receiver
                and bound
                and self_cls is not None
                and id(self_cls) not in self.built
            ):
                continue  # a virtual call: only the classes this role builds are on its path
            kind = kind_of(function)
            if (
                exact
                and _is_name(receiver, "self", "cls")
                and self_cls is not None
                and _shadowed(self.tree, self_cls, func.attr)  # self.m = ... somewhere: not the method
            ):
                kind = None
            if kind is None:
                found.append(Callee(None, self_cls, shape, False))
                continue
            if kind == "static":
                bound = False
            elif kind == "method" and class_receiver:
                bound = False  # Base.method(self, ...): the instance is passed explicitly
            found.append(self._forward(Callee(function, self_cls, shape, bound)))
        return found

    def _super_with_class(self, frame: Frame, call: ast.Call) -> list | None:
        """``super(Klass, self).m(...)``: the lookup starts after ``Klass`` in the MRO of the class
        built ([] when ``Klass`` is not in it); None for any other call."""
        func = call.func
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if not (_is_super(receiver) and len(receiver.args) == 2 and frame.self_cls is not None):
            return None
        named = receiver.args[0]
        if not isinstance(named, (ast.Name, ast.Attribute)):
            return []
        klass = self.tree.resolve_class(frame.function.path, ast.unparse(named))
        mro = self.tree.mro(frame.self_cls)
        if klass is None or klass not in mro:
            return []
        found = method_on(self.tree, frame.self_cls, func.attr, after=klass)
        return [] if found is None else [(found, frame.self_cls, True)]

    def _module_call(self, frame: Frame, call: ast.Call, shape: CallShape) -> list[Callee] | None:
        """``self.<attr>(...)`` on a module the role builds: its ``forward`` (``__call__``)."""
        func = call.func
        if not (
            isinstance(func, ast.Attribute) and _is_name(func.value, "self") and frame.self_cls is not None
        ):
            return None
        if method_on(self.tree, frame.self_cls, func.attr) is not None:
            return []  # a method the resolver could not follow (decorated, shadowed): not judged
        found = []
        for klass in self.attribute_built(frame.self_cls, func.attr):
            entry = method_on(self.tree, klass, "__call__")
            if entry is None and self._is_module(klass):
                entry = method_on(self.tree, klass, "forward")
            if entry is None or kind_of(entry) != "method":
                found.append(Callee(None, klass, shape, False, module=True))
                continue
            via = f"self.{func.attr}: {klass.name}"
            found.append(self._forward(Callee(entry, klass, shape, True, via=via, module=True)))
        return found

    def _attribute_call(self, frame: Frame, call: ast.Call, shape: CallShape) -> list[Callee] | None:
        """``self.<attr>.m(...)`` the resolver could not type: ``m`` on each class the role builds
        that ``self.<attr>`` may hold (``attribute_built``); None when the receiver is another."""
        func = call.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and _is_name(func.value.value, "self")
            and frame.self_cls is not None
        ):
            return None
        found = []
        for klass in self.attribute_built(frame.self_cls, func.value.attr):
            function = method_on(self.tree, klass, func.attr)
            kind = kind_of(function) if function is not None else None
            if kind is None or _shadowed(self.tree, klass, func.attr):
                found.append(Callee(None, klass, shape, False))
                continue
            via = f"self.{func.value.attr}: {klass.name}"
            found.append(self._forward(Callee(function, klass, shape, kind != "static", via=via)))
        return found

    def _constructor(self, frame: Frame, call: ast.Call, shape: CallShape) -> list[Callee]:
        func = call.func
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return []
        text = ast.unparse(func)
        if not text.rpartition(".")[2][:1].isupper():
            return []
        klass = self.tree.resolve_class(frame.function.path, text)
        if klass is None:
            return []
        init = self.initializer(klass)
        if init is None:
            return []
        return [Callee(init, klass, shape, True, via=f"{klass.name}(...)")]

    def initializer(self, klass: ClassInfo) -> FunctionRef | None:
        """The ``__init__`` that ``klass(...)`` runs, where the source settles it."""
        for member in self.tree.mro(klass):
            node = member.node
            if node.decorator_list or node.keywords or "__new__" in member.methods:
                return None
            if "__init__" in member.class_attributes and "__init__" not in member.methods:
                return None
            if "__init__" in member.methods:
                ref = FunctionRef.method(member, member.methods["__init__"])
                return ref if kind_of(ref) == "method" else None
            if any(isinstance(b, str) for b in self.tree.bases(member)):
                return None  # an external base may define it
        return None

    # ----- the platform dispatch and pure forwarders ---------------------------------------------
    def _forward(self, callee: Callee) -> Callee:
        """Follow the platform dispatch of sglang's ops and pure ``*args, **kwargs`` forwarders to
        the definition that receives the arguments (an unsettled one when that cannot be told)."""
        for _ in range(MAX_FORWARDS):
            node = callee.function.node
            if not is_spread_only(node) or callee.self_cls is None or not callee.bound:
                return callee
            shape = _drop_keywords(callee.shape, node)
            target = self._dispatched(callee) or self._forwarded_to(callee)
            if target is None:
                return callee  # takes anything: binds
            if kind_of(target) != "method":
                return replace(callee, function=None, passed=(*callee.passed, callee.function))
            callee = replace(
                callee,
                function=target,
                shape=shape,
                via=_via(callee.via, target),
                passed=(*callee.passed, callee.function),
            )
        return callee

    def _dispatched(self, callee: Callee) -> FunctionRef | None:
        """``forward(self, *args, **kwargs)`` of a platform-dispatched op: what runs on NPU."""
        if callee.function.name != "forward":
            return None
        klass = callee.self_cls
        native = method_on(self.tree, klass, "forward_native")
        if native is None:
            return None
        npu = method_on(self.tree, klass, "forward_npu")
        return npu if npu is not None else native

    def _forwarded_to(self, callee: Callee) -> FunctionRef | None:
        """``return self.<m>(*args, **kwargs)``: the method it hands everything to."""
        node = callee.function.node
        args, kwargs = node.args.vararg.arg, node.args.kwarg.arg
        targets = []
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and _is_name(sub.func.value, "self")
                and any(isinstance(a, ast.Starred) and _is_name(a.value, args) for a in sub.args)
                and any(k.arg is None and _is_name(k.value, kwargs) for k in sub.keywords)
            ):
                targets.append(sub.func.attr)
        if len(targets) != 1:
            return None
        return method_on(self.tree, callee.self_cls, targets[0])

    # ----- shapes --------------------------------------------------------------------------------
    def shape(self, frame: Frame, call: ast.Call) -> CallShape:
        """``CallShape.of(call)``, with a ``*spread`` of a local tuple of known length counted."""
        shape = CallShape.of(call)
        starred = [a for a in call.args if isinstance(a, ast.Starred)]
        if len(starred) == 1 and isinstance(starred[0].value, ast.Name):
            length = self.tuple_length(frame, starred[0].value.id)
            if length is None:
                length = self.paired_length(frame, call)
            if length is not None:
                shape = replace(shape, positional=shape.positional + length, star_args=False)
        return shape

    def tuple_length(self, frame: Frame, name: str) -> int | None:
        """The length of the tuple a local ``name`` holds: assigned once, from a tuple display or a
        call of a function whose every ``return`` is a tuple display of that length."""
        values = [
            node.value
            for node in ast.walk(frame.function.node)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_name(node.targets[0], name)
        ]
        stores = sum(
            1
            for node in ast.walk(frame.function.node)
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)
        )
        if len(values) != 1 or stores != 1:
            return None
        value = values[0]
        if isinstance(value, ast.Tuple):
            return _display_length(value)
        if not isinstance(value, ast.Call):
            return None
        try:
            targets = self.resolver.resolve(frame.function, frame.self_cls, value)
        except (RecursionError, ValueError):
            return None
        lengths = {returned_length(function) for function, _, _ in targets or []}
        return lengths.pop() if len(lengths) == 1 else None

    def paired_length(self, frame: Frame, call: ast.Call) -> int | None:
        """What a ``*_core*`` function is spread from: sglang splits an attention forward into a
        ``<name>_prepare<suffix>`` that returns the state as a tuple and ``<name>_core<suffix>``
        called with ``*`` that state (``forward_dsa_core_npu(self, *inner_state)`` after
        ``inner_state = forward_dsa_prepare_npu(...)``, handed between the two through the layer's
        intermediate state). The length of the tuple the partner returns, if the source gives it."""
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if "_core" not in name:
            return None
        partner_name = name.replace("_core", "_prepare", 1)
        partner = None
        if isinstance(func, ast.Name):
            partner = module_function(self.tree, frame.function.path, partner_name)
        elif _is_name(func.value, "self") and frame.self_cls is not None:
            partner = method_on(self.tree, frame.self_cls, partner_name)
        return None if partner is None else returned_length(partner)

    # ----- what an attribute holds ---------------------------------------------------------------
    def attribute_built(self, cls: ClassInfo, attr: str) -> list[ClassInfo]:
        """The classes the role builds that ``self.<attr>`` of a ``cls`` may hold: a class named in
        an assignment ``self.<attr> = C(...)`` (either side of a conditional expression) in a method
        of its MRO, outside branches that are dead on NPU, or in a class-body annotation, narrowed
        to the built classes that are that class or derive from it."""
        memo = self.tree.memo.setdefault("binding.declared", {})  # what the source says, any role
        key = (id(cls), attr)
        if key not in memo:
            declared: list[ClassInfo] = []
            for klass in self.tree.mro(cls):
                for stmt in klass.node.body:
                    if isinstance(stmt, ast.AnnAssign) and _is_name(stmt.target, attr):
                        declared += annotation_classes(self.tree, klass.path, stmt.annotation)
                for ref, value in _live_assigned(self.tree, klass).get(attr, ()):
                    for alternative in _alternatives(value):
                        declared += self._value_classes(ref, alternative)
            memo[key] = declared
        if key not in self._held:
            declared = memo[key]
            self._held[key] = [
                built
                for built in self.built.values()
                if any(made is built or made in self.tree.mro(built) for made in declared)
            ]
        return self._held[key]

    def _value_classes(self, ref: FunctionRef, value: ast.expr) -> list[ClassInfo]:
        """``C(...)``: C; a parameter of ``ref``: the classes its annotation names."""
        if isinstance(value, ast.Name):
            for param in ref.parameters:
                if param.arg == value.id:
                    return annotation_classes(self.tree, ref.path, param.annotation)
            return []
        if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
            return []
        text = ast.unparse(value.func)
        if not text.rpartition(".")[2][:1].isupper():
            return []
        made = self.tree.resolve_class(ref.path, text)
        return [] if made is None else [made]

    def _is_module(self, klass: ClassInfo) -> bool:
        return any(_MODULE_BASES.fullmatch(base) for base in self.tree.external_bases(klass))


# ----- definitions -------------------------------------------------------------------------------
def kind_of(ref: FunctionRef) -> str | None:
    """``method``, ``static`` or ``class`` for a definition whose decorators keep its signature;
    None for a property or a decorator that may change it."""
    kind = "method"
    for decorator in ref.node.decorator_list:
        name = _decorator_name(decorator)
        if name == "staticmethod":
            kind = "static"
        elif name == "classmethod":
            kind = "class"
        elif name in SIGNATURE_KEEPING:
            continue
        elif not _tree_decorator_keeps(ref, decorator):
            return None
    return kind


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target).rpartition(".")[2]


def _tree_decorator_keeps(ref: FunctionRef, decorator: ast.expr) -> bool:
    """An in-tree decorator (or decorator factory) whose wrappers take ``*args, **kwargs`` and
    whose nested decorators take the function alone: the call reaches the definition as written."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not isinstance(target, ast.Name):
        return False
    function = module_function(ref.tree, ref.path, target.id)
    if function is None:
        return False
    node = _last_real_definition(function)
    for sub in ast.walk(node):
        if sub is node or not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = sub.args
        named = [*args.posonlyargs, *args.args]
        wrapper = not named and args.vararg is not None and args.kwarg is not None
        inner_decorator = len(named) == 1 and args.vararg is None and args.kwarg is None
        if not (wrapper or inner_decorator):
            return False
    return True


def _last_real_definition(function: FunctionRef) -> ast.FunctionDef | ast.AsyncFunctionDef:
    module = function.tree.parse(function.path)
    same = [
        s
        for s in flatten_conditional(module.body if module is not None else [])
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == function.name
    ]
    real = [s for s in same if not any(_decorator_name(d) == "overload" for d in s.decorator_list)]
    return real[-1] if real else function.node


def definitions(ref: FunctionRef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The live definitions of ``ref``'s name in the body that defines it: ``@overload`` stubs and
    copies under a branch dead on NPU left out (one per platform: ``if _is_npu: def f ... else:``)."""
    if ref.outer is not None:
        return [ref.node]
    memo = ref.tree.memo.setdefault("binding.definitions", {})
    key = id(ref.node)
    if key not in memo:
        if ref.owner is not None:
            body = ref.owner.node.body
        else:
            module = ref.tree.parse(ref.path)
            body = module.body if module is not None else []
        found = [
            node
            for node in _live_definitions(ref.tree, ref, body)
            if node.name == ref.name
            and not any(_decorator_name(d) == "overload" for d in node.decorator_list)
        ]
        memo[key] = found if len(found) > 1 else [ref.node]
    return memo[key]


def _live_definitions(tree: SourceTree, ref: FunctionRef, body: list[ast.stmt]):
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt
        elif isinstance(stmt, ast.If):
            value = value_on_npu(tree, ref.path, stmt.test)
            if value is not False:
                yield from _live_definitions(tree, ref, stmt.body)
            if value is not True:
                yield from _live_definitions(tree, ref, stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from _live_definitions(tree, ref, block)


def is_spread_only(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``(self, *args, **kwargs)``, keyword-only parameters with defaults allowed: takes anything."""
    args = node.args
    return (
        len([*args.posonlyargs, *args.args]) == 1
        and args.vararg is not None
        and args.kwarg is not None
        and all(d is not None for d in args.kw_defaults)
    )


def returned_length(function: FunctionRef) -> int | None:
    """The length of the tuple display every ``return`` of ``function`` (not of nested functions)
    returns; None when one returns anything else, or the lengths differ."""
    lengths = set()
    stack = list(function.node.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return None
        if isinstance(node, ast.Return):
            if not isinstance(node.value, ast.Tuple):
                return None
            lengths.add(_display_length(node.value))
        stack.extend(ast.iter_child_nodes(node))
    return lengths.pop() if len(lengths) == 1 and None not in lengths else None


def _display_length(value: ast.Tuple) -> int | None:
    return None if any(isinstance(e, ast.Starred) for e in value.elts) else len(value.elts)


def _drop_keywords(shape: CallShape, node: ast.FunctionDef | ast.AsyncFunctionDef) -> CallShape:
    """The shape a forwarder hands on: its own keyword-only parameters (``backend=``) consumed."""
    own = {a.arg for a in node.args.kwonlyargs}
    return replace(shape, keywords=tuple(k for k in shape.keywords if k not in own))


def _via(previous: str, target: FunctionRef) -> str:
    step = f"{target.qualname} ({target.where()})"
    return f"{previous} -> {step}" if previous else step


# ----- names and attributes ----------------------------------------------------------------------
def is_local(ref: FunctionRef, name: str) -> bool:
    """``name`` is a parameter or a local of ``ref`` or an enclosing function (not a nested ``def``,
    which the resolver follows): what it holds is not the module-level function of that name."""
    scope: FunctionRef | None = ref
    while scope is not None:
        if name in _locals(scope):
            return True
        scope = scope.outer
    return False


def _locals(ref: FunctionRef) -> set[str]:
    memo = ref.tree.memo.setdefault("binding.locals", {})
    key = id(ref.node)
    if key not in memo:
        names = {a.arg for a in ref.parameters}
        args = ref.node.args
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        for node in ast.walk(ref.node):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Lambda):
                names |= {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
        memo[key] = names
    return memo[key]


def module_names(ref: FunctionRef) -> set[str]:
    """The names bound at the top level of ``ref``'s module (definitions, imports, assignments)."""
    memo = ref.tree.memo.setdefault("binding.module_names", {})
    if ref.path not in memo:
        module = ref.tree.parse(ref.path)
        names: set[str] = set()
        for stmt in flatten_conditional(module.body if module is not None else []):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).partition(".")[0] for a in stmt.names}
            else:
                names |= {
                    n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
        memo[ref.path] = names
    return memo[ref.path]


def _shadowed(tree: SourceTree, cls: ClassInfo, name: str) -> bool:
    """An instance attribute of the same name as a method (``self.forward = self.forward_npu``):
    which callable ``self.<name>`` holds is not the method the class body defines."""
    return any(name in _assigned_names(tree, klass) for klass in tree.mro(cls))


def _assigned_names(tree: SourceTree, klass: ClassInfo) -> set[str]:
    """The ``self.<name>`` a class's methods assign (``setattr(self, "<name>", ...)`` too)."""
    memo = tree.memo.setdefault("binding.assigned", {})
    if id(klass) not in memo:
        names: set[str] = set()
        for node in ast.walk(klass.node):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _is_name(node.value, "self")
            ):
                names.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and _is_name(node.func, "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                names.add(str(node.args[1].value))
        memo[id(klass)] = names
    return memo[id(klass)]


def _live_assigned(tree: SourceTree, klass: ClassInfo) -> dict[str, list[tuple[FunctionRef, ast.expr]]]:
    """attribute -> ``(method, value)`` of every ``self.<attr> = value`` (``setattr(self, "<attr>",
    value)``) in the class's own methods, outside the branches an Ascend host cannot take (memoised)."""
    memo = tree.memo.setdefault("binding.live_assigned", {})
    if id(klass) not in memo:
        found: dict[str, list[tuple[FunctionRef, ast.expr]]] = {}
        for ref in _methods(klass):
            for node in live_nodes(ref):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Attribute) and _is_name(target.value, "self"):
                            found.setdefault(target.attr, []).append((ref, node.value))
                elif (
                    isinstance(node, ast.Call)
                    and _is_name(node.func, "setattr")
                    and len(node.args) >= 3
                    and _is_name(node.args[0], "self")
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)
                ):
                    found.setdefault(node.args[1].value, []).append((ref, node.args[2]))
        memo[id(klass)] = found
    return memo[id(klass)]


def _alternatives(value: ast.expr) -> list[ast.expr]:
    if isinstance(value, ast.IfExp):
        return [*_alternatives(value.body), *_alternatives(value.orelse)]
    return [value]


def _methods(klass: ClassInfo) -> list[FunctionRef]:
    return [FunctionRef.method(klass, node) for node in klass.methods.values()]


def _is_name(node: ast.AST | None, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _is_name(node.func, "super")
