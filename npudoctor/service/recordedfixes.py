"""The fixes ``npudoctor fix --apply`` recorded beside an sglang: whether sglang's own plugin
loading applies the record in a server's environment, how each recorded fix stands against the
installed code and the deployment (``fix --status``), and the fixes ``check`` and ``advise``
judge a deployment with. Never imports sglang."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from npudoctor.errors import InputError
from npudoctor.patching import activation, records
from npudoctor.patching.fixbase import Fix, all_fixes
from npudoctor.results import Result, Status
from npudoctor.service.planning import Action, Planned
from npudoctor.target.discovery import Target


def loads_plugins(target: Target) -> bool:
    """Whether this sglang loads the ``sglang.srt.plugins`` entry-point group (0.5.11+)."""
    path = target.tree.module_path("sglang.srt.plugins")
    return path is not None and records.PLUGIN_GROUP.encode() in target.tree.read(path)


PLUGINS_FILTER = "SGLANG_PLUGINS"  # sglang's own: the plugins its processes load, by name


def record_not_loaded(
    target: Target, record_dir: Path, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why sglang's own plugin loading would not apply the record in ``record_dir`` (the directory
    holding its ``.dist-info``) in a server started from ``environ`` (default: this process's
    environment); None when it would. The one answer ``check``, ``advise``, ``fix --apply``/``--status``
    and ``run`` give.

    sglang's ``load_plugins()`` (``sglang/srt/plugins/__init__.py``, unchanged from 0.5.11 to 0.5.23)
    loads the entry points of group ``sglang.srt.plugins`` that ``importlib.metadata.entry_points()``
    finds on the process's ``sys.path`` (the first distribution of each name), skips those whose name
    ``SGLANG_PLUGINS`` (comma-separated, blanks stripped) does not list when it is set, and keeps one
    per name, the last (``SGLANG_PLATFORM`` skips only distributions that provide a platform plugin,
    which the record does not). The same rule is asked here of the same inputs: the sys.path a
    server has (``server_path``) and the variables as ``environ`` holds them."""
    environ = os.environ if environ is None else environ
    if not loads_plugins(target):
        return f"sglang {target.version} loads no plugins (0.5.11+ do): the record reaches no process"
    if activation.disabled(environ):
        return f"{activation.KILL_SWITCH} is set: sglang's processes apply no fix"
    allowed = environ.get(PLUGINS_FILTER, "")
    if allowed and records.PLUGIN_NAME not in {name.strip() for name in allowed.split(",")}:
        return (
            f"{PLUGINS_FILTER} is set and does not name {records.PLUGIN_NAME}: sglang's processes skip "
            f"its plugin (add {records.PLUGIN_NAME} to it)"
        )
    path = server_path(target, environ)
    here = record_dir.resolve()
    if here not in {Path(entry or ".").resolve() for entry in path}:
        return (
            f"{record_dir} is not on the sys.path of sglang's processes (the directory sglang is imported "
            "from, PYTHONPATH, this environment's site-packages): put it on their PYTHONPATH"
        )
    found = _plugin_entry_point(path)
    if found is None:
        return (
            f"the record has no entry point in group {records.PLUGIN_GROUP} (its entry_points.txt): "
            "`npudoctor fix --apply` writes it again"
        )
    location, value = found
    if location != here:
        return (
            f"sglang's processes load the plugin {records.PLUGIN_NAME} from {location}, not from this record"
        )
    if value != records.PLUGIN_OBJECT:
        return f"the record's entry point names {value}, not {records.PLUGIN_OBJECT}"
    return None


def server_path(target: Target, environ: Mapping[str, str]) -> list[str]:
    """The ``sys.path`` on which a server started from ``environ`` finds distributions: the directory
    sglang is imported from (``records.import_dir``; none for a source tree), ``environ``'s
    ``PYTHONPATH``, then this interpreter's entries (its site-packages) but those its own
    ``PYTHONPATH`` put there."""
    own = {os.path.abspath(entry) for entry in _pythonpath(os.environ)}
    entries = []
    with contextlib.suppress(InputError):  # a source tree: imported through an install not seen here
        entries.append(str(records.import_dir(target)))
    entries += _pythonpath(environ)
    entries += [entry for entry in sys.path if os.path.abspath(entry or ".") not in own]
    return list(dict.fromkeys(entries))


def _pythonpath(environ: Mapping[str, str]) -> list[str]:
    return [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _plugin_entry_point(path: list[str]) -> tuple[Path, str] | None:
    """Where the plugin named ``npudoctor`` that sglang would load on ``path`` comes from (its
    distribution's directory) and what it names: as ``importlib.metadata.entry_points()``, the first
    distribution of each name in path order; as ``load_plugins()``, of one name the last."""
    seen: set[str] = set()
    found = None
    for dist in importlib.metadata.distributions(path=path):
        # the name entry_points() tells distributions apart by (importlib.metadata's own, from the
        # .dist-info's name: no METADATA parsed), else the one in METADATA
        name = (
            getattr(dist, "_normalized_name", None)
            or re.sub(r"[-_.]+", "_", dist.metadata["Name"] or "").lower()
        )
        if name and name in seen:
            continue
        seen.add(name)
        for entry in dist.entry_points:
            if entry.group == records.PLUGIN_GROUP and entry.name == records.PLUGIN_NAME:
                found = (Path(str(dist.locate_file(""))).resolve(), entry.value)
    return found


@dataclass(frozen=True)
class SiteStatus:
    """One fix as ``--status`` sees it: recorded, or needed now and not recorded."""

    fix_id: str
    state: str  # "in place" | "not applied" | "stale" | "not needed" | "unknown fix" | "not recorded"
    detail: str

    @property
    def fits(self) -> bool:
        """The record holds what ``--apply`` would record now, for this fix."""
        return self.state == "in place"


def status(
    document: dict,
    target: Target,
    planned: list[Planned],
    not_loaded: str | None = None,
    judged: Mapping[str, Result] | None = None,
) -> list[SiteStatus]:
    """Whether each recorded fix still matches the installed code (sglang may have changed since)
    and whether the deployment still needs it, and which fix it needs now that is not recorded
    (an upgrade can bring a new defect): ``planned`` holds ``plan``'s decisions for every fix.
    ``not_loaded`` (``record_not_loaded``): why sglang's processes will not apply the record; a fix
    that would be in place is then "not applied". ``judged`` (``operations.judged_with_record``): each
    recorded fix's check with the record in place, as ``check`` judges it after ``--apply``; a fix in
    place says its verdict, the proof that it cures the deployment."""
    decided = {p.fix.id: p for p in planned}
    judged = judged or {}
    found = []
    for p in planned:
        if p.decision.action is Action.APPLY and p.fix.id not in document["fixes"]:
            found.append(SiteStatus(p.fix.id, "not recorded", f"needed now: {p.decision.reason}"))
    for fix_id, entry in sorted(document["fixes"].items()):
        if fix_id not in decided:
            found.append(SiteStatus(fix_id, "unknown fix", "this npudoctor has no such fix"))
            continue
        fix, decision = decided[fix_id].fix, decided[fix_id].decision
        changed = changed_sites(fix, entry, target)
        if changed:
            found.append(
                SiteStatus(
                    fix_id,
                    "stale",
                    "the installed code changed since --apply; sglang's processes will refuse it: "
                    + ", ".join(changed),
                )
            )
        elif decision.action is Action.NOT_NEEDED:
            found.append(SiteStatus(fix_id, "not needed", decision.reason))
        else:
            detail = (
                f"replaces {', '.join(s.partition(':')[2] for s in entry.get('replaces') or [])} "
                f"(written for sglang {entry.get('release')})"
            )
            if decision.action is Action.REFUSED:
                detail += f"; `npudoctor fix` would not apply it now: {decision.reason}"
            if fix_id in judged:
                verdict = judged[fix_id]
                detail += f"; judged with it: {fix_id} {verdict.status.value}" + (
                    "" if verdict.status is Status.PASS else f" ({verdict.summary})"
                )
            found.append(SiteStatus(fix_id, "in place" if not_loaded is None else "not applied", detail))
    return found


def changed_sites(fix: Fix, entry: dict, target: Target) -> list[str]:
    """The sites of a recorded fix (``entry``) whose shape the installed code no longer has: sglang's
    processes refuse a fix with any (``npudoctor.patching.activation``)."""
    recorded = entry.get("shape", {})
    current = fix.shape_of_source(target.tree)
    return sorted(site for site in recorded if current.get(site) != recorded[site])


@dataclass(frozen=True)
class RecordedFixes:
    """The fixes ``fix --apply`` recorded beside a target, as the commands that judge a deployment
    (``check``, ``advise``) take them: sglang's processes install a recorded fix whose shape the
    installed code still has, so the deployment runs with it, and its verdict is judged with it
    (the live probes run with the fix applied, as ``--with-fix`` does)."""

    record: Path  # the record's .dist-info
    plan: dict[str, dict[str, str]]  # {fix id: shape} the verdicts are judged with
    verified: tuple[str, ...]  # the recorded fixes whose shape the installed code has
    not_used: dict[str, str]  # fix id -> why the verdicts do not include it
    damaged: str | None = None  # why the record cannot be read (then it holds no fix)

    def summary(self, results: list[Result], live) -> dict:
        """What became of each recorded fix in an evaluation (its ``results`` and ``live`` outcome), and
        one line saying it (the report's ``recorded_fixes``)."""
        verdicts = {r.id: r for r in results}
        fixes: dict[str, dict] = {}
        for fix_id in sorted({*self.verified, *self.not_used}):
            result = verdicts.get(fix_id)
            outcome = live.fixes.get(fix_id) if live is not None else None
            if fix_id in self.not_used:
                verified = "shape verified; " if fix_id in self.verified else ""
                fixes[fix_id] = {"judged": False, "detail": verified + self.not_used[fix_id]}
            elif result is None:
                fixes[fix_id] = {"judged": False, "detail": "not checked (not selected)"}
            elif result.status is Status.SKIP:
                fixes[fix_id] = {"judged": False, "detail": f"{fix_id} does not apply: {result.summary}"}
            elif outcome == "applied" and live is not None and fix_id in live.probes:
                fixes[fix_id] = {"judged": True, "detail": "shape verified; the live probe ran with it"}
            else:
                why = outcome if outcome and outcome != "applied" else "its live probe did not run"
                fixes[fix_id] = {"judged": False, "detail": f"shape verified; {why}"}
        line = f"{self.damaged}; judged without it" if self.damaged else _recorded_line(fixes)
        return {"record": str(self.record), "fixes": fixes, "line": line}


def _recorded_line(fixes: dict[str, dict]) -> str:
    """``judged with recorded fix NPD001 (shape verified); NPD006 not judged: ...``, the fixes not
    judged for one reason named together."""
    judged = [fix_id for fix_id, state in fixes.items() if state["judged"]]
    parts = [f"judged with recorded fix {', '.join(judged)} (shape verified)"] if judged else []
    why: dict[str, list[str]] = {}
    for fix_id, state in fixes.items():
        if not state["judged"]:
            why.setdefault(state["detail"], []).append(fix_id)
    parts += [f"{', '.join(ids)} not judged: {detail}" for detail, ids in why.items()]
    return "; ".join(parts)


def recorded_fixes(target: Target, depth: str, use: bool = True) -> RecordedFixes | None:
    """The fixes ``fix --apply`` recorded for ``target`` (``records.read_beside``) that a check at
    ``depth`` is judged with: those whose shape the installed code still has, when sglang's own
    plugin loading would apply the record in this environment (``record_not_loaded``: 0.5.11+, fixes
    not turned off, ``SGLANG_PLUGINS`` naming it, the record on the server's path with its entry
    point) and the depth runs fixes (not ``static``: a fix is judged by running it). ``use`` False (``--no-recorded-fixes``):
    none, each said. None when nothing is recorded for this target."""
    try:
        found = records.read_beside(target)
    except InputError as error:  # a damaged record: sglang's processes refuse it too
        path = records.site_dir(None, target) / records.DIST_INFO
        return RecordedFixes(path, {}, (), {}, damaged=str(error))
    if found is None:
        return None
    path, document = found
    known = {fix.id: fix for fix in all_fixes()}
    plan, verified, not_used = {}, [], {}
    for fix_id, entry in sorted(document["fixes"].items()):
        if fix_id not in known:
            not_used[fix_id] = "this npudoctor has no such fix"
        elif changed := changed_sites(known[fix_id], entry, target):
            not_used[fix_id] = (
                "stale: the installed code changed since --apply (sglang's processes refuse it): "
                + ", ".join(changed)
            )
        else:
            verified.append(fix_id)
            plan[fix_id] = entry["shape"]
    reason = None
    if not use:
        reason = "--no-recorded-fixes: the installed code alone"
    elif (not_loaded := record_not_loaded(target, path.parent)) is not None:
        reason = not_loaded
    elif depth == "static":
        reason = "--depth static runs no fix (--depth auto judges the deployment with it)"
    if reason is not None:
        not_used.update(dict.fromkeys(plan, reason))
        plan = {}
    return RecordedFixes(path, plan, tuple(verified), not_used)
