"""NPP004's static probe: every call on each role's NPU path bound to what it reaches
(``static.binding.CallBinder``), the ``forward_npu`` twins of the layers the role builds compared
with the twins their callers were written against, and the findings ranked and merged across
roles."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from npudoctor.deployment.facts import Facts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.binding import CallBinder, Mismatch, is_spread_only, kind_of
from npudoctor.static.expressions import truth
from npudoctor.static.npupath import RolePath, reachable_calls, role_paths
from npudoctor.static.poolclasses import OFFLOAD_METHODS
from npudoctor.static.signatures import accepts_keyword, bind_errors, only_raises, signature_text
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.static.walker import Frame, method_on

# words in a function's, class's or module's name that say the code is another device's: an Ascend
# host never runs it, whatever the walk over-approximates (``DeepseekMLARocmForwardMixin``,
# ``rocm_mla_decode_rope.py``). "cuda" is not one: sglang names shared code after it
# (``CudaGraphRunner``, which ``NPUGraphRunner`` extends).
OTHER_DEVICE_WORDS = frozenset(
    {"rocm", "hip", "aiter", "musa", "xpu", "hpu", "mps", "cutlass", "flashinfer", "trtllm", "flashmla"}
)
# ``SpeculativeAlgorithm.is_<x>()`` that are true for exactly the algorithm of that name (is_eagle()
# is true for several, so it is not decided)
SINGLE_ALGORITHMS = frozenset({"NONE", "DFLASH", "NGRAM", "STANDALONE", "LOOKAHEAD"})
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
TWINS = ("forward_native", "forward_cuda")


@dataclass
class Finding:
    """One call (or one twin pair) that does not bind, with the roles whose path has it."""

    status: Status
    subject: str
    evidence: Evidence
    roles: list[str] = field(default_factory=list)


def probe(tree: SourceTree, facts: Facts) -> Probe:
    return judge(tree, facts, role_paths(tree, facts))


def judge(tree: SourceTree, facts: Facts, paths: list[RolePath]) -> Probe:
    """Bind every call each role's path runs on NPU; the probe of all roles together."""
    findings: dict[tuple, Finding] = {}
    assumptions: list[str] = []
    left_out: dict[str, None] = {}
    calls = 0
    for path in paths:
        assumptions += [a for a in path.assumptions if a not in assumptions]
        binder = CallBinder(tree, [*path.classes, *composite_pools(tree, facts)])
        graph = _Graph(tree, path, binder)
        for frame in graph.live():
            for call, callees, dead in graph.calls[_key(frame)]:
                if dead:
                    continue
                calls += 1
                if not callees:
                    for finding in _override_findings(tree, binder, frame, call):
                        _add(findings, finding, path)
                for mismatch in binder.judge(frame, call, callees):
                    _add(findings, _call_finding(mismatch), path)
        left_out.update(dict.fromkeys(graph.why))
        for finding in _twin_findings(tree, path, graph.modules_called()):
            _add(findings, finding, path)
    assumptions += list(left_out)
    ordered = sorted(findings.values(), key=lambda f: (-f.status.severity, f.subject))
    roles = tuple(p.name for p in paths)
    failing = [f for f in ordered if f.status is Status.FAIL]
    warning = [f for f in ordered if f.status is Status.WARN]
    evidence = tuple(f.evidence for f in ordered)
    if failing:
        summary = (
            f"{len(failing)} call(s) on the NPU path do not bind (TypeError when they run): "
            + "; ".join(f"{f.subject} [{', '.join(f.roles)}]" for f in failing[:3])
        )
        return Probe(Status.FAIL, summary, evidence, tuple(assumptions), roles)
    if warning:
        summary = "cannot tell whether these bind: " + "; ".join(f.subject for f in warning[:3])
        return Probe(Status.WARN, summary, evidence, tuple(assumptions), roles)
    functions = sum(len(p.frames) for p in paths)
    summary = (
        f"every call on the NPU path binds ({calls} calls in {functions} functions, {len(paths)} role(s))"
    )
    return Probe(Status.PASS, summary, (), tuple(assumptions), roles)


def composite_pools(tree: SourceTree, facts: Facts) -> list[ClassInfo]:
    """The pools sglang's model runner wraps around the NPU KV pool for the model's layers, which
    the allocator then holds: ``HybridLinearKVPool`` (linear-attention layers' mamba state beside
    the NPU pool) and ``SWAKVPool`` (sliding-window layers). A call on the allocator's pool may
    reach either, so it is claimed only when both the composite and the NPU pool refuse it."""
    model = facts.model
    if model is None:
        return []
    names = [
        n
        for n, used in (
            ("HybridLinearKVPool", model.hybrid_linear_layers),
            ("SWAKVPool", model.sliding_window),
        )
        if used
    ]
    return [c for name in names for c in tree.find_classes(name, under="srt")]


def _key(frame: Frame) -> tuple[int, int]:
    return id(frame.function.node), id(frame.self_cls)


class _Graph:
    """The calls of one role's path, each with what it reaches, and which functions of the walk an
    Ascend host runs: the walk over-approximates (it follows every branch it cannot prove dead), so
    a function is left out when the role never runs it for a reason the walk does not know:

    * it, its class or its module is named for another device (``DeepseekMLARocmForwardMixin``,
      ``rocm_mla_decode_rope.py``);
    * it copies KV to or from the host (``get_cpu_copy``/``load_cpu_copy``) in a role that does not
      offload (only a PD decode server retracts to host memory);
    * every call of it on the path sits in a branch for a dispatch value NPU never has: ``if m ==
      AttnForwardMethod.MHA`` where the enum has the NPU variant ``MHA_NPU`` (NPU dispatches to the
      variant), or a member named for another device (``MLA_FUSED_ROPE_ROCM``), or under a
      speculative algorithm the role does not run (``spec_algorithm.is_dflash()``), transitively.
    """

    def __init__(self, tree: SourceTree, path: RolePath, binder: CallBinder):
        self.tree = tree
        self.path = path
        self.calls: dict[tuple[int, int], list] = {}
        self.why: list[str] = []
        self._dead: set[tuple[int, int]] = set()
        self._callers: dict[tuple[int, int], list[tuple[tuple[int, int], bool]]] = {}
        offloads = path.role is None or path.role.can_offload_kv
        for frame in path.frames:
            key = _key(frame)
            if key in self.calls:
                continue
            entries = []
            self.calls[key] = entries
            if other_device(frame):
                self._note("functions named for another device (ROCm, aiter, flashinfer, ...) left out")
                self._dead.add(key)
                continue
            if not offloads and frame.function.name in OFFLOAD_METHODS:
                self._note(f"{'/'.join(OFFLOAD_METHODS)}: role {path.name} does not offload KV to the host")
                self._dead.add(key)
                continue
            for call in reachable_calls(frame):
                callees = binder.callees(frame, call)
                dead = dispatch_dead(tree, frame.function, call) or speculation_dead(
                    path.role, frame.function, call
                )
                entries.append((call, callees, dead is not None))
                for callee in callees:
                    for reached in callee.chain:
                        self._callers.setdefault((id(reached.node), id(callee.self_cls)), []).append(
                            (key, dead is not None)
                        )
                if dead is not None and callees:
                    self._note(dead)

    def modules_called(self) -> set[int]:
        """The ids of the classes some ``self.<attr>(...)`` of the path calls as a module."""
        return {
            id(callee.self_cls)
            for entries in self.calls.values()
            for _, callees, _ in entries
            for callee in callees
            if callee.module
        }

    def _note(self, text: str) -> None:
        if text not in self.why:
            self.why.append(text)

    def live(self) -> list[Frame]:
        """The frames an Ascend host runs: the entries, every frame no call on the path was seen
        to reach (reached in ways this check does not resolve: kept), and what a live frame reaches
        outside dead branches."""
        frames = {}
        for frame in self.path.frames:
            frames.setdefault(_key(frame), frame)
        live = {
            key
            for key, frame in frames.items()
            if key not in self._dead and (frame.depth == 0 or key not in self._callers)
        }
        changed = True
        while changed:
            changed = False
            for key in frames:
                if key in live or key in self._dead:
                    continue
                if any(caller in live and not dead for caller, dead in self._callers.get(key, ())):
                    live.add(key)
                    changed = True
        return [frames[key] for key in frames if key in live]


def dispatch_dead(tree: SourceTree, ref: FunctionRef, node: ast.AST) -> str | None:
    """Why ``node`` sits in a branch NPU never takes by its dispatch value, if it does: a taken
    ``x == E.M`` (``x in (E.M, ...)``) where ``E`` is an NPU dispatch enum (it pairs a member with
    its NPU variant: ``MHA`` and ``MHA_NPU``; the Ascend handler picks the variants) and no member
    tested is NPU's, or the members tested are named for another device."""
    for test, taken in tests_around(ref, node):
        if not taken:
            continue
        members = _compared_members(test.test)
        enums = {text for text, _ in members}
        if len(enums) != 1:
            continue
        enum = tree.resolve_class(ref.path, enums.pop())
        if enum is None:
            continue
        names = enum.class_attributes
        dispatch = any(_npu_member(n) and _plain_member(n) in names for n in names)
        if all(
            (dispatch and not _npu_member(m)) or any(w.lower() in OTHER_DEVICE_WORDS for w in m.split("_"))
            for _, m in members
        ):
            return (
                f"branches on {enum.name} members other than its NPU ones ({ref.relpath}) left out: "
                "NPU dispatches to the NPU members"
            )
    return None


def tests_around(ref: FunctionRef, call: ast.Call) -> list[tuple[ast.If, bool]]:
    """The ``if`` statements around ``call`` in ``ref``, outermost first, each with True when the call
    is in its body and False when in its ``else`` (``dataflow.enclosing_tests``, for every call of
    the function in one walk, memoised per tree)."""
    memo = ref.tree.memo.setdefault("npp004.tests", {})
    if id(ref.node) not in memo:
        chains: dict[int, list[tuple[ast.If, bool]]] = {}
        stack: list[tuple[ast.AST, list]] = [(stmt, []) for stmt in ref.node.body]
        while stack:
            node, chain = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If):
                stack.append((node.test, chain))
                stack.extend((child, [*chain, (node, True)]) for child in node.body)
                stack.extend((child, [*chain, (node, False)]) for child in node.orelse)
                continue
            if isinstance(node, ast.Call):
                chains[id(node)] = chain
            stack.extend((child, chain) for child in ast.iter_child_nodes(node))
        memo[id(ref.node)] = chains
    return memo[id(ref.node)].get(id(call), [])


def _npu_member(name: str) -> bool:
    return any(word in ("NPU", "ASCEND") for word in name.split("_"))


def _plain_member(name: str) -> str:
    return "_".join(w for w in name.split("_") if w not in ("NPU", "ASCEND"))


def speculation_dead(role: RoleFacts | None, ref: FunctionRef, node: ast.AST) -> str | None:
    """Why ``node`` sits in a branch the role's speculative algorithm never takes, if it does:
    ``if self.model_runner.spec_algorithm.is_dflash():`` with no speculation, or another one."""
    if role is None:
        return None
    algorithm = (role.speculative_algorithm or "NONE").upper()
    for test, taken in tests_around(ref, node):
        value = _speculation_value(test.test, algorithm)
        if value is not None and value != taken:
            return (
                f"branches for a speculative algorithm other than {algorithm} ({ref.relpath}) left out: "
                f"role {role.name} does not run them"
            )
    return None


def _speculation_value(test: ast.expr, algorithm: str) -> bool | None:
    """``test`` for a role whose speculative algorithm is ``algorithm`` (``NONE`` without one):
    ``<...>spec_algorithm.is_<name>()`` and ``not``/``and``/``or`` over such calls; None otherwise."""
    return truth(test, lambda operand: _speculation_call_value(operand, algorithm))


def _speculation_call_value(test: ast.expr, algorithm: str) -> bool | None:
    """``<...>spec_algorithm.is_<name>()`` for ``algorithm``; None for any other operand."""
    if not (
        isinstance(test, ast.Call)
        and not test.args
        and isinstance(test.func, ast.Attribute)
        and test.func.attr.startswith("is_")
        and ast.unparse(test.func.value).rpartition(".")[2] in ("spec_algorithm", "speculative_algorithm")
    ):
        return None
    name = test.func.attr[3:].upper()
    if name == algorithm:
        return True
    if algorithm == "NONE" or name in SINGLE_ALGORITHMS:
        return False  # no speculation: every is_<x>() but is_none() is False; these name one algorithm
    return None


def _compared_members(test: ast.expr) -> list[tuple[str, str]]:
    """``[(enum text, member)]`` for ``x == E.M`` / ``x is E.M`` / ``x in (E.A, E.B)``."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return []
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        values = [left, right]
        found = [_member(v) for v in values if _member(v) is not None]
        return found if len(found) == 1 else []
    if isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        found = [_member(v) for v in right.elts]
        return found if found and all(f is not None for f in found) else []
    return []


def _member(node: ast.expr) -> tuple[str, str] | None:
    if (
        isinstance(node, ast.Attribute)
        and node.attr.isupper()
        and isinstance(node.value, (ast.Name, ast.Attribute))
    ):
        return ast.unparse(node.value), node.attr
    return None


def _add(findings: dict[tuple, Finding], finding: Finding, path: RolePath) -> None:
    location = finding.evidence.location
    key = (
        finding.status,
        finding.subject,
        location.path if location else "",
        location.line if location else 0,
    )
    kept = findings.setdefault(key, finding)
    if path.name not in kept.roles:
        kept.roles.append(path.name)


def _call_finding(mismatch: Mismatch) -> Finding:
    caller, callee = mismatch.caller, mismatch.callee
    function = callee.function
    via = f" (through {callee.via})" if callee.via else ""
    subject = f"{caller.qualname} -> {function.qualname}"
    expected = (
        f"{function.qualname}{_on(callee.self_cls, function)} ({function.where()}) accepts what "
        f"{caller.qualname} passes: {callee.shape.describe()}"
    )
    observed = (
        f"{caller.where(mismatch.line)} calls {signature_text(function.node)} at {function.where()}{via}: "
        f"TypeError: {'; '.join(mismatch.errors)}"
    )
    location = Location(caller.relpath, mismatch.line, caller.qualname)
    return Finding(Status.FAIL, subject, Evidence(expected, observed, location))


def _on(cls: ClassInfo | None, function: FunctionRef) -> str:
    return "" if cls is None or function.owner is cls else f" on {cls.name}"


# ----- NPU overrides on receivers the source does not type -------------------------------------
def _override_findings(tree: SourceTree, binder: CallBinder, frame: Frame, call: ast.Call) -> list[Finding]:
    """``<expr>.m(...)`` whose receiver nothing types (``forward_batch.token_to_kv_pool.m(...)``):
    where a class the role builds defines ``m`` as an NPU override narrower than the method it
    overrides, and the call binds to the overridden method but not to the override, ``warn``: the
    call fails if the receiver is that class, and the source does not say whether it is."""
    func = call.func
    if not isinstance(func, ast.Attribute) or _is_self(func.value) or func.attr.startswith("__"):
        return []
    found = []
    shape = None
    for cls, override, base in _narrowing_overrides(tree, binder, func.attr):
        shape = shape or binder.shape(frame, call)
        errors = bind_errors(override.node, shape)
        if not errors or bind_errors(base.node, shape):
            continue
        subject = f"{frame.function.qualname} -> {override.qualname}?"
        expected = (
            f"{override.qualname} ({override.where()}), an NPU override of {base.qualname} ({base.where()}), "
            f"accepts what {frame.function.qualname} passes to `{ast.unparse(func)}`: {shape.describe()}"
        )
        observed = (
            f"{frame.function.where(call.lineno)} calls `{ast.unparse(func)}(...)` on a receiver the source does "
            f"not type; the role builds {cls.name}, and if the receiver is one: TypeError: {'; '.join(errors)} "
            f"({signature_text(override.node)}; {signature_text(base.node)} takes it)"
        )
        location = Location(frame.function.relpath, call.lineno, frame.function.qualname)
        found.append(Finding(Status.WARN, subject, Evidence(expected, observed, location)))
    return found


def _narrowing_overrides(tree: SourceTree, binder: CallBinder, name: str) -> list:
    """``(class built, its NPU override of name, the method overridden)`` where the override takes
    less than the overridden method (memoised per binder)."""
    memo = binder.__dict__.setdefault("_narrowing", {})
    if name not in memo:
        found = []
        for cls in binder.built.values():
            mro = tree.mro(cls)
            override = tree.lookup(mro, name)
            if override is None or not _is_npu_class(tree, override.owner) or kind_of(override) != "method":
                continue
            base = tree.lookup(mro, name, mro.index(override.owner) + 1)
            if base is None or _is_npu_class(tree, base.owner) or kind_of(base) != "method":
                continue
            if narrower(override, base):
                found.append((cls, override, base))
        memo[name] = found
    return memo[name]


def _is_npu_class(tree: SourceTree, cls: ClassInfo | None) -> bool:
    if cls is None:
        return False
    rel = tree.relpath(cls.path).lower()
    return cls.name.startswith(("NPU", "Ascend", "Npu")) or "/npu/" in rel or "ascend" in rel


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


# ----- forward_npu and its twins -----------------------------------------------------------------
def _twin_findings(tree: SourceTree, path: RolePath, called: set[int]) -> list[Finding]:
    """Layers the role builds whose ``forward_npu`` takes less than a twin, and that no call on the
    path was seen to reach (a reached one was bound above): ``warn``, the callers are not known."""
    found = []
    for cls in path.classes:
        if id(cls) in called:
            continue
        npu = method_on(tree, cls, "forward_npu")
        if npu is None or is_spread_only(npu.node) or kind_of(npu) != "method":
            continue
        for name in TWINS:
            twin = method_on(tree, cls, name)
            if (
                twin is None
                or is_spread_only(twin.node)
                or only_raises(twin.node)
                or kind_of(twin) != "method"
            ):
                continue
            missing = narrower(npu, twin)
            if missing:
                found.append(_twin_finding(cls, npu, twin, missing))
                break
    return found


def narrower(override: FunctionRef, other: FunctionRef) -> list[str]:
    """What ``other`` (bound) accepts that ``override`` (bound) does not: its named parameters
    ``override`` takes by no name, and positions beyond ``override``'s."""
    node, twin = override.node, other.node
    missing = [
        a.arg
        for a in [*twin.args.args[1:], *twin.args.kwonlyargs]
        if not accepts_keyword(node, a.arg) and not _positional_slot(node, twin, a.arg)
    ]
    if twin.args.vararg is not None and node.args.vararg is None:
        missing.append(f"*{twin.args.vararg.arg}")
    if twin.args.kwarg is not None and node.args.kwarg is None:
        missing.append(f"**{twin.args.kwarg.arg}")
    return missing


def _positional_slot(node: ast.FunctionDef | ast.AsyncFunctionDef, twin: ast.FunctionDef, name: str) -> bool:
    """``name`` is a positional-only parameter of ``twin`` whose position ``node`` also takes."""
    position = (
        [a.arg for a in twin.args.posonlyargs].index(name)
        if name in {a.arg for a in twin.args.posonlyargs}
        else None
    )
    if position is None:
        return False
    return node.args.vararg is not None or position < len([*node.args.posonlyargs, *node.args.args])


def _twin_finding(cls: ClassInfo, npu: FunctionRef, twin: FunctionRef, missing: list[str]) -> Finding:
    subject = f"{cls.name}.forward_npu narrower than {twin.name}"
    expected = (
        f"{cls.name}.forward_npu ({npu.where()}) accepts what its twin {twin.qualname} ({twin.where()}) "
        "accepts: callers are written against the twins, and sglang's platform dispatch sends them to "
        "forward_npu on Ascend"
    )
    observed = (
        f"{signature_text(npu.node)} does not take {', '.join(missing)} that {signature_text(twin.node)} "
        f"takes; no call of a {cls.name} was found on the path to tell whether a caller passes it"
    )
    return Finding(
        Status.WARN, subject, Evidence(expected, observed, Location(npu.relpath, npu.line, npu.qualname))
    )


# ----- code an Ascend host never runs ------------------------------------------------------------
def other_device(frame: Frame) -> bool:
    """The frame's function, its class or its module is named for another device."""
    ref = frame.function
    names = [ref.name, ref.path.stem]
    if ref.owner is not None:
        names.append(ref.owner.name)
    return any(word.lower() in OTHER_DEVICE_WORDS for name in names for word in _WORDS.findall(name))
