"""``npudoctor fix`` and ``npudoctor run``: decide, record, revert, report and launch.

The CLI only gathers options; the decisions live here so tests and embedders get the
same behaviour. Patching itself happens in the processes that run sglang
(``npudoctor.patching.activation``); this module never imports sglang.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.deployment.facts import Facts
from npudoctor.deployment.redact import redact_argv
from npudoctor.engine.registry import select
from npudoctor.errors import InputError
from npudoctor.patching import activation, records
from npudoctor.patching.fixbase import Fix, Safety, all_fixes
from npudoctor.patching.planfile import BOOTSTRAP_DIR
from npudoctor.results import Result, Status
from npudoctor.service.evaluate import evaluate
from npudoctor.target.discovery import Target
from npudoctor.terminal import shell_join

if TYPE_CHECKING:
    from npudoctor.results import Report

SCHEMA = 1


class Action(str, enum.Enum):
    APPLY = "apply"
    NOT_NEEDED = "not needed"
    REFUSED = "refused"


@dataclass(frozen=True)
class Decision:
    """What ``npudoctor fix`` would do with one fix on this target, and why."""

    fix_id: str
    action: Action
    reason: str
    shape: dict[str, str]
    release: str | None = None  # the release whose shape matched
    installs: tuple[str, ...] = ()  # the sites of ``replaces`` that would be installed
    # the check fails here: a refusal leaves a confirmed defect in place (``fix`` exits 1, ``refusals``)
    confirmed: bool = False


def decide(fix: Fix, target: Target, result: Result, allow_unsafe: bool = False) -> Decision:
    """Apply only where the check's verdict (``result``, from ``npudoctor.service.evaluate``) is ``fail``
    and the code is a shape the fix knows."""
    if result.status in (Status.PASS, Status.SKIP):
        return Decision(fix.id, Action.NOT_NEEDED, f"{fix.id} {result.status.value}: {result.summary}", {})
    if result.status is not Status.FAIL:
        return Decision(
            fix.id,
            Action.REFUSED,
            f"{fix.id} could not confirm the defect ({result.status.value}: {result.summary})",
            {},
        )
    shape = fix.shape_of_source(target.tree)
    release = fix.known_release(shape)
    if release is None:
        differing = fix.differences(shape) or sorted(shape)
        return Decision(
            fix.id,
            Action.REFUSED,
            "the installed code is not a shape this fix was written for: "
            + ", ".join(f"{site} ({shape[site]})" for site in differing)
            + f" differ from sglang {', '.join(fix.written_for)}",
            shape,
            confirmed=True,
        )
    installs = fix.installs_in_source(target.tree)
    if not installs:
        return Decision(
            fix.id,
            Action.REFUSED,
            f"{fix.id} fails here ({result.summary}), but none of the functions this fix replaces "
            "needs it in this code",
            shape,
            release,
            confirmed=True,
        )
    if fix.safety is Safety.UNSAFE and not allow_unsafe:
        return Decision(
            fix.id,
            Action.REFUSED,
            "changes behaviour of running code (unsafe): pass --unsafe to apply it",
            shape,
            release,
            installs,
            confirmed=True,
        )
    reason = f"{fix.id} fails here: {result.summary}"
    if set(installs) != set(fix.replaces):
        kept = [site.partition(":")[2] for site in fix.replaces if site not in installs]
        reason += (
            f"; replaces only {', '.join(site.partition(':')[2] for site in installs)} here "
            f"({', '.join(kept)} already right in this code)"
        )
    return Decision(fix.id, Action.APPLY, reason, shape, release, installs)


@dataclass(frozen=True)
class Planned:
    fix: Fix
    decision: Decision


def select_fixes(ids: list[str]) -> list[Fix]:
    return select(all_fixes(), ids, "fix")


def plan(
    fixes: list[Fix],
    target: Target,
    facts: Facts,
    allow_unsafe: bool,
    depth: str = "auto",
    on_step: Callable[[str], None] | None = None,
) -> list[Planned]:
    """Each fix's decision from its check's verdict at ``depth``: the verdict ``npudoctor check``
    gives at that depth (live where the target imports, at ``auto``)."""
    results = evaluate([fix.check for fix in fixes], target, facts, depth, on_step=on_step).results
    return decisions(fixes, target, results, allow_unsafe)


def decisions(fixes: list[Fix], target: Target, results: list[Result], allow_unsafe: bool) -> list[Planned]:
    """Each fix's decision from the verdicts ``results`` (one per check id) of an evaluation."""
    verdicts = {result.id: result for result in results}
    return [Planned(fix, decide(fix, target, verdicts[fix.id], allow_unsafe)) for fix in fixes]


def refusals(planned: list[Planned]) -> list[Planned]:
    """The fixes refused where their check fails: the defect stays (``fix`` exits 1, one line each)."""
    return [p for p in planned if p.decision.action is Action.REFUSED and p.decision.confirmed]


def plan_json(planned: list[Planned]) -> list[dict]:
    """The plan as ``npudoctor fix --format json`` shows it: every fix's decision and what it replaces."""
    return [plan_entry(p) for p in planned]


def plan_entry(p: Planned) -> dict:
    """One fix of a plan: its decision, and what it replaces in this code (``--apply`` records a
    fix it applies with the same values, ``record_document``)."""
    return {
        "id": p.fix.id,
        "action": p.decision.action.value,
        "reason": p.decision.reason,
        "safety": p.fix.safety.value,
        "upstream": p.fix.upstream,
        "own": p.fix.own or None,
        "replaces": list(p.decision.installs or p.fix.replaces),  # what this code gets
        "release": p.decision.release,
    }


_RECORDED = ("release", "upstream", "safety", "replaces")  # of a plan entry, in the record's order


def record_document(planned: list[Planned], target: Target) -> dict:
    """What ``--apply`` records and ``npudoctor run`` hands its bootstrap: the fixes to apply, each
    with the shape of the code it was decided for."""
    recorded = {}
    for p in planned:
        if p.decision.action is Action.APPLY:
            entry = plan_entry(p)
            recorded[p.fix.id] = {"shape": p.decision.shape, **{key: entry[key] for key in _RECORDED}}
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "sglang": {"version": target.version, "path": str(target.package_dir)},
        "fixes": recorded,
    }


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


def run_command(command: list[str], document: dict | None) -> int:
    """Run ``command`` with the bootstrap on ``PYTHONPATH``; returns its exit code.

    Every Python interpreter the command starts (sglang's spawned schedulers included)
    imports the bootstrap's ``sitecustomize``, which enables ``document``'s fixes. The plan
    file lives in a temporary directory for the duration of the command. ``document`` None
    (``NPUDOCTOR_DISABLE_FIXES``): the command runs as given, with no bootstrap.
    """
    executable = resolve_command(command)
    workdir = Path(tempfile.mkdtemp(prefix="npudoctor-run-"))
    try:
        env = dict(os.environ)
        if document is not None:
            plan_path = workdir / "plan.json"
            plan_path.write_text(json.dumps(document), encoding="utf-8")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH")) if p)
            env[activation.RUN_PLAN] = str(plan_path)
        try:
            child = subprocess.Popen([executable, *command[1:]], env=env)
        except OSError as error:
            shown = redact_argv(command[:1])[0]
            raise CommandNotFound(f"run: cannot execute {shown}: {error.strerror}", 126) from None
        previous = {  # one npudoctor was started ignoring (nohup's SIGHUP) the command ignores too
            sig: signal.signal(sig, _forward(child))
            for sig in FORWARDED_SIGNALS
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
        try:
            code = child.wait()
            return 128 - code if code < 0 else code  # signal N ended it: 128 + N, as a shell says
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def resolve_command(command: list[str]) -> str:
    """The executable ``npudoctor run`` starts for ``command``, as a shell finds it; else
    ``CommandNotFound`` with the shell's exit code: 127 when there is no such command, 126 when a
    path names something that cannot be executed (a file without the x bit, a directory); an
    ``InputError`` when there is no command."""
    if not command:
        raise InputError(
            "run: give the command after '--' (npudoctor run -- python -m sglang.launch_server ...)"
        )
    name = command[0]
    found = shutil.which(name)
    if found is not None:
        return found
    shown = redact_argv([name])[0]  # `npudoctor run -- HF_TOKEN=x cmd` must not echo the token
    if os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name)
        if path.is_dir():
            raise CommandNotFound(f"run: cannot execute {shown}: it is a directory", 126)
        if path.exists():
            raise CommandNotFound(f"run: cannot execute {shown}: permission denied (not executable)", 126)
    elif "=" in name:
        raise CommandNotFound(
            f"run: command not found: {shown} (put environment assignments before `npudoctor run`, "
            "or use `env NAME=value cmd`)"
        )
    raise CommandNotFound(f"run: command not found: {shown}")


@dataclass(frozen=True)
class IgnoredEnvironment:
    """How a command's Python misses the environment ``npudoctor run`` gives it (its bootstrap on
    ``PYTHONPATH``, the plan in ``NPUDOCTOR_RUN_PLAN``): ``how`` names it (``python -E``, ``env -i``),
    ``environ`` is the environment its processes do have."""

    how: str
    environ: dict[str, str]


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_ENV_OPTION_ARGUMENT = "uCS"  # env's short options that take a value: -u NAME, -C DIR, -S STRING
_PYTHON_OPTION_ARGUMENT = "WX"  # python's: -W ARG, -X OPT (-c and -m end its options)


def environment_ignored(command: Sequence[str]) -> IgnoredEnvironment | None:
    """Whether ``command`` runs a Python that ignores the environment ``npudoctor run`` sets, as the
    words say: ``env -i``/``env -``, ``env -u PYTHONPATH``, a ``PYTHONPATH=`` assignment, or the
    interpreter's ``-E`` or ``-I`` (read only before ``-c``, ``-m`` or the script: after them, a word
    is the program's). None when nothing says so (a wrapper npudoctor does not read, ``sudo``, is not
    looked into)."""
    words, environ, how = list(command), dict(os.environ), None
    if words and os.path.basename(words[0]) == "env":
        words, how = _env_options(words[1:], environ)
        while words and _ASSIGNMENT.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            environ[name] = value
            how = "PYTHONPATH=... in the command" if name == "PYTHONPATH" and how is None else how
    if how is None and words and _PYTHON.fullmatch(os.path.basename(words[0])):
        how = _python_ignoring_flag(words[1:])
        if how is not None:
            environ = {name: value for name, value in environ.items() if not name.startswith("PYTHON")}
    return IgnoredEnvironment(how, environ) if how is not None else None


def _env_options(words: list[str], environ: dict[str, str]) -> tuple[list[str], str | None]:
    """``env``'s options at the start of ``words`` applied to ``environ``: the words after them, and
    how they drop what ``npudoctor run`` sets (``env -i``, ``env -u PYTHONPATH``)."""
    how = None
    while words and words[0].startswith("-"):
        word = words.pop(0)
        if word == "--":
            break
        unset = None
        if word in ("-", "-i", "--ignore-environment"):
            environ.clear()
            how = "env -i"
            continue
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            if name == "--unset":
                unset = value if equals else (words.pop(0) if words else "")
            elif name in ("--chdir", "--split-string") and not equals and words:
                words.pop(0)
        else:
            for position, letter in enumerate(word[1:], 1):
                if letter == "i":
                    environ.clear()
                    how = "env -i"
                elif letter in _ENV_OPTION_ARGUMENT:
                    value = word[position + 1 :] or (words.pop(0) if words else "")
                    unset = value if letter == "u" else None
                    break
        if unset is not None:
            environ.pop(unset, None)
            if unset == "PYTHONPATH" and how is None:
                how = "env -u PYTHONPATH"
    return words, how


def _python_ignoring_flag(words: list[str]) -> str | None:
    """``python -E`` or ``python -I`` when the interpreter's options (``words``, up to ``-c``, ``-m``
    or the script) hold one: both ignore every ``PYTHON*`` variable, ``PYTHONPATH`` with them."""
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word in ("-", "--") or not word.startswith("-"):
            return None  # the script (or stdin) is next
        if word.startswith("--"):
            continue  # --version, --help
        for position, letter in enumerate(word[1:], 1):
            if letter in "EI":
                return f"python -{letter}"
            if letter in "cm":
                return None
            if letter in _PYTHON_OPTION_ARGUMENT:
                index += position == len(word) - 1  # its value: the rest of the word, or the next one
                break
    return None


class CommandNotFound(InputError):
    """The command given to ``npudoctor run`` does not exist or cannot run (exit 127 / 126, as ``env`` does)."""

    def __init__(self, message: str, exit_code: int = 127):
        super().__init__(message)
        self.exit_code = exit_code


# What ``run`` hands to the command instead of acting on itself: what a terminal, a supervisor or
# an operator sends to stop, reload or poke a server (systemd's stop and reload, a CI runner's cancel,
# Kubernetes' termination, ``kill -USR1`` for a stack dump). npudoctor's default action for most of
# them would end it and leave the command orphaned and the plan's folder behind; forwarded, the
# command decides, npudoctor waits for it and exits with its status.
FORWARDED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


def _forward(child: subprocess.Popen):
    def handler(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    return handler


# --- hints: the npudoctor commands the output names -------------------------------------------

# What each command a hint may name takes besides its own options: the target (--sglang-path), the
# deployment options (and a launch command after `--`), and --depth, with its default.
_TAKES_TARGET = frozenset({"check", "fix", "advise"})
_TAKES_DEPLOYMENT = frozenset({"check", "fix", "run", "advise"})
_DEFAULT_DEPTH = {"check": "auto", "fix": "auto", "run": "auto", "advise": "static"}
# `npudoctor run` runs the launch command: with a deployment given another way, the hint shows
# where the user's own command goes
LAUNCH_TEMPLATE = ("python", "-m", "sglang.launch_server", "...")


@dataclass(frozen=True)
class UserOptions:
    """The user's own options that a hint repeats (``npudoctor fix --select NPD001 <these>``): the
    target, the deployment, the depth and ``fix``'s ``--site``; the launch command goes last, after
    ``--`` (``hint``). Secret values are redacted for the shell (``redact_argv(..., for_shell=True)``):
    the hint refers to a variable for each (``--api-key "${API_KEY:?redacted}"``), never ``***``."""

    target: tuple[str, ...] = ()  # --sglang-path DIR
    deployment: tuple[str, ...] = ()  # --config, --model-path and its flags, --isolated
    depth: str | None = None  # the depth the user asked for; None: the default of the command they ran
    site: tuple[str, ...] = ()  # --site DIR (fix only)
    launch_command: tuple[str, ...] = ()

    @classmethod
    def of_report(cls, report: Report) -> UserOptions:
        """What a report itself names, for a caller that has no request: ``--sglang-path`` for a
        tree given by path, ``--config`` for a YAML deployment, the depth."""
        target: tuple[str, ...] = ()
        if report.target.source == "path":
            target = ("--sglang-path", str(Path(report.target.path).parent))
        source = str(report.deployment.get("source", ""))
        deployment = ("--config", source[len("yaml:") :]) if source.startswith("yaml:") else ()
        depth = report.depth if report.depth != "auto" else None
        target, deployment = redact_argv(target, for_shell=True), redact_argv(deployment, for_shell=True)
        return cls(target=tuple(target), deployment=tuple(deployment), depth=depth)


def fix_hint(fix_ids: str | Sequence[str], user: UserOptions | None = None) -> str:
    """A finding's fix, or the fixes of all a report's findings, as one command (``npudoctor fix
    --select ID[,ID]``, the plan for them), with ``--unsafe`` where a fix changes running code:
    pasted, the plan marks it apply, never "refused" for the flag the hint left out."""
    ids = [fix_ids] if isinstance(fix_ids, str) else list(fix_ids)
    unsafe = any(f.id in ids and f.safety is Safety.UNSAFE for f in all_fixes())
    return hint("fix", "--select", ",".join(ids), *(["--unsafe"] if unsafe else []), user=user)


def hint(command: str, *own: str, user: UserOptions | None = None, deployment: bool = True) -> str:
    """The one way npudoctor names one of its commands in what it prints (a finding's fix, the plan's
    ``fix --apply``, ``--apply``'s ``--status`` and ``--revert``, ``--status``'s next step,
    ``advise``'s recommendation, ``explain --full``), so that the line works pasted into a shell:
    ``npudoctor COMMAND OWN...`` (the command's own options: ``--apply --select NPD001``), then the
    user's options that COMMAND takes (``user``; ``deployment=False``: only the target and
    ``--site``), the depth where it is not COMMAND's default, and last ``--`` and the launch
    command: an option after ``--`` would be a word of the launch command (``run`` executes it, so a
    leading ``NAME=value`` goes through ``env``, as a shell runs it). Every word is quoted for a
    shell (``npudoctor.terminal.shell_join``: as ``shlex.join`` quotes it, a value with a control
    character as ``$'...'``)."""
    user = user or UserOptions()
    words = ["npudoctor", command, *own]
    if command in _TAKES_TARGET:
        words += user.target
    launch: Sequence[str] = ()
    if deployment and command in _TAKES_DEPLOYMENT:
        words += user.deployment
        if user.depth is not None and user.depth != _DEFAULT_DEPTH[command]:
            words += ["--depth", user.depth]
        launch = user.launch_command or (LAUNCH_TEMPLATE if command == "run" else ())
    if command == "fix":
        words += user.site
    if launch:
        if command == "run" and _ASSIGNMENT.match(launch[0]):
            launch = ["env", *launch]  # `run` executes the command: a shell's `X=1 cmd` is `env X=1 cmd`
        words += ["--", *launch]
    return shell_join(words)
