"""Static analysis of an sglang source tree with ``ast``; sglang is never imported.

The static depth of every check is built from a few questions this module answers
for any release layout, because code moves between files across releases:

* where is class ``X`` defined, and what are its bases (resolved through the defining
  module's imports, then by name across the tree);
* what is its MRO (C3 over the classes found in the tree) and which method does
  ``X().m`` resolve to;
* which ``self`` attributes does building an ``X`` assign (following ``__init__``,
  ``super()`` chains and ``self.helper()`` calls the way Python would run them);
* which ``self`` attributes does a method read (following its ``self``/``super()`` calls).

Files are read once, and parsed only when a class in them is needed: a substring
test on the raw bytes picks the few files worth parsing.

Only regular files of at most ``MAX_SOURCE_BYTES`` are read (``read_source``): a tree may come from
anyone on a shared machine, and a ``.py`` that is a FIFO blocks ``open`` for ever, one linked to
/dev/zero reads until memory runs out, a dangling link cannot be opened at all. Such a file is left
out of the tree (``SourceTree.unread``, which the report lists) and the checks judge the rest.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

# Bases that define no instance attributes a check could care about; never searched for.
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

_TYPING_NAMES = {"Any", "Optional", "Union", "List", "Dict", "Tuple", "Set", "Callable", "Type", "Sequence"}
INERT_BASES = frozenset(
    {"object", "ABC", "abc.ABC", "Generic", "Protocol", "enum.Enum", "Enum", "IntEnum", "enum.IntEnum"}
)


_CLASS_STATEMENT = re.compile(rb"^[ \t]*class[ \t]+(\w+)", re.M)

# The largest ``.py`` file read from a tree. sglang's largest module is ~250 KB (server_args.py,
# 0.5.2x); 4 MiB is sixteen times that, and reads in milliseconds.
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# open() without waiting for a FIFO's writer (O_NONBLOCK), the file's type then checked on the open
# descriptor itself (fstat): what is read is what was checked, whatever is renamed meanwhile
_OPEN_SOURCE = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class Unreadable(OSError):
    """A tree's file npudoctor does not read; the message says why (no traceback, no contents)."""


def read_source(path: str | os.PathLike[str], limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (a symlink to one is followed), at most ``limit``;
    ``Unreadable`` for anything else: a dangling link, a FIFO, a device, a directory, a larger file
    (read up to ``limit + 1`` bytes, so a file that grows while it is read is bounded too)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a device is never opened: opening one may act
            raise Unreadable("not a regular file")
        fd = os.open(path, _OPEN_SOURCE)
    except Unreadable:
        raise
    except OSError as error:
        reason = "a dangling link" if os.path.islink(path) else (error.strerror or type(error).__name__)
        raise Unreadable(reason) from None
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("not a regular file")
        if info.st_size > limit:
            raise Unreadable(f"larger than {limit // (1024 * 1024)} MiB")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(f"larger than {limit // (1024 * 1024)} MiB")
    return data


def python_files(package_dir: Path) -> tuple[list[str], dict[str, str]]:
    """Every ``.py`` file below ``package_dir`` that ``read_source`` would read (paths as strings,
    for speed), and the others by path with the reason they are left out. One ``stat`` a file, the
    link followed: a listing costs what the walk costs."""
    found, unread = [], {}
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            try:
                info = os.stat(path)
            except OSError as error:
                unread[path] = "a dangling link" if os.path.islink(path) else (error.strerror or "unreadable")
                continue
            if not stat.S_ISREG(info.st_mode):
                unread[path] = "not a regular file"
            elif info.st_size > MAX_SOURCE_BYTES:
                unread[path] = f"larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB"
            else:
                found.append(path)
    return found, unread


@dataclass(eq=False)
class ClassInfo:
    """One class definition found in the tree."""

    name: str
    module: str
    path: Path
    node: ast.ClassDef
    tree: SourceTree = field(repr=False)

    @property
    def line(self) -> int:
        return self.node.lineno

    @property
    def relpath(self) -> str:
        return self.tree.relpath(self.path)

    @cached_property
    def methods(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for stmt in flatten_conditional(self.node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[stmt.name] = stmt
        return found

    @cached_property
    def class_attributes(self) -> set[str]:
        """Names bound in the class body: methods, properties, class variables."""
        names = set(self.methods)
        for stmt in flatten_conditional(self.node.body):
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
        return names

    def __str__(self) -> str:
        return f"{self.name} ({self.relpath}:{self.line})"


@dataclass(frozen=True)
class FunctionRef:
    """A function or method definition found in the tree: for a method, as resolved on some class
    (``owner`` is the class whose body defines it)."""

    node: FunctionNode
    path: Path
    tree: SourceTree
    owner: ClassInfo | None = None  # the class whose body defines it, for methods
    outer: FunctionRef | None = None  # the function it is nested in, for closures

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def qualname(self) -> str:
        if self.owner is not None:
            return f"{self.owner.name}.{self.node.name}"
        if self.outer is not None:
            return f"{self.outer.qualname}.<locals>.{self.node.name}"
        return self.node.name

    @property
    def line(self) -> int:
        return self.node.lineno

    @property
    def relpath(self) -> str:
        return self.tree.relpath(self.path)

    def where(self, line: int | None = None) -> str:
        return f"{self.relpath}:{self.line if line is None else line}"

    @property
    def parameters(self) -> list[ast.arg]:
        args = self.node.args
        return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs]

    def __str__(self) -> str:
        return f"{self.qualname} ({self.where()})"

    @classmethod
    def method(cls, owner: ClassInfo, node: FunctionNode) -> FunctionRef:
        return cls(node, owner.path, owner.tree, owner=owner)


@dataclass(frozen=True)
class AttributeUse:
    """A ``self.<name>`` read or assignment, with the method it appears in."""

    name: str
    method: FunctionRef
    line: int

    def where(self) -> str:
        return f"{self.method.relpath}:{self.line}"


class SourceTree:
    """The Python files of one sglang package directory, indexed lazily."""

    def __init__(self, package_dir: Path):
        self.package_dir = package_dir
        self.root = package_dir.parent
        self._bytes: dict[str, bytes] = {}
        self._modules: dict[Path, ast.Module | None] = {}
        self._classes_by_file: dict[Path, list[ClassInfo]] = {}
        self._containing: dict[tuple[str, str], list[Path]] = {}
        self._bases: dict[int, list[ClassInfo | str]] = {}
        self._mro: dict[int, list[ClassInfo]] = {}
        self._resolved: dict[tuple[Path, str], ClassInfo | None] = {}
        self.memo: dict[str, object] = {}  # per-tree caches of the helper modules (dataflow)
        self.unread: dict[str, str] = {}  # files left unread (``read_source``) -> why

    def release(self) -> None:
        """Drop everything parsed and memoised (a check run calls it when it is done with the
        source). The classes found hold the tree and the tree holds them, so without this the ASTs
        (about a million objects for a release) wait for a full pass of the cyclic garbage
        collector, which then traverses them all; released, reference counting frees them at
        once. A later question reads and parses again."""
        for cache in (self._bytes, self._modules, self._classes_by_file, self._containing):
            cache.clear()
        for cache in (self._bases, self._mro, self._resolved, self.memo):
            cache.clear()
        self.__dict__.pop("files", None)

    # ----- files -------------------------------------------------------------------
    @cached_property
    def files(self) -> list[str]:
        """Paths (as strings, for speed) of every ``.py`` file below the package directory that
        npudoctor reads (``python_files``); the others are in ``unread``."""
        found, unread = python_files(self.package_dir)
        self.unread.update(unread)
        return found

    def read(self, path: Path | str) -> bytes:
        """The file's bytes; empty (and the file in ``unread``) when it is not one ``read_source``
        reads: a module that is a FIFO, say, is then a module with no code."""
        key = str(path)
        data = self._bytes.get(key)
        if data is None:
            try:
                data = read_source(key)
            except Unreadable as why:
                self.unread[key] = str(why)
                data = b""
            self._bytes[key] = data
        return data

    def parse(self, path: Path) -> ast.Module | None:
        if path not in self._modules:
            try:
                self._modules[path] = ast.parse(self.read(path), filename=str(path))
            except (SyntaxError, ValueError):
                self._modules[path] = None
        return self._modules[path]

    def files_containing(self, needle: str, under: str = "") -> list[Path]:
        """Files whose text contains ``needle``: a cheap filter before parsing, scanned once per needle."""
        key = (needle, under)
        if key not in self._containing:
            raw = needle.encode()
            prefix = os.path.join(self.package_dir, under, "") if under else ""
            self._containing[key] = [
                Path(path) for path in self.files if path.startswith(prefix) and raw in self.read(path)
            ]
        return self._containing[key]

    def relpath(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def module_name(self, path: Path) -> str:
        rel = path.relative_to(self.root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def absolute_module(self, path: Path, stmt: ast.ImportFrom) -> str:
        """The module a ``from ... import`` statement in ``path`` names, relative levels resolved."""
        if not stmt.level:
            return stmt.module or ""
        current = self.module_name(path)
        package = current if path.name == "__init__.py" else current.rpartition(".")[0]
        for _ in range(stmt.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{stmt.module}" if stmt.module else package

    def module_path(self, module: str) -> Path | None:
        """The file of ``module`` if it is one of the tree's own (the package or below it), else
        None. Installed, sglang shares its folder with its dependencies: ``torch.cuda.graphs`` is a
        file beside it, yet no module of the tree (every path the tree hands out is below
        ``package_dir``; ``relpath`` and ``module_name`` rely on it), and a name imported from it
        is imported from outside, as in an unpacked wheel that holds sglang alone."""
        if module.partition(".")[0] != self.package_dir.name:
            return None
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    # ----- classes -----------------------------------------------------------------
    def classes_in(self, path: Path) -> list[ClassInfo]:
        if path not in self._classes_by_file:
            module = self.parse(path)
            found = []
            if module is not None:
                name = self.module_name(path)
                for stmt in flatten_conditional(module.body):
                    if isinstance(stmt, ast.ClassDef):
                        found.append(ClassInfo(stmt.name, name, path, stmt, self))
            self._classes_by_file[path] = found
        return self._classes_by_file[path]

    def find_classes(self, name: str, under: str = "") -> list[ClassInfo]:
        """Every top-level definition of class ``name`` in the tree (or below ``under``)."""
        prefix = os.path.join(self.package_dir, under, "") if under else ""
        return [
            cls
            for path in self._class_index().get(name, ())
            if path.startswith(prefix)
            for cls in self.classes_in(Path(path))
            if cls.name == name
        ]

    def _class_index(self) -> dict[str, list[str]]:
        """The files that have a ``class <name>`` statement, by name: one regex pass over the tree
        answers every lookup (a walk over a deployment's whole path asks for hundreds of names,
        and a scan per name cost 50 ms each on a 4,700-file release)."""
        index = self.memo.get("source.class_index")
        if index is None:
            index = {}
            for path in self.files:
                for name in dict.fromkeys(_CLASS_STATEMENT.findall(self.read(path))):
                    index.setdefault(name.decode(), []).append(path)
            self.memo["source.class_index"] = index
        return index  # type: ignore[return-value]

    def resolve_name(self, module_path: Path, name: str, _depth: int = 0) -> ClassInfo | None:
        """The class that ``name`` (possibly dotted) denotes inside the module at ``module_path``."""
        if _depth > 8:
            return None
        head, _, rest = name.partition(".")
        for cls in self.classes_in(module_path):
            if cls.name == name:
                return cls
        module = self.parse(module_path)
        if module is None:
            return None
        for stmt in flatten_conditional(module.body):
            if isinstance(stmt, ast.ImportFrom) and stmt.module:
                source = self.absolute_module(module_path, stmt)
                for alias in stmt.names:
                    if (alias.asname or alias.name) == head:
                        if rest:  # from pkg import mod; mod.Class
                            sub = self.module_path(f"{source}.{alias.name}")
                            return self.resolve_name(sub, rest, _depth + 1) if sub else None
                        target = self.module_path(source)
                        if target is not None and target != module_path:
                            found = self.resolve_name(target, alias.name, _depth + 1)
                            if found is not None:
                                return found
            elif isinstance(stmt, ast.Import) and rest:  # import pkg.mod [as m]; m.Class
                module_name, _, class_name = name.rpartition(".")
                for alias in stmt.names:
                    if alias.asname == head:
                        real = alias.name + module_name[len(head) :]
                    elif alias.asname is None and alias.name.split(".")[0] == head:
                        real = module_name
                    else:
                        continue
                    target = self.module_path(real)
                    if target is not None:
                        return self.resolve_name(target, class_name, _depth + 1)
        return None

    def resolve_class(self, module_path: Path, name: str) -> ClassInfo | None:
        """The class ``name`` denotes in the module at ``module_path``, more leniently than
        ``resolve_name``: a definition or an import, a module-level alias ``name = Other`` or,
        failing those, the only class of that name in the tree (typing names and builtins are
        never sglang classes)."""
        key = (module_path, name)
        if key not in self._resolved:
            self._resolved[key] = self._resolve_class(module_path, name)
        return self._resolved[key]

    def _resolve_class(self, path: Path, name: str) -> ClassInfo | None:
        if name in _TYPING_NAMES or (("." not in name) and hasattr(builtins, name)):
            return None
        found = self.resolve_name(path, name)
        if found is not None:
            return found
        module = self.parse(path)
        if module is not None and "." not in name:
            for stmt in flatten_conditional(module.body):
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.value, (ast.Name, ast.Attribute))
                    and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
                ):
                    target = ast.unparse(stmt.value)
                    if target != name:
                        return self.resolve_name(path, target)
        if "." not in name:
            candidates = self.find_classes(name)
            if len(candidates) == 1:
                return candidates[0]
        return None

    def bases(self, cls: ClassInfo) -> list[ClassInfo | str]:
        """The bases of ``cls``: a ClassInfo where the tree defines it, else the base's source text."""
        if id(cls) not in self._bases:
            resolved: list[ClassInfo | str] = []
            for base in cls.node.bases:
                text = ast.unparse(base.value if isinstance(base, ast.Subscript) else base)  # Generic[T]
                found = None if text in INERT_BASES else self.resolve_name(cls.path, text)
                if found is None and "." not in text and text not in INERT_BASES:
                    # a name not found through imports: look in the same subpackage (srt/, lang/, ...)
                    part = cls.path.relative_to(self.package_dir).parts[0]
                    candidates = [c for c in self.find_classes(text, under=part) if c is not cls]
                    found = candidates[0] if len(candidates) == 1 else None
                resolved.append(found if found is not None else text)
            self._bases[id(cls)] = resolved
        return self._bases[id(cls)]

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """C3 linearisation over the classes defined in the tree (computed once per class)."""
        if id(cls) not in self._mro:
            self._mro[id(cls)] = self._linearise(cls, frozenset())
        return self._mro[id(cls)]

    def external_bases(self, cls: ClassInfo) -> list[str]:
        """Bases anywhere in the MRO that the tree does not define and that may carry state."""
        found: list[str] = []
        for klass in self.mro(cls):
            for base in self.bases(klass):
                if isinstance(base, str) and base not in INERT_BASES and base not in found:
                    found.append(base)
        return found

    def _linearise(self, cls: ClassInfo, seen: frozenset[int]) -> list[ClassInfo]:
        if id(cls) in self._mro:
            return self._mro[id(cls)]
        if id(cls) in seen:  # a cycle can only come from a name resolved to the wrong class
            return [cls]
        seen = seen | {id(cls)}
        parents = [b for b in self.bases(cls) if isinstance(b, ClassInfo)]
        sequences = [list(self._linearise(p, seen)) for p in parents] + [list(parents)]
        result = [cls]
        while any(sequences):
            for seq in sequences:
                if seq and not any(seq[0] in s[1:] for s in sequences):
                    head = seq[0]
                    break
            else:  # inconsistent hierarchy: fall back to depth-first order
                head = next(s[0] for s in sequences if s)
            result.append(head)
            sequences = [s[1:] if s and s[0] is head else [x for x in s if x is not head] for s in sequences]
        return result

    def is_subclass(self, cls: ClassInfo, base_name: str) -> bool:
        return any(c.name == base_name for c in self.mro(cls))

    def lookup(self, mro: list[ClassInfo], method: str, start: int = 0) -> FunctionRef | None:
        for klass in mro[start:]:
            node = klass.methods.get(method)
            if node is not None:
                return FunctionRef.method(klass, node)
        return None

    # ----- attribute flow ----------------------------------------------------------
    def construction_methods(self, cls: ClassInfo) -> list[FunctionRef]:
        """The methods ``cls(...)`` runs: its ``__init__`` and what that calls on ``self``/``super()``."""
        mro = self.mro(cls)
        start = self.lookup(mro, "__init__")
        return [] if start is None else self._reachable_methods(mro, start)

    def construction_assignments(self, cls: ClassInfo) -> dict[str, AttributeUse]:
        """``self`` attributes assigned while ``cls(...)`` runs, following the calls it makes."""
        assigned: dict[str, AttributeUse] = {}
        for ref in self.construction_methods(cls):
            for use in _self_assignments(ref):
                assigned.setdefault(use.name, use)
        return assigned

    def reads(self, cls: ClassInfo, method: FunctionRef) -> dict[str, AttributeUse]:
        """``self`` attributes that calling ``method`` on a ``cls`` reads, following its calls."""
        mro = self.mro(cls)
        found: dict[str, AttributeUse] = {}
        for ref in self._reachable_methods(mro, method):
            for use in _self_reads(ref):
                found.setdefault(use.name, use)
        return found

    def methods_reached(self, mro: list[ClassInfo], start: FunctionRef) -> list[FunctionRef]:
        """``start`` and every method it transitively calls on ``self`` through ``mro`` (incl.
        ``super()`` and ``Base.m(self)``), memoised per tree."""
        memo = self.memo.setdefault("source.reached", {})
        key = (id(mro[0]) if mro else 0, id(start.node), id(start.owner))
        if key not in memo:
            memo[key] = self._reachable_methods(mro, start)
        return memo[key]

    def _reachable_methods(self, mro: list[ClassInfo], start: FunctionRef) -> list[FunctionRef]:
        """``start`` and every method it transitively calls on ``self`` (incl. via ``super()``)."""
        order: list[FunctionRef] = []
        seen: set[tuple[int, str]] = set()
        stack = [start]
        index = {id(c): i for i, c in enumerate(mro)}
        while stack:
            ref = stack.pop()
            key = (id(ref.owner), ref.node.name)
            if key in seen:
                continue
            seen.add(key)
            order.append(ref)
            for call in _calls(ref.node):
                target = self._call_target(mro, index, ref, call)
                if target is not None:
                    stack.append(target)
        return order

    def _call_target(self, mro, index, caller: FunctionRef, call: ast.Call) -> FunctionRef | None:
        func = call.func
        receiver = func.value
        if is_self(receiver):
            return self.lookup(mro, func.attr)
        if (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "super"
        ):
            after = caller.owner
            if receiver.args:  # super(Klass, self)
                named = self.resolve_name(caller.owner.path, ast.unparse(receiver.args[0]))
                after = named if named is not None else after
            position = index.get(id(after))
            if position is None:
                position = next((i for i, c in enumerate(mro) if c.name == after.name), None)
            return None if position is None else self.lookup(mro, func.attr, position + 1)
        if call.args and is_self(call.args[0]) and isinstance(receiver, (ast.Name, ast.Attribute)):
            named = self.resolve_name(caller.owner.path, ast.unparse(receiver))  # Base.method(self, ...)
            if named is not None:
                position = index.get(id(named))
                if position is None:
                    position = next((i for i, c in enumerate(mro) if c.name == named.name), None)
                if position is not None:
                    return self.lookup(mro, func.attr, position)
        return None


def flatten_conditional(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module or class body, looking into ``if``/``try`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from flatten_conditional(stmt.body)
            yield from flatten_conditional(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from flatten_conditional(block)
        else:
            yield stmt


def is_self(node: ast.AST) -> bool:
    """``node`` is the name ``self``."""
    return isinstance(node, ast.Name) and node.id == "self"


def body_without_docstring(func: FunctionNode) -> list[ast.stmt]:
    """The statements of ``func``'s body after its docstring, if it has one."""
    body = list(func.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body


def own_nodes(func: ast.AST) -> list[ast.AST]:
    """The nodes of a function body in source order, not descending into nested scopes."""
    found = []
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    found.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    return found


def _calls(func: ast.AST) -> Iterator[ast.Call]:
    for node in own_nodes(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def _self_assignments(ref: FunctionRef) -> Iterator[AttributeUse]:
    for node in own_nodes(ref.node):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
            yield AttributeUse(node.attr, ref, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and is_self(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield AttributeUse(node.args[1].value, ref, node.lineno)


def _self_reads(ref: FunctionRef) -> Iterator[AttributeUse]:
    guarded = {
        node.args[1].value
        for node in own_nodes(ref.node)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr")
        and len(node.args) >= 2
        and is_self(node.args[0])
        and isinstance(node.args[1], ast.Constant)
    }
    for node in own_nodes(ref.node):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and is_self(node.value)
            and node.attr not in guarded
        ):
            yield AttributeUse(node.attr, ref, node.lineno)
