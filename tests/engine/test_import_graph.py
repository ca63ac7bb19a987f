"""npudoctor's modules import each other without cycles.

The graph is read with ``ast`` from the source (``npudoctor/``, ``checks/`` installed as
``npudoctor.checks``, ``fixes/`` as ``npudoctor.fixes``): every ``import`` and ``from ... import``,
also inside functions and under ``TYPE_CHECKING`` (a lazy import is still a dependency), relative
imports resolved, and every ``importlib.import_module("a.literal.name")`` (a module imported by
its spelled-out name is a dependency too; a name computed at run time, the way the check and fix
folders are discovered, is not one the source can show). A package's ``__init__`` is an edge only where a module imports it by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {
    "npudoctor": REPO / "npudoctor",
    "npudoctor.checks": REPO / "checks",
    "npudoctor.fixes": REPO / "fixes",
}


def modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The npudoctor modules ``name`` (at ``path``) imports, each resolved to a module of ``known``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
        elif _imported_by_name(node):
            found.add(node.args[0].value)
    return {m for m in found if m in known and m != name}


def _imported_by_name(node: ast.AST) -> bool:
    """Whether ``node`` is ``importlib.import_module("literal")`` (or ``import_module("literal")``)."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )
    first = node.args[0]
    return named and isinstance(first, ast.Constant) and isinstance(first.value, str)


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert "npudoctor.patching.activation" in graph["npudoctor.service.recordedfixes"]
    assert "npudoctor.engine.check" in graph["npudoctor.live.child_process"]
    assert any(name.startswith("npudoctor.checks.npd001") for name in graph)
    # a lazy import inside a function counts
    assert "npudoctor.patching.fixbase" in graph["npudoctor.patching.activation"]


def test_a_module_imported_by_its_literal_name_is_an_edge(tmp_path):
    """``importlib.import_module("npudoctor.x")`` hides an edge from ``import`` statements alone:
    the registry once reached the catalog that way, a cycle through the check model."""
    known = {
        "npudoctor.a": tmp_path / "a.py",
        "npudoctor.b": tmp_path / "b.py",
        "npudoctor.c": tmp_path / "c.py",
    }
    known["npudoctor.a"].write_text(
        "import importlib\n"
        "from importlib import import_module\n"
        "def late(name):\n"
        "    importlib.import_module('npudoctor.b')\n"
        "    import_module('npudoctor.c')\n"
        "    importlib.import_module(name)\n"
        "    importlib.import_module(f'npudoctor.{name}')\n",
        encoding="utf-8",
    )
    assert imports_of("npudoctor.a", known["npudoctor.a"], known) == {"npudoctor.b", "npudoctor.c"}


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_cycles_are_found(graph, expected):
    assert sorted(cycles(graph)) == expected


def repeated_names(paths: list[Path]) -> dict[str, list[str]]:
    """Module and package names used more than once among ``paths`` (relative to the engine's root):
    ``fix.py`` beside ``fixes/``, or ``plan.py`` in two packages, make a reader ask which one."""
    seen: dict[str, list[str]] = {}
    for path in paths:
        for index, part in enumerate(path.parts):
            name = part.removesuffix(".py")
            if name in ("__init__", "__main__") or (index < len(path.parts) - 1 and part.endswith(".py")):
                continue
            where = "/".join(path.parts[: index + 1])
            if where not in seen.setdefault(name, []):
                seen[name].append(where)
    return {name: places for name, places in seen.items() if len(places) > 1}


def engine_paths() -> list[Path]:
    root = ROOTS["npudoctor"]
    return sorted(p.relative_to(root) for p in root.rglob("*.py"))


def test_no_module_name_is_used_twice_in_the_engine():
    repeated = repeated_names(engine_paths())
    assert not repeated, "names used twice: " + "; ".join(f"{n}: {', '.join(p)}" for n, p in repeated.items())


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["a/plan.py", "b/plan.py", "b/other.py"], {"plan": ["a/plan.py", "b/plan.py"]}),
        (["live/probe.py", "engine/live.py"], {"live": ["live", "engine/live.py"]}),
        (["a/__init__.py", "b/__init__.py", "a/x.py"], {}),
    ],
)
def test_repeated_names_are_found(paths, expected):
    assert repeated_names([Path(p) for p in paths]) == expected


def package_of(module: str) -> str:
    """The engine package a module belongs to: ``npudoctor.<package>`` for the modules of a
    subpackage (checks and fixes included), ``npudoctor`` for the root's vocabulary modules
    (errors, results, lazy); ``npudoctor.__main__`` is the entry point, above everything."""
    parts = module.split(".")
    subpackage = len(parts) == 2 and (module in ROOTS or (ROOTS["npudoctor"] / parts[1]).is_dir())
    if len(parts) > 2 or subpackage:
        return ".".join(parts[:2])
    return module if parts[-1] == "__main__" else "npudoctor"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        own = package_of(module)
        packages.setdefault(own, set()).update(p for p in map(package_of, imported) if p != own)
    return packages


def test_packages_are_layered():
    """Packages, not only modules, import one way: each package sits on the ones below it
    (DESIGN.md, "Layers"), so a change to a lower package never needs a higher one."""
    found = cycles(package_graph(import_graph()))
    assert not found, "packages that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_package_cycles_are_found():
    graph = {
        "npudoctor.a.x": {"npudoctor.b.y"},
        "npudoctor.b.y": set(),
        "npudoctor.b.z": {"npudoctor.a.w"},
        "npudoctor.a.w": set(),
    }
    assert cycles(package_graph(graph)) == [["npudoctor.a", "npudoctor.b"]]
