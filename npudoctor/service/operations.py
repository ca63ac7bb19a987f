"""What ``npudoctor fix`` and ``npudoctor run`` do, apart from reading options and printing.

``fix`` plans (the default), records (``--apply``), compares (``--status``) or removes
(``--revert``) the fixes of one sglang and deployment; ``run`` plans the same way for the
command it starts. The decisions themselves are ``npudoctor.service.planning``'s; the record
is ``npudoctor.patching.records``'. Like them, this module never imports sglang.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.engine.kinds import CheckKind
from npudoctor.errors import InputError, NoTargetError
from npudoctor.patching import activation, records
from npudoctor.service import hints, planning, recordedfixes

if TYPE_CHECKING:
    from npudoctor.results import Result
    from npudoctor.service.runner import CheckRequest
    from npudoctor.service.subject import Subject
    from npudoctor.target.discovery import Target


@dataclass(frozen=True)
class FixSetting:
    """The sglang, the deployment and the record directory (``--site``) one ``fix`` works on."""

    request: CheckRequest
    subject: Subject
    site: Path | None

    def user_options(self) -> hints.UserOptions:
        """The user's options the hints repeat, ``--site`` included."""
        site = ("--site", str(self.site)) if self.site is not None else ()
        return replace(self.request.user_options(), site=site)


def fix_setting(request: CheckRequest, site: Path | None, writing: bool) -> FixSetting:
    """The sglang ``request`` names (it must have the Ascend NPU backend) and its deployment
    (``subject.resolve``); with ``writing`` (``--apply``), the record directory is proven writable
    before the plan's live run."""
    from npudoctor.service.subject import resolve

    subject = resolve(request.deployment, depth=request.depth, sglang_path=request.sglang_path)
    if writing:
        records.require_writable(site, subject.target)
    return FixSetting(request, subject, site)


def plan_fixes(request: CheckRequest, subject: Subject, unsafe: bool, quiet: bool):
    """``planning.plan`` of the request's fixes (all of them without --select) for the resolved
    ``subject``, with progress."""
    from npudoctor.service.progress import Progress
    from npudoctor.service.runner import live_steps

    target, facts = subject.target, subject.facts
    fixes = planning.select_fixes(request.select)
    with Progress.for_stderr(quiet) as progress:
        progress.step(
            f"planning fixes for sglang {target.version} ({len(fixes)} fix(es), depth {request.depth})"
        )
        return planning.plan(
            fixes, target, facts, unsafe, request.depth, on_step=live_steps(progress.step, target)
        )


def uncured(setting: FixSetting) -> list[Result]:
    """The findings ``npudoctor check`` gives this deployment that no runtime fix cures: the known-defect
    catalog's (its records have no runtime fix; read from the source, as ``check`` reads them, under
    the deployment's gate). After ``fix --apply`` the gate stays red on these: each result's remedy
    names the release that fixes it and the workaround."""
    from npudoctor.service.runner import run

    request = replace(
        setting.request,
        select=[CheckKind.CATALOG.prefix],
        depth="static",
        with_fixes=[],
        recorded_fixes=False,
    )
    return run(request).findings()


def uncured_json(results: list[Result]) -> list[dict]:
    """``uncured`` as ``fix --format json`` gives it."""
    return [
        {
            "id": r.id,
            "title": r.title,
            "status": r.status.value,
            "impact": r.impact,
            "fixed_in": r.remediation.fixed_in if r.remediation else None,
            "advice": r.remediation.advice if r.remediation else "",
        }
        for r in results
    ]


def apply_hint(setting: FixSetting, unsafe: bool, fix_ids: list[str] | None = None) -> str:
    """The ``npudoctor fix --apply`` that records the plan shown, with the user's options: ``fix_ids``
    selected (default: the user's own ``--select``), ``--unsafe`` when given."""
    selected = fix_ids if fix_ids is not None else setting.request.select
    own = [
        "--apply",
        *(["--select", ",".join(selected)] if selected else []),
        *(["--unsafe"] if unsafe else []),
    ]
    return hints.hint("fix", *own, user=setting.user_options())


@dataclass(frozen=True)
class Reverted:
    removed: Path | None  # the record removed; None: there was none
    searched: Path | None  # where no record was found


def revert(site: Path | None, sglang_path: Path | None) -> Reverted:
    """``fix --revert``: remove the record ``--apply`` wrote (beside the sglang named, or installed)."""
    from npudoctor.target.discovery import discover

    target = None
    if site is None and sglang_path is None:
        with contextlib.suppress(NoTargetError):  # no sglang installed: this interpreter's site-packages
            target = discover()
    elif site is None:
        target = discover(sglang_path)
    removed = records.remove(site, target)
    return Reverted(removed, None if removed else records.site_dir(site, target))


def recorded(setting: FixSetting) -> dict | None:
    """The record ``--apply`` wrote for this setting, if any (``fix --status``; what a ``fix``
    killed half-way left beside it is removed first, when no other ``fix`` is writing)."""
    records.tidy(setting.site, setting.subject.target)
    return records.read(setting.site, setting.subject.target)


def record_dir(setting: FixSetting) -> Path:
    return records.site_dir(setting.site, setting.subject.target)


@dataclass(frozen=True)
class RecordStatus:
    """``fix --status``: what the record holds (``document``; None: nothing is recorded) against what
    ``fix`` decides now."""

    record: Path  # the record's .dist-info
    document: dict | None
    rows: list[recordedfixes.SiteStatus]
    fits: bool  # the record holds what --apply would record now (nothing recorded: no fix is needed)
    next_command: str  # what makes the record fit again
    not_applied: str | None = None  # why sglang's processes will not apply the record (it does not fit)

    @property
    def recorded_for(self):
        return (self.document or {}).get("sglang", {}).get("version")

    @property
    def needed(self) -> list[str]:
        """The fixes needed now that the record lacks: what ``--apply`` would add."""
        return [row.fix_id for row in self.rows if row.state == "not recorded"]

    @property
    def outdated(self) -> bool:
        """The record holds other fixes than ``--apply`` would record now: ``next_command`` mends it."""
        return any(not row.fits and row.state != "not applied" for row in self.rows)

    def to_json(self) -> dict:
        data = {"recorded": self.document, "status": [r.__dict__ for r in self.rows], "fits": self.fits}
        if self.not_applied is not None:
            data["not_applied"] = self.not_applied
        return {**data, "next": self.next_command} if self.outdated else data


def judged_with_record(setting: FixSetting, planned: list[planning.Planned], quiet: bool) -> dict:
    """``fix --status``'s proof: the checks of the fixes recorded where ``check`` looks for them
    (``recordedfixes.recorded_fixes``), judged with those fixes in place, by id; empty when ``check`` would
    judge none (nothing recorded there, a record sglang would not load, ``--depth static``). The
    live run is the one ``check`` after ``--apply`` makes (the result cache keeps it for that check)."""
    from npudoctor.service.evaluate import evaluate
    from npudoctor.service.progress import Progress
    from npudoctor.service.runner import live_steps

    depth = setting.request.depth
    recorded = recordedfixes.recorded_fixes(setting.subject.target, depth)
    if (
        recorded is None
        or not recorded.plan
        or recorded.record.parent.resolve() != record_dir(setting).resolve()
    ):
        return {}
    checks = [p.fix.check for p in planned if p.fix.id in recorded.plan]
    if not checks:
        return {}
    with Progress.for_stderr(quiet) as progress:
        progress.step(f"live probes with the recorded fix(es) {', '.join(recorded.plan)}")
        results = evaluate(
            checks,
            setting.subject.target,
            setting.subject.facts,
            depth,
            fixes=recorded.plan,
            on_step=live_steps(progress.step, setting.subject.target),
        ).results
    return {result.id: result for result in results}


def status(
    setting: FixSetting,
    document: dict | None,
    planned: list[planning.Planned],
    unsafe: bool = False,
    judged: dict | None = None,
) -> RecordStatus:
    """Whether ``document`` (None: nothing is recorded) still fits the installed sglang, and whether
    the deployment still needs it and needs nothing more (the decisions ``planned`` that ``fix``
    makes now); if not, the ``fix --apply`` (or ``--revert``) that makes it fit, with the user's
    options. With nothing recorded it fits only when no fix is needed. ``judged``
    (``judged_with_record``): the verdicts with the record in place, said beside each fix in place."""
    where = record_dir(setting)
    not_loaded = (
        recordedfixes.record_not_loaded(setting.subject.target, where) if document is not None else None
    )
    rows = recordedfixes.status(
        document or {"fixes": {}}, setting.subject.target, planned, not_loaded, judged
    )
    needed = [p.fix.id for p in planned if p.decision.action is planning.Action.APPLY]
    if needed:
        command = apply_hint(setting, unsafe, needed)
    else:
        command = hints.hint("fix", "--revert", user=setting.user_options(), deployment=False)
    fits = all(row.fits for row in rows) and not_loaded is None
    return RecordStatus(where / records.DIST_INFO, document, rows, fits, command, not_loaded)


NOT_SELECTED = "not selected"  # why a recorded fix is dropped: --select left it out


@dataclass(frozen=True)
class Applied:
    """``fix --apply``: the fixes recorded (none: nothing to apply), those the record held before
    and no longer holds, and the commands that check and undo it."""

    fixes: list[str]
    record: Path | None
    status_command: str
    undo_command: str
    dropped: dict[str, str] = field(default_factory=dict)  # fix id -> why: NOT_SELECTED, "not needed"...
    keep_command: str | None = None  # the --apply that also records the dropped fixes not selected

    @property
    def not_selected(self) -> list[str]:
        """The dropped fixes this ``--apply`` did not select (``keep_command`` records them too)."""
        return [fix_id for fix_id, why in self.dropped.items() if why == NOT_SELECTED]

    def to_json(self) -> dict:
        data = {"applied": self.fixes, "record": str(self.record), "dropped": self.dropped}
        return data if self.keep_command is None else {**data, "keep": self.keep_command}


def apply(setting: FixSetting, planned: list[planning.Planned], unsafe: bool = False) -> Applied:
    """Record the fixes the plan accepts where sglang's processes find them; the commands that
    check and undo it repeat the user's options.

    The record is the plan of this ``--apply``, so it replaces the fixes recorded before: those it
    no longer holds are said (``dropped``), with the ``--apply`` that keeps the ones the user's
    ``--select`` left out."""
    document = planning.record_document(planned, setting.subject.target)
    fixes = sorted(document["fixes"])
    written = records.write(document, setting.site, setting.subject.target) if fixes else None
    before = (written.replaced or {}).get("fixes", {}) if written else {}
    decided = {p.fix.id: p.decision.action.value for p in planned}
    dropped = {fix_id: decided.get(fix_id, NOT_SELECTED) for fix_id in sorted(set(before) - set(fixes))}
    user = setting.user_options()
    applied = Applied(
        fixes,
        written.record if written else None,
        hints.hint("fix", "--status", user=user),
        hints.hint("fix", "--revert", user=user, deployment=False),
        dropped,
    )
    if not applied.not_selected:
        return applied
    return replace(applied, keep_command=apply_hint(setting, unsafe, sorted([*fixes, *applied.not_selected])))


@dataclass(frozen=True)
class PluginNote:
    text: str
    warning: bool  # this sglang loads no plugins: a record alone fixes nothing
    command: str | None = None  # then: the `npudoctor run` that starts the server with the fixes


def plugin_note(setting: FixSetting, unsafe: bool = False) -> PluginNote:
    """How the record reaches sglang's processes: the plugin group ``sglang.srt.plugins`` (sglang
    0.5.11+ loads it in every scheduler process), when their plugin loading would apply it in this
    environment (``recordedfixes.record_not_loaded``); else why not, and ``npudoctor run`` (the command,
    with the user's options and launch command, or where theirs goes), which needs no plugin."""
    target = setting.subject.target
    not_loaded = recordedfixes.record_not_loaded(target, record_dir(setting))
    if not_loaded is None:
        return PluginNote(
            f"sglang {target.version} loads the plugin 'npudoctor' (group sglang.srt.plugins) of this "
            "record in every scheduler process started from this environment",
            warning=False,
        )
    if activation.disabled():  # no process applies a fix, `npudoctor run`'s neither
        return PluginNote(f"sglang's processes will not apply the record: {not_loaded}", warning=True)
    selected = setting.request.select
    own = [*(["--select", ",".join(selected)] if selected else []), *(["--unsafe"] if unsafe else [])]
    command = hints.hint("run", *own, user=setting.user_options())
    return PluginNote(
        f"sglang's processes will not apply the record: {not_loaded}; or start the server with npudoctor run:",
        warning=True,
        command=command,
    )


def record_route(target: Target, document: dict, environ: dict[str, str]) -> str | None:
    """Why the record ``fix --apply`` wrote for ``target`` would not apply the fixes of ``document``
    (``npudoctor run``'s plan) in a command whose processes have ``environ`` and not the environment
    ``run`` gives them (``launcher.environment_ignored``); None when it would: it holds each of them
    with the same shape, and sglang's plugin loading applies it there (``recordedfixes.record_not_loaded``)."""
    try:
        found = records.read_beside(target)
    except InputError as error:
        return str(error)
    if found is None:
        return f"no fix is recorded for sglang {target.version} in {records.site_dir(None, target)}"
    record, recorded = found
    wanted = document["fixes"]
    missing = [
        fix_id
        for fix_id in sorted(wanted)
        if recorded["fixes"].get(fix_id, {}).get("shape") != wanted[fix_id]["shape"]
    ]
    if missing:
        return f"the record {record} does not hold {', '.join(missing)} as planned now"
    return recordedfixes.record_not_loaded(target, record.parent, environ)
