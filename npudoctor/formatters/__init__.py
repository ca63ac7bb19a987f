"""Report formats. Each module renders the same ``Report`` object with ``render(report) -> str``.

``FORMATS`` is the one list of them: ``check --format`` and ``advise --format`` offer these, and the
fuzz and hardening suites render every one (a test fails when a module here renders a ``Report``
and is not in it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from npudoctor.results import Report

FORMATS = ("text", "json", "junit", "sarif", "github", "markdown")


def renderer(name: str) -> Callable[[Report], str]:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}")
    return importlib.import_module(f"npudoctor.formatters.{name}").render
