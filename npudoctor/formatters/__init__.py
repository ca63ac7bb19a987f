"""The output formats of ``check`` and ``advise``: one registry, ``FORMATS``, and one module each.

A format is one entry here and one module, ``npudoctor/formatters/<name>.py``, that renders both
documents those commands print, each family with one signature:

- ``render(report, user=None, verbose=False) -> str``: a ``check`` report. ``user`` is the user's
  own options that a hint repeats (``npudoctor.service.hints.UserOptions``; None: those the report
  itself names), ``verbose`` every check's details (a format that shows only the findings'
  details reads it); a format without hints or details takes both and ignores them.
- ``render_advice(advice) -> str``: ``advise``'s release matrix and recommendation.

What an entry says beyond its name is what a caller does differently for it: ``terminal``, the
module also draws both on a rich console (``print_report(console, report, user, verbose)``,
``print_advice(console, advice)``), which the CLI uses for stdout, so a terminal gets its width
and colours; ``step_summary``, the module also appends Markdown to ``$GITHUB_STEP_SUMMARY``
(``write_step_summary(report, path)``, ``write_advice_step_summary(advice, path)``) when the
variable is set. ``hints`` and ``parsed_as`` describe the output for the tests that iterate the
registry: the formats that name npudoctor commands to paste (a finding's fix, with the user's
options) and show a control character escaped, and the syntax a tool parses a format with.

``check --format`` and ``advise --format`` offer exactly these (``npudoctor.cli.options``
derives the choice from ``NAMES``), and every output test (redaction, fuzz, the slim install,
hints) iterates ``FORMATS``, so a new format cannot escape them. A module is loaded when its
format is used: this file imports none of them, and none of them imports this file.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal


@dataclass(frozen=True)
class Format:
    """One output format: its name and what a caller or a test does differently for it."""

    name: str  # ``--format NAME``, and the module ``npudoctor.formatters.NAME``
    hints: bool = False  # names the npudoctor commands to paste, with the user's options
    terminal: bool = False  # drawn on the console when it goes to stdout
    step_summary: bool = False  # appends Markdown to $GITHUB_STEP_SUMMARY
    parsed_as: Literal["json", "xml"] | None = None  # the syntax tools read it with; None: lines

    def module(self) -> ModuleType:
        """The module that renders it (imported on first use: ``--help`` loads no renderer)."""
        return importlib.import_module(f"{__name__}.{self.name}")


FORMATS = (
    Format("text", hints=True, terminal=True),
    Format("json", parsed_as="json"),
    Format("junit", hints=True, parsed_as="xml"),
    Format("sarif", parsed_as="json"),
    Format("github", hints=True, step_summary=True),
    Format("markdown", hints=True),
)
NAMES = tuple(f.name for f in FORMATS)
DEFAULT = FORMATS[0]


def named(name: str) -> Format:
    """The entry of a ``--format`` value."""
    for found in FORMATS:
        if found.name == name:
            return found
    raise ValueError(f"unknown format {name!r}")
