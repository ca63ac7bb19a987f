"""The records table of catalog/README.md is what ``scripts/catalog_table.py`` prints from the
records today (ranges, remedies and titles change with the records; the table must follow)."""

from __future__ import annotations

import contextlib
import importlib.util
import io

from support.repo import REPO

_spec = importlib.util.spec_from_file_location("catalog_table", REPO / "scripts" / "catalog_table.py")
catalog_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catalog_table)


def test_the_readme_table_is_the_records_today():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        catalog_table.main()
    assert printed.getvalue() in (REPO / "catalog" / "README.md").read_text()
