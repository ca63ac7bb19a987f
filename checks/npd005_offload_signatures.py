"""NPD005: every ``get_cpu_copy``/``load_cpu_copy`` override accepts, and passes on, the keywords its callers pass.

A PD decode server that runs short of KV cache retracts a request and offloads its KV to
host memory: the scheduler calls ``token_to_kv_pool_allocator.get_cpu_copy(indices, ...)``,
the allocator forwards to its pool (``self._kvcache.get_cpu_copy(...)``), composite pools
forward to their sub-pools. The keywords on that chain grow release by release
(``mamba_indices=`` from 0.5.11, ``req_pool_index=`` later) and every override must grow
with them: the allocator in 0.5.13 always passes ``mamba_indices=``, while the NPU pools'
new overrides were written as ``get_cpu_copy(self, indices)``, so Python raised
``TypeError: unexpected keyword argument 'mamba_indices'`` before a byte was copied and
the decode instance died at its first retraction. The same defect in the SWA pool and
allocator was fixed upstream by explicit parameters forwarded down the chain
(https://github.com/sgl-project/sglang/pull/24026).

Static probe (reads the source with ``ast``; sglang is never imported). The property:
every call of ``get_cpu_copy``/``load_cpu_copy`` under ``sglang/srt`` binds to every
override it can reach, and an override passes on the keywords it receives when the next
level would use them. The keyword set is read from the installed callers, never from a
list in npudoctor.

* **Calls.** Each call is recorded with its shape (positional count, keywords, spreads)
  and the class and method it is written in. What it reaches, by receiver:
  ``super().m(...)`` and ``Base.m(self, ...)`` reach exactly the method the caller's MRO
  gives; a receiver whose text names an allocator (``token_to_kv_pool_allocator``, in the
  scheduler) reaches every allocator override; any other receiver (``self._kvcache`` in
  an allocator, ``self.full_kv_pool`` in a composite pool, ...) reaches every KV-pool
  override. Coarse, hence sound: a keyword anyone passes to "a pool" must be taken by
  every pool that is not provably a component (below).
* **Overrides.** Definitions of the two methods in classes whose MRO contains
  ``KVCache`` (pools) or ``BaseTokenToKVPoolAllocator`` (allocators), found by
  inheritance wherever they live (``mem_cache/allocator.py`` became a package). Every
  class of the hierarchies resolves the methods to one of these definitions, so checking
  the definitions checks every class; the classes of the deployment's path are named.
* **Binding.** Each reaching call is bound to the override as CPython would bind it:
  unexpected keyword, too many positional arguments, missing required argument.
* **Forwarding.** An override that receives a keyword it accepts, never reads it and
  calls the next level has dropped it. On the deployment's path that is a ``fail`` when
  the next level on the path reads the keyword (what is copied changes: e.g. mamba state
  left behind) and a ``warn`` when it only accepts it. Elsewhere a drop is reported when
  the override is a one-statement forwarder (``return self._kvcache.m(...)``) or hands over
  with ``super()`` to a method that reads the keyword, ranked like a binding failure below.
  A composite that consumes a keyword itself reads it, and has not dropped it.
* **No false alarms.** A method whose body only raises (HiSparse and fused-draft pools:
  "does not support get_cpu_copy") refuses offload whatever it is passed: not a signature
  defect (NPD001 reports missing offload support on the NPU path). A class whose every
  use builds it into ``self.<attr>`` of another pool or allocator (directly, or as a
  ``<attr>_cls=`` argument of ``super().__init__`` that the base instantiates into
  ``self.<attr>``), and that nothing subclasses, registers or passes around, is a
  component: only calls on that attribute reach it (0.5.23's NVFP4 index-K pool).
* **Ranking.** The deployment's path is built level by level, the way a decode server
  runs a retraction: the scheduler calls the allocator the decode role builds on Ascend
  (the NPU paged allocator; ``SWATokenToKVPoolAllocator`` for sliding-window models);
  that allocator calls the pool it holds: the NPU pool class of the model's attention
  family (``npudoctor.pools.npu_pool_classes``), or for hybrid linear-attention and
  sliding-window models the composite (``HybridLinearKVPool``, ``SWAKVPool``) whose
  attribute calls then reach the NPU pool; ``super()`` calls stay on their level. A
  binding failure is a ``fail`` when a call made on the path reaches the override on the
  path (the 0.5.13 defect: ``allocator/paged.py`` -> ``NPUMLATokenToKVPool``). It is a
  ``warn`` when the override belongs to a class the deployment builds but only calls made
  elsewhere fail (0.5.13 with Qwen3-Next: the NPU MHA pool sits under
  ``HybridLinearKVPool``, which calls it without keywords). Offenders in classes the
  deployment does not build (CUDA-only pools such as 0.5.12's ``NSATokenToKVPool``, the
  other attention family's NPU pool) are reported, marked "not on this deployment's NPU
  path", in the evidence and the summary, and never change the status.

Live probe (imports the real sglang modules in the live child, behind the NPU simulation). The
static graph names the classes of the deployment's path and the scheduler's calls into the
allocator; the live probe builds that allocator over that pool on CPU with their real
constructors and the deployment's dimensions (the hybrid pool with its ``MambaPool`` shaped by
sglang's own config class of the model), and makes the scheduler's two calls with exactly the
keywords the installed callers pass (values of the kind a decode server's ``Req`` holds:
``mamba_indices`` None, or a real mamba slot for a hybrid model; ``req_pool_index`` 0).
Every level's offload methods are shadowed on the instance by a recorder while the calls run,
so the evidence says what each level received. A call that does not bind is a ``fail`` (the
sglang line that made it, the keyword, CPython's own message); a keyword dropped between
levels is a ``fail`` when the next level reads it, a ``warn`` when it only accepts it; the
offloaded slots must come back (a copy that raises for other reasons is NPD001's, reported,
not counted); a class that cannot be built on CPU is a ``warn`` with the reason. Both depths
judge the same roles and classes.

Matters for roles that offload KV (a PD decode server: ``RoleFacts.can_offload_kv``);
otherwise ``skip``. With no deployment, a PD decode role with an MLA and an MHA model is
assumed and listed. A tree where no allocator caller, no pool override or no NPU pool is
recognised gives ``warn``, never a silent ``pass``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts
from npudoctor.pools import npu_pool_classes, offload_scope
from npudoctor.results import Evidence, Location, Status
from npudoctor.signatures import (
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
from npudoctor.source import ClassInfo, MethodRef, SourceTree
from npudoctor.target import Target

OFFLOAD_METHODS = ("get_cpu_copy", "load_cpu_copy")
POOL, ALLOCATOR = "KV pool", "allocator"
TOP, SUB = "pool", "sub-pool"  # path levels below the allocator
HIERARCHY_BASES = {POOL: ("KVCache",), ALLOCATOR: ("BaseTokenToKVPoolAllocator",)}
# Grade of a finding in a class this deployment does not build (a CUDA-only pool, the other
# attention family's NPU pool): reported in the evidence, never counted against the deployment.
OFF_PATH = Status.PASS
_OFF_PATH_NOTE = "[not on this deployment's NPU path] "
# A class statement deriving from some ...Allocator: the only NPU files worth parsing for the allocator.
_ALLOCATOR_CLASS = re.compile(rb"^class\s+\w+\s*\([^)]*Allocator", re.MULTILINE)


class OffloadSignatures(Check):
    """NPD005: ``get_cpu_copy``/``load_cpu_copy`` overrides accept and forward their callers' keywords."""

    id = "NPD005"
    title = "get_cpu_copy/load_cpu_copy overrides accept the keywords their callers pass"
    upstream = ("https://github.com/sgl-project/sglang/pull/24026",)
    fixed_in = "0.5.15"
    why = (
        "Callers pass keywords (mamba_indices=, req_pool_index=) through the allocator to the pool; "
        "an override with a narrower signature raises TypeError at the first retraction, and one "
        "that drops a keyword silently offloads the wrong state."
    )
    bites_when = (
        "PD decode role that retracts, with a pool or allocator whose offload override lacks a "
        "keyword the installed callers pass (or drops one the next level uses)."
    )
    how_to_fix = "Upgrade sglang, or apply the npudoctor runtime override for NPD005 (accept and forward the keywords)."

    def static(self, target: Target, facts: Facts) -> Probe:
        """Bind every offload call to every override it can reach; rank offenders by the deployment's path."""
        scope = _path_scope(facts)
        if isinstance(scope, Probe):
            return scope
        return _OffloadGraph(target.tree).probe(*scope)

    def live_imports(self) -> None:
        """Import the module of every class a decode server's offload path can hold (the static
        path's classes, for any deployment), while ``is_npu()`` is still False."""
        from npudoctor import livepools

        livepools.import_pool_modules()
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.origin is None:
            return
        graph = _graph(Path(spec.origin).parent)
        for sliding, hybrid in ((False, False), (True, True)):
            for cls in graph.path(["mla", "mha"], sliding, hybrid).classes():
                importlib.import_module(cls.module)

    def live(self, target: Target, facts: Facts) -> Probe:
        """Build the deployment's allocator and pools on CPU, call ``get_cpu_copy``/``load_cpu_copy``
        through the real chain with the keywords the installed callers pass, and record what every
        level receives (see ``_LiveProbe``)."""
        scope = _path_scope(facts)
        if isinstance(scope, Probe):
            return scope
        return _LiveProbe(_graph(target.tree.package_dir), facts).run(*scope)


def _path_scope(facts: Facts):
    """``(families, sliding, hybrid, roles, assumptions)`` of the offload path both depths
    judge, or the skip when no role of the deployment offloads KV to CPU."""
    roles, families, assumptions = offload_scope(facts)
    if not roles:
        return Probe(
            Status.SKIP,
            "no role of this deployment offloads KV to CPU: only a PD decode server retracts "
            "requests to host memory (get_cpu_copy/load_cpu_copy)",
        )
    sliding = bool(facts.model and facts.model.sliding_window)
    hybrid = bool(facts.model and facts.model.hybrid_linear_layers)
    return families, sliding, hybrid, roles, assumptions


@dataclass(eq=False)
class _Site:
    """One call of an offload method, and what it can reach."""

    scoped: ScopedCall
    relpath: str
    caller: ClassInfo | None
    shape: CallShape
    family: str | None = None  # an open call reaches every override of this hierarchy
    target: MethodRef | None = None  # an exact call (super(), Base.m(self)) reaches this one

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

    ref: MethodRef
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


class _OffloadGraph:
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
                    self.overrides.extend(_Override(MethodRef(cls, node), family) for node in defined)

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

    def path_targets(self, site: _Site, path: _Path) -> list[MethodRef]:
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
            if ("npu" not in rel and "ascend" not in rel) or not _ALLOCATOR_CLASS.search(
                self.tree.read(path)
            ):
                continue
            for cls in self.tree.classes_in(path):
                if self.family(cls) != ALLOCATOR:
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
        unrecognised = self._unrecognised(families, path)
        findings: list[_Finding] = []
        for override in self.overrides:
            if only_raises(override.node):
                continue  # refuses offload whatever it is passed: not a signature defect
            findings.extend(self._binding_findings(override, path))
            findings.extend(self._drop_findings(override, path))
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
        evidence += [f.evidence for f in aside]
        return Probe(status, summary, tuple(evidence), assumptions, roles)

    def _unrecognised(self, families: list[str], path: _Path) -> list[tuple[str, Evidence]]:
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


# ----- the live probe ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _graph(package_dir: Path) -> _OffloadGraph:
    """One static graph per tree and child: ``live_imports`` and ``live`` ask the same questions."""
    return _OffloadGraph(SourceTree(Path(package_dir).resolve()))


# Token slots offloaded and reloaded, as (page, offset) pairs: a few, across page boundaries,
# never slot 0 (sglang's padding slot).
_SLOTS = ((1, 1), (1, -1), (2, 0), (3, 3))
# The positional arguments the scheduler passes: (indices,) and (the offloaded copy, indices).
_POSITIONAL = {"get_cpu_copy": 1, "load_cpu_copy": 2}
_LIVE = " (live, CPU)"


@dataclass
class _Entry:
    """What the installed scheduler passes to the allocator for one method: the keywords, with
    the values a decode server has there (``values``), and where it says so."""

    site: _Site
    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    unexercised: str = ""  # why the call could not be made as written (an unknown positional shape)

    @property
    def method(self) -> str:
        return self.site.method

    def location(self) -> Location:
        return Location(self.site.relpath, self.site.scoped.line, self._caller_name())

    def _caller_name(self) -> str:
        function = self.site.scoped.function
        if function is None:
            return ""
        return f"{self.site.caller.name}.{function.name}" if self.site.caller else function.name

    def describe(self) -> str:
        keywords = ", ".join(f"{k}=" for k in self.values) or "no keywords"
        return f"{self.site.where()} ({self._caller_name()}) passes {keywords}"


@dataclass
class _Run:
    """One call of the scheduler's into the allocator, and what every level received."""

    entry: _Entry
    calls: list  # liveoffload.LevelCall, in call order
    error: BaseException | None = None
    result: Any = None
    payload_note: str = ""  # where load_cpu_copy's payload came from, when get_cpu_copy raised


class _LiveProbe:
    """The live half of NPD005 for one deployment: the static graph names the classes and the
    installed callers' keywords; real objects built on CPU say what happens when they are called.

    For every allocator of the deployment's path and every pool it can hold (the NPU pool of the
    model's attention family; a composite with the NPU pool below for hybrid and sliding-window
    models), the allocator is built over the pool with their real constructors, a few token
    slots are filled with random bits, and the scheduler's two calls are made with exactly the
    keywords of the installed callers: ``get_cpu_copy``, the slots overwritten, ``load_cpu_copy``.
    Every level's offload methods are shadowed on the instance by a recorder for the duration
    (``npudoctor.liveoffload.recording``), so the evidence shows what each level received.

    * A call that does not bind is a ``fail``: the first retraction raises ``TypeError`` there.
    * A keyword a level received, does not use itself and did not pass to the next level, which
      accepts it, was dropped: ``fail`` when the next level reads it (what it copies changes),
      ``warn`` when it only accepts it.
    * The slots must come back; a copy that raises for another reason after every keyword was
      delivered is NPD001's property (the round trip) and is reported, not counted; a copy that
      returns but brings other bits back is a ``warn`` (a signature-only pass must not hide it).
    * A class of the path that cannot be built on CPU is a ``warn`` with the reason.
    """

    def __init__(self, graph: _OffloadGraph, facts: Facts):
        from npudoctor.facts import RoleFacts

        self.graph = graph
        self.facts = facts
        self.role = facts.role("decode") or RoleFacts(name="decode (assumed)", disaggregation_mode="decode")

    def run(
        self,
        families: list[str],
        sliding: bool,
        hybrid: bool,
        roles: tuple[str, ...],
        assumptions: tuple[str, ...],
    ) -> Probe:
        from npudoctor import livepools

        path = self.graph.path(families, sliding, hybrid)
        unrecognised = self.graph._unrecognised(families, path)
        findings: list[_Finding] = []
        passed: list[Evidence] = []
        notes: list[Evidence] = []
        chains: list[str] = []
        for allocator, top, sub in self._scenarios(path):
            chain = " -> ".join(c.name for c in (allocator, top, sub) if c is not None)
            chains.append(chain)
            outcome = livepools.in_role(self.role, lambda a=allocator, t=top, s=sub: self._scenario(a, t, s))
            findings += outcome[0]
            passed += outcome[1]
            notes += outcome[2]
        findings.sort(key=lambda f: -f.status.severity)
        failing = [f for f in findings if f.status is Status.FAIL]
        warning = [f for f in findings if f.status is Status.WARN]
        if failing:
            status = Status.FAIL
            summary = f"{_describe(failing)} at the first retraction, live on CPU through {'; '.join(chains)}"
        elif warning or unrecognised or not chains:
            status = Status.WARN
            parts = [text for text, _ in unrecognised]
            parts += [f"live on CPU: {_describe(warning)}"] if warning else []
            summary = "; ".join(parts) or "no offload chain of this deployment could be exercised"
        else:
            status = Status.PASS
            keywords = sorted({k for e in self._entries(None) for k in e.values})
            delivered = f"the keywords the installed callers pass ({', '.join(k + '=' for k in keywords)})"
            if not keywords:
                delivered = "the installed callers' calls (they pass no keywords)"
            if notes:
                summary = (
                    f"live on CPU: {delivered} bind at every level they reach of {'; '.join(chains)}; "
                    "the copy itself raised before the end (see the evidence: NPD001's property, "
                    "not a signature defect)"
                )
            else:
                summary = f"live on CPU: {delivered} bind and reach every level of {'; '.join(chains)}"
        evidence = [f.evidence for f in failing + warning] + [e for _, e in unrecognised] + notes + passed
        return Probe(status, summary, tuple(evidence), assumptions, roles)

    # ----- what to build ---------------------------------------------------------------------------
    def _scenarios(self, path: _Path) -> list[tuple[ClassInfo, ClassInfo, ClassInfo | None]]:
        """(allocator, pool it holds, NPU pool below a composite) for every combination of the path."""
        found = []
        for allocator in path.allocators:
            for top in path.tops:
                for sub in path.subs or [None]:
                    found.append((allocator, top, sub))
        return found

    def _scenario(
        self, allocator_info: ClassInfo, top_info: ClassInfo, sub_info: ClassInfo | None
    ) -> tuple[list[_Finding], list[Evidence], list[Evidence]]:
        from npudoctor import liveoffload, livepools

        try:
            top = self._build_pool(top_info, sub_info)
            allocator = liveoffload.build_allocator(_live_class(allocator_info), top, self.role)
        except livepools.CannotBuild as reason:
            return [self._cannot_build(allocator_info, top_info, sub_info, str(reason))], [], []
        runs, mismatch, snapshot = self._exercise(allocator, top, self._mamba_index(top))
        findings, passed, notes = [], [], []
        for run in runs:
            found, note = self._judge(run)
            findings += found
            notes += note
            if not found:
                passed.append(self._delivered(run))
        if mismatch is not None:
            findings.append(self._mismatch(allocator, mismatch))
        elif not notes and not any(r.error for r in runs):
            passed.append(self._round_trip_ok(allocator, snapshot))
        findings += self._unreached(runs, sub_info)
        findings += self._refused_elsewhere(runs, sub_info)
        return findings, passed, notes

    def _build_pool(self, top: ClassInfo, sub: ClassInfo | None) -> Any:
        from npudoctor import livepools

        if sub is not None:
            return self._build_composite(top, sub)
        return livepools.build_pool(_live_class(top), self.facts.model, self.role)

    def _build_composite(self, top: ClassInfo, sub: ClassInfo) -> Any:
        """The composite pool with the NPU pool below it; only the hybrid linear-attention pool
        (mamba state beside full-attention KV) is built on CPU so far."""
        import inspect

        from npudoctor import liveoffload, livepools

        cls, npu = _live_class(top), _live_class(sub)
        if "mamba_pool" in inspect.signature(cls.__init__).parameters:
            return liveoffload.build_hybrid_linear_pool(cls, npu, self.facts.model, self.role)
        raise livepools.CannotBuild(
            f"{top.name} (holding {sub.name}) needs the model's sliding-window layer split, "
            "which npudoctor does not build on CPU yet"
        )

    def _mamba_index(self, top: Any) -> Any:
        """The request's mamba slot where the pool holds mamba state (hybrid models), else None:
        ``Req.mamba_pool_idx`` is None for every other model."""
        from npudoctor import liveoffload

        return liveoffload.mamba_slot(top)

    # ----- the calls -----------------------------------------------------------------------------
    def _entries(self, mamba_index: Any) -> list[_Entry]:
        """The scheduler's calls into the allocator, from the installed source, one per distinct
        keyword set; the values are what a decode server's ``Req`` holds there."""
        entries, seen = [], set()
        for site in self.graph.sites:
            if site.family != ALLOCATOR:
                continue
            key = (site.method, site.shape.keywords)
            if key in seen:
                continue
            seen.add(key)
            values, notes, unexercised = {}, [], ""
            expected = _POSITIONAL[site.method]
            if site.shape.star_args or site.shape.positional != expected:
                unexercised = (
                    f"{site.describe()} passes {site.shape.describe()}; npudoctor makes this call with "
                    f"{expected} positional argument{'s' if expected > 1 else ''} (indices"
                    f"{', preceded by the offloaded copy' if expected > 1 else ''})"
                )
            for keyword in site.scoped.call.keywords:
                if keyword.arg is None:
                    notes.append(f"{site.where()} also spreads **{ast.unparse(keyword.value)}: not exercised")
                    continue
                values[keyword.arg], note = _keyword_value(
                    keyword.arg, ast.unparse(keyword.value), mamba_index
                )
                notes += [note] if note else []
            entries.append(_Entry(site, values, notes, unexercised))
        return entries

    def _exercise(self, allocator: Any, top: Any, mamba_index: Any) -> tuple[list[_Run], str | None, Any]:
        """The scheduler's get_cpu_copy, the slots overwritten, its load_cpu_copy; per keyword set."""
        import torch

        from npudoctor import liveoffload

        page = top.page_size
        slots = torch.tensor([p * page + (o if o >= 0 else page + o) for p, o in _SLOTS], dtype=torch.int64)
        slots = slots[(slots > 0) & (slots < top.size)]
        entries = self._entries(mamba_index)
        gets = [e for e in entries if e.method == "get_cpu_copy"]
        loads = [e for e in entries if e.method == "load_cpu_copy"]
        runs: list[_Run] = []
        mismatch, snapshot = None, None
        for index in range(max(len(gets), len(loads))):
            snapshot = liveoffload.SlotSnapshot.take(allocator, slots, mamba_index, seed=index)
            saved = None
            if gets:
                get = _call(allocator, gets[index % len(gets)], (slots,))
                runs.append(get)
                saved = liveoffload.host_copy(get.result)
                if get.error is not None:
                    saved, note = _payload_without_keywords(top, slots)
                    get.payload_note = note
            snapshot.scramble(allocator)
            if loads:
                load = _call(allocator, loads[index % len(loads)], (saved, slots))
                runs.append(load)
                if load.error is None and not any(r.error for r in runs) and mismatch is None:
                    mismatch = snapshot.mismatch(allocator)
        return runs, mismatch, snapshot

    # ----- judging what happened ------------------------------------------------------------------
    def _judge(self, run: _Run) -> tuple[list[_Finding], list[Evidence]]:
        from npudoctor import liveoffload

        findings = [self._refused(run, c) for c in run.calls if c.bind_error]
        binding, keyword = liveoffload.binding_keyword(run.error) if run.error else (False, None)
        if binding and not findings:  # refused by a call the recorder does not see (a super() hand-over)
            findings.append(self._refused_unrecorded(run, keyword))
        findings += self._drops(run)
        if run.entry.unexercised:
            evidence = Evidence(
                f"{run.entry.method} called the way the installed scheduler calls it",
                f"{run.entry.unexercised}: the live call differs from the installed one{_LIVE}",
                run.entry.location(),
            )
            findings.append(_Finding(Status.WARN, evidence, run.entry.method, "caller shape not recognised"))
        notes = []
        if run.error is not None and not binding:
            notes.append(self._copy_raised(run))
        return findings, notes

    def _refused(self, run: _Run, call) -> _Finding:
        from npudoctor import liveoffload

        refused = [k for k in call.keywords if not liveoffload.accepts(call.function, k)]
        error = str(run.error) if run.error is not None else call.bind_error
        caller = call.caller or run.entry.location()
        by = f"{caller.path}:{caller.line} ({caller.symbol})" if call.caller else run.entry.describe()
        where = call.location()
        observed = (
            f"{by} calls {call.resolved} "
            + (
                f"({where.path}:{where.line}: def {liveoffload.signature_of(call.function)}) "
                if where
                else ""
            )
            + f"with {call.received()} -> TypeError: {error}; raised at {caller.path}:{caller.line}"
            + run.payload_note
            + _LIVE
        )
        expected = f"{call.resolved} accepts what its caller passes" + (
            f", including {', '.join(k + '=' for k in refused)}" if refused else ""
        )
        kind = f"TypeError ({', '.join(k + '=' for k in refused)})" if refused else "TypeError"
        return _Finding(Status.FAIL, Evidence(expected, observed, caller), call.owner.__name__, kind)

    def _refused_unrecorded(self, run: _Run, keyword: str | None) -> _Finding:
        from npudoctor import liveoffload

        where = liveoffload.raising_location(run.error) or run.entry.location()
        last = run.calls[-1] if run.calls else None
        subject = last.owner.__name__ if last else run.entry.method
        observed = (
            f"{run.entry.describe()}; {where.path}:{where.line} ({where.symbol}) raised "
            f"TypeError: {run.error}{_LIVE}"
        )
        expected = f"every {run.entry.method} on the chain accepts the keywords passed down to it"
        kind = f"TypeError ({keyword}=)" if keyword else "TypeError"
        return _Finding(Status.FAIL, Evidence(expected, observed, where), subject, kind)

    def _drops(self, run: _Run) -> list[_Finding]:
        """Keywords a level received and neither used nor passed on, while the next level accepts them."""
        from npudoctor import liveoffload

        findings = []
        for call in run.calls:
            if call.parent is None or call.bind_error:
                continue
            parent = run.calls[call.parent]
            for keyword in parent.keywords:
                if keyword in call.keywords or not liveoffload.accepts(call.function, keyword):
                    continue
                if liveoffload.reads(parent.function, keyword) is not False:
                    continue  # the parent consumes it itself (a composite), or its source is unreadable
                findings.append(self._drop(run, parent, call, keyword))
        return findings

    def _drop(self, run: _Run, parent, call, keyword: str) -> _Finding:
        from npudoctor import liveoffload

        used = liveoffload.reads(call.function, keyword)
        status = Status.FAIL if used else Status.WARN
        where = call.caller or parent.location()
        why = (
            f"{call.resolved} reads {keyword}, so what it copies changes"
            if used
            else f"{call.resolved} accepts {keyword} and ignores it today"
        )
        observed = (
            f"{parent.resolved} received {parent.received()} ({run.entry.site.where()}), never reads "
            f"{keyword}, and at {where.path}:{where.line} called {call.resolved} with {call.received()}: "
            f"{keyword}= dropped; {why}{_LIVE}"
        )
        evidence = Evidence(f"{parent.resolved} passes {keyword}= on to {call.resolved}", observed, where)
        note = "" if used else "the next level ignores it today"
        return _Finding(status, evidence, parent.owner.__name__, f"drops {keyword}=", note)

    def _copy_raised(self, run: _Run) -> Evidence:
        from npudoctor import liveoffload

        where = liveoffload.raising_location(run.error)
        levels = "; ".join(f"{c.resolved} received {c.received()}" for c in run.calls)
        observed = (
            f"{run.entry.describe()}; every level bound its call ({levels}), then the copy itself raised "
            f"{type(run.error).__name__}: {run.error}"
            + (f" at {where.path}:{where.line}" if where else "")
            + run.payload_note
            + ": the CPU round trip is NPD001's property, not a signature defect"
            + _LIVE
        )
        return Evidence(
            f"{run.entry.method} through the real chain with the installed callers' keywords", observed, where
        )

    def _delivered(self, run: _Run) -> Evidence:
        levels = "; ".join(
            f"{c.resolved}"
            + (f" ({c.location().path}:{c.location().line})" if c.location() else "")
            + f" received {c.received()}"
            for c in run.calls
        )
        notes = "".join(f"; {n}" for n in run.entry.notes)
        return Evidence(
            expected=f"{run.entry.method}: every level receives the keywords its caller passes",
            observed=f"{run.entry.describe()}; delivered at each level: {levels}{notes}{_LIVE}",
            location=run.entry.location(),
        )

    def _round_trip_ok(self, allocator: Any, snapshot: Any) -> Evidence:
        name = type(allocator).__name__
        mamba = f" and mamba slot {int(snapshot.mamba_slot)}" if snapshot.mamba_slot is not None else ""
        return Evidence(
            expected=f"{name}: the offloaded token slots come back after get_cpu_copy/load_cpu_copy",
            observed=(
                f"{len(snapshot.slots)} token slots{mamba} of {snapshot.buffers} buffer(s), every layer, "
                f"offloaded, overwritten and reloaded through {name}: every bit came back{_LIVE}"
            ),
        )

    def _mismatch(self, allocator: Any, mismatch: str) -> _Finding:
        name = type(allocator).__name__
        evidence = Evidence(
            expected=f"{name}: the offloaded token slots come back after get_cpu_copy/load_cpu_copy",
            observed=f"every call bound, but {mismatch}: the chain returns without copying what it was asked{_LIVE}",
        )
        return _Finding(Status.WARN, evidence, name, "slots do not come back")

    def _unreached(self, runs: list[_Run], sub: ClassInfo | None) -> list[_Finding]:
        """A composite's sub-pool the chain never reached, although no level raised: its keywords are
        unverified. (A level that raised, e.g. a composite without offload support, is reported.)"""
        if sub is None or any(c.owner.__name__ == sub.name for r in runs for c in r.calls):
            return []
        if any(r.error is not None for r in runs):
            return []
        evidence = Evidence(
            expected=f"the offload calls reach {sub.name} below the composite pool",
            observed=f"no call reached {sub.name}: its keywords could not be verified{_LIVE}",
        )
        return [_Finding(Status.WARN, evidence, sub.name, "not reached")]

    def _refused_elsewhere(self, runs: list[_Run], sub: ClassInfo | None) -> list[_Finding]:
        """The NPU pool below a composite is called by the composite, without keywords, so it binds
        here; but it is an allocator's pool elsewhere, and the allocator passes keywords. Bind
        those to its real signature too: where they do not bind, it is a ``warn`` (a class this
        deployment builds, refusing calls this deployment does not make), as the static depth says."""
        from npudoctor import liveoffload

        if sub is None:
            return []
        findings = []
        for run in runs:
            handed = [c for c in run.calls if c.parent is not None and run.calls[c.parent].parent is None]
            below = [c for c in run.calls if c.owner.__name__ == sub.name]
            if not handed or not below:
                continue
            top, call = handed[0], below[0]
            refused = [k for k in top.keywords if not liveoffload.accepts(call.function, k)]
            if not refused:
                continue
            where, by = call.location(), top.caller
            observed = (
                f"{call.resolved} ({where.path}:{where.line}: def {liveoffload.signature_of(call.function)}) "
                f"has no {', '.join(k + '=' for k in refused)}, which {by.path}:{by.line} ({by.symbol}) "
                f"passes to the pool an allocator holds; here {top.qualname} holds it and called it with "
                f"{call.received()}, so this deployment's retraction binds{_LIVE}"
                if where and by
                else f"{call.resolved} has no {', '.join(k + '=' for k in refused)}{_LIVE}"
            )
            evidence = Evidence(
                f"{call.resolved} accepts the keywords allocators pass to their pool", observed, where
            )
            findings.append(
                _Finding(
                    Status.WARN,
                    evidence,
                    sub.name,
                    f"TypeError ({', '.join(k + '=' for k in refused)})",
                    "not on the calls this deployment makes",
                )
            )
        return findings[:1] + [f for f in findings[1:] if f.kind != findings[0].kind]

    def _cannot_build(
        self, allocator: ClassInfo, top: ClassInfo, sub: ClassInfo | None, reason: str
    ) -> _Finding:
        chain = " -> ".join(c.name for c in (allocator, top, sub) if c is not None)
        evidence = Evidence(
            expected=f"{chain} built on CPU with this deployment's dimensions",
            observed=f"cannot build it: {reason}; its keywords are not verified live",
            location=Location(top.relpath, top.line, top.name),
        )
        return _Finding(Status.WARN, evidence, top.name, "not built on CPU")


def _live_class(info: ClassInfo) -> type:
    """The loaded class the static graph names (its module was imported by ``live_imports``)."""
    import sys

    from npudoctor.livepools import CannotBuild

    module = sys.modules.get(info.module)
    cls = getattr(module, info.name, None) if module is not None else None
    if not isinstance(cls, type):
        raise CannotBuild(f"{info.name} is not loaded from {info.module}")
    return cls


def _call(allocator: Any, entry: _Entry, positional: tuple) -> _Run:
    """``allocator.<method>(*positional, **entry.values)`` with every level recorded."""
    from npudoctor import liveoffload

    run = _Run(entry, [])
    with liveoffload.recording(allocator) as calls:
        try:
            run.result = getattr(allocator, entry.method)(*positional, **entry.values)
        except Exception as error:  # the evidence: what the first retraction would raise
            run.error = error
    run.calls = list(calls)
    return run


def _payload_without_keywords(pool: Any, slots: Any) -> tuple[Any, str]:
    """A payload for load_cpu_copy when the chain's get_cpu_copy raised: the pool's own copy of the
    slots, called as the allocator's oldest callers did (no keywords)."""
    try:
        return pool.get_cpu_copy(slots), (
            f"; load_cpu_copy's payload came from {type(pool).__name__}.get_cpu_copy(indices) without keywords"
        )
    except Exception as error:
        return None, (
            f"; load_cpu_copy ran with no payload ({type(pool).__name__}.get_cpu_copy raised "
            f"{type(error).__name__} without keywords too)"
        )


def _keyword_value(name: str, expression: str, mamba_index: Any) -> tuple[Any, str]:
    """The value a decode server passes for ``name=<expression>``: the request's mamba slot
    (None unless the model has mamba state), its row in the request-to-token pool (0 here), or
    None for a keyword npudoctor has no value for (said in the evidence)."""
    text = f"{name} {expression}".lower()
    if "mamba" in text:
        return mamba_index, ""
    if "req_pool" in text:
        return 0, ""
    return None, f"{name}={expression}: no value known to npudoctor, passed None"


CHECK = OffloadSignatures()
