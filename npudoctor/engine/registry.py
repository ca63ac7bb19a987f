"""Every check with its kind (``all_checks``), the discovery of the one-module-per-id registries
(``npudoctor.checks``, ``npudoctor.fixes``) and selection by id, shared so both behave alike.

This module is the one place that gathers the kinds: it imports the check model
(``npudoctor.engine.check``) and the catalog (``npudoctor.engine.catalog``), one way (in
``all_checks``); neither imports it back. The check and fix folders are named, not imported: their
modules import the engine (``npudoctor.engine.check``, ``npudoctor.patching.fixbase``), so the
engine finds them by name at run time, the way plugins are found, and npudoctor's import graph
stays free of cycles (``tests/engine/test_import_graph.py``)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from npudoctor.engine.kinds import CheckKind
from npudoctor.errors import unknown_ids

if TYPE_CHECKING:
    from npudoctor.engine.check import Check

T = TypeVar("T")


def module_names(package: str, prefix: str = "") -> Iterator[str]:
    """The full names of the modules and subpackages directly in ``package`` (not imported)
    whose own name starts with ``prefix``."""
    spec = importlib.util.find_spec(package)
    for info in pkgutil.iter_modules(spec.submodule_search_locations or []):
        if info.name.startswith(prefix):
            yield f"{package}.{info.name}"


def discover(package: str, attribute: str, of_type: type[T]) -> list[T]:
    """The ``attribute`` object (an instance of ``of_type``) of every module in ``package``, by id."""
    found: dict[str, T] = {}
    for name in module_names(package):
        module = importlib.import_module(name)
        item = getattr(module, attribute, None)
        if isinstance(item, of_type):
            if item.id in found:  # type: ignore[attr-defined]
                raise RuntimeError(f"duplicate id {item.id} in {name}")  # type: ignore[attr-defined]
            found[item.id] = item  # type: ignore[attr-defined]
    return [found[key] for key in sorted(found)]


def all_checks() -> list[Check]:
    """Every check module in ``npudoctor.checks``, ordered by id (the deep checks, then the
    generic properties), then every record of the known-defect catalog. The model and the catalog
    are imported here, not at the top: a runtime fix in sglang's processes finds its module through
    ``module_names`` and must not load them."""
    from npudoctor.engine.catalog import all_records
    from npudoctor.engine.check import Check
    from npudoctor.results import Impact

    checks = discover("npudoctor.checks", "CHECK", Check)
    for check in checks:
        kind = getattr(check, "kind", None)  # every decision by kind reads it: a check without one is a bug
        if not isinstance(kind, CheckKind) or not kind.owns(check.id):
            raise RuntimeError(f"check {check.id} names no kind whose prefix its id carries (CheckKind)")
        if not isinstance(getattr(check, "impact", None), Impact):  # the gate grades every finding by it
            raise RuntimeError(f"check {check.id} names no impact (npudoctor.results.Impact)")
    return checks + list(all_records())


def _default_selected(item: object) -> bool:
    """A check's own default (``Check.default_selected``: an opt-in check is not); a fix takes its
    check's kind's."""
    own = getattr(item, "default_selected", None)
    return own if isinstance(own, bool) else CheckKind.of(item.id).default_selected  # type: ignore[attr-defined]


def select(items: list[T], ids: list[str], noun: str, option: str = "--select") -> list[T]:
    """``items`` (checks, or fixes: a fix has the id and so the kind of the check it cures) whose id
    is in ``ids``, in the order given; when empty, those of a kind selected by default
    (``CheckKind.default_selected``: not the generic properties). As ruff's rule selectors: a value
    may list several ids with commas, a prefix selects every id it starts (a kind's prefix, as
    ``NPC``, selects the kind; ``NPC01``: NPC010..NPC019) but an opt-in check (the dry run) only
    when it is the prefix's one id, and ``ALL`` selects everything. A value
    that is neither an id nor a prefix of one is an input error."""
    if not ids:
        return [item for item in items if _default_selected(item)]
    known = {item.id: item for item in items}  # type: ignore[attr-defined]
    wanted = [part.strip().upper() for value in ids for part in value.split(",") if part.strip()]
    chosen: list[str] = []
    unknown = []
    for token in wanted:
        if token == "ALL":
            chosen += list(known)
            continue
        matched = [token] if token in known else [i for i in known if i.startswith(token)]
        if len(matched) > 1:  # a prefix of several: an opt-in check only when named (or ALL)
            matched = [i for i in matched if _default_selected(known[i])] or matched
        if not matched:
            unknown.append(token)
        chosen += matched
    if unknown:
        raise unknown_ids(option, noun, unknown, list(known))
    return [known[i] for i in dict.fromkeys(chosen)]
