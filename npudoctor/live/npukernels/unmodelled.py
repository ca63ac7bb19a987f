"""How a CPU reference refuses a call it does not model.

A reference answers only for the argument forms its docstring lists; anything else raises
``NotImplementedError`` naming the op and the argument, so a dry run never passes on a kernel call
whose result the reference would have had to guess. The simulation reports such a refusal as its own
gap, never as sglang's defect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn


def refuse(op: str, argument: str, detail: str) -> NoReturn:
    """Raise ``NotImplementedError`` for ``op`` called with an ``argument`` form it does not model."""
    raise NotImplementedError(f"CPU reference of {op}: {argument}: {detail}")


def refuse_given(op: str, extras: Mapping[str, Any]) -> None:
    """Refuse the keyword arguments a reference does not take, unless left at None (sglang passes
    e.g. ``antiquant_scale=None`` explicitly)."""
    given = sorted(name for name, value in extras.items() if value is not None)
    if given:
        refuse(op, ", ".join(given), "argument not modelled")
