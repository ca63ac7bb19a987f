"""The known-defect catalog: one record per upstream Ascend defect, judged from the target's code.

The deep checks prove their properties with static and live probes and carry runtime fixes;
the catalog covers the rest of the defect space reported upstream, one data file per defect
(``catalog/<id>.yaml``, installed as ``npudoctor.catalog``), the way OSV and govulncheck records
name the affected symbols:

* **when it bites**: a predicate over one role's facts (``npudoctor.deployment.predicate``), with
  the NPU defaults of the server arguments it reads;
* **how to tell from the source**: fingerprints of the defective and of the fixed code
  (``npudoctor.static.fingerprints``), evaluated on the target tree, so a source state between
  releases or a vendor fork gets its verdict from its code, never from its version string;
* **the releases that ship it**: derived by running the fingerprints over every PyPI wheel
  (``scripts/catalog_ranges.py`` writes them into the record; ``tests/catalog`` re-derives them);
* **the remedy**: the first fixed release (from the derived ranges), a workaround in flags or env,
  a runtime fix where one is written.

A record is a ``Check`` (``CatalogRecord``): ``check``, ``list``, ``explain``, ``advise``,
``--select``/``--ignore`` and every format treat it as one. Its verdict:

* ``skip``: no role of the deployment meets the predicate (it cannot trigger the defect);
* ``fail``: a defective fingerprint matches (the deployment reaches the defective code), with the
  file:line of the code that shows it;
* ``pass``: a fixed fingerprint matches, or the target defines none of the symbols the record
  names (the code the defect lives in is not in this release);
* ``warn``: a symbol is there but neither shape is recognised: the code changed, and the record
  says which function to read (never a silent pass).
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from packaging.version import Version

from npudoctor.deployment.predicate import compile_predicate, evaluate, role_namespace
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Evidence, Impact, Location, Status
from npudoctor.static import fingerprints
from npudoctor.static.fingerprints import Fingerprint
from npudoctor.target import history, resultcache

if TYPE_CHECKING:
    import ast

    from npudoctor.deployment.facts import Facts
    from npudoctor.target.discovery import Target

RANGE_KINDS = ("affected", "fixed", "absent", "unrecognised")
_KEYS = {
    "id",
    "title",
    "impact",
    "summary",
    "upstream",
    "bites_when",
    "bites_when_text",
    "defaults",
    "defective",
    "fixed",
    "remedy",
    "releases",
    "notes",
}


@dataclass(frozen=True)
class Shape:
    """The defective or the fixed code: what it does, in words, and its fingerprints. Each
    alternative is a list of fingerprints that must all match (the first gives the evidence)."""

    says: str
    alternatives: tuple[tuple[Fingerprint, ...], ...]

    @classmethod
    def from_data(cls, data: Any, where: str) -> Shape:
        if not isinstance(data, dict) or set(data) - {"says", "fingerprints"} or not data.get("fingerprints"):
            raise ValueError(f"{where}: needs says and fingerprints")
        alternatives = []
        for index, item in enumerate(data["fingerprints"]):
            spot = f"{where}.fingerprints[{index}]"
            if isinstance(item, dict) and "all" in item:
                parts = tuple(Fingerprint.from_data(p, f"{spot}.all") for p in item["all"])
            else:
                parts = (Fingerprint.from_data(item, spot),)
            alternatives.append(parts)
        return cls(str(data.get("says", "")).strip(), tuple(alternatives))  # a folded scalar ends in "\n"

    @property
    def symbols(self) -> list[str]:
        return list(dict.fromkeys(fp.symbol for alt in self.alternatives for fp in alt if not fp.absent))


@dataclass(frozen=True)
class SourceVerdict:
    """What the target's code is for one record: ``affected``, ``fixed``, ``absent`` (none of the
    record's symbols defined) or ``unrecognised``, and where."""

    kind: str
    site: fingerprints.Site | None = None


@dataclass(frozen=True)
class Upstream:
    report: tuple[str, ...] = ()
    fix: tuple[str, ...] = ()
    introduced: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return self.report + self.fix + self.introduced


@dataclass(frozen=True)
class Remedy:
    workaround: str = ""
    flags: dict[str, Any] = field(default_factory=dict)  # server arguments that avoid the defect
    env: dict[str, str] = field(default_factory=dict)
    fix: str | None = None  # the runtime fix of the same id, where one is written


class CatalogRecord(Check):
    """One catalogued defect (``catalog/<id>.yaml``) as a check."""

    kind = CheckKind.CATALOG
    upstream_history = False  # the record's own derived ranges say where it is fixed

    def __init__(self, data: dict[str, Any], where: str):
        unknown = set(data) - _KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        self.where = where
        self.id = str(data["id"])
        if not self.kind.owns(self.id):
            raise ValueError(
                f"{where}: a record's id is {self.kind.prefix} and three digits, got {self.id!r}"
            )
        self.title = str(data["title"])
        if data.get("impact") not in {i.value for i in Impact}:  # the gate grades the record's finding by it
            raise ValueError(f"{where}: impact must be one of {', '.join(i.value for i in Impact)}")
        self.impact = Impact(data["impact"])
        self.summary = str(data.get("summary", "")).strip()
        up = data.get("upstream") or {}
        self.references = Upstream(*(tuple(up.get(k) or ()) for k in ("report", "fix", "introduced")))
        self.upstream = self.references.all
        self.predicate_text = str(data["bites_when"])
        self.predicate: ast.Expression = compile_predicate(self.predicate_text, f"{where}: bites_when")
        self.bites_when = str(data.get("bites_when_text") or self.predicate_text).strip()
        self.defaults = dict(data.get("defaults") or {})
        self.defective = Shape.from_data(data.get("defective"), f"{where}: defective")
        self.fixed = Shape.from_data(data["fixed"], f"{where}: fixed") if data.get("fixed") else None
        remedy = data.get("remedy") or {}
        self.remedy = Remedy(
            str(remedy.get("workaround", "")).strip(),
            dict(remedy.get("flags") or {}),
            {k: str(v) for k, v in (remedy.get("env") or {}).items()},
            remedy.get("fix"),
        )
        self.runtime_fix = self.remedy.fix is not None
        self.workaround = self.remedy.workaround
        self.releases: dict[str, tuple[str, ...]] = {
            kind: tuple(str(v) for v in (data.get("releases") or {}).get(kind) or ()) for kind in RANGE_KINDS
        }
        # when the ranges were last derived (OSV's ``modified``): scripts/catalog_ranges.py writes it
        self.modified = str((data.get("releases") or {}).get("derived") or "1970-01-01T00:00:00Z")
        self.notes = str(data.get("notes", "")).strip()
        self.why = f"{self.summary} ({self.impact.meaning})"
        self.how_to_fix = self._how_to_fix()

    # ----- when it bites -----------------------------------------------------------------
    def biting_roles(self, facts: Facts) -> list[str]:
        return [
            role.name
            for role in facts.roles
            if evaluate(self.predicate, role_namespace(facts, role, self.defaults))
        ]

    def out_of_scope(self, facts: Facts) -> Probe | None:
        if not facts.described or self.biting_roles(facts):
            return None
        return Probe(Status.SKIP, f"the deployment cannot trigger it; it bites: {self.bites_when}")

    # ----- how to tell from the source ---------------------------------------------------------
    def source_verdict(self, target: Target) -> SourceVerdict:
        """What the target's code is for this record (the same answer whatever the deployment)."""
        tree = target.tree
        for kind, shape in (("affected", self.defective), ("fixed", self.fixed)):
            if shape is None:
                continue
            for alternative in shape.alternatives:
                site = _all_match(tree, alternative)
                if site is not False:
                    return SourceVerdict(kind, None if site is True else site)
        symbols = self.defective.symbols + (self.fixed.symbols if self.fixed else [])
        for symbol in symbols:
            found = fingerprints.definitions(tree, symbol, names=catalog_names())
            if found:
                return SourceVerdict("unrecognised", found[0].site(symbol))
        return SourceVerdict("absent")

    def static(self, target: Target, facts: Facts) -> Probe:
        found = self.source_verdict(target)
        roles = tuple(self.biting_roles(facts)) if facts.described else ()
        assumptions = () if facts.described else (f"no deployment given: assumed {self.bites_when}",)
        location = Location(found.site.path, found.site.line, found.site.symbol) if found.site else None
        fixed_says = self.fixed.says if self.fixed else "code without the defect"
        if found.kind == "affected":
            evidence = Evidence(expected=fixed_says, observed=self.defective.says, location=location)
            return Probe(
                Status.FAIL,
                f"{self.summary.rstrip('.')} ({self.impact.meaning})",
                (evidence,),
                assumptions,
                roles,
            )
        if found.kind == "fixed":
            evidence = Evidence(expected=fixed_says, observed=fixed_says, location=location)
            return Probe(Status.PASS, f"the fixed code: {fixed_says}", (evidence,), assumptions, roles)
        if found.kind == "absent":
            names = ", ".join(self.defective.symbols)
            return Probe(
                Status.PASS,
                f"the defective code is not in this release: it defines none of {names}",
                (),
                assumptions,
                roles,
            )
        evidence = Evidence(
            expected=f"either the defective shape ({self.defective.says}) or the fixed one ({fixed_says})",
            observed=f"{found.site.symbol} has neither: the code changed; read it against {', '.join(self.references.fix or self.upstream)}",
            location=location,
        )
        return Probe(
            Status.WARN,
            f"neither the defective nor the fixed shape of {found.site.symbol} is recognised",
            (evidence,),
            assumptions,
            roles,
        )

    # ----- the remedy --------------------------------------------------------------------
    def table(self) -> dict[str, str]:
        """``{release: status}`` over the final releases the ranges were derived from (``fail``
        where it ships, ``warn`` where the shape was not recognised, else ``pass``): the record's
        release history, in the form ``npudoctor.target.history`` reads."""
        status = {"affected": "fail", "unrecognised": "warn", "fixed": "pass", "absent": "pass"}
        return {
            version: status[kind]
            for kind in RANGE_KINDS
            for version in self.releases[kind]
            if ".post" not in version
        }

    def upstream_for(self, version: str | None) -> history.Upstream:
        """Where the record's defect is gone for good after ``version`` (the rule of
        ``history.holds_from``), and the newest release the ranges were derived over."""
        table = self.table()
        if not table:
            return history.Upstream(None, None)
        after = history.version_key(version) if version else ()
        fixed = history.holds_from({r: s == "pass" for r, s in table.items()}, after)
        return history.Upstream(fixed, max(table, key=history.version_key))

    def affected_runs(self) -> list[tuple[list[str], str | None]]:
        """The affected releases as runs of consecutive releases (in PyPI order over every release
        the ranges were derived from), each with the first release after it (None: the newest)."""
        derived = sorted((v for kind in RANGE_KINDS for v in self.releases[kind]), key=sort_key)
        affected = set(self.releases["affected"])
        runs: list[tuple[list[str], str | None]] = []
        current: list[str] = []
        for version in derived:
            if version in affected:
                current.append(version)
            elif current:
                runs.append((current, version))
                current = []
        if current:
            runs.append((current, None))
        return runs

    @property
    def first_fixed(self) -> str | None:
        """The first release, after the newest that ships the defect, from which no release ships
        it (derived from the wheels); None while the newest release checked ships it."""
        if not self.releases["affected"]:
            return None
        return self.upstream_for(None).fixed_in

    @property
    def newest_checked(self) -> str | None:
        return self.upstream_for(None).newest_checked

    @property
    def _fix_id(self) -> str | None:
        return self.remedy.fix

    def _how_to_fix(self) -> str:
        """npudoctor's own remedy, without the upgrade (``Check.remediation`` adds the release)."""
        parts = []
        if self.remedy.fix:
            parts.append(f"apply the runtime fix: npudoctor fix --apply --select {self.remedy.fix}")
        if self.remedy.workaround:
            parts.append(f"workaround: {self.remedy.workaround}")
        if not parts:
            fix = ", ".join(self.references.fix) or "the upstream fix"
            parts.append(f"no workaround in flags or environment is known; the fix: {fix}")
        return "; ".join(parts)


def sort_key(version: str) -> Version:
    """PyPI order, post-releases included (0.5.12 < 0.5.12.post1 < 0.5.13)."""
    return Version(version)


def _all_match(tree, alternative: tuple[Fingerprint, ...]) -> fingerprints.Site | None | bool:
    """Whether every fingerprint of ``alternative`` matches: the site of the first that names a
    definition (True when all of them are ``absent`` symbols), False otherwise."""
    first: fingerprints.Site | None = None
    for fingerprint in alternative:
        found = fingerprints.definitions(tree, fingerprint.symbol, fingerprint.under, catalog_names())
        if fingerprint.absent:
            if found:
                return False
            continue
        hit = next((d for d in found if fingerprints.matches(d, fingerprint)), None)
        if hit is None:
            return False
        if first is None:
            first = hit.site(fingerprint.symbol, fingerprints.deciding_line(hit, fingerprint))
    return first if first is not None else True


@functools.lru_cache(maxsize=1)
def catalog_names() -> frozenset[str]:
    """The top-level names every record's fingerprints look up: one pass over a tree finds them all."""
    return frozenset(
        fp.symbol.split(".")[0]
        for record in all_records()
        for shape in (record.defective, record.fixed)
        if shape is not None
        for alternative in shape.alternatives
        for fp in alternative
    )


@functools.lru_cache(maxsize=1)
def all_records() -> tuple[CatalogRecord, ...]:
    """Every record of ``npudoctor.catalog``, ordered by id; a malformed record is an error of
    npudoctor's own (``tests/catalog`` loads them all). The parsed files come from the result
    cache (its key covers the records' files): reading 50 YAML files is a fifth of a warm check."""
    records = []
    for name, data in resultcache.remembered("catalog records", ("npudoctor.catalog",), _record_files):
        where = f"catalog/{name}"
        record = CatalogRecord(data, where)
        if name.split("_")[0].removesuffix(".yaml") != record.id:
            raise ValueError(f"{where}: the file's name starts with the record's id {record.id}")
        records.append(record)
    return tuple(records)


def _record_files() -> list[tuple[str, dict[str, Any]]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    package = importlib.resources.files("npudoctor.catalog")
    return [
        (entry.name, yaml.load(entry.read_text(encoding="utf-8"), Loader=loader))
        for entry in sorted(package.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    ]
