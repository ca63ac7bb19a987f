"""Check kinds are data: every check names its kind, and no code outside ``npudoctor.engine.kinds``
decides a kind from an id prefix literal or from the catalog's class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from npudoctor.cli.options import SelectOption
from npudoctor.engine.catalog import all_records
from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks, select

from support.repo import REPO, check_folder_ids

KINDS = REPO / "npudoctor" / "engine" / "kinds.py"
# the code npudoctor ships: it never spells a kind's prefix, whatever for
PACKAGE = ("npudoctor", "checks", "fixes")
# the code around it: it spells a prefix as user syntax (``--select NPD``), never to decide a kind
AROUND = ("tests", "scripts", "benchmarks")
PREFIXES = {kind.prefix for kind in CheckKind} | {kind.heading for kind in CheckKind}


def _is_prefix(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PREFIXES


def _prefix_literals(node: ast.AST) -> list[ast.Constant]:
    """``node`` itself, or the elements of a tuple, list or set literal, that are a prefix literal
    (not those inside a call: ``ids(["NPP"]) == [...]`` selects, it does not decide)."""
    elements = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [n for n in elements if _is_prefix(n)]


def _is_an_id(node: ast.AST) -> bool:
    """``x.id`` or ``x["id"]``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "id"
    return (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "id"
    )


def _is_a_prefix_cut(node: ast.AST) -> bool:
    """``[:3]``: as long as a kind's prefix."""
    lengths = {len(kind.prefix) for kind in CheckKind}
    return (
        isinstance(node, ast.Slice) and isinstance(node.upper, ast.Constant) and node.upper.value in lengths
    )


def kind_decisions(source: str, shipped: bool) -> list[tuple[int, str]]:
    """``(line, what)`` for each place in ``source`` that decides a kind on its own: a prefix literal
    anywhere in shipped code; elsewhere one that an id is tested against (``.startswith("NPC")``,
    ``== "NPD"``, ``in {"NPD", "NPC"}``); and, anywhere, an id cut to its prefix (``item.id[:3]``)
    or ``isinstance(x, CatalogRecord)``."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if shipped and _is_prefix(node):
            found.append((node.lineno, repr(node.value)))
        elif not shipped and isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
            found += [(n.lineno, f"startswith({n.value!r})") for a in node.args for n in _prefix_literals(a)]
        elif not shipped and isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += [(n.lineno, f"compared with {n.value!r}") for n in _prefix_literals(side)]
        if isinstance(node, ast.Subscript) and _is_a_prefix_cut(node.slice) and _is_an_id(node.value):
            found.append((node.lineno, f"{ast.unparse(node)}: an id cut to a prefix"))
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "isinstance"
            and len(node.args) == 2
            and "CatalogRecord" in ast.unparse(node.args[1])
        ):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def python_files() -> list[tuple[Path, bool]]:
    return [
        (path, top in PACKAGE)
        for top in PACKAGE + AROUND
        for path in sorted((REPO / top).rglob("*.py"))
        if path != KINDS and ".venv" not in path.parts
    ]


def test_no_kind_is_decided_outside_the_kinds():
    """On main this failed at 25 places in 14 files, among them ``ID_PREFIX = "NPC"`` (npudoctor/engine/catalog.py),
    ``select=["NPC"]`` (npudoctor/service/operations.py), ``isinstance(c, CatalogRecord)``
    (npudoctor/formatters/osv.py), ``item.id[:3]`` (npudoctor/formatters/listing.py) and
    ``r["id"].startswith("NPC")`` (tests/cli/test_gate.py)."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path, shipped in python_files()
        for line, what in kind_decisions(path.read_text(encoding="utf-8"), shipped)
    ]
    assert not found, "a kind decided from an id literal, not CheckKind:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "shipped", "expected"),
    [
        ('ID_PREFIX = "NPC"', True, [(1, "'NPC'")]),
        ('f"{x}"; y = ["NPD*"]', True, [(1, "'NPD*'")]),
        ('cli("check", "--select", "NPD")', False, []),
        ('[r for r in rs if r["id"].startswith("NPC")]', False, [(1, "startswith('NPC')")]),
        (
            'any(i.startswith(("NPD", "NPP")) for i in x)',
            False,
            [(1, "startswith('NPD')"), (1, "startswith('NPP')")],
        ),
        (
            'assert {i[:3] for i in c} == {"NPD", "NPC"}',
            False,
            [(1, "compared with 'NPC'"), (1, "compared with 'NPD'")],
        ),
        ("isinstance(item, CatalogRecord)", False, [(1, "isinstance(item, CatalogRecord)")]),
        ('f"--select {item.id[:3]}"', True, [(1, "item.id[:3]: an id cut to a prefix")]),
        ('r["id"][:3] == kind', False, [(1, "r['id'][:3]: an id cut to a prefix")]),
        ("receiver.id[:1]", True, []),
        ('"NPD001".startswith("NPD0")', False, []),
        ('assert ids(["NPP"]) == ["NPP001"]', False, []),
    ],
)
def test_kind_decisions_are_found(source, shipped, expected):
    assert kind_decisions(source, shipped) == expected


def test_every_check_names_the_kind_of_its_folder():
    checks = all_checks()
    for kind in (CheckKind.DEEP, CheckKind.PROPERTY):
        assert check_folder_ids(kind) and [c.id for c in checks if c.kind is kind] == check_folder_ids(kind)
    assert [c.id for c in checks if c.kind is CheckKind.CATALOG] == [r.id for r in all_records()]
    assert [c.kind for c in checks] == sorted((c.kind for c in checks), key=list(CheckKind).index)


@pytest.mark.parametrize("kind", list(CheckKind))
def test_a_kind_prefix_selects_the_kind(kind):
    checks = all_checks()
    opt_in = {c.id for c in checks if getattr(c, "opt_in", False)}  # named by id only
    assert select(checks, [kind.prefix], "check") == [
        c for c in checks if c.kind is kind and c.id not in opt_in
    ]
    assert all(CheckKind.of(c.id) is kind for c in checks if c.kind is kind)


def test_the_default_selection_is_the_default_kinds_without_the_opt_in_checks():
    checks = all_checks()
    opt_in = [c.id for c in checks if getattr(c, "opt_in", False)]
    assert opt_in == ["NPD007"]  # the dry run: a start-up of sglang per role
    assert select(checks, [], "check") == [
        c for c in checks if c.kind.default_selected and c.id not in opt_in
    ]
    assert [k for k in CheckKind if not k.default_selected] == [CheckKind.PROPERTY]
    # selected by its id and by ALL; a prefix of several ids (``--select NPD``: the deep checks, as
    # the examples and hints use it) leaves it out
    assert [c.id for c in select(checks, ["NPD007"], "check")] == ["NPD007"]
    assert "NPD007" in [c.id for c in select(checks, ["ALL"], "check")]
    assert [c.id for c in select(checks, [CheckKind.DEEP.prefix], "check")] == [
        c.id for c in checks if c.kind is CheckKind.DEEP and c.id not in opt_in
    ]


def test_a_result_id_names_its_kind_and_an_id_of_no_kind_is_refused():
    assert CheckKind.of("NPC072-ignore-expired") is CheckKind.CATALOG  # npudoctor.deployment.ignores
    for result_id in ("NPX001", "npd001", "X-NPD001", ""):
        with pytest.raises(ValueError):
            CheckKind.of(result_id)
    assert not any(kind.owns(i) for kind in CheckKind for i in ("NPD01", "NPD0001", "NPD001-ignore-expired"))


def test_the_select_help_names_every_kind():
    (option,) = SelectOption.__metadata__
    for kind in CheckKind:
        assert f"{kind.prefix} ({kind.described})" in option.help
