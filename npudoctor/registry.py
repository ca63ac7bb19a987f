"""Discovery of the one-module-per-id registries (``npudoctor.checks``, ``npudoctor.fixes``)
and selection by id, shared so both behave alike."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import TypeVar

from npudoctor.errors import InputError

T = TypeVar("T")


def discover(package: ModuleType, attribute: str, kind: type[T]) -> list[T]:
    """The ``attribute`` object (an instance of ``kind``) of every module in ``package``, by id."""
    found: dict[str, T] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        item = getattr(module, attribute, None)
        if isinstance(item, kind):
            if item.id in found:  # type: ignore[attr-defined]
                raise RuntimeError(f"duplicate id {item.id} in {info.name}")  # type: ignore[attr-defined]
            found[item.id] = item  # type: ignore[attr-defined]
    return [found[key] for key in sorted(found)]


def select(items: list[T], ids: list[str], noun: str, option: str = "--select") -> list[T]:
    """``items`` whose id is in ``ids`` (all when empty), in the order given; unknown ids are an input error."""
    if not ids:
        return items
    known = {item.id: item for item in items}  # type: ignore[attr-defined]
    wanted = [i.strip().upper() for i in ids]
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise InputError(f"{option}: unknown {noun} id(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[i] for i in dict.fromkeys(wanted)]
