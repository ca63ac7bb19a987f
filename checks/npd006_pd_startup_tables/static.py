"""NPD006 static probe: run each NPU pool class's construction and the table builders sglang's PD
start-up calls on it (``get_contiguous_buf_infos`` always, ``get_state_buf_infos`` where the
release's ``_init_kv_manager``/``setup_state_kv_args`` calls it and the class has it) on symbols
(``npudoctor.static.shapes``), with the deployment's pool parameters (``index_head_dim`` None without the
NSA indexer) and the role's environment, and require that no builder reads a buffer attribute that
construction left ``None`` for this deployment (indexing or iterating it raises ``TypeError`` at
start-up).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from npudoctor.deployment.facts import RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.results import Evidence, Location
from npudoctor.static.poolclasses import no_npu_pool, npu_pool_classes
from npudoctor.static.shapes import LayoutEvaluator, Sym
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree, is_self

from .verdict import TABLES, Kind, verdict

STATE_TABLE = "get_state_buf_infos"


@dataclass(frozen=True)
class NoneRead:
    """A builder reading ``self.<attr>`` as a container while it is ``None``."""

    attr: str
    location: Location
    certain: bool  # on the path the deployment decides (no undecided condition before it)


class _NoneReadEvaluator(LayoutEvaluator):
    """``LayoutEvaluator`` that records subscripts, attribute reads and iteration of ``self``
    attributes that hold ``None`` on the path the deployment's parameters decide, and where
    construction set them to ``None``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: dict[tuple[str, str, int], NoneRead] = {}
        self.set_none: dict[str, Location] = {}
        self.undecided = 0

    def _decide(self, test, env, method):
        decided = super()._decide(test, env, method)
        if decided is None:
            self.undecided += 1
        return decided

    def _check(self, node: ast.expr, env, method: FunctionRef) -> None:
        if (
            isinstance(node, ast.Attribute)
            and is_self(node.value)
            and node.attr not in self.params
            and env.attrs.get(node.attr, ...) is None
        ):
            key = (node.attr, method.relpath, node.lineno)
            location = Location(method.relpath, node.lineno, method.qualname)
            self.reads.setdefault(key, NoneRead(node.attr, location, self.undecided == 0))

    def _eval(self, node, env, method):
        if isinstance(node, ast.Subscript) or (isinstance(node, ast.Attribute) and not is_self(node.value)):
            self._check(node.value, env, method)
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
            for generator in node.generators:
                self._check(generator.iter, env, method)
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "len")
        ):
            for arg in node.args:
                self._check(arg, env, method)
        return super()._eval(node, env, method)

    def _exec(self, stmt, env, method):
        if isinstance(stmt, ast.For):
            self._check(stmt.iter, env, method)
        super()._exec(stmt, env, method)
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and stmt.value.value is None:
            for target in stmt.targets:
                if isinstance(target, ast.Attribute) and is_self(target.value):
                    self.set_none[target.attr] = Location(method.relpath, stmt.lineno, method.qualname)

    def table(self, name: str) -> list[NoneRead]:
        """Run builder ``name`` on the constructed pool; the ``None`` reads on its path."""
        self.reads.clear()
        self.undecided = 0
        self.call(name)
        return list(self.reads.values())


def state_table_callers(tree: SourceTree) -> list[Location]:
    """Where the release's PD start-up asks the (target model's) KV pool for its state buffers:
    ``<...>token_to_kv_pool.get_state_buf_infos()`` in ``srt/disaggregation`` (``setup_state_kv_args``
    since 0.5.12, ``_init_kv_manager`` in prefill.py/decode.py before)."""
    found = []
    for path in tree.files_containing(STATE_TABLE, under="srt/disaggregation"):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == STATE_TABLE
            ):
                receiver = ast.unparse(node.func.value)
                if (
                    receiver.endswith("token_to_kv_pool")
                    and "draft" not in receiver
                    and "req_to" not in receiver
                ):
                    found.append(Location(tree.relpath(path), node.lineno))
    return sorted(found, key=lambda loc: (not loc.path.endswith("utils.py"), loc.path, loc.line))


def static_probe(
    tree: SourceTree, roles: list[RoleFacts], kinds: list[Kind], assumptions: tuple[str, ...]
) -> Probe:
    """The verdict over every NPU pool class of each pool kind, for every PD role's environment."""
    evidence: list[Evidence] = []
    failing, unknown, checked = [], [], []
    callers = state_table_callers(tree)
    notes = []
    if callers:
        notes.append(
            f"static: PD start-up asks the KV pool for its state buffers at {callers[0].path}:{callers[0].line}"
        )
    for kind in kinds:
        classes = npu_pool_classes(tree, kind.family)
        if not classes:
            unknown.append(f"no NPU {kind.family.upper()} pool class")
            evidence.append(no_npu_pool(kind.family))
            continue
        for cls in classes:
            for role in _distinct_environments(roles):
                outcome, item = _judge(tree, cls, kind, role, callers)
                evidence.append(item)
                label = f"{cls.name} ({kind.label})"
                {"fail": failing, "unknown": unknown, "pass": checked}[outcome].append(label)
    return verdict(roles, evidence, assumptions + tuple(notes), failing, unknown, "static")


def _distinct_environments(roles: list[RoleFacts]) -> list[RoleFacts]:
    """One role per distinct environment: the source is the same for both roles, only the
    environment (``ASCEND_USE_FIA``) can take another path through it."""
    seen, chosen = set(), []
    for role in roles:
        key = (tuple(sorted(role.env.items())), role.use_fia, role.kv_cache_dtype)
        if key not in seen:
            seen.add(key)
            chosen.append(role)
    return chosen


def _judge(
    tree: SourceTree, cls: ClassInfo, kind: Kind, role: RoleFacts, callers: list[Location]
) -> tuple[str, Evidence]:
    params: dict = {"is_quantized_kv_cache": False} if role.kv_cache_dtype == "auto" else {}
    params["index_head_dim"] = Sym.const(kind.model.index_head_dim) if kind.model.index_head_dim else None
    env = dict(role.env)
    env.setdefault("ASCEND_USE_FIA", "1" if role.use_fia else "0")
    evaluator = _NoneReadEvaluator(tree, cls, env, params)
    if tree.lookup(evaluator.mro, TABLES[0]) is None:
        return "unknown", Evidence(
            f"{cls.name}.{TABLES[0]}, the KV table builder PD start-up calls on every pool",
            f"{cls.name} has none (through its MRO): a pool layout npudoctor does not recognise",
            Location(cls.relpath, cls.line, cls.name),
        )
    evaluator.construct()
    tables = [TABLES[0]]
    state = tree.lookup(evaluator.mro, STATE_TABLE)
    if state is not None and callers:
        tables.append(STATE_TABLE)
    reads: list[tuple[str, NoneRead]] = [(t, r) for t in tables for r in evaluator.table(t)]
    names = " and ".join(f"{cls.name}.{t}" for t in tables)
    expected = (
        f"{names} read only buffers that {cls.name} builds for {kind.label} "
        f"(index_head_dim={kind.model.index_head_dim})"
    )
    certain = [(t, r) for t, r in reads if r.certain]
    if certain or reads:
        table, read = (certain or reads)[0]
        origin = evaluator.set_none.get(read.attr)
        set_at = (
            f", which {origin.symbol} sets to None at {origin.path}:{origin.line}" if origin else " (None)"
        )
        caller = ""
        if table == STATE_TABLE and callers:
            caller = f"; PD start-up calls it at {callers[0].path}:{callers[0].line}"
        observed = (
            f"{table} ({read.location.path}:{read.location.line}) reads self.{read.attr}{set_at} for this "
            f"deployment: TypeError when the KV manager's tables are built at PD start-up{caller}"
        )
        if not certain:
            return "unknown", Evidence(
                expected, observed + " (on a path whose conditions npudoctor cannot decide)", read.location
            )
        return "fail", Evidence(expected, observed, read.location)
    where = tree.lookup(evaluator.mro, tables[-1])
    location = (
        Location(where.relpath, where.line, where.qualname) if where else Location(cls.relpath, cls.line)
    )
    skipped = (
        ""
        if STATE_TABLE in tables
        else (
            f"; {STATE_TABLE} not called on it at start-up"
            if state is not None
            else f"; no {STATE_TABLE} on it"
        )
    )
    return "pass", Evidence(
        expected,
        f"{names} read no attribute that {cls.name} leaves None for {kind.label}{skipped}",
        location,
    )
