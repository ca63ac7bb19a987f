"""Generic ``ast`` helpers for following values and calls through an sglang tree.

``npudoctor.static.source`` answers questions about classes (where, bases, MRO, ``self``
attributes). The probes that check how a *value* is used need a few more, for plain
functions and for objects passed between them, still without importing anything:

* find every function or method with a given name, wherever releases moved it
  (``functions_named``), and the calls to it (``calls_to``);
* resolve a called name to the function it denotes, through the calling module's imports
  (``module_function``, ``imported_module``), or tell that it is outside the tree (torch,
  numpy, builtins, a module-level logger: ``is_external_name``);
* resolve a type annotation or a module-level alias (``X = Y``) to the classes it names
  (``annotation_classes``, ``SourceTree.resolve_class``); the classes a function returns
  (``return_classes``) or a local or parameter holds (``name_classes``); every subclass of a
  class in the tree (``subclasses``), for virtual dispatch through a base-class annotation
  (method lookup through the MRO is ``SourceTree.lookup``; what a class defines for its
  instances and what ``self.<attr>`` holds is ``npudoctor.static.classdefs``);
* how arguments of a call bind to a callee's parameters (``bind_arguments``), which local
  names are aliases of some seed expression (``aliases``), and the ``if`` tests that guard a
  statement (``enclosing_tests``).

Bases, MROs, subclasses, resolved names and needle scans are memoised per ``SourceTree``
(``SourceTree.bases`` scans every file for a base it cannot resolve through imports, such as
``ABC``, and ``mro`` recomputes on each call), so a probe asking about many classes stays
well under a second on a 4,700-file release.

All of it is flow-insensitive and conservative in the way the probes need: a name that
*may* hold a value is treated as holding it, and whatever cannot be resolved is reported
as unresolved rather than guessed.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from npudoctor.static.source import ClassInfo, FunctionNode, FunctionRef, SourceTree, flatten_conditional


# ----- finding functions ---------------------------------------------------------------
def functions_in(tree: SourceTree, path: Path) -> Iterator[FunctionRef]:
    """Module-level functions and methods of top-level classes in one file."""
    module = tree.parse(path)
    if module is None:
        return
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield FunctionRef(stmt, path, tree)
    for cls in tree.classes_in(path):
        for node in cls.methods.values():
            yield FunctionRef.method(cls, node)


def functions_named(tree: SourceTree, name: str, under: str = "") -> list[FunctionRef]:
    """Every module-level function and method called ``name`` in the tree."""
    needle = f"def {name}(".encode()
    return [
        ref
        for path in _under(tree, tree.files_containing(f"{name}("), under)
        if needle in tree.read(path)
        for ref in functions_in(tree, path)
        if ref.name == name
    ]


def calls_to(tree: SourceTree, name: str, under: str = "") -> list[tuple[FunctionRef, ast.Call]]:
    """Calls ``name(...)`` or ``<anything>.name(...)`` and the function each one sits in."""
    found = []
    for path in _under(tree, tree.files_containing(f"{name}("), under):
        for ref in functions_in(tree, path):
            for node in ast.walk(ref.node):
                if isinstance(node, ast.Call) and called_name(node) == name:
                    found.append((ref, node))
    return found


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def nested_function(ref: FunctionRef, name: str) -> FunctionRef | None:
    """A function ``name`` defined inside ``ref`` (a closure): the first in ``ast.walk`` order."""
    memo = ref.tree.memo.setdefault("dataflow.nested", {})
    names = memo.get(id(ref.node))
    if names is None:
        names = {}
        for node in ast.walk(ref.node):
            if node is not ref.node and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.setdefault(node.name, node)
        memo[id(ref.node)] = names
    node = names.get(name)
    return None if node is None else FunctionRef(node, ref.path, ref.tree, outer=ref)


def module_function(tree: SourceTree, path: Path, name: str, _depth: int = 0) -> FunctionRef | None:
    """The module-level function ``name`` denotes in the module at ``path`` (through imports)."""
    if _depth > 6:
        return None
    module = tree.parse(path)
    if module is None:
        return None
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            return FunctionRef(stmt, path, tree)
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    target = tree.module_path(tree.absolute_module(path, stmt))
                    if target is not None and target != path:
                        return module_function(tree, target, alias.name, _depth + 1)
    return None


def is_imported_from_outside(tree: SourceTree, path: Path, name: str) -> bool:
    """``name`` is bound in the module at ``path`` by an import of a module the tree lacks."""
    module = tree.parse(path)
    if module is None:
        return False
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    return tree.module_path(alias.name) is None
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    source = tree.absolute_module(path, stmt)
                    return (
                        tree.module_path(source) is None
                        and tree.module_path(f"{source}.{alias.name}") is None
                    )
    return False


# ----- classes -------------------------------------------------------------------------
class _Memo:
    def __init__(self) -> None:
        self.subclasses: dict[int, list[ClassInfo]] = {}


def _memo(tree: SourceTree) -> _Memo:
    memo = tree.memo.get("dataflow")
    if memo is None:
        memo = tree.memo["dataflow"] = _Memo()
    return memo


def annotation_names(node: ast.expr | None) -> list[str]:
    """Class names an annotation mentions: ``Optional[A]``, ``Union[A, B]``, ``A | None``, ``"A"``."""
    if node is None:
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return annotation_names(node.left) + annotation_names(node.right)
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).rpartition(".")[2]
        if head in ("Optional", "Union"):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [n for part in inner for n in annotation_names(part)]
        return annotation_names(node.value)
    if isinstance(node, (ast.Name, ast.Attribute)):
        text = ast.unparse(node)
        return [] if text == "None" else [text]
    return []


def annotation_classes(tree: SourceTree, path: Path, node: ast.expr | None) -> list[ClassInfo]:
    found = []
    for name in annotation_names(node):
        cls = tree.resolve_class(path, name)
        if cls is not None and cls not in found:
            found.append(cls)
    return found


def return_classes(ref: FunctionRef) -> list[ClassInfo]:
    """Classes ``ref`` returns: its return annotation, else the classes of ``return C(...)``."""
    found = annotation_classes(ref.tree, ref.path, ref.node.returns)
    if found:
        return found
    for node in ast.walk(ref.node):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, (ast.Name, ast.Attribute)):
                cls = ref.tree.resolve_class(ref.path, ast.unparse(func))
                if cls is not None and cls not in found:
                    found.append(cls)
    return found


def subclasses(tree: SourceTree, cls: ClassInfo) -> list[ClassInfo]:
    """Every class in the tree (other than ``cls``) whose MRO contains ``cls``.

    Searches by name, level by level: a direct subclass names its base in its file, a
    subclass of that names the subclass; only classes with such a base are resolved."""
    memo = _memo(tree)
    if id(cls) in memo.subclasses:
        return memo.subclasses[id(cls)]
    found: list[ClassInfo] = []
    frontier = [cls]
    searched: set[str] = set()
    while frontier:
        parent = frontier.pop()
        if parent.name in searched:
            continue
        searched.add(parent.name)
        for path in files_declaring_base(tree).get(parent.name, ()):
            for klass in tree.classes_in(Path(path)):
                if klass is cls or klass in found:
                    continue
                named = {ast.unparse(b).rpartition(".")[2].partition("[")[0] for b in klass.node.bases}
                if parent.name not in named:
                    continue
                if cls in tree.mro(klass):
                    found.append(klass)
                    frontier.append(klass)
    memo.subclasses[id(cls)] = found
    return found


_CLASS_WITH_BASES = re.compile(rb"^[ \t]*class[ \t]+\w+[ \t]*\(([^)]*)\)", re.M)


def files_declaring_base(tree: SourceTree) -> dict[str, list[str]]:
    """The files whose ``class X(...)`` statements name a base, by the base's last name: one regex
    pass over the tree answers every ``subclasses`` question (a scan per base cost 50 ms each)."""
    index = tree.memo.get("dataflow.bases_index")
    if index is None:
        index = {}
        for path in tree.files:
            names = {
                n for group in _CLASS_WITH_BASES.findall(tree.read(path)) for n in re.findall(rb"\w+", group)
            }
            for name in names:
                index.setdefault(name.decode(), []).append(path)
        tree.memo["dataflow.bases_index"] = index
    return index  # type: ignore[return-value]


# ----- what a name holds ---------------------------------------------------------------
def imported_module(tree: SourceTree, path: Path, name: str) -> Path | None:
    """The tree module that ``name`` denotes in the module at ``path`` (``from pkg import mod``,
    ``import pkg.mod as name``), if it denotes one."""
    module = tree.parse(path)
    if module is None:
        return None
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    return tree.module_path(f"{tree.absolute_module(path, stmt)}.{alias.name}")
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    return tree.module_path(alias.name)
    return None


def value_classes(tree: SourceTree, path: Path, value: ast.expr) -> list[ClassInfo]:
    """Classes a value expression evaluates to, where the code says: ``C(...)`` builds a ``C``,
    ``f(...)`` returns what ``f`` declares or returns."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        function = module_function(tree, path, value.func.id)
        if function is not None:
            return return_classes(function)
        built = tree.resolve_class(path, value.func.id)
        if built is not None:
            return [built]
    return []


def name_classes(ref: FunctionRef, name: str) -> list[ClassInfo]:
    """Classes a parameter or local of ``ref`` is declared as (annotation) or assigned from."""
    tree = ref.tree
    for param in ref.parameters:
        if param.arg == name:
            return annotation_classes(tree, ref.path, param.annotation)
    for node in _local_bindings(ref).get(name, ()):
        if isinstance(node, ast.AnnAssign):
            return annotation_classes(tree, ref.path, node.annotation)
        found = value_classes(tree, ref.path, node.value)
        if found:
            return found
    return []


def _local_bindings(ref: FunctionRef) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    """The assignments to each local name of ``ref``, in ``ast.walk`` order; one walk per function."""
    memo = ref.tree.memo.setdefault("dataflow.locals", {})
    found = memo.get(id(ref.node))
    if found is None:
        found = {}
        for node in ast.walk(ref.node):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.setdefault(node.target.id, []).append(node)
            elif isinstance(node, ast.Assign):
                for name in dict.fromkeys(t.id for t in node.targets if isinstance(t, ast.Name)):
                    found.setdefault(name, []).append(node)
        memo[id(ref.node)] = found
    return found


def is_external_name(tree: SourceTree, path: Path, name: str) -> bool:
    """``name`` in the module at ``path`` is a builtin, an import from outside the tree, or a
    module-level value built by code outside it (``logger = logging.getLogger(...)``)."""
    if hasattr(builtins, name) or is_imported_from_outside(tree, path, name):
        return True
    module = tree.parse(path)
    if module is None:
        return False
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            root = stmt.value.func if isinstance(stmt.value, ast.Call) else stmt.value
            while isinstance(root, (ast.Attribute, ast.Call)):
                root = root.value if isinstance(root, ast.Attribute) else root.func
            return isinstance(root, ast.Name) and is_imported_from_outside(tree, path, root.id)
    return False


# ----- values --------------------------------------------------------------------------
def bind_arguments(callee: FunctionRef, call: ast.Call, bound_receiver: bool) -> dict[str, ast.expr]:
    """Parameter name -> argument expression, for the arguments ``call`` passes to ``callee``.

    ``bound_receiver`` is true when the callee's first parameter is filled by the receiver
    (``obj.method(...)`` on an instance), so positional arguments start at the second."""
    params = [*callee.node.args.posonlyargs, *callee.node.args.args]
    if bound_receiver and params and not _is_staticmethod(callee.node):
        params = params[1:]
    bound: dict[str, ast.expr] = {}
    for param, arg in zip(params, call.args):
        if isinstance(arg, ast.Starred):
            break
        bound[param.arg] = arg
    names = {p.arg for p in [*params, *callee.node.args.kwonlyargs]}
    for keyword in call.keywords:
        if keyword.arg in names:
            bound[keyword.arg] = keyword.value
    return bound


def aliases(
    func: ast.AST, seeds: dict[str, object], value_of: Callable[[ast.expr, dict[str, object]], object | None]
) -> dict[str, object]:
    """Local names bound (anywhere in ``func``, closures included) to a tracked value.

    ``seeds`` maps names already known to hold a tracked value to what they hold;
    ``value_of(expr, known)`` says what a right-hand side holds, or None. Iterates to a
    fixpoint, so aliases of aliases are found whatever the statement order."""
    known = dict(seeds)
    assignments: list[tuple[ast.expr, ast.expr]] = []
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            assignments.extend((target, node.value) for target in node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            assignments.append((node.target, node.value))
    changed = True
    while changed:
        changed = False
        for target, value in assignments:
            if isinstance(target, ast.Name) and target.id not in known:
                held = value_of(value, known)
                if held is not None:
                    known[target.id] = held
                    changed = True
    return known


def enclosing_tests(func: ast.AST, target: ast.AST) -> list[tuple[ast.If, bool]]:
    """The ``if`` statements around ``target`` in ``func``, outermost first, each with
    True when ``target`` is in its body and False when it is in its ``else``."""

    def walk(stmts: list[ast.stmt], chain: list[tuple[ast.If, bool]]) -> list[tuple[ast.If, bool]] | None:
        for stmt in stmts:
            if stmt is target or any(node is target for node in ast.walk(stmt)):
                if isinstance(stmt, ast.If) and stmt is not target:
                    if any(node is target for node in ast.walk(stmt.test)):
                        return chain
                    inner = walk(stmt.body, chain + [(stmt, True)])
                    return inner if inner is not None else walk(stmt.orelse, chain + [(stmt, False)])
                for block in _blocks(stmt):
                    inner = walk(block, chain)
                    if inner is not None:
                        return inner
                return chain
        return None

    return walk(getattr(func, "body", []), []) or []


# ----- internals -----------------------------------------------------------------------
def _under(tree: SourceTree, paths: list[Path], under: str) -> list[Path]:
    if not under:
        return paths
    prefix = tree.package_dir / under
    return [p for p in paths if p.is_relative_to(prefix)]


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    blocks.extend(h.body for h in getattr(stmt, "handlers", []))
    blocks.extend(c.body for c in getattr(stmt, "cases", []))
    return blocks


def _is_staticmethod(node: FunctionNode) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
