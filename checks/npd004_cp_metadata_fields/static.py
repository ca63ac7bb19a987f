"""NPD004's static probe: walk the FIA context-parallel attention path of the target's source
with ``ast`` and test every CP metadata read and every split of the query on it (sglang#26705
renamed the CP metadata's per-request lengths; an NPU reader left on the old names raises
``AttributeError`` at the first CP prefill).

``MetadataModel`` finds the CP metadata classes of the tree and the batch fields that hold them;
``CPPath`` is the visitor ``npudoctor.static.walker.PathWalker`` runs from each entry along the
calls that pass the batch or the metadata (methods on ``self``, functions by name, methods on
objects of declared types and their subclasses), at most ``MAX_DEPTH`` calls deep and
``MAX_FUNCTIONS`` functions per entry; ``_judge`` fails a read that no reaching metadata class
defines, and a fixed midpoint split of q where the metadata describes several requests and no
admission gate limits a CP batch to one, and warns where a call on the path cannot be followed.

The whole NPU CP prefill path is checked, not one function: ``npu_readers`` finds every NPU
function that reads CP metadata or asks for the CP strategy (the entries are those no other
reader calls); ``PathScope`` says which of them the deployment runs (attention family by the
reader's name, and through ``walker.Branches``: ``self.use_mla`` tests, ``enable_*`` switches the
role does not set, tests that are false on NPU) and which CP strategy its virtual calls go to;
``deployed_metadata`` decides which metadata class the batch holds (the strategy's under CP-v2,
else the model-level one), so a read is checked against what the deployment's preparation really
stores; a call on the path into a function that always raises (``walker.AlwaysRaises``: a strategy
step that only raises ``NotImplementedError``, a helper left as a stub that calls one that only
raises) fails, naming the call and the ``raise``.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from npudoctor.deployment.facts import RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.classdefs import instance_names
from npudoctor.static.dataflow import (
    aliases,
    annotation_classes,
    annotation_names,
    bind_arguments,
    called_name,
    functions_named,
    return_classes,
    subclasses,
)
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import (
    AlwaysRaises,
    Branches,
    CallResolver,
    Frame,
    PathWalker,
    RaiseSite,
    method_on,
)

# The legacy --prefill-cp-mode values and the CP strategies they select
# (0.5.15 server_args.ServerArgs._handle_legacy_cp_arguments).
LEGACY_CP_MODES = {"in-seq-split": "zigzag", "round-robin-split": "interleave"}


def cp_strategy_name(role: RoleFacts) -> str:
    """The CP strategy the role selects: ``cp_strategy``, or the legacy ``prefill_cp_mode``."""
    chosen = role.server_args.get("cp_strategy")
    if chosen:
        return str(chosen)
    return LEGACY_CP_MODES.get(str(role.server_args.get("prefill_cp_mode") or "in-seq-split"), "zigzag")


# CP metadata classes are found by this name suffix, then by inheritance.
METADATA_SUFFIX = "ContextParallelMetadata"
# The batch field that holds the CP metadata; used as-is when no declaration is found.
DEFAULT_FIELD = "attn_cp_metadata"
# CP admission gates that may limit a CP batch to one request.
BATCH_GATES = ("can_cp_split",)
# Fields that make the metadata describe several requests: a batch size, per-request length lists.
PER_REQUEST_FIELD = re.compile(r"^(bs|batch_size)$|^\w*(len|seq)\w*_list$")
QUERY_PARAMETERS = ("q", "query")
SPLIT_FUNCTIONS = ("chunk", "tensor_split")
MAX_DEPTH = 6  # calls followed from an entry
MAX_FUNCTIONS = 96  # functions visited per entry

_SUFFIX = METADATA_SUFFIX.encode()
# Cheap byte filters before parsing: a file that declares a metadata class, or a field typed with one.
_DECLARES_METADATA_CLASS = re.compile(rb"class\s+\w*" + _SUFFIX + rb"\b|class\s+\w+\s*\([^)]*" + _SUFFIX)
_DECLARES_METADATA_FIELD = re.compile(rb"^[ \t]+\w+[ \t]*:[^\n=]*" + _SUFFIX, re.M)

Classes = tuple[ClassInfo, ...]
# What an expression of one function holds: the metadata classes it can be, or None.
ValueOf = Callable[[ast.expr, dict[str, object]], Classes | None]


def probe(
    tree: SourceTree,
    entries: list[FunctionRef],
    roles: tuple[str, ...],
    assumptions: tuple[str, ...],
    path: PathScope | None = None,
) -> Probe:
    """Walk the CP path of every entry and test every metadata read and query split on it."""
    path = path or PathScope()
    metadata = MetadataModel.find(tree)
    if not metadata.classes:
        first = entries[0]
        return Probe(
            Status.WARN,
            f"cannot tell: {first.qualname} exists but no CP metadata class was found in this tree",
            (
                Evidence(
                    expected=f"a class named *{METADATA_SUFFIX} (or a subclass of one) that "
                    f"{first.qualname} reads its CP layout from",
                    observed="none found under sglang/: this release's layout is not one npudoctor recognises",
                    location=Location(first.relpath, first.line, first.qualname),
                ),
            ),
            assumptions,
            roles,
        )

    evidence: list[Evidence] = []
    statuses: list[Status] = []
    seen: set[tuple] = set()  # functions walked from an earlier entry are not walked again
    keys: set[tuple] = set()
    raises: list[Raise] = []
    deployed, note = deployed_metadata(tree, metadata, path)
    if note:
        assumptions = (*assumptions, note)
    for entry in entries:
        walk = CPPath(
            tree,
            metadata,
            CallResolver(tree, strategy=path.strategy),
            Branches(
                mla=None if path.family is None else path.family in (MLA, MLA_INDEXER),
                server_args=path.server_args,
            ),
            excluded=path.excluded,
            deployed=deployed,
        )
        walk.walk(entry, seen)
        raises.extend(walk.raises)
        status, found = _judge(tree, metadata, entry, walk)
        statuses.append(status)
        for item in found:  # a read reached from several entries is one finding
            key = (item.location, item.expected)
            if item.location is None or key not in keys:
                keys.add(key)
                evidence.append(item)
    evidence.extend(metadata.notes)

    if Status.FAIL in statuses:
        status = Status.FAIL
        missing = sorted({_field_of(e) for e in evidence if _field_of(e)})
        parts = []
        if missing:
            parts.append(
                f"reads CP metadata fields no metadata class that reaches it defines ({', '.join(missing)}): "
                "AttributeError at the first CP prefill"
            )
        if any(e.expected.startswith(_SPLIT_EXPECTED) for e in evidence):
            parts.append("splits q at a fixed midpoint: wrong attention for a batch of several requests")
        if any(e.expected.startswith(_RAISE_EXPECTED) for e in evidence):
            parts.append(
                f"runs a step the {path.strategy or 'selected'} CP strategy does not implement "
                "(raises NotImplementedError at the first CP prefill)"
            )
        parts.extend(
            dict.fromkeys(raise_summary(r) for r in outermost_raises(raises) if not r.not_implemented)
        )
        summary = f"the NPU context-parallel prefill path ({path.label}) " + "; ".join(parts)
    elif Status.WARN in statuses:
        status = Status.WARN
        summary = f"cannot tell whether the NPU context-parallel prefill path ({path.label}) reads only defined metadata fields"
    else:
        status = Status.PASS
        summary = f"the NPU context-parallel prefill path ({path.label}) reads only fields its CP metadata classes define"
    return Probe(status, summary, tuple(evidence), assumptions, roles)


# ----- which readers run for the deployment --------------------------------------------------
# Attention families of a deployment, as npudoctor.deployment.facts.AttentionKind names them (MHA and GQA share one path).
MHA, MLA, MLA_INDEXER = "mha", "mla", "mla+indexer"
FAMILIES = (MHA, MLA, MLA_INDEXER)
# NPU files: the readers of CP metadata on the Ascend prefill path live there.
NPU_PATH = re.compile(r"(?i)npu|ascend")
# What a reader's name (qualified name and file) says it serves: DeepSeek-V4's own backend; the FIA
# (non-MLA) CP attention; the DSA/NSA sparse attention and its indexer (MLA with an indexer).
OTHER_MODEL = re.compile(r"(?i)dsv4|deepseekv4")
MHA_ONLY = ("do_cp_attn_fia",)
INDEXER_ONLY = re.compile(r"(?i)dsa|nsa|indexer|sparse|sparsity|balance")
# What makes a function a reader: it names a metadata field or asks for the CP strategy.
_READER_NEEDLES = ("get_cp_strategy",)


def reader_families(ref: FunctionRef) -> frozenset[str]:
    """The attention families whose CP prefill runs ``ref`` (by what its name and file say)."""
    text = f"{ref.relpath} {ref.qualname}"
    if OTHER_MODEL.search(text):
        return frozenset({"dsv4"})
    if ref.name in MHA_ONLY:
        return frozenset({MHA})
    if INDEXER_ONLY.search(text):
        return frozenset({MLA_INDEXER})
    return frozenset(FAMILIES)


def npu_readers(tree: SourceTree) -> list[FunctionRef]:
    """Every NPU function (module-level or method) that names a CP metadata field of the batch or
    asks for the CP strategy: the entries of the NPU CP prefill path (attention backend CP
    functions, the KV all-gather/save helper, the MLA/DSA CP code, the NPU indexer)."""
    from npudoctor.static.dataflow import functions_in

    metadata = MetadataModel.find(tree)
    needles = (
        tuple(metadata.fields) + _READER_NEEDLES if metadata.classes else (DEFAULT_FIELD, *_READER_NEEDLES)
    )
    found: list[FunctionRef] = []
    for path in tree.files_containing("cp", under="srt"):
        if not NPU_PATH.search(tree.relpath(path)):
            continue
        text = tree.read(path)
        if not any(n.encode() in text for n in needles):
            continue
        for ref in functions_in(tree, path):
            if ref.outer is not None:
                continue
            names = (
                {n.attr for n in ast.walk(ref.node) if isinstance(n, ast.Attribute)}
                | {n.id for n in ast.walk(ref.node) if isinstance(n, ast.Name)}
                | {
                    n.value
                    for n in ast.walk(ref.node)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
            )
            if any(n in names for n in needles):
                found.append(ref)
    # a reader another reader calls is reached through that call, under the tests around it (which
    # decide whether the deployment takes it); the readers nothing here calls are the entries
    called = {called_name(node) for ref in found for node in ast.walk(ref.node) if isinstance(node, ast.Call)}
    return [ref for ref in found if ref.name not in called]


@dataclass
class PathScope:
    """What part of the NPU CP path a deployment runs: its attention family, its CP strategy and
    its server arguments (None: not described, follow everything)."""

    family: str | None = None
    strategy: str | None = None
    server_args: dict[str, object] | None = None
    architectures: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        family = {MHA: "MHA/GQA with FIA", MLA: "MLA", MLA_INDEXER: "MLA with the DSA/NSA indexer"}.get(
            self.family or "", "every attention family"
        )
        return f"{family}, {self.strategy} strategy" if self.strategy else family

    @property
    def runs_fia(self) -> bool:
        """The family runs the FIA (non-MLA) CP attention."""
        return self.family in (None, MHA)

    def runs(self, ref: FunctionRef) -> bool:
        families = reader_families(ref)
        return self.family is None or self.family in families

    def excluded(self, ref: FunctionRef) -> bool:
        return not self.runs(ref)


# sglang's list of model classes that run the CP-v2 (strategy) preparation by default (0.5.14-0.5.19),
# and the switch that turns it on for every model.
CP_V2_MODELS = "CP_V2_DEFAULT_MODEL_CLASSES"
CP_V2_SWITCH = "SGLANG_ENABLE_CP_V2"


def deployed_metadata(
    tree: SourceTree, metadata: MetadataModel, path: PathScope
) -> tuple[set[ClassInfo], str]:
    """The metadata classes the deployment's CP preparation builds, and how that was decided.
    The strategy classes (``ZigzagCPStrategy``...) build their own metadata class; a release that
    still has the model-level preparation runs it for models outside ``CP_V2_DEFAULT_MODEL_CLASSES``
    (unless ``SGLANG_ENABLE_CP_V2`` is set), and that one builds the classes no strategy builds."""
    if not path.strategy or not metadata.classes:
        return set(), ""
    strategies = [
        c
        for path_ in tree.files_containing("Strategy", under="srt")
        if b"class " in tree.read(path_) and b"Strategy" in tree.read(path_)
        for c in tree.classes_in(path_)
        if c.name.endswith("Strategy") and any(m in c.methods for m in ("build_metadata", "run_attention"))
    ]
    if not strategies:
        return set(), ""
    built = {c.name: built_metadata(tree, metadata, c) for c in strategies}
    chosen = [c for c in strategies if c.name.lower().startswith(path.strategy.lower())]
    by_strategy: set[ClassInfo] = set().union(*built.values()) if built else set()
    legacy = {c for c in metadata.classes if c not in by_strategy and c.name == METADATA_SUFFIX}
    listed, where = cp_v2_models(tree)
    v2 = True
    reason = ""
    if listed is not None and legacy:
        switch = path.env.get(CP_V2_SWITCH)
        switched = switch is not None and str(switch).lower() in ("1", "true", "yes", "on")
        v2 = switched if switch is not None else any(a in listed for a in path.architectures)
        reason = (
            f"{CP_V2_SWITCH}={switch}"
            if switch is not None
            else f"{'/'.join(path.architectures) or 'the model'} is {'' if v2 else 'not '}in {CP_V2_MODELS} ({where})"
        )
    if not v2:
        return legacy, f"static: the CP metadata is the model-level {METADATA_SUFFIX} ({reason})"
    classes = set().union(*(built[c.name] for c in chosen)) if chosen else set()
    if not classes:
        return set(), ""
    names = ", ".join(sorted(c.name for c in classes))
    return classes, (
        f"static: the {path.strategy} CP strategy builds {names}; reads of the batch's CP metadata are "
        f"checked against {'it' if len(classes) == 1 else 'them'}" + (f" ({reason})" if reason else "")
    )


def cp_v2_models(tree: SourceTree) -> tuple[set[str] | None, str]:
    for path in tree.files_containing(CP_V2_MODELS, under="srt"):
        module = tree.parse(path)
        if module is None:
            continue
        for stmt in module.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == CP_V2_MODELS for t in stmt.targets
            ):
                names = {
                    n.value
                    for n in ast.walk(stmt.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
                return names, f"{tree.relpath(path)}:{stmt.lineno}"
    return None, ""


# ----- metadata classes ------------------------------------------------------------------
@dataclass
class MetadataModel:
    """The CP metadata classes of a tree and the fields that can hold them."""

    tree: SourceTree
    classes: list[ClassInfo]
    fields: dict[str, Classes]  # field name -> classes that can be stored in it
    declarations: dict[str, list[str]]  # field name -> "Owner.field (path:line)"
    owners: set[str]  # snake_case names of the classes declaring the fields (forward_batch)
    notes: list[Evidence] = field(default_factory=list)

    @classmethod
    def find(cls, tree: SourceTree) -> MetadataModel:
        files = tree.files_containing(METADATA_SUFFIX)
        named = [
            klass
            for path in files
            if _DECLARES_METADATA_CLASS.search(tree.read(path))
            for klass in tree.classes_in(path)
            if klass.name.endswith(METADATA_SUFFIX)
        ]
        classes = list(named)
        for klass in named:
            classes.extend(c for c in subclasses(tree, klass) if c not in classes)
        model = cls(tree, classes, {}, {}, set())
        if not classes:
            return model
        names = {c.name for c in classes}
        for path in files:
            if not _DECLARES_METADATA_FIELD.search(tree.read(path)):
                continue
            for owner in tree.classes_in(path):
                for stmt in owner.node.body:
                    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                        continue
                    mentioned = [n.rpartition(".")[2] for n in annotation_names(stmt.annotation)]
                    if not any(n.endswith(METADATA_SUFFIX) or n in names for n in mentioned):
                        continue
                    declared = [c for c in annotation_classes(tree, path, stmt.annotation) if c in classes]
                    if not declared:
                        continue
                    name = stmt.target.id
                    reach = list(model.fields.get(name, ()))
                    for klass in declared:
                        reach.extend(c for c in (klass, *subclasses(tree, klass)) if c not in reach)
                    model.fields[name] = tuple(reach)
                    model.declarations.setdefault(name, []).append(
                        f"{owner.name}.{name}: {ast.unparse(stmt.annotation)} ({tree.relpath(path)}:{stmt.lineno})"
                    )
                    model.owners.add(_snake(owner.name))
        if DEFAULT_FIELD not in model.fields:
            model.fields[DEFAULT_FIELD] = tuple(classes)
            model.notes.append(
                Evidence(
                    expected=f"a declared type for the batch field {DEFAULT_FIELD}",
                    observed=f"no class-body annotation of {DEFAULT_FIELD} naming a CP metadata class: "
                    f"checked its reads against every CP metadata class in the tree "
                    f"({', '.join(c.name for c in classes)})",
                )
            )
        if not model.owners:
            model.owners.add("forward_batch")
        return model

    def attributes(self, klass: ClassInfo) -> set[str]:
        return instance_names(self.tree, klass)

    def defines(self, classes: Classes, name: str) -> bool:
        return any(name in self.attributes(c) for c in classes)

    def per_request_fields(self, classes: Classes) -> list[str]:
        names: set[str] = set()
        for klass in classes:
            names |= {n for n in self.attributes(klass) if PER_REQUEST_FIELD.match(n)}
        return sorted(names)


# ----- the path walk ---------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    function: FunctionRef
    line: int
    text: str  # e.g. "cp_meta.kv_len_prev"
    attr: str
    classes: Classes


@dataclass(frozen=True)
class Split:
    function: FunctionRef
    line: int
    text: str


@dataclass(frozen=True)
class Raise:
    """A call on the path into a function that always raises (``walker.AlwaysRaises``: its body,
    or a function it always calls, ends in a ``raise`` on every path): a strategy that does not
    implement a step of the path, or a helper a release left as a stub that only raises. The first
    CP prefill raises there. ``site`` is the callee and the calls down to the ``raise``; ``caller``
    is the function on the path that makes the call, at ``call_line``."""

    site: RaiseSite
    caller: FunctionRef
    call_line: int
    call: str  # the called expression, e.g. "cp_strategy.materialize_full_kv"

    @property
    def call_site(self) -> str:
        return f"{self.call}(...) at {self.caller.where(self.call_line)}"

    @property
    def function(self) -> FunctionRef:
        return self.site.chain[0][0]

    @property
    def raising(self) -> FunctionRef:
        return self.site.function

    @property
    def line(self) -> int:
        return self.site.line

    @property
    def text(self) -> str:
        return self.site.text

    @property
    def not_implemented(self) -> bool:
        """A step its class does not implement: ``raise NotImplementedError`` in the callee itself."""
        return len(self.site.chain) == 1 and "NotImplementedError" in self.site.text


@dataclass
class CPPath:
    """What one entry's CP path does with the metadata and the query, recorded by ``visit`` as
    ``PathWalker`` walks the calls that pass the batch or the metadata on."""

    tree: SourceTree
    metadata: MetadataModel
    resolver: CallResolver
    branches: Branches
    # functions not followed: readers that serve another attention family than the deployment's
    excluded: Callable[[FunctionRef], bool] = lambda ref: False
    # the metadata classes the deployment's preparation builds (its CP strategy's, or the legacy
    # one): reads outside a strategy class are checked against these; empty: every reaching class
    deployed: set[ClassInfo] = field(default_factory=set)
    reads: list[Read] = field(default_factory=list)
    splits: list[Split] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)
    delegations: list[str] = field(default_factory=list)
    raises: list[Raise] = field(default_factory=list)
    # whether a callee always raises (transitively), with the same call resolution as the walk
    always_raises: AlwaysRaises | None = None

    def __post_init__(self) -> None:
        if self.always_raises is None:
            self.always_raises = AlwaysRaises(self.resolver)

    def walk(self, entry: FunctionRef, seen: set[tuple]) -> None:
        walker = PathWalker(self.visit, max_depth=MAX_DEPTH, max_functions=MAX_FUNCTIONS, seen=seen)
        walker.walk(_frame(entry, entry.owner, {}, frozenset()))

    def visit(self, frame: Frame) -> Iterator[Frame]:
        """Record what the function reads and stores on the metadata and how it splits the query;
        yield the functions its calls pass the batch or the metadata to, with what they receive."""
        ref, self_cls = frame.function, frame.self_cls
        seeds, carriers = frame.state
        value_of = self._metadata_values(built_metadata(self.tree, self.metadata, self_cls), self.deployed)
        seeds = self._declared_seeds(ref, seeds)
        carriers = self._carriers(ref, carriers)
        known = aliases(ref.node, seeds, value_of)
        guarded = self._getattr_reads(ref, known, value_of)
        self._attribute_reads(ref, known, value_of, guarded)
        self.splits.extend(_query_splits(ref))
        for callee, callee_self, callee_seeds, callee_carriers in self._calls(
            ref, self_cls, known, carriers, value_of
        ):
            yield _frame(callee, callee_self, callee_seeds, callee_carriers)

    def _declared_seeds(self, ref: FunctionRef, seeds: dict[str, Classes]) -> dict[str, Classes]:
        """``seeds`` and the parameters annotated with a metadata class (it and its subclasses)."""
        tree, metadata = self.tree, self.metadata
        seeds = dict(seeds)
        for param in ref.parameters:
            declared = tuple(
                c for c in annotation_classes(tree, ref.path, param.annotation) if c in metadata.classes
            )
            if declared and param.arg not in seeds:
                seeds[param.arg] = tuple({c: None for k in declared for c in (k, *subclasses(tree, k))})
        return seeds

    def _carriers(self, ref: FunctionRef, carriers: frozenset[str]) -> set[str]:
        """``carriers`` and the parameters that hold a batch: named after, or annotated with, a class
        that declares a metadata field."""
        metadata = self.metadata
        return set(carriers) | {
            p.arg
            for p in ref.parameters
            if p.arg in metadata.owners
            or any(_snake(n.rpartition(".")[2]) in metadata.owners for n in annotation_names(p.annotation))
        }

    def _metadata_values(self, narrowed: set[ClassInfo], deployed: set[ClassInfo] = frozenset()) -> ValueOf:
        """Which metadata classes an expression holds: a metadata field (``<x>.attn_cp_metadata``,
        ``getattr(<x>, "attn_cp_metadata")``) or a known name; narrowed to the classes a strategy
        builds (``narrowed``) where any of them can be there."""
        metadata = self.metadata

        def narrow(classes: Classes, name: str) -> Classes:
            if narrowed:
                kept = tuple(c for c in classes if c in narrowed)
                if kept:
                    return kept
            if deployed and name == DEFAULT_FIELD:
                # what the deployment's preparation stores there, whatever the field's declaration
                # says (0.5.14-0.5.19 declare the model-level class, CP-v2 stores the strategy's)
                return tuple(sorted(deployed, key=lambda c: c.name))
            return classes

        def value_of(expr: ast.expr, known: dict[str, object]) -> Classes | None:
            if isinstance(expr, ast.Attribute) and expr.attr in metadata.fields:
                return narrow(metadata.fields[expr.attr], expr.attr)
            if isinstance(expr, ast.Name) and expr.id in known:
                return known[expr.id]  # type: ignore[return-value]
            if (
                isinstance(expr, ast.Call)
                and isinstance(expr.func, ast.Name)
                and expr.func.id == "getattr"
                and len(expr.args) >= 2
                and isinstance(expr.args[1], ast.Constant)
                and expr.args[1].value in metadata.fields
            ):
                return narrow(metadata.fields[expr.args[1].value], expr.args[1].value)
            return None

        return value_of

    def _getattr_reads(self, ref: FunctionRef, known: dict[str, object], value_of: ValueOf) -> set[str]:
        """Record ``getattr(<metadata>, "name")`` reads; return the names read only under a guard
        (``hasattr``, ``getattr`` with a default), which are not required."""
        guarded: set[str] = set()
        for node in ast.walk(ref.node):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and value_of(node.args[0], known) is not None
            ):
                if node.func.id == "hasattr" or len(node.args) > 2:
                    guarded.add(node.args[1].value)
                else:
                    self.reads.append(
                        Read(
                            ref,
                            node.lineno,
                            ast.unparse(node),
                            node.args[1].value,
                            value_of(node.args[0], known),
                        )
                    )
        return guarded

    def _attribute_reads(
        self, ref: FunctionRef, known: dict[str, object], value_of: ValueOf, guarded: set[str]
    ) -> None:
        """Record ``<metadata>.name`` reads (not the guarded names) and the names stored on metadata."""
        for node in ast.walk(ref.node):
            if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
                held = value_of(node.value, known)
                if held is None:
                    continue
                if isinstance(node.ctx, ast.Load):
                    if node.attr not in guarded and not self.branches.off_path(ref, node):
                        self.reads.append(Read(ref, node.lineno, ast.unparse(node), node.attr, held))
                else:
                    self.stored.add(node.attr)

    def _calls(
        self,
        ref: FunctionRef,
        self_cls: ClassInfo | None,
        known: dict[str, object],
        carriers: set[str],
        value_of: ValueOf,
    ) -> Iterator[tuple[FunctionRef, ClassInfo | None, dict[str, Classes], frozenset[str]]]:
        """The functions the calls in ``ref`` that pass the metadata or a batch may run; a call
        that cannot be resolved is recorded in ``unresolved``."""
        for node in ast.walk(ref.node):
            if not isinstance(node, ast.Call):
                continue
            passed = [
                a
                for a in [*node.args, *(k.value for k in node.keywords)]
                if value_of(a, known) is not None or (isinstance(a, ast.Name) and a.id in carriers)
            ]
            if not passed:
                continue
            targets = self.resolver.resolve(ref, self_cls, node)
            if targets is None:
                if not self.branches.off_path(ref, node):
                    self.unresolved.append(f"{ast.unparse(node.func)}(...) at {ref.where(node.lineno)}")
                continue
            if self.branches.off_path(ref, node):
                continue
            for callee, callee_self, bound_receiver in targets:
                if self.excluded(callee):
                    self.branches.skipped.append(f"{callee.qualname} ({callee.where()})")
                    continue
                raised = self.always_raises(callee, callee_self)
                if raised is not None:
                    self.raises.append(Raise(raised, ref, node.lineno, ast.unparse(node.func)))
                if callee.owner is not None and callee.owner is not ref.owner:
                    self.delegations.append(f"{ast.unparse(node.func)} -> {callee}")
                callee_seeds, callee_carriers = _received(
                    callee, node, bound_receiver, known, carriers, value_of
                )
                yield callee, callee_self, callee_seeds, callee_carriers


def _frame(
    function: FunctionRef, self_cls: ClassInfo | None, seeds: dict[str, Classes], carriers: frozenset[str]
) -> Frame:
    return Frame(function, self_cls, (seeds, carriers), key=(tuple(sorted(seeds)), carriers))


def built_metadata(tree: SourceTree, metadata: MetadataModel, self_cls: ClassInfo | None) -> set[ClassInfo]:
    """The metadata classes a strategy class builds (any method of its MRO that returns one)."""
    if self_cls is None:
        return set()
    names = {c.name for c in metadata.classes}
    built: set[ClassInfo] = set()
    for name in sorted({m for klass in tree.mro(self_cls) for m in klass.methods}):
        method = method_on(tree, self_cls, name)
        returned = annotation_names(method.node.returns) + [
            ast.unparse(n.value.func)
            for n in ast.walk(method.node)
            if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)
        ]
        if not any(r.rpartition(".")[2] in names for r in returned):
            continue
        for klass in return_classes(method):
            if klass in metadata.classes:
                built |= {klass, *subclasses(tree, klass)}
    return built


def _received(
    callee: FunctionRef,
    call: ast.Call,
    bound_receiver: bool,
    known: dict[str, object],
    carriers: set[str],
    value_of: ValueOf,
) -> tuple[dict[str, Classes], frozenset[str]]:
    """What ``call`` passes ``callee``: its parameters that receive metadata (with the classes),
    and those that receive a batch."""
    binding = bind_arguments(callee, call, bound_receiver)
    callee_seeds = {}
    callee_carriers = set()
    for param, arg in binding.items():
        held = value_of(arg, known)
        if held is not None:
            callee_seeds[param] = held
        elif isinstance(arg, ast.Name) and arg.id in carriers:
            callee_carriers.add(param)
    return callee_seeds, frozenset(callee_carriers)


def _query_splits(ref: FunctionRef) -> list[Split]:
    """Fixed-count splits of the query: ``torch.chunk(q, 2)``, ``q.chunk(2)``, ``q[: q.shape[0] // 2]``."""
    query = {p.arg for p in ref.parameters if p.arg in QUERY_PARAMETERS}
    if not query:
        return []

    def mentions(expr: ast.AST, names: set[str]) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))

    known = aliases(
        ref.node,
        dict.fromkeys(query, True),
        lambda e, k: (
            True if isinstance(e, (ast.Call, ast.Attribute, ast.Subscript)) and mentions(e, set(k)) else None
        ),
    )
    names = set(known)
    found = []
    for node in ast.walk(ref.node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SPLIT_FUNCTIONS
        ):
            receiver = node.func.value
            if isinstance(receiver, ast.Name) and receiver.id in names:  # q.chunk(2)
                count = node.args[0] if node.args else _keyword(node, "chunks", "sections")
            elif (
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in names
            ):  # torch.chunk(q, 2)
                count = node.args[1] if len(node.args) > 1 else _keyword(node, "chunks", "sections")
            else:
                continue
            if isinstance(count, ast.Constant) and isinstance(count.value, int) and count.value >= 2:
                found.append(Split(ref, node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in names
            and isinstance(node.slice, ast.Slice)
        ):
            for bound in (node.slice.lower, node.slice.upper):
                if (
                    isinstance(bound, ast.BinOp)
                    and isinstance(bound.op, ast.FloorDiv)
                    and isinstance(bound.right, ast.Constant)
                    and bound.right.value == 2
                    and mentions(bound.left, names)
                ):
                    found.append(Split(ref, node.lineno, ast.unparse(node)))
    return found


def _keyword(call: ast.Call, *names: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg in names), None)


# ----- verdict ---------------------------------------------------------------------------
_SPLIT_EXPECTED = "q split per request"
_RAISE_EXPECTED = "every step of the CP prefill implemented by the deployment's CP strategy"
_CALL_EXPECTED = "every function the CP prefill path calls to return"


def _judge(
    tree: SourceTree, metadata: MetadataModel, entry: FunctionRef, walk: CPPath
) -> tuple[Status, list[Evidence]]:
    """Status and evidence for one entry's path: FAIL for reads no reaching class defines and for
    a midpoint split of a multi-request batch, WARN where the path could not be fully analysed."""
    evidence: list[Evidence] = []
    failed = uncertain = False
    sites: set[tuple] = set()
    for read in walk.reads:
        site = (read.attr, read.function.path, read.line)
        if site in sites or read.attr in walk.stored or metadata.defines(read.classes, read.attr):
            continue
        sites.add(site)
        external = sorted({b for c in read.classes for b in tree.external_bases(c)})
        at = Location(read.function.relpath, read.line, read.function.qualname)
        if external:
            uncertain = True
            evidence.append(
                Evidence(
                    expected=f"`{read.attr}` defined by {', '.join(c.name for c in read.classes)}",
                    observed=f"{read.function.qualname} reads {read.text} at {read.function.where(read.line)}; "
                    f"those classes do not define it, but they derive from bases outside sglang "
                    f"({', '.join(external)}) that may",
                    location=at,
                )
            )
            continue
        failed = True
        via = "" if read.function is entry else f" (on the CP path of {entry.qualname})"
        evidence.append(
            Evidence(
                expected=f"`{read.attr}` defined by the CP metadata class that reaches {read.function.qualname}: "
                + ", ".join(str(c) for c in read.classes),
                observed=f"{read.function.qualname}{via} reads {read.text} at {read.function.where(read.line)}, "
                f"but no CP metadata class that can reach it defines `{read.attr}`"
                f"{_similar(metadata, read)}: AttributeError at the first CP prefill",
                location=at,
            )
        )

    reaching = tuple({c: None for r in walk.reads for c in r.classes}) or metadata.fields.get(
        DEFAULT_FIELD, ()
    )
    per_request = metadata.per_request_fields(reaching)
    gate, gate_function = _batch_of_one_gate(tree)
    if per_request and gate is None:
        admits = (
            f"{gate_function.qualname} ({gate_function.where()}) does not limit a CP batch to one request"
            if gate_function is not None
            else "no CP admission gate limits a batch to one request"
        )
        for split in walk.splits:
            failed = True
            evidence.append(
                Evidence(
                    expected=f"{_SPLIT_EXPECTED}: the metadata describes several requests "
                    f"({', '.join(per_request)} on {', '.join(c.name for c in reaching)}), so the boundary "
                    "between q's prev and next halves is the sum of the per-request prev lengths",
                    observed=f"{split.function.qualname} splits q with {split.text} at "
                    f"{split.function.where(split.line)}: a fixed midpoint split, right only for a batch of "
                    f"one request; {admits}",
                    location=Location(split.function.relpath, split.line, split.function.qualname),
                )
            )

    for raised in outermost_raises(walk.raises):
        failed = True
        evidence.append(_raise_evidence(raised))
    if walk.unresolved:
        uncertain = True
        evidence.append(
            Evidence(
                expected="every call on the CP path that passes the batch or the CP metadata to be followed",
                observed=f"{entry.qualname}'s CP path passes them to "
                + "; ".join(walk.unresolved[:4])
                + ", which npudoctor cannot resolve: what runs there was not checked",
                location=Location(entry.relpath, entry.line, entry.qualname),
            )
        )
    if failed:
        return Status.FAIL, evidence
    if uncertain:
        return Status.WARN, evidence
    return Status.PASS, [_pass_evidence(entry, walk, per_request, gate)]


def outermost_raises(raises: list[Raise]) -> list[Raise]:
    """One call per ``raise`` reached: the one whose chain is longest (the call on the path that
    first enters code that can only raise, not the calls it makes on the way)."""
    by_site: dict[tuple, Raise] = {}
    for raised in raises:
        key = (id(raised.raising.node), raised.line)
        if key not in by_site or len(raised.site.chain) > len(by_site[key].site.chain):
            by_site[key] = raised
    return list(by_site.values())


def _raise_evidence(raised: Raise) -> Evidence:
    callee, raising = raised.function, raised.raising
    at = Location(raising.relpath, raised.line, raising.qualname)
    if raised.not_implemented:
        return Evidence(
            expected=f"{_RAISE_EXPECTED}: {callee.qualname}, called by {raised.call_site}, "
            "to implement its step of the CP prefill",
            observed=f"{callee.qualname} ({callee.where()}) only does `{raised.text}` "
            f"(at {callee.where(raised.line)}): the first CP prefill on this path raises there",
            location=at,
        )
    return Evidence(
        expected=f"{_CALL_EXPECTED}: {callee.qualname}, called by {raised.caller.qualname} "
        f"({raised.call_site})",
        observed=f"{raised.caller.qualname} calls {callee.qualname} at {raised.caller.where(raised.call_line)}, "
        f"which raises whatever it is passed: {raised.site.path_text()}: the first CP prefill on this path "
        "raises there",
        location=at,
    )


def raise_summary(raised: Raise) -> str:
    """The summary part for one call into code that always raises."""
    exception = re.match(r"raise\s+([\w.]+)", raised.text)
    kind = exception.group(1) if exception else "an exception"
    return (
        f"{raised.caller.qualname} calls {raised.function.qualname} ({raised.caller.where(raised.call_line)}), "
        f"which always raises {kind} ({raised.raising.qualname}, {raised.raising.where(raised.line)}): "
        "the first CP prefill raises there"
    )


def _similar(metadata: MetadataModel, read: Read) -> str:
    defined = sorted(set().union(*(metadata.attributes(c) for c in read.classes)))
    near = [n for n in defined if n.startswith(read.attr)] or difflib.get_close_matches(
        read.attr, defined, n=4
    )
    return f" (it has {', '.join(near)})" if near else ""


def _pass_evidence(
    entry: FunctionRef, walk: CPPath, per_request: list[str], gate: Location | None
) -> Evidence:
    by_function: dict[int, tuple[FunctionRef, dict[str, Read]]] = {id(entry.node): (entry, {})}
    for read in walk.reads:
        _, reads = by_function.setdefault(id(read.function.node), (read.function, {}))
        reads.setdefault(read.text, read)
    parts = []
    for function, reads in by_function.values():
        if reads:
            listed = ", ".join(f"{r.text} ({function.relpath}:{r.line})" for r in reads.values())
            parts.append(f"{function} reads {listed}")
        elif function is entry:
            parts.append(f"{entry} reads no CP metadata field itself")
    delegations = list(dict.fromkeys(walk.delegations))
    if delegations:
        parts.insert(1, f"it calls {'; '.join(delegations[:4])}")
    observed = "; ".join(parts)
    classes = tuple({c: None for r in walk.reads for c in r.classes})
    if classes:
        observed += f"; all defined by {', '.join(str(c) for c in classes)}"
    for split in walk.splits:
        why = (
            f"{gate.symbol} ({gate.path}:{gate.line}) admits only CP batches of one request"
            if gate is not None
            else "the metadata carries no per-request lengths: one request per CP batch"
        )
        observed += f". {split.text} at {split.function.where(split.line)} splits q at its midpoint, right here: {why}"
    if not walk.splits and per_request:
        observed += (
            f". No fixed split of q on the path; the metadata carries per-request {', '.join(per_request)}"
        )
    return Evidence(
        expected=f"every field {entry.qualname}'s CP path reads is defined by the CP metadata class that reaches it",
        observed=observed,
        location=Location(entry.relpath, entry.line, entry.qualname),
    )


def _batch_of_one_gate(tree: SourceTree) -> tuple[Location | None, FunctionRef | None]:
    """Where a CP admission gate requires a batch of exactly one request (if one does), and the gate."""
    gates = [f for name in BATCH_GATES for f in functions_named(tree, name, under="srt")]
    for function in gates:
        for node in ast.walk(function.node):
            if (
                isinstance(node, ast.Compare)
                and len(node.ops) == 1
                and isinstance(node.ops[0], ast.Eq)
                and isinstance(node.comparators[0], ast.Constant)
                and node.comparators[0].value == 1
                and re.search(r"shape\[0\]|len\(|\bbs\b|batch_size", ast.unparse(node.left))
            ):
                return Location(function.relpath, node.lineno, function.qualname), function
    return None, (gates[0] if gates else None)


def _field_of(evidence: Evidence) -> str | None:
    match = re.match(r"`(\w+)` defined by the CP metadata class", evidence.expected)
    return match.group(1) if match else None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
