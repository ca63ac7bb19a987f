"""What a class defines for its instances, read from its source and its MRO.

Two checks ask it of different classes: NPD004 whether the CP metadata class that reaches a read
has the field read (sglang#26705 renamed ``kv_len_prev``/``kv_len_next`` on the metadata but not at
every reader), NPD005 whether a pool or allocator the deployment builds has the method or flag its
offload path calls (sglang#24026 added ``cpu_copy_carries_mamba`` and helpers some NPU classes
lack). Both need the same answer, so it is collected once here:

* names bound in a class body (methods, properties, class variables, dataclass fields) and the
  entries of its ``__slots__``;
* ``self.<name>`` assigned anywhere in the class (``__init__``, helpers, closures), also through
  a method's first parameter whatever it is called, and ``setattr(..., "<name>", ...)``;
* the same for every class of its MRO.

``has_dynamic_attributes`` says when the source cannot settle the question (an external base or a
``__getattr__``); ``attribute_classes`` and ``call_assigned_to`` say what ``self.<name>`` holds.
Everything is memoised per ``SourceTree``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from npudoctor.static.dataflow import annotation_classes, subclasses, value_classes
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree


def instance_names(tree: SourceTree, cls: ClassInfo) -> set[str]:
    """Every name an instance of ``cls`` has: what each class of its MRO binds in its body or its
    ``__slots__``, and every attribute its code assigns on the instance."""
    memo = tree.memo.setdefault("classdefs", {})
    if id(cls) not in memo:
        names: set[str] = set()
        for klass in tree.mro(cls):
            names |= klass.class_attributes | _slots(klass) | _assigned_on_instance(klass)
        memo[id(cls)] = names
    return memo[id(cls)]


def names_set_when_run(tree: SourceTree, cls: ClassInfo) -> set[str]:
    """The names an instance of ``cls`` really has: the class-body names and ``__slots__`` of its
    MRO, and ``self.<name>`` assigned by the methods that can run on it: its public and special
    methods (``__init__`` first), each resolved through the MRO, and the methods they call on
    ``self`` (``super()`` and ``Base.m(self)`` included); a private helper counts when one of
    them calls it. Narrower than ``instance_names``: a base's ``__init__`` that the
    class overrides without calling it assigns nothing on the instance (sglang#25249: the NPU MLA
    pool's ``__init__`` never ran ``MLATokenToKVPool``'s, so ``self.kv_buffer`` was never set)."""
    memo = tree.memo.setdefault("classdefs.run", {})
    if id(cls) not in memo:
        mro = tree.mro(cls)
        names: set[str] = set()
        methods: dict[tuple[int, str], FunctionRef] = {}
        for klass in mro:
            names |= klass.class_attributes | _slots(klass)
            for name in klass.methods:
                if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                    continue  # a private helper runs when something calls it (followed below)
                resolved = tree.lookup(mro, name)
                if resolved is not None and (id(resolved.owner), name) not in methods:
                    for ref in tree.methods_reached(mro, resolved):
                        methods.setdefault((id(ref.owner), ref.name), ref)
        for ref in methods.values():
            names |= _assigned_in(ref.node)
        memo[id(cls)] = names
    return memo[id(cls)]


def has_dynamic_attributes(tree: SourceTree, cls: ClassInfo) -> bool:
    """An external base or a ``__getattr__``/``__getattribute__`` in the MRO: a name missing from
    the source may still exist at run time."""
    return bool(tree.external_bases(cls)) or any(
        "__getattr__" in k.methods or "__getattribute__" in k.methods for k in tree.mro(cls)
    )


def attribute_classes(tree: SourceTree, cls: ClassInfo, attr: str) -> list[ClassInfo]:
    """Classes ``self.<attr>`` of a ``cls`` is declared as (class-body annotation) or assigned from."""
    memo = tree.memo.setdefault("classdefs.attribute_classes", {})
    key = (id(cls), attr)
    if key not in memo:
        memo[key] = _attribute_classes(tree, cls, attr)
    return memo[key]


def _attribute_classes(tree: SourceTree, cls: ClassInfo, attr: str) -> list[ClassInfo]:
    for klass in tree.mro(cls):
        for stmt in klass.node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == attr
            ):
                return annotation_classes(tree, klass.path, stmt.annotation)
        for annotation, value in _instance_assignments(tree, klass).get(attr, ()):
            found = annotation_classes(tree, klass.path, annotation) if annotation is not None else []
            found = found or (value_classes(tree, klass.path, value) if value is not None else [])
            if found:
                return found
    return []


def _instance_assignments(
    tree: SourceTree, klass: ClassInfo
) -> dict[str, list[tuple[ast.expr | None, ast.expr | None]]]:
    """``self.<attr> = value`` (and annotated) assignments in ``klass``'s methods, by attribute, in
    the order ``attribute_classes`` tries them; one walk per class."""
    memo = tree.memo.setdefault("classdefs.assignments", {})
    if id(klass) not in memo:
        found: dict[str, list[tuple[ast.expr | None, ast.expr | None]]] = {}
        for method in klass.methods.values():
            for node in ast.walk(method):
                target = value = annotation = None
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign):
                    target, value, annotation = node.target, node.value, node.annotation
                if _is_self_attribute(target):
                    found.setdefault(target.attr, []).append((annotation, value))
        memo[id(klass)] = found
    return memo[id(klass)]


def call_assigned_to(tree: SourceTree, cls: ClassInfo, attr: str) -> tuple[ast.Call, Path] | None:
    """The call ``self.<attr> = f(...)`` stores, in a method of ``cls``, its bases or its subclasses
    (a mixin's attribute is set by the class that mixes it in), with the file it is in."""
    for klass in [*tree.mro(cls), *subclasses(tree, cls)]:
        for method in klass.methods.values():
            for node in ast.walk(method):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and _is_self_attribute(node.targets[0])
                    and node.targets[0].attr == attr
                    and isinstance(node.value, ast.Call)
                ):
                    return node.value, klass.path
    return None


def _assigned_on_instance(klass: ClassInfo) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(klass.node):  # setattr(self or anything, "<name>", ...) in the class body too
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self_attribute(node):
            names.add(node.attr)
    for method in klass.methods.values():  # the instance under another name than ``self``
        first = (method.args.posonlyargs + method.args.args)[:1]
        if first and first[0].arg != "self":
            names |= _assigned_in(method)
    return names


def _assigned_in(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names ``method`` assigns on its instance: ``self.<name> = ...`` (through its first
    parameter whatever it is called, closures included) and ``setattr(..., "<name>", ...)``."""
    first = (method.args.posonlyargs + method.args.args)[:1]
    me = first[0].arg if first else "self"
    names: set[str] = set()
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in (me, "self")
        ):
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
    return names


def _slots(klass: ClassInfo) -> set[str]:
    for stmt in klass.node.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets)
            and isinstance(stmt.value, (ast.Tuple, ast.List, ast.Set))
        ):
            return {
                e.value for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return set()


def _is_self_attribute(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
