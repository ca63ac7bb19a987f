"""The output formats are one registry, ``npudoctor.formatters.FORMATS``, and every output test
iterates it.

A format is one entry and one module rendering both documents with one signature per family
(``render(report, user, verbose)``, ``render_advice(advice)``); ``check --format`` and ``advise
--format`` offer exactly the registered names; and no test keeps a format list of its own, so
the redaction, fuzz, slim-install and hint tests cover a format the day it is registered.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import typing
from enum import Enum
from pathlib import Path

import pytest

import npudoctor.formatters
from npudoctor.cli import advise_command, check_command
from npudoctor.formatters import FORMATS, NAMES
from npudoctor.results import Report
from npudoctor.service.advise import Advice

TESTS = Path(__file__).resolve().parents[1]


def test_every_module_that_renders_a_report_is_a_registered_format():
    """A module of ``npudoctor/formatters/`` whose ``render`` takes a ``Report`` is registered (a new
    format cannot escape the suites), and each registered module renders both documents with the
    family's one signature, and what its entry says it does besides."""
    renders_a_report = set()
    for module_info in pkgutil.iter_modules(npudoctor.formatters.__path__):
        module = importlib.import_module(f"npudoctor.formatters.{module_info.name}")
        render = getattr(module, "render", None)
        if render is None or not inspect.isfunction(render):
            continue
        first = next(iter(inspect.signature(render).parameters))
        if typing.get_type_hints(render).get(first) is Report:
            renders_a_report.add(module_info.name)
    assert renders_a_report == set(NAMES)
    for entry in FORMATS:
        module = entry.module()
        assert list(inspect.signature(module.render).parameters) == ["report", "user", "verbose"], entry
        assert typing.get_type_hints(module.render_advice)["advice"] is Advice, entry
        for name in ("print_report", "print_advice"):
            assert callable(getattr(module, name, None)) is entry.terminal, (entry, name)
        for name in ("write_step_summary", "write_advice_step_summary"):
            assert callable(getattr(module, name, None)) is entry.step_summary, (entry, name)


@pytest.mark.parametrize("command", [check_command.check, advise_command.advise], ids=["check", "advise"])
def test_check_and_advise_offer_the_registered_formats(command):
    """``--format``'s choices are the registry's names, in its order (its Enum derived from it)."""
    annotated = typing.get_type_hints(command, include_extras=True)["output_format"]
    choice = typing.get_args(annotated)[0]
    (enum,) = [t for t in (choice, *typing.get_args(choice)) if isinstance(t, type) and issubclass(t, Enum)]
    assert tuple(member.value for member in enum) == NAMES


def private_format_lists(source: str) -> list[int]:
    """The lines of ``source`` holding a tuple, list or set literal of two or more registered format
    names: a format list of a test's own, which a new format would escape. A literal an ``==``
    compares with is an expected value (the formats a shipped workflow uses), not a list to iterate."""
    tree = ast.parse(source)
    expected = {
        id(side)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
        for side in (node.left, *node.comparators)
    }
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set))
        and len(node.elts) >= 2
        and id(node) not in expected
        and all(isinstance(e, ast.Constant) and e.value in NAMES for e in node.elts)
    )


def test_no_test_spells_a_format_list_of_its_own():
    """Every output test takes its formats from the registry (``FORMATS``, ``NAMES``, an entry's
    ``hints`` or ``parsed_as``)."""
    found = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in private_format_lists(path.read_text(encoding="utf-8"))
    ]
    assert not found, "format lists of a test's own (iterate npudoctor.formatters.FORMATS): " + ", ".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('for f in ("text", "json", "junit"):\n    pass\n', [1]),
        ('HINTED = ("text", "markdown")\n', [1]),
        ('ok = fmt in ["json", "sarif"]\n', [1]),
        ('assert sorted(formats) == ["github", "junit"]\n', []),
        ('for f in ("text", "yaml"):\n    pass\n', []),
        ("for f in FORMATS:\n    pass\n", []),
    ],
)
def test_private_format_lists_are_found(source, lines):
    assert private_format_lists(source) == lines
