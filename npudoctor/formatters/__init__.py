"""Report formats. Each module renders the same ``Report`` object with ``render(report) -> str``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from npudoctor.results import Report

FORMATS = ("text", "json", "junit", "sarif", "github", "markdown")


def renderer(name: str) -> Callable[[Report], str]:
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}")
    return importlib.import_module(f"npudoctor.formatters.{name}").render
