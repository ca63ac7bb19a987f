"""What a command judges, resolved once: the sglang tree and the deployment.

Every command that reads a deployment (``check``, ``fix``, ``run``, ``advise``, ``list``,
``explain``) and the in-process API (``npudoctor.fixes.apply``) call ``resolve``, the one place
that reads the deployment, names the sglang, and holds the two against each other. The order is
the one every command keeps: the user's input first (a bad deployment or ``--ignore`` is exit 2
whatever sglang is there), then the sglang (exit 4 when there is none to judge), then the names
the deployment gives that this sglang does not know (exit 2, before any probe runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.deployment import ignores as ignore_entries
from npudoctor.deployment.spec import DeploymentSpec

if TYPE_CHECKING:
    from npudoctor.deployment.facts import Facts
    from npudoctor.deployment.ignores import Ignore
    from npudoctor.target.discovery import Target


class Need(Enum):
    """Which sglang a command needs beside the deployment."""

    DEPLOYMENT = "deployment"  # none: the deployment alone (`list`, `explain`, `run` with fixes disabled)
    ANY_SGLANG = "any"  # the sglang found, with or without the Ascend backend (`run`, the fixes API)
    ASCEND = "ascend"  # an sglang with the Ascend NPU backend: nothing else has anything to check


@dataclass(frozen=True)
class Subject:
    deployment: DeploymentSpec  # as the user described it (hints, workarounds)
    facts: Facts  # what the checks read of it
    target: Target | None = None  # None: ``Need.DEPLOYMENT``
    fail_on: str | None = None  # the YAML's ``fail_on`` words (``--fail-on`` wins when given)
    ignores: list[Ignore] = field(default_factory=list)  # the YAML's and --ignore's, validated


def resolve(
    deployment: DeploymentSpec,
    *,
    depth: str = "auto",
    sglang_path: Path | None = None,
    need: Need = Need.ASCEND,
    ignore: Sequence[str] | None = None,
) -> Subject:
    """The subject of one command. The deployment is parsed first; a launch command with the
    installed release's own parser, which knows every flag it has, only when the command may
    import sglang at all (``depth`` is not ``static``) and the sglang is the installed one.

    ``ignore`` (``check``, ``advise``): the ``--ignore`` entries, validated with the YAML's against
    every check id and kept on the subject; None where ignores play no part (``fix``, ``run``)."""
    may_import = depth != "static" and sglang_path is None
    if may_import:
        from npudoctor.deployment.launch import sglang_parser

        loaded = deployment.load(sglang_parser)
    else:
        loaded = deployment.load()
    entries: list[Ignore] = []
    if ignore is not None:
        from npudoctor.engine.registry import all_checks

        entries = loaded.ignores + [ignore_entries.parse_cli(spec) for spec in ignore]
        ignore_entries.validate(entries, {c.id for c in all_checks()})
    if need is Need.DEPLOYMENT:
        return Subject(deployment, loaded.facts, None, loaded.fail_on, entries)
    from npudoctor.target.discovery import discover, require_ascend_backend
    from npudoctor.target.serverargs import validate_arguments

    target = discover(sglang_path)
    if need is Need.ASCEND:
        require_ascend_backend(target)
    validate_arguments(loaded.facts, target)  # a name no sglang knows: exit 2 before any probe runs
    return Subject(deployment, loaded.facts, target, loaded.fail_on, entries)
