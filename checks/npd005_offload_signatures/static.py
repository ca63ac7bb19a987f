"""NPD005's static probe, on one source tree read with ``ast``: every call of
``get_cpu_copy``/``load_cpu_copy`` under ``sglang/srt`` (``_Site``), every override of them in a
pool or allocator class (``_Override``), which calls can reach which override, the classes a
decode server of the deployment builds and the methods they run (``_Path``), and the probe that
binds each reaching call to each override and ranks the offenders by that path
(``OffloadGraph.probe``). The live probe builds and calls the classes this graph names."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.poolclasses import OFFLOAD_METHODS, npu_pool_classes
from npudoctor.static.signatures import (
    CallShape,
    ScopedCall,
    accepts_keyword,
    bind_errors,
    is_single_call_body,
    is_super_call,
    iter_references,
    lines_mentioning,
    method_calls,
    names_read,
    only_raises,
    self_attribute,
    signature_text,
)
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree

from .chain import Chain, chain_evidence, chain_finding, walk

POOL, ALLOCATOR = "KV pool", "allocator"
TOP, SUB = "pool", "sub-pool"  # path levels below the allocator
HIERARCHY_BASES = {POOL: ("KVCache",), ALLOCATOR: ("BaseTokenToKVPoolAllocator",)}
# Grade of a finding in a class this deployment does not build (a CUDA-only pool, the other
# attention family's NPU pool): reported in the evidence, never counted against the deployment.
OFF_PATH = Status.PASS
_OFF_PATH_NOTE = "[not on this deployment's NPU path] "
# A class statement deriving from some ...Allocator: the only NPU files worth parsing for the allocator.
_ALLOCATOR_CLASS = re.compile(rb"^class\s+\w+\s*\([^)]*Allocator", re.MULTILINE)


@dataclass(eq=False)
class _Site:
    """One call of an offload method, and what it can reach."""

    scoped: ScopedCall
    relpath: str
    caller: ClassInfo | None
    shape: CallShape
    family: str | None = None  # an open call reaches every override of this hierarchy
    target: FunctionRef | None = None  # an exact call (super(), Base.m(self)) reaches this one

    @property
    def method(self) -> str:
        return self.scoped.method

    def where(self) -> str:
        return f"{self.relpath}:{self.scoped.line}"

    def describe(self) -> str:
        inside = ""
        if self.scoped.function is not None:
            owner = f"{self.caller.name}." if self.caller else ""
            inside = f" in {owner}{self.scoped.function.name}"
        text = ast.unparse(self.scoped.call)
        if len(text) > 110:
            text = f"{self.scoped.receiver_text}.{self.method}({self.shape.describe()})"
        return f"{self.where()}{inside}: {text}"


@dataclass(eq=False)
class _Override:
    """A definition of an offload method in a pool or allocator class."""

    ref: FunctionRef
    family: str

    @property
    def node(self):
        return self.ref.node

    def where(self) -> str:
        return self.ref.where()

    def describe(self) -> str:
        return f"{self.ref.owner.name}.{signature_text(self.node)} ({self.where()})"


@dataclass
class _Finding:
    status: Status
    evidence: Evidence
    subject: str  # the class whose override is at fault
    kind: str  # "TypeError" or "drops <keyword>="
    note: str = ""  # why a finding in a class this deployment builds is only a warning


@dataclass
class _Path:
    """What the deployment builds and runs on a retraction, level by level: the scheduler calls the
    allocator, the allocator its pool (``self._kvcache``), a composite pool its sub-pools."""

    allocators: list[ClassInfo] = field(default_factory=list)
    tops: list[ClassInfo] = field(default_factory=list)  # the pool the allocator holds
    subs: list[ClassInfo] = field(default_factory=list)  # the pools a composite top pool holds
    npu: dict[str, list[ClassInfo]] = field(default_factory=dict)  # family -> NPU pool classes
    level: dict[int, str] = field(default_factory=dict)  # id(function node) -> level it runs at
    users: dict[int, list[str]] = field(default_factory=dict)  # id(function node) -> path classes

    def classes(self) -> list[ClassInfo]:
        return list(dict.fromkeys([*self.allocators, *self.tops, *self.subs]))


class OffloadGraph:
    """Offload calls and overrides of one source tree, and the questions the probe asks of them."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self._mros: dict[int, list[ClassInfo]] = {}
        self._holder_cache: dict[int, list[tuple[ClassInfo, str]] | None] = {}
        self.sites: list[_Site] = []
        self.overrides: list[_Override] = []
        self._read_tree()

    # ----- collecting -------------------------------------------------------------------
    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        key = id(cls)
        if key not in self._mros:
            self._mros[key] = self.tree.mro(cls)
        return self._mros[key]

    def family(self, cls: ClassInfo | None) -> str | None:
        if cls is None:
            return None
        names = {c.name for c in self.mro(cls)}
        for family, bases in HIERARCHY_BASES.items():
            if names.intersection(bases):
                return family
        return None

    def _read_tree(self) -> None:
        tree = self.tree
        for path in tree.files_containing("_cpu_copy", under="srt"):
            data = tree.read(path)
            lines = sorted({n for m in OFFLOAD_METHODS for n in lines_mentioning(data, m)})
            if not lines:
                continue
            module = tree.parse(path)
            if module is None:
                continue
            classes = {id(c.node): c for c in tree.classes_in(path)}
            for scoped in method_calls(module, OFFLOAD_METHODS, lines):
                site = self._site(path, scoped, classes.get(id(scoped.class_node)))
                if site is not None:
                    self.sites.append(site)
            for cls in classes.values():
                defined = [cls.methods[m] for m in OFFLOAD_METHODS if m in cls.methods]
                family = self.family(cls) if defined else None
                if family is not None:
                    self.overrides.extend(
                        _Override(FunctionRef.method(cls, node), family) for node in defined
                    )

    def _site(self, path: Path, scoped: ScopedCall, caller: ClassInfo | None) -> _Site | None:
        call, receiver = scoped.call, scoped.receiver
        relpath = self.tree.relpath(path)
        if is_super_call(receiver):
            if caller is None:
                return None
            mro = self.mro(caller)
            after = caller
            if receiver.args:  # super(Klass, self)
                named = self.tree.resolve_name(caller.path, ast.unparse(receiver.args[0]))
                after = named if named is not None else caller
            position = next((i for i, c in enumerate(mro) if c is after or c.name == after.name), 0)
            target = self.tree.lookup(mro, scoped.method, position + 1)
            return _Site(scoped, relpath, caller, CallShape.of(call), target=target) if target else None
        if (
            call.args
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id == "self"
            and isinstance(receiver, (ast.Name, ast.Attribute))
            and not (isinstance(receiver, ast.Name) and receiver.id == "self")
            and self_attribute(receiver) is None
        ):  # Base.get_cpu_copy(self, ...)
            named = self.tree.resolve_name(path, ast.unparse(receiver))
            if named is not None:
                target = self.tree.lookup(self.mro(named), scoped.method)
                if target is not None:
                    return _Site(scoped, relpath, caller, CallShape.of(call, skip_first=True), target=target)
        if isinstance(receiver, ast.Name) and receiver.id == "self":
            family = self.family(caller) or POOL
        else:
            family = ALLOCATOR if "allocator" in scoped.receiver_text.lower() else POOL
        return _Site(scoped, relpath, caller, CallShape.of(call), family=family)

    # ----- reachability -----------------------------------------------------------------
    def reaching(self, override: _Override, narrow: bool = False) -> list[_Site]:
        """Calls that can reach ``override``: open calls of its hierarchy and exact calls naming it.
        ``narrow``: if its class is a component of other classes only, just the calls on that attribute."""
        holders = self._holders(override.ref.owner) if narrow else None
        found = []
        for site in self.sites:
            if site.method != override.node.name:
                continue
            if site.target is not None:
                if site.target.node is override.node:
                    found.append(site)
            elif site.family == override.family and (holders is None or self._calls_holder(site, holders)):
                found.append(site)
        return found

    def _calls_holder(self, site: _Site, holders: list[tuple[ClassInfo, str]]) -> bool:
        attr = self_attribute(site.scoped.receiver)
        if attr is None or site.caller is None:
            return False
        for holder, name in holders:
            if name == attr and (holder in self.mro(site.caller) or site.caller in self.mro(holder)):
                return True
        return False

    def _holders(self, cls: ClassInfo) -> list[tuple[ClassInfo, str]] | None:
        """``(class, attribute)`` pairs when ``cls`` is only ever a component: every use of its name
        under srt builds an instance into ``self.<attribute>`` of a pool or allocator class, directly
        or through a ``*_cls=`` argument of ``super().__init__``, or is an isinstance test, an
        annotation or a class-attribute read. None when an instance may end up anywhere (built
        elsewhere, subclassed, stored in a registry, passed around)."""
        if id(cls) not in self._holder_cache:
            holders: list[tuple[ClassInfo, str]] | None = []
            for path in self.tree.files_containing(cls.name, under="srt"):
                lines = lines_mentioning(self.tree.read(path), cls.name)
                if not lines:
                    continue  # only longer names contain it (KlassHost)
                module = self.tree.parse(path)
                if module is None:
                    holders = None
                    break
                classes = {id(c.node): c for c in self.tree.classes_in(path)}
                for ref, chain in iter_references(module, cls.name, lines):
                    found = self._component_use(ref, chain, classes)
                    if found is None:
                        holders = None
                        break
                    holders.extend(found)
                if holders is None:
                    break
            self._holder_cache[id(cls)] = holders
        return self._holder_cache[id(cls)]

    def _component_use(
        self, ref: ast.expr, chain: tuple[ast.AST, ...], classes: dict[int, ClassInfo]
    ) -> list[tuple[ClassInfo, str]] | None:
        """What one reference to a class name does: the holders it builds ([] for harmless uses);
        None when it lets an instance escape."""
        parent = chain[-1]
        if isinstance(parent, ast.Attribute) and parent.value is ref:
            call = chain[-2] if len(chain) > 1 else None
            if not (isinstance(call, ast.Call) and call.func is parent):
                return []  # Klass.CONSTANT: a namespace, not an instance
            first = call.args[0] if call.args else None
            # Klass.method(self, ...) runs on an instance that exists already; Klass.create(...) may build one
            return [] if isinstance(first, ast.Name) and first.id == "self" else None
        if _in_isinstance_or_annotation(ref, chain):
            return []
        owner = next((classes.get(id(n)) for n in reversed(chain) if isinstance(n, ast.ClassDef)), None)
        if owner is None or self.family(owner) is None:
            return None
        if isinstance(parent, ast.Call) and parent.func is ref:
            attr = _stored_in_self(parent, chain[:-1])
            return [(owner, attr)] if attr else None
        if isinstance(parent, ast.keyword) and parent.arg and len(chain) >= 2:
            call = chain[-2]
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "__init__"
                and is_super_call(call.func.value)
            ):
                mro = self.mro(owner)
                init = self.tree.lookup(mro, "__init__", mro.index(owner) + 1) if owner in mro else None
                attrs = _param_stored_in_self(init.node, parent.arg) if init else None
                return [(owner, a) for a in attrs] if attrs else None
        return None

    # ----- the deployment's path ----------------------------------------------------------
    def path(self, families: list[str], sliding: bool, hybrid: bool) -> _Path:
        """The classes a decode server of this deployment builds, and the methods they run."""
        path = _Path()
        for family in families:
            path.npu[family] = npu_pool_classes(self.tree, family)
        npu = [c for family in families for c in path.npu[family]]
        composites = []
        if hybrid:
            composites += self._pool_classes_named("HybridLinearKVPool")
        if sliding:
            composites += self._pool_classes_named("SWAKVPool")
        path.tops, path.subs = (composites, npu) if composites else (npu, [])
        path.allocators = self._path_allocators(sliding)
        for level, classes in ((ALLOCATOR, path.allocators), (TOP, path.tops), (SUB, path.subs)):
            for cls in classes:
                for method in OFFLOAD_METHODS:
                    ref, user = self.tree.lookup(self.mro(cls), method), cls.name
                    while ref is not None:
                        path.users.setdefault(id(ref.node), []).append(user)
                        if id(ref.node) in path.level:
                            break
                        path.level[id(ref.node)] = level
                        # what it hands over to with super() or Base.m(self, ...) runs at the same level
                        site = next(
                            (s for s in self.sites if s.scoped.function is ref.node and s.target), None
                        )
                        if site is None:
                            break
                        ref = site.target
                        how = "super()" if is_super_call(site.scoped.receiver) else site.scoped.receiver_text
                        user = f"{cls.name} via {how}"
        return path

    def path_targets(self, site: _Site, path: _Path) -> list[FunctionRef]:
        """The overrides ``site`` reaches when it runs on the deployment's path (none if it does not)."""
        function = site.scoped.function
        level = path.level.get(id(function)) if function is not None else None
        if site.target is not None:
            return [site.target] if level else []
        if site.family == ALLOCATOR:  # the scheduler holds the allocator the path builds
            below = path.allocators
        elif level == ALLOCATOR:
            below = path.tops
        elif level == TOP and self_attribute(site.scoped.receiver):
            below = path.subs
        else:
            return []
        found = (self.tree.lookup(self.mro(c), site.method) for c in below)
        return list({id(r.node): r for r in found if r is not None}.values())

    def _pool_classes_named(self, name: str) -> list[ClassInfo]:
        return [c for c in self.tree.find_classes(name, under="srt") if self.family(c) == POOL]

    def _path_allocators(self, sliding: bool) -> list[ClassInfo]:
        """The allocator a decode server builds on Ascend: the NPU paged allocator, or the SWA
        allocator for sliding-window models (model_runner's ``_is_npu`` branch)."""
        if sliding:
            return [c for c in self.tree.find_classes("SWATokenToKVPoolAllocator", under="srt")]
        found = []
        for path in self.tree.files_containing("Allocator", under="srt"):
            rel = self.tree.relpath(path).lower()
            npu_file = "npu" in rel or "ascend" in rel
            text = self.tree.read(path)
            if not _ALLOCATOR_CLASS.search(text) or not (
                npu_file or b"class Ascend" in text or b"class NPU" in text
            ):
                continue  # parse only files that can hold an NPU allocator (0.4.10 keeps Ascend* in mem_cache/)
            for cls in self.tree.classes_in(path):
                if self.family(cls) != ALLOCATOR or not (npu_file or cls.name.startswith(("NPU", "Ascend"))):
                    continue
                if any("SWA" in c.name for c in self.mro(cls)):
                    continue  # hybrid sliding-window allocators serve other models
                found.append(cls)
        return found

    # ----- the probe ------------------------------------------------------------------------
    def probe(
        self,
        families: list[str],
        sliding: bool,
        hybrid: bool,
        roles: tuple[str, ...],
        assumptions: tuple[str, ...],
    ) -> Probe:
        path = self.path(families, sliding, hybrid)
        unrecognised = self.unrecognised(families, path)
        findings: list[_Finding] = []
        for override in self.overrides:
            if only_raises(override.node):
                continue  # refuses offload whatever it is passed: not a signature defect
            findings.extend(self._binding_findings(override, path))
            findings.extend(self._drop_findings(override, path))
        chain = walk(self, path, hybrid)
        findings.extend(self._chain_findings(chain))
        findings.sort(key=lambda f: (-f.status.severity, f.subject, f.evidence.location.line))

        failing = [f for f in findings if f.status is Status.FAIL]
        warning = [f for f in findings if f.status is Status.WARN]
        aside = [f for f in findings if f.status is OFF_PATH]
        if failing:
            status = Status.FAIL
            summary = f"{_describe(failing)} at the first retraction on this deployment's path"
            if len(findings) > len(failing):
                summary += f" ({len(findings) - len(failing)} more finding(s) in the evidence)"
        elif warning or unrecognised:
            status = Status.WARN
            parts = [text for text, _ in unrecognised]
            if warning:
                parts.append(f"in classes this deployment builds: {_describe(warning)}")
            summary = "; ".join(parts)
        else:
            status = Status.PASS
            names = ", ".join(c.name for c in path.classes())
            summary = (
                f"every offload call on this deployment's path binds and passes its keywords on ({names})"
            )
        if aside and not failing:
            summary += (
                f"; also, off this deployment's NPU path: {', '.join(dict.fromkeys(f.subject for f in aside))} "
                "(offload overrides that do not take their callers' keywords, see the evidence)"
            )
        evidence = [f.evidence for f in failing + warning] + [e for _, e in unrecognised]
        evidence += self._caller_evidence()
        if not failing and not warning:
            evidence += self._path_evidence(path)
        if not self._chain_findings(chain):
            evidence += chain_evidence(chain)
        evidence += [f.evidence for f in aside]
        return Probe(status, summary, tuple(evidence), assumptions, roles)

    def _chain_findings(self, chain: Chain) -> list[_Finding]:
        """Calls on the offload path, beyond the two copy methods' own overrides (judged above),
        that would not bind to what the deployment's class resolves them to."""
        judged = {id(o.node) for o in self.overrides}
        return [
            _Finding(Status.FAIL, *chain_finding(edge))
            for edge in chain.failing()
            if not (
                edge.method in OFFLOAD_METHODS and edge.callee is not None and id(edge.callee.node) in judged
            )
        ]

    def unrecognised(self, families: list[str], path: _Path) -> list[tuple[str, Evidence]]:
        """What the probe expected to find and did not: reported, never a silent pass."""
        layout = "none found: this release's layout is not one npudoctor recognises"
        missing = []
        if not any(s.family == ALLOCATOR for s in self.sites):
            missing.append(
                (
                    "no call of get_cpu_copy/load_cpu_copy on an allocator found",
                    "the scheduler to call token_to_kv_pool_allocator.get_cpu_copy/load_cpu_copy under sglang/srt",
                )
            )
        if not any(o.family == POOL for o in self.overrides):
            missing.append(
                (
                    "no get_cpu_copy/load_cpu_copy in any KVCache subclass",
                    "get_cpu_copy/load_cpu_copy defined in subclasses of KVCache under sglang/srt",
                )
            )
        for family in families:
            if not path.npu.get(family):
                missing.append(
                    (
                        f"no NPU {family.upper()} pool class found",
                        f"an NPU subclass of the generic {family.upper()} KV pool under sglang/srt",
                    )
                )
        if not path.allocators:
            missing.append(
                (
                    "no NPU token-to-KV allocator class found",
                    "an allocator class (subclass of BaseTokenToKVPoolAllocator) in an NPU backend file",
                )
            )
        return [(text, Evidence(expected=expected, observed=layout)) for text, expected in missing]

    def _binding_findings(self, override: _Override, path: _Path) -> list[_Finding]:
        """Calls that reach ``override`` and would not bind to it."""
        on_path = id(override.node) in path.level
        failures = self._failures(override, self.reaching(override))
        if failures and not on_path:  # a component is reached only through its holder: look again
            failures = self._failures(override, self.reaching(override, narrow=True))
        if not failures:
            return []
        on_path_failures = [
            (s, e) for s, e in failures if any(r.node is override.node for r in self.path_targets(s, path))
        ]
        status = Status.FAIL if on_path_failures else Status.WARN if on_path else OFF_PATH
        ordered = on_path_failures + [f for f in failures if f not in on_path_failures]
        site, errors = ordered[0]
        node = override.node
        missing = sorted({k for s, _ in failures for k in s.shape.keywords if not accepts_keyword(node, k)})
        users = path.users.get(id(node))
        used_by = f" (used by the {', '.join(dict.fromkeys(users))} this deployment builds)" if users else ""
        more = list(dict.fromkeys(s.where() for s, _ in ordered[1:]))
        also = f"; calls at {', '.join(more)} fail the same way" if more else ""
        if on_path and not on_path_failures:
            also += "; on this deployment's path none of these calls reaches it"
        expected = f"{override.ref.qualname}{used_by} accepts every call that reaches it" + (
            f", including {', '.join(k + '=' for k in missing)}" if missing else ""
        )
        lacks = (
            f"has no parameter {', '.join(missing)} and no **kwargs"
            if missing
            else "has a signature these calls do not bind to"
        )
        observed = (
            (_OFF_PATH_NOTE if status is OFF_PATH else "")
            + f"{override.describe()} {lacks}, but {site.describe()} -> TypeError: {errors[0]}"
            + (" on the first retraction" if status is Status.FAIL else "")
            + also
        )
        location = Location(override.ref.relpath, override.ref.line, override.ref.qualname)
        note = "not on the calls this deployment makes" if status is Status.WARN else ""
        return [
            _Finding(
                status, Evidence(expected, observed, location), override.ref.owner.name, "TypeError", note
            )
        ]

    def _failures(self, override: _Override, sites: list[_Site]) -> list[tuple[_Site, list[str]]]:
        found = []
        for site in sites:
            errors = bind_errors(override.node, site.shape)
            if errors:
                found.append((site, errors))
        return found

    def _drop_findings(self, override: _Override, path: _Path) -> list[_Finding]:
        """Keywords the override receives and accepts, but never reads, while it calls the next level."""
        node = override.node
        onward = [s for s in self.sites if s.scoped.function is node and s.method == node.name]
        if not onward:
            return []
        read = names_read(node)
        received: dict[str, _Site] = {}
        on_path: set[str] = set()
        for site in self.reaching(override):
            reaches_on_path = any(r.node is node for r in self.path_targets(site, path))
            for keyword in site.shape.keywords:
                if accepts_keyword(node, keyword) and _local_name(node, keyword) not in read:
                    received.setdefault(keyword, site)
                    if reaches_on_path:
                        on_path.add(keyword)
        findings = []
        for keyword, giver in received.items():
            status, why = self._drop_severity(keyword, onward, keyword in on_path, path)
            if status is None:
                continue
            if status is Status.WARN and id(node) not in path.level:
                status = OFF_PATH
            if keyword not in on_path and not any(
                keyword in s.shape.keywords for s in self.reaching(override, narrow=True)
            ):
                continue  # a component whose holder never passes the keyword
            nexts = "; ".join(s.describe() for s in onward)
            findings.append(
                _Finding(
                    status,
                    Evidence(
                        expected=f"{override.ref.qualname} passes {keyword}= on to the next level",
                        observed=(
                            (_OFF_PATH_NOTE if status is OFF_PATH else "")
                            + f"{override.describe()} receives {keyword}= (from {giver.where()}) and never reads it; "
                            f"it calls {nexts} without it{why}"
                        ),
                        location=Location(override.ref.relpath, override.ref.line, override.ref.qualname),
                    ),
                    override.ref.owner.name,
                    f"drops {keyword}=",
                    "the next level ignores it today"
                    if keyword in on_path
                    else "not on this deployment's path",
                )
            )
        return findings

    def _drop_severity(
        self, keyword: str, onward: list[_Site], on_path: bool, path: _Path
    ) -> tuple[Status | None, str]:
        """FAIL when, on the path, the next level reads the keyword; WARN when it only accepts it, or
        off the path for a pure forwarder or a super() call whose target reads it."""
        if on_path:
            downstream = [r for s in onward for r in self.path_targets(s, path)]
            readers = [
                r for r in downstream if accepts_keyword(r.node, keyword) and _reads_keyword(r.node, keyword)
            ]
            if readers:
                where = ", ".join(f"{r.qualname} ({r.where()})" for r in readers)
                return Status.FAIL, f"; {where} reads {keyword}, so what it copies changes"
            takers = [r for r in downstream if accepts_keyword(r.node, keyword) and not only_raises(r.node)]
            if takers:
                where = ", ".join(f"{r.qualname} ({r.where()})" for r in takers)
                return Status.WARN, f"; {where} accepts {keyword} (and ignores it today)"
        exact = [s.target for s in onward if s.target is not None]
        readers = [r for r in exact if accepts_keyword(r.node, keyword) and _reads_keyword(r.node, keyword)]
        if readers:
            where = ", ".join(f"{r.qualname} ({r.where()})" for r in readers)
            return Status.WARN, f"; {where} reads {keyword}, so what it copies changes"
        if any(s.scoped.function and is_single_call_body(s.scoped.function, s.scoped.call) for s in onward):
            return Status.WARN, " (a pure forwarder: whatever it wraps never sees the keyword)"
        return None, ""

    # ----- evidence when things line up -------------------------------------------------------
    def _caller_evidence(self) -> list[Evidence]:
        entry = [s for s in self.sites if s.family == ALLOCATOR]
        if not entry:
            return []
        keywords = sorted({k for s in entry for k in s.shape.keywords})
        where = ", ".join(s.where() for s in entry)
        return [
            Evidence(
                expected="the offload keywords are read from the installed callers",
                observed=(
                    f"callers of the allocator pass {', '.join(k + '=' for k in keywords)} ({where})"
                    if keywords
                    else f"callers pass no keywords to get_cpu_copy/load_cpu_copy yet ({where})"
                ),
                location=Location(entry[0].relpath, entry[0].scoped.line),
            )
        ]

    def _path_evidence(self, path: _Path) -> list[Evidence]:
        evidence = []
        for cls in path.classes():
            for method in OFFLOAD_METHODS:
                ref = self.tree.lookup(self.mro(cls), method)
                if ref is None:
                    continue
                override = _Override(ref, self.family(cls) or POOL)
                if only_raises(ref.node):
                    observed = (
                        f"{cls.name}.{method} resolves to {override.describe()}, which only raises: "
                        "offload unsupported, not a signature question"
                    )
                else:
                    sites = self.reaching(override)
                    keywords = sorted({k for s in sites for k in s.shape.keywords})
                    observed = (
                        f"{cls.name}.{method} resolves to {override.describe()}, which binds all "
                        f"{len(sites)} call{'s' if len(sites) != 1 else ''} that can reach it"
                        + (f" (keywords {', '.join(k + '=' for k in keywords)})" if keywords else "")
                    )
                evidence.append(
                    Evidence(
                        expected=f"{cls.name}.{method} accepts every keyword its callers pass",
                        observed=observed,
                        location=Location(ref.relpath, ref.line, ref.qualname),
                    )
                )
        return evidence


def _describe(findings: list[_Finding]) -> str:
    """``Klass: TypeError; Other: drops k= (why only a warning)`` for a summary."""
    kinds: dict[str, list[str]] = {}
    for finding in findings:
        kind = f"{finding.kind} ({finding.note})" if finding.note else finding.kind
        kinds.setdefault(finding.subject, [])
        if kind not in kinds[finding.subject]:
            kinds[finding.subject].append(kind)
    return "; ".join(f"{subject}: {' and '.join(k)}" for subject, k in kinds.items())


def _named(node, keyword: str) -> bool:
    return keyword in {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}


def _local_name(node, keyword: str) -> str:
    """The name a keyword argument has inside the function: itself, or the ``**kwargs`` dict."""
    return keyword if node.args.kwarg is None or _named(node, keyword) else node.args.kwarg.arg


def _reads_keyword(node, keyword: str) -> bool:
    return _local_name(node, keyword) in names_read(node)


def _in_isinstance_or_annotation(ref: ast.expr, chain: tuple[ast.AST, ...]) -> bool:
    path = (*chain, ref)
    for i, node in enumerate(chain):
        below = path[i + 1]
        if isinstance(node, ast.arg):
            return True  # a parameter's annotation
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and below is node.returns:
            return True
        if isinstance(node, ast.AnnAssign) and below is node.annotation:
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and any(below is a for a in node.args[1:])
        ):
            return True
    return False


def _stored_in_self(call: ast.Call, chain: tuple[ast.AST, ...]) -> str | None:
    """``attr`` when ``call`` is what ``self.attr = ...`` stores (also as a branch of ``x if c else None``)."""
    value: ast.AST = call
    for node in reversed(chain):
        if isinstance(node, ast.IfExp) and value is not node.test:
            value = node
            continue
        if isinstance(node, ast.Assign) and node.value is value and len(node.targets) == 1:
            return self_attribute(node.targets[0])
        if isinstance(node, ast.AnnAssign) and node.value is value:
            return self_attribute(node.target)
        return None
    return None


def _param_stored_in_self(func, param: str) -> list[str] | None:
    """The ``self`` attributes a class-valued parameter is instantiated into, when that is all the
    function does with it; None otherwise."""
    if param not in {a.arg for a in (*func.args.args, *func.args.kwonlyargs)}:
        return None
    parents: dict[int, ast.AST] = {}
    uses = []
    for node in ast.walk(func):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
            if isinstance(child, ast.Name) and child.id == param:
                uses.append(child)
    attrs = []
    for use in uses:
        call = parents.get(id(use))
        if not isinstance(use.ctx, ast.Load) or not isinstance(call, ast.Call) or call.func is not use:
            return None
        chain: list[ast.AST] = []
        node = call
        while id(node) in parents:
            node = parents[id(node)]
            chain.append(node)
        attr = _stored_in_self(call, tuple(reversed(chain)))
        if attr is None:
            return None
        attrs.append(attr)
    return attrs or None
