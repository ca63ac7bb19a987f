"""The NPU path of a deployment, walked statically: from entry functions, along the calls the
deployment's classes resolve, into the branches its flags and environment select.

A property of a deployment is about the code it runs, not about every function of the release:
NPD004 checks the CP metadata reads on the FIA context-parallel prefill path (sglang#26705 renamed
fields the NPU readers still use), NPD005 every call of the KV offload path down to the NPU pools
(sglang#24026 added keywords and helpers some NPU overrides do not take). Both walk the same way,
so the walk is here once:

* ``PathWalker`` runs the walk: each function once per (class it runs on, what the check tracks
  into it), at most ``max_depth`` calls deep and ``max_functions`` functions; a check's visitor
  looks at one function (``Frame``) and yields the functions its calls run. In call order, each
  callee is walked where it is called, so records come out in execution order; otherwise the
  functions found are walked last call first.
* Calls resolve through the MRO of the class the deployment builds: ``self.m()``, ``super().m()``
  and ``Base.m(self)`` (``method_on``, ``super_target``, ``base_call``); ``CallResolver`` adds
  names, closures, imports, typed receivers with virtual dispatch to every subclass, narrowed to
  the deployment's CP strategy, and tells code outside sglang (``[]``) from a call it cannot
  resolve (``None``, reported by the check as unresolved).
* ``Branches`` decides the branches: a call under ``if self.use_mla`` for another attention
  family, under a test that is false on an NPU, or under ``if <x>.enable_<feature>`` the role
  does not enable is not on the deployment's path.
* ``AlwaysRaises`` tells a function that raises whatever it is passed (every path through its
  body ends in a ``raise`` or in a call to such a function, transitively), with the calls down
  to the ``raise`` (``RaiseSite``): a call on the path into one dies there (sglang 0.5.20 left
  ``cp_utils.cp_all_gather_rerange_kv_cache`` as a stub that calls ``_deprecated_platform_cp()``,
  which only raises, while the NPU CP prefill still calls it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace

from npudoctor.static.classdefs import attribute_classes, call_assigned_to
from npudoctor.static.dataflow import (
    enclosing_tests,
    imported_module,
    is_external_name,
    module_function,
    name_classes,
    nested_function,
    subclasses,
)
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree, flatten_conditional


# ----- the walk -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Frame:
    """One function on the path as it runs: on an instance of ``self_cls`` (None for a plain
    function), with what the check tracks into it (``state``); ``key`` is the part of the state
    that makes it another visit of the same function on the same class."""

    function: FunctionRef
    self_cls: ClassInfo | None
    state: object = None
    key: Hashable = ()
    depth: int = 0


Visit = Callable[[Frame], Iterable[Frame]]


class PathWalker:
    """Walks frames with a check's ``visit``, which records what the check wants of one function
    and yields the frames its calls run. ``seen`` may be shared by the walks of several entries,
    so that a function reached from an earlier entry is not walked again."""

    def __init__(
        self,
        visit: Visit,
        *,
        max_depth: int,
        max_functions: int | None = None,
        in_call_order: bool = False,
        seen: set[tuple] | None = None,
    ):
        self.visit = visit
        self.max_depth = max_depth
        self.max_functions = max_functions
        self.in_call_order = in_call_order
        self.seen = set() if seen is None else seen
        self.visited: list[FunctionRef] = []

    def walk(self, frame: Frame) -> None:
        if self.in_call_order:
            self._walk_in_call_order(frame)
            return
        stack = [frame]
        while stack and (self.max_functions is None or len(self.visited) < self.max_functions):
            current = stack.pop()
            if not self._enter(current):
                continue
            for callee in self.visit(current):
                if current.depth < self.max_depth:
                    stack.append(replace(callee, depth=current.depth + 1))

    def _walk_in_call_order(self, frame: Frame) -> None:
        if not self._enter(frame):
            return
        for callee in self.visit(frame):
            if frame.depth < self.max_depth:
                self._walk_in_call_order(replace(callee, depth=frame.depth + 1))

    def _enter(self, frame: Frame) -> bool:
        key = (id(frame.function.node), id(frame.self_cls), frame.key)
        if key in self.seen:
            return False
        self.seen.add(key)
        self.visited.append(frame.function)
        return True


# ----- calls on the instance, through the MRO -----------------------------------------------------
def method_on(
    tree: SourceTree, cls: ClassInfo, name: str, after: ClassInfo | None = None
) -> FunctionRef | None:
    """The method ``cls().name`` resolves to, or ``super(after, self).name`` when ``after`` is given."""
    mro = tree.mro(cls)
    if after is None:
        return tree.lookup(mro, name)
    return tree.lookup(mro, name, mro.index(after) + 1) if after in mro else None


def super_target(
    tree: SourceTree, cls: ClassInfo, caller: FunctionRef, name: str
) -> tuple[FunctionRef, int] | None:
    """What ``super().name`` in ``caller`` runs on a ``cls``, and the MRO position the lookup
    started from; None when ``caller``'s class is not in that MRO or nothing after it defines it."""
    mro = tree.mro(cls)
    position = next((i for i, c in enumerate(mro) if c is caller.owner), None)
    if position is None:
        return None
    found = tree.lookup(mro, name, position + 1)
    return None if found is None else (found, position + 1)


def base_call(
    tree: SourceTree, cls: ClassInfo, caller: FunctionRef, call: ast.Call
) -> tuple[FunctionRef, int] | None:
    """What ``Base.name(self, ...)`` in ``caller`` runs on a ``cls`` (the lookup starts at ``Base``
    in ``cls``'s MRO), and that position; None for any other call."""
    func = call.func
    receiver = func.value if isinstance(func, ast.Attribute) else None
    if not (
        call.args
        and _is_name(call.args[0], "self")
        and isinstance(receiver, (ast.Name, ast.Attribute))
        and not (isinstance(receiver, ast.Attribute) and _is_name(receiver.value, "self"))
    ):
        return None
    named = tree.resolve_name(caller.path, ast.unparse(receiver))
    if named is None:
        return None
    mro = tree.mro(cls)
    position = next((i for i, c in enumerate(mro) if c is named or c.name == named.name), None)
    if position is None:
        return None
    found = tree.lookup(mro, func.attr, position)
    return None if found is None else (found, position)


def locally_imported(ref: FunctionRef, name: str) -> FunctionRef | None:
    """A function ``ref`` imports inside its own body (``from sglang.x import f`` in a function)."""
    tree = ref.tree
    memo = tree.memo.setdefault("walker.local_imports", {})
    scope: FunctionRef | None = ref
    while scope is not None:
        imports = memo.get(id(scope.node))
        if imports is None:  # the first ``from ... import`` of each name, in ``ast.walk`` order
            imports = {}
            for node in ast.walk(scope.node):
                if isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        imports.setdefault(alias.asname or alias.name, (node, alias.name))
            memo[id(scope.node)] = imports
        if name in imports:
            node, imported = imports[name]
            target = tree.module_path(tree.absolute_module(ref.path, node))
            if target is not None:
                return module_function(tree, target, imported)
        scope = scope.outer
    return None


# (function, the class it runs on, whether the receiver fills its first parameter)
Target = tuple[FunctionRef, ClassInfo | None, bool]


@dataclass
class CallResolver:
    """The functions a call on the path may run. ``strategy`` is the deployment's CP strategy
    (``zigzag``, ``interleave``): a virtual call on strategy classes goes to the classes named
    after it only; None follows every implementation. ``implementations``: the classes a call on
    a receiver declared as a class may run on (default: the class and every subclass in the tree;
    the whole-path walk narrows it to what an NPU deployment builds)."""

    tree: SourceTree
    strategy: str | None = None
    implementations: Callable[[ClassInfo], list[ClassInfo]] | None = None

    def resolve(self, ref: FunctionRef, self_cls: ClassInfo | None, call: ast.Call) -> list[Target] | None:
        """``[]`` for code outside the tree (torch, numpy, builtins, loggers) and constructors;
        None when it cannot be told."""
        tree, func = self.tree, call.func
        if isinstance(func, ast.Name):
            scope = ref
            while scope is not None:  # a closure defined in this function or an enclosing one
                inner = nested_function(scope, func.id)
                if inner is not None:
                    return [(inner, self_cls, False)]
                scope = scope.outer
            found = module_function(tree, ref.path, func.id) or locally_imported(ref, func.id)
            if found is not None:
                return [(found, None, False)]
            if is_external_name(tree, ref.path, func.id) or tree.resolve_class(ref.path, func.id) is not None:
                return []
            return None
        if not isinstance(func, ast.Attribute):
            return None
        receiver, method = func.value, func.attr
        if (_is_name(receiver, "self") or _is_name(receiver, "cls")) and self_cls is not None:
            found = method_on(tree, self_cls, method)
            return None if found is None else [(found, self_cls, True)]
        if (
            isinstance(receiver, ast.Call)
            and _is_name(receiver.func, "super")
            and self_cls is not None
            and ref.owner is not None
        ):
            after = ref.owner
            if receiver.args:  # super(Klass, self): the lookup starts after Klass, not after the caller
                named = tree.resolve_name(ref.path, ast.unparse(receiver.args[0]))
                after = named if named is not None else after
            found = method_on(tree, self_cls, method, after=after)
            return None if found is None else [(found, self_cls, True)]
        root = receiver
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id != "self" and is_external_name(tree, ref.path, root.id):
            return []
        if isinstance(receiver, ast.Name) and receiver.id not in {p.arg for p in ref.parameters}:
            klass = tree.resolve_class(ref.path, receiver.id)
            if klass is not None and receiver.id[:1].isupper():  # Class.method(...): class/static method
                found = method_on(tree, klass, method)
                return None if found is None else [(found, klass, True)]
        if isinstance(receiver, ast.Name):
            module = imported_module(tree, ref.path, receiver.id)
            if module is not None:
                found = module_function(tree, module, method)
                return None if found is None else [(found, None, False)]
            classes = name_classes(ref, receiver.id)
        elif (
            isinstance(receiver, ast.Attribute) and _is_name(receiver.value, "self") and self_cls is not None
        ):
            classes = attribute_classes(tree, self_cls, receiver.attr)
        else:
            classes = []
        targets = []
        for klass in classes:  # virtual dispatch: the declared class and every subclass in the tree
            implementations = (
                self.implementations(klass)
                if self.implementations is not None
                else [klass, *subclasses(tree, klass)]
            )
            for impl in implementations:
                found = method_on(tree, impl, method)
                if found is not None:
                    targets.append((found, impl, True))
        if self.strategy:
            chosen = [t for t in targets if t[1].name.lower().startswith(self.strategy.lower())]
            if chosen:
                targets = chosen
        return targets or None


# ----- which branches the deployment takes -------------------------------------------------------
@dataclass
class Branches:
    """The branches of the path a deployment takes. ``mla``: its attention family is MLA (None:
    not described); ``server_args``: the role's server arguments (None: not described). What was
    left out, and why, is kept in ``skipped``."""

    mla: bool | None = None
    server_args: dict[str, object] | None = None
    skipped: list[str] = field(default_factory=list)

    def off_path(self, ref: FunctionRef, node: ast.AST) -> bool:
        """``node`` sits under ``if self.use_mla`` of the other attention family, under a test that
        is false on an NPU, or under ``if <x>.enable_<feature>`` the role does not enable (e.g.
        ``enable_sparsity_driven_kv_offload``): not the deployment's path."""
        tests = enclosing_tests(ref.node, node)
        for test, taken in tests:
            text = ast.unparse(test.test)
            if self.mla is not None and re.fullmatch(r"(not )?self\.use_mla", text):
                mla_branch = taken != text.startswith("not ")
                if mla_branch != self.mla:
                    self.skipped.append(
                        f"calls under `{text}` ({ref.where(test.lineno)}): another attention family"
                    )
                    return True
        for test, taken in tests:
            gate = npu_off_gate(ref, test.test) if taken else None
            if gate is not None:
                self.skipped.append(
                    f"calls under `{ast.unparse(test.test)}` ({ref.where(test.lineno)}): {gate}"
                )
                return True
        if self.server_args is None:
            return False
        for test, taken in tests:
            for name_node in ast.walk(test.test):
                name = (
                    name_node.attr
                    if isinstance(name_node, ast.Attribute)
                    else name_node.id
                    if isinstance(name_node, ast.Name)
                    else ""
                )
                if not name.startswith("enable_") or not taken:
                    continue
                if ast.unparse(test.test).startswith("not "):
                    continue
                if not self.server_args.get(name):
                    self.skipped.append(
                        f"calls under `{ast.unparse(test.test)}` ({ref.where(test.lineno)}): not enabled"
                    )
                    return True
        return False


def npu_off_gate(ref: FunctionRef, test: ast.expr) -> str | None:
    """Why ``test`` (an ``if`` whose body the call sits in) is false on an NPU, if it is: one of its
    ``and`` terms is a call, or ``self.<x>`` assigned from a call, of a function that returns False on
    NPU first thing (0.5.20 ``is_dsa_enable_prefill_cp``: ``if is_hip() or is_npu() ...: return
    False``)."""
    terms = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for term in terms:
        call, path = (term, ref.path) if isinstance(term, ast.Call) else (None, ref.path)
        if (
            call is None
            and isinstance(term, ast.Attribute)
            and _is_name(term.value, "self")
            and ref.owner is not None
        ):
            call, path = call_assigned_to(ref.tree, ref.owner, term.attr) or (None, path)
        if call is None or not isinstance(call.func, ast.Name):
            continue
        function = module_function(ref.tree, path, call.func.id) or locally_imported(ref, call.func.id)
        if function is not None and _false_on_npu(function):
            return f"{function.qualname} ({function.where()}) returns False on NPU"
    return None


def _false_on_npu(function: FunctionRef) -> bool:
    body = [  # every string statement aside, not only the docstring
        s
        for s in function.node.body
        if not (
            isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
        )
    ]
    if not body or not isinstance(body[0], ast.If):
        return False
    first = body[0]
    mentions_npu = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "is_npu"
        for n in ast.walk(first.test)
    )
    returns_false = (
        len(first.body) == 1
        and isinstance(first.body[0], ast.Return)
        and isinstance(first.body[0].value, ast.Constant)
        and first.body[0].value.value is False
    )
    negated = isinstance(first.test, ast.UnaryOp) and isinstance(first.test.op, ast.Not)
    return (
        mentions_npu
        and returns_false
        and not negated
        and not isinstance(first.test, ast.BoolOp)
        or (
            mentions_npu
            and returns_false
            and isinstance(first.test, ast.BoolOp)
            and isinstance(first.test.op, ast.Or)
        )
    )


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


# ----- functions that always raise ---------------------------------------------------------------
@dataclass(frozen=True)
class RaiseSite:
    """Where calling a function ends, whatever it is passed: ``chain`` is the function and each
    function it calls on the way, each with its line (the call into the next; for the last, the
    ``raise``); ``text`` is that ``raise`` statement."""

    chain: tuple[tuple[FunctionRef, int], ...]
    text: str

    @property
    def function(self) -> FunctionRef:
        return self.chain[-1][0]

    @property
    def line(self) -> int:
        return self.chain[-1][1]

    def path_text(self) -> str:
        """``f calls g (b.py:8) at a.py:3, which does `raise E(...)` at b.py:9``: each call on the way
        (the callee's definition and the call), then the raise, with file:line."""
        steps = [
            f"calls {callee.qualname} ({callee.where()}) at {function.where(line)}"
            for (function, line), (callee, _) in zip(self.chain, self.chain[1:])
        ]
        steps.append(f"does `{self.text}` at {self.function.where(self.line)}")
        return f"{self.chain[0][0].qualname} " + ", which ".join(steps)


class AlwaysRaises:
    """Whether calling a function raises whatever it is passed: every path through its body ends in
    a ``raise`` (or ``assert False``), or in a call to a function that always raises (this question,
    asked again of the callee: the property is transitive). Only what runs unconditionally counts:
    a ``raise`` under an ``if`` whose other branch can complete, after a statement that may
    ``return``, inside a loop, in a ``try`` whose handler may swallow it, or a call inside a
    conditional expression, a short-circuit operand, a lambda or a comprehension, does not.

    Calls resolve with ``CallResolver`` (through the MRO of the class the function runs on, names,
    imports, typed receivers); a virtual call always raises only if every implementation does. Not
    counted as raising: generator and ``async`` functions (calling one runs nothing), abstract
    methods, and a function defined more than once in its module or class body (a definition under
    ``if`` for one platform and another for the rest: which runs is not known statically).
    Answers are cached per (function, class)."""

    MAX_DEPTH = 8

    def __init__(self, resolver: CallResolver):
        self.resolver = resolver
        self._known: dict[tuple[int, int], RaiseSite | None] = {}

    def __call__(
        self, ref: FunctionRef, self_cls: ClassInfo | None = None, _depth: int = 0
    ) -> RaiseSite | None:
        key = (id(ref.node), id(self_cls))
        if key in self._known:
            return self._known[key]
        self._known[key] = None  # a recursive call while this one is open: not known to raise
        found = None
        if _depth <= self.MAX_DEPTH and self._may_raise_on_call(ref):
            found = self._block(ref.node.body, ref, self_cls, _depth)
        self._known[key] = found
        return found

    @staticmethod
    def _may_raise_on_call(ref: FunctionRef) -> bool:
        node = ref.node
        if isinstance(node, ast.AsyncFunctionDef):
            return False
        if any(ast.unparse(d).rpartition(".")[2] == "abstractmethod" for d in node.decorator_list):
            return False
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(node)):
            return False
        return _defined_once(ref)

    def _block(
        self, body: list[ast.stmt], ref: FunctionRef, self_cls: ClassInfo | None, depth: int
    ) -> RaiseSite | None:
        """How ``body`` always raises, if it does: the first statement that always raises, reached
        with no statement before it that may leave the block otherwise."""
        for stmt in body:
            found = self._statement(stmt, ref, self_cls, depth)
            if found is not None:
                return found
            if _may_leave(stmt):
                return None
        return None

    def _statement(
        self, stmt: ast.stmt, ref: FunctionRef, self_cls: ClassInfo | None, depth: int
    ) -> RaiseSite | None:
        if isinstance(stmt, ast.Raise):
            return RaiseSite(((ref, stmt.lineno),), ast.unparse(stmt))
        if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and not stmt.test.value:
            return RaiseSite(((ref, stmt.lineno),), ast.unparse(stmt))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None  # a definition runs no body
        if isinstance(stmt, ast.If):
            found = self._calls_in(stmt.test, ref, self_cls, depth)
            if found is not None:
                return found
            body = self._block(stmt.body, ref, self_cls, depth)
            orelse = self._block(stmt.orelse, ref, self_cls, depth) if stmt.orelse else None
            return body if body is not None and orelse is not None else None
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                found = self._calls_in(item.context_expr, ref, self_cls, depth)
                if found is not None:
                    return found
            return self._block(stmt.body, ref, self_cls, depth)
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            final = self._block(stmt.finalbody, ref, self_cls, depth) if stmt.finalbody else None
            if final is not None:
                return final
            body = self._block(stmt.body, ref, self_cls, depth)
            handled = all(self._block(h.body, ref, self_cls, depth) is not None for h in stmt.handlers)
            return body if body is not None and handled else None
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            return self._calls_in(stmt.iter, ref, self_cls, depth)  # the body may run no time
        if isinstance(stmt, ast.While):
            return self._calls_in(stmt.test, ref, self_cls, depth)
        if isinstance(stmt, (ast.Expr, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign)):
            value = stmt.value
            return None if value is None else self._calls_in(value, ref, self_cls, depth)
        return None

    def _calls_in(
        self, expr: ast.expr, ref: FunctionRef, self_cls: ClassInfo | None, depth: int
    ) -> RaiseSite | None:
        """The first call evaluated whenever ``expr`` is that always raises, if one does."""
        for call in _unconditional_calls(expr):
            targets = self.resolver.resolve(ref, self_cls, call)
            if not targets:
                continue
            sites = [self(callee, callee_self, depth + 1) for callee, callee_self, _ in targets]
            if all(site is not None for site in sites):
                return RaiseSite(((ref, call.lineno), *sites[0].chain), sites[0].text)
        return None


def always_raises(ref: FunctionRef, self_cls: ClassInfo | None = None) -> RaiseSite | None:
    """``AlwaysRaises`` for one question, with calls resolved in ``ref``'s tree."""
    return AlwaysRaises(CallResolver(ref.tree))(ref, self_cls)


def _unconditional_calls(expr: ast.expr) -> list[ast.Call]:
    """The calls evaluating ``expr`` always makes, in evaluation order (a call's function and
    arguments before the call): not inside a lambda, a comprehension, the branches of a conditional
    expression or a short-circuit operand after the first."""
    found: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.IfExp):
            visit(node.test)
            return
        if isinstance(node, ast.BoolOp):
            visit(node.values[0])
            return
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.Call):
            found.append(node)

    visit(expr)
    return found


def _may_leave(stmt: ast.stmt) -> bool:
    """``stmt`` may end the function early (a ``return`` in it, outside nested functions): what
    follows it is not unconditional. (Loop bodies are never walked as blocks, so a ``break`` or
    ``continue`` only ends a loop inside ``stmt``, after which the block goes on.)"""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    return any(isinstance(n, ast.Return) for n in [stmt, *_own_nodes(stmt)])


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes under ``node``, not descending into nested functions, classes or lambdas."""
    found = []
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        found.append(child)
        stack.extend(ast.iter_child_nodes(child))
    return found


def _defined_once(ref: FunctionRef) -> bool:
    """``ref``'s name is defined once in the body that defines it (module, class or function)."""
    if ref.owner is not None:
        body = ref.owner.node.body
    elif ref.outer is not None:
        body = [n for n in _own_nodes(ref.outer.node) if isinstance(n, ast.stmt)]
    else:
        module = ref.tree.parse(ref.path)
        body = module.body if module is not None else []
    definitions = [
        s
        for s in (body if ref.outer is not None else flatten_conditional(body))
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == ref.name
    ]
    return len(definitions) <= 1
