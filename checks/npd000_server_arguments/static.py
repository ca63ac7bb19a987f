"""NPD000 static probe: every name the deployment passes against the release's ServerArgs table
(``npudoctor.target.serverargs.read_table``), with the releases that know a name this one lacks."""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.target.discovery import Target
from npudoctor.target.serverargs import (
    SERVER_ARGS_MODULE,
    ServerArgsTable,
    Unaccepted,
    history,
    read_table,
    unaccepted,
)


def static_probe(target: Target, facts: Facts) -> Probe:
    release = f"sglang {target.version}" if target.version else "this sglang"
    table = read_table(target.tree)
    if table is None:
        return Probe(
            Status.WARN,
            f"cannot tell whether {release} accepts the deployment's server arguments: no ServerArgs "
            f"class npudoctor can read in sglang/{SERVER_ARGS_MODULE}",
            (
                Evidence(
                    expected=f"a ServerArgs class in sglang/{SERVER_ARGS_MODULE}",
                    observed="none npudoctor can read (the file or class is missing, or its fields "
                    "and flags are laid out in a way the reader does not know)",
                    location=Location(f"sglang/{SERVER_ARGS_MODULE}", 1),
                ),
            ),
        )
    given = [g for role in facts.roles for g in role.given]
    missing = unaccepted(facts, table)
    if not missing:
        return Probe(
            Status.PASS,
            f"{release} accepts every server argument and flag the deployment passes "
            f"({len(given)} checked against its {len(table.fields)} ServerArgs fields and "
            f"{len(table.flags)} flags)",
            (
                Evidence(
                    expected=f"every ServerArgs field and launch flag the deployment passes is one {release} defines",
                    observed=f"all {len(given)} are" if given else "the deployment passes none by name",
                    location=table.location,
                ),
            ),
        )
    refused = {item.given for item in missing}
    roles = tuple(r.name for r in facts.roles if refused.intersection(r.given))
    reasons = list(dict.fromkeys(_reason(item) for item in missing))  # a name two roles pass: once
    return Probe(
        Status.FAIL,
        f"{release} has {_join(reasons)}: the server would refuse to start",
        tuple(_evidence(item, table, release) for item in missing),
        roles=roles,
    )


def _reason(item: Unaccepted) -> str:
    """``no --enable-prefill-cp (known in 0.5.14..0.5.23)`` and its kin, for the summary."""
    if item.retired is not None:
        return f"retired {item.label} (sglang refuses it: {item.retired})"
    if item.ambiguous:
        return f"no flag {item.label} (an ambiguous abbreviation of {', '.join(item.ambiguous)})"
    known = (
        f"known in {item.known_in[0]}..{item.known_in[1]}"
        if item.known_in
        else f"known in no release {history().span}"
    )
    return f"no {item.label} ({known})"


def _evidence(item: Unaccepted, table: ServerArgsTable, release: str) -> Evidence:
    given = item.given
    if given.kind == "field":
        expected = f"a ServerArgs field {release} defines ({len(table.fields)} fields)"
    else:
        expected = f"a flag {release}'s launch parser accepts ({len(table.flags)} option strings)"
    return Evidence(
        expected=expected,
        observed=f"{given.where} passes {given.name}: {release} has {_reason(item)}",
        location=table.location,
    )


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
