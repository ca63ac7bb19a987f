"""Accepted findings: ``--ignore ID[:YYYY-MM-DD]`` or an ``ignore:`` list in the deployment YAML.

An ignore entry keeps its check's result in every report, marked as ignored, so the
gate passes while the reason stays visible. Every entry should expire: once its date
has passed the check counts again and the stale entry is reported as a finding of its
own, so nobody forgets an exception that outlived its reason.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from npudoctor.errors import InputError, short_repr, unknown_ids
from npudoctor.results import Depth, Remediation, Result, Status


@dataclass(frozen=True)
class Ignore:
    check_id: str
    until: dt.date | None
    reason: str
    origin: str

    def expired(self, today: dt.date) -> bool:
        return self.until is not None and today > self.until


def parse_cli(spec: str) -> Ignore:
    check_id, dated, until = spec.partition(":")
    origin = f"--ignore {spec}"
    return Ignore(check_id.strip().upper(), _date(until, origin) if dated else None, "", origin)


def parse_yaml(entries: Any, where: str) -> list[Ignore]:
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InputError(f"{where}: ignore must be a list of {{id, until, reason}} entries")
    parsed = []
    for index, entry in enumerate(entries):
        origin = f"{where}: ignore[{index}]"
        if isinstance(entry, str):
            entry = {"id": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise InputError(f"{origin}: needs an 'id' (e.g. NPD001)")
        unknown = set(entry) - {"id", "until", "reason"}
        if unknown:
            raise InputError(f"{origin}: unknown key(s) {', '.join(sorted(unknown))}")
        until = entry.get("until")
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise InputError(f"{origin}.reason: must be text")
        parsed.append(
            # only an absent or null ``until`` means "no expiry": 0, false or "" are bad dates
            Ignore(
                entry["id"].strip().upper(),
                _date(until, origin) if until is not None else None,
                reason,
                origin,
            )
        )
    return parsed


def validate(ignores: list[Ignore], known_ids: set[str]) -> None:
    for entry in ignores:
        if entry.check_id not in known_ids:
            raise unknown_ids(entry.origin, "check", [entry.check_id], sorted(known_ids))


def apply(results: list[Result], ignores: list[Ignore], today: dt.date) -> list[Result]:
    """Mark results covered by a live ignore entry; add a finding for every expired entry."""
    active = {i.check_id: i for i in ignores if not i.expired(today)}
    marked = []
    for result in results:
        entry = active.get(result.id)
        if entry is not None and result.status.severity > 0:
            note = entry.reason or "no reason given"
            if entry.until:
                note += f" (until {entry.until.isoformat()})"
            result = replace(result, ignored=note)
        marked.append(result)
    for entry in ignores:
        if entry.expired(today):
            marked.append(
                Result(
                    id=f"{entry.check_id}-ignore-expired",
                    title=f"Ignore entry for {entry.check_id} expired",
                    status=Status.FAIL,
                    depth=Depth.STATIC,
                    summary=(
                        f"{entry.origin} expired on {entry.until.isoformat()}"
                        + (f" (reason was: {entry.reason})" if entry.reason else "")
                        + f"; {entry.check_id} counts again"
                    ),
                    remediation=Remediation(
                        advice=f"fix {entry.check_id}, or renew the entry with a new date and reason"
                    ),
                )
            )
    return marked


def _date(value: Any, origin: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise InputError(f"{origin}: expiry {short_repr(value)} is not a date (YYYY-MM-DD)") from None
