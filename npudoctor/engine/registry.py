"""Discovery of the one-module-per-id registries (``npudoctor.checks``, ``npudoctor.fixes``)
and selection by id, shared so both behave alike.

A registry is named, not imported: its modules import the engine (``npudoctor.engine.check``,
``npudoctor.patching.fixbase``), so the engine finds them by name at run time, the way plugins are found,
and npudoctor's import graph stays free of cycles (``tests/engine/test_import_graph.py``)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Iterator
from typing import TypeVar

from npudoctor.errors import unknown_ids

T = TypeVar("T")


def module_names(package: str, prefix: str = "") -> Iterator[str]:
    """The full names of the modules and subpackages directly in ``package`` (not imported)
    whose own name starts with ``prefix``."""
    spec = importlib.util.find_spec(package)
    for info in pkgutil.iter_modules(spec.submodule_search_locations or []):
        if info.name.startswith(prefix):
            yield f"{package}.{info.name}"


def discover(package: str, attribute: str, kind: type[T]) -> list[T]:
    """The ``attribute`` object (an instance of ``kind``) of every module in ``package``, by id."""
    found: dict[str, T] = {}
    for name in module_names(package):
        module = importlib.import_module(name)
        item = getattr(module, attribute, None)
        if isinstance(item, kind):
            if item.id in found:  # type: ignore[attr-defined]
                raise RuntimeError(f"duplicate id {item.id} in {name}")  # type: ignore[attr-defined]
            found[item.id] = item  # type: ignore[attr-defined]
    return [found[key] for key in sorted(found)]


def catalog_records() -> tuple:
    """The known-defect catalog's records (``npudoctor.engine.catalog``), found by name like the
    check modules: the catalog builds on ``Check``, so the engine must not import it."""
    return importlib.import_module("npudoctor.engine.catalog").all_records()


def select(items: list[T], ids: list[str], noun: str, option: str = "--select") -> list[T]:
    """``items`` whose id is in ``ids``, in the order given; when empty, those selected by default
    (not the generic properties, ``Check.default_selected``). As ruff's rule selectors: a value may
    list several ids with commas, a prefix selects every id it starts (``NPD``: the seven checks,
    ``NPC``: the catalog, ``NPP``: the properties, ``NPC01``: NPC010..NPC019), and ``ALL`` selects
    everything. A value that is neither an id nor a prefix of one is an input error."""
    if not ids:
        return [item for item in items if getattr(item, "default_selected", True)]
    known = {item.id: item for item in items}  # type: ignore[attr-defined]
    wanted = [part.strip().upper() for value in ids for part in value.split(",") if part.strip()]
    chosen: list[str] = []
    unknown = []
    for token in wanted:
        if token == "ALL":
            chosen += list(known)
            continue
        matched = [token] if token in known else [i for i in known if i.startswith(token)]
        if not matched:
            unknown.append(token)
        chosen += matched
    if unknown:
        raise unknown_ids(option, noun, unknown, list(known))
    return [known[i] for i in dict.fromkeys(chosen)]
