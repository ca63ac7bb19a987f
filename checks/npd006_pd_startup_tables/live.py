"""NPD006 live probe: build each role's real NPU pools on CPU (the draft model's too), assemble
``kv_args`` the way the release's ``_init_kv_manager`` does, with its own ``setup_state_kv_args``
where it has one, and check the tables against the buffers the pools hold."""

from __future__ import annotations

import gc
import importlib
import sys
import traceback
import types
from typing import Any

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.live import kvargs, livepools, processstate
from npudoctor.live.locations import code_location, raising_location, relative
from npudoctor.results import Evidence

from .verdict import TABLES, Kind, verdict

UTILS_MODULE = kvargs.UTILS_MODULE
BASE_MODULE = "sglang.srt.disaggregation.base"


def import_table_modules() -> None:
    """The ``KVArgs`` container and the disaggregation utils, where the release has
    ``setup_state_kv_args`` (0.5.12+). Older releases fill the tables in ``_init_kv_manager``
    from the pool alone; the probe needs neither module there, and their imports reach far
    (``server_args`` and, on 0.5.4, a pydantic schema over a stood-in ``xgrammar``)."""
    utils = processstate.imported_tree().module_path(UTILS_MODULE)
    if utils is not None and b"def setup_state_kv_args(" in utils.read_bytes():
        importlib.import_module(BASE_MODULE)
        importlib.import_module(UTILS_MODULE)


def kv_args_class() -> type:
    """The ``KVArgs`` container ``_init_kv_manager`` fills: ``get_kv_class(backend, KVARGS)``
    returns ``disaggregation.base.KVArgs`` for every transfer backend in every release (0.5.19+
    says so: "Every backend shares the same KVArgs container"), so the backend's own modules
    (networking, engines) need not be imported for the tables. Where the release has no
    ``setup_state_kv_args`` nothing of sglang reads the container while the tables are built (the
    pools' builders do not see it): a plain namespace stands for it."""
    base = sys.modules.get(BASE_MODULE)
    return base.KVArgs if base is not None else types.SimpleNamespace


def live_probe(roles: list[RoleFacts], kinds: list[Kind], assumptions: tuple[str, ...]) -> Probe:
    evidence: list[Evidence] = []
    failing, unknown, checked = [], [], []
    setup = kvargs.state_producer()
    where = code_location(setup) if setup is not None else None
    notes = [
        "live: kv_args completed by sglang's setup_state_kv_args"
        + (f" ({where.path}:{where.line})" if where else "")
        if setup is not None
        else "live: no setup_state_kv_args in this release: state tables taken as its _init_kv_manager "
        "takes them (get_state_buf_infos where the pool has it)"
    ]
    args_class = kv_args_class()
    for kind in kinds:
        classes = livepools.npu_pool_classes(kind.family)
        if not classes:
            return livepools.no_pool_loaded(kind.family, assumptions, tuple(r.name for r in roles))
        for cls in classes:
            for role in roles:
                label = f"{cls.__name__} ({kind.label}; {role.name})"
                try:
                    outcome, item = processstate.in_role(
                        role,
                        lambda cls=cls, role=role, kind=kind: _role_tables(cls, kind, role, args_class),
                    )
                finally:
                    gc.collect()
                evidence.append(item)
                {"fail": failing, "unknown": unknown, "pass": checked}[outcome].append(label)
    return verdict(roles, evidence, assumptions + tuple(notes), failing, unknown, "live")


def _role_tables(cls: type, kind: Kind, role: RoleFacts, args_class: type) -> tuple[str, Evidence]:
    """Build the role's pools, its tables as ``_init_kv_manager`` does, and judge them."""
    model = livepools.probed_model(kind.model)
    draft_note = f" + draft pool of {role.draft_layers} layer(s)" if role.draft_layers else ""
    expected = (
        f"{role.name}, {kind.label}: {cls.__name__}{draft_note} tables (KV data, state) build and describe the pool's "
        "buffers: each pointer a buffer's data_ptr, each length its nbytes, item lengths dividing it, "
        "equal-length lists, every KV buffer registered"
    )
    try:
        pool = livepools.build_pool(cls, model, role)
        draft = (
            livepools.build_pool(cls, model, role, layers_range=(0, role.draft_layers))
            if role.draft_layers
            else None
        )
    except livepools.CannotBuild as reason:
        return "unknown", Evidence(expected, str(reason), code_location(cls, "__init__"))
    except Exception as error:  # sglang's constructor raised: before the tables, outside the property
        if raising_location(error) is None or processstate.unpublished_parallel_name(error) is not None:
            raise  # npudoctor's own bug, or a parallel width liveprocess.in_role sets and retries with
        return "unknown", Evidence(
            expected, f"the pool could not be built on CPU: {_raised(error)}", raising_location(error)
        )
    if not callable(getattr(pool, TABLES[0], None)):
        return "unknown", Evidence(
            expected,
            f"{cls.__name__} has no {TABLES[0]}: a pool layout npudoctor does not recognise",
            code_location(cls, "__init__"),
        )
    try:
        kv_args = assemble_kv_args(args_class, pool, draft, model, role)
    except Exception as error:
        if raising_location(error) is None or processstate.unpublished_parallel_name(error) is not None:
            raise  # npudoctor's own bug (an error result), or a parallel width in_role sets and retries with
        if processstate.needs_process_state(error) or "not published" in str(error):
            return "unknown", Evidence(
                expected,
                f"{type(error).__name__}: {error}: scheduler-process state the probe does not set up",
                raising_location(error),
            )
        return "fail", Evidence(expected, _raised(error), raising_location(error))
    problems = describe_problems(kv_args, [p for p in (pool, draft) if p is not None])
    location = code_location(cls, TABLES[0])
    if problems:
        return "fail", Evidence(expected, "; ".join(problems[:4]) + " (live, CPU)", location)
    states = _flat(getattr(kv_args, "state_data_ptrs", []) or [])
    return "pass", Evidence(
        expected,
        f"{len(kv_args.kv_data_ptrs)} KV entries and {len(states)} state entries, each a buffer of the "
        "pools with its nbytes and a dividing item length (live, CPU)" + livepools.sampled_note(kind.model),
        location,
    )


def _raised(error: BaseException) -> str:
    """The exception and the sglang frames it went through (``f (path:line) -> g (path:line)``)."""
    frames = [(f, relative(f.filename)) for f in traceback.extract_tb(error.__traceback__)]
    chain = " -> ".join(f"{f.name} ({path}:{f.lineno})" for f, path in frames if path is not None)
    return f"{type(error).__name__}: {error}, raised in sglang: {chain} (live, CPU)"


def assemble_kv_args(args_class: type, pool: Any, draft_pool: Any, model: ModelFacts, role: RoleFacts) -> Any:
    """``kv_args`` as ``_init_kv_manager`` fills them (``npudoctor.live.kvargs``), state tables included,
    without NPD003's workaround: here an exception of sglang's is the finding.

    With ``setup_state_kv_args`` (0.5.12+) the release's own producer fills the state tables;
    before it, ``_init_kv_manager`` asked ``token_to_kv_pool.get_state_buf_infos()`` when the pool
    has the method (0.5.4-0.5.11), which is what is done here."""
    kv_args = kvargs.initial_kv_args(args_class, pool, draft_pool, model, role)
    setup = kvargs.state_producer()
    if setup is not None:
        setup(kv_args, pool, draft_pool, model.num_layers, req_to_token_pool=None)
    elif hasattr(pool, TABLES[1]):
        kv_args.state_data_ptrs, kv_args.state_data_lens, kv_args.state_item_lens = pool.get_state_buf_infos()
    return kv_args


def _flat(value: Any) -> list:
    """State tables: one flat list (<= 0.5.11) or one list per state component (0.5.12+)."""
    out = []
    for item in value:
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out


def describe_problems(kv_args: Any, pools: list[Any]) -> list[str]:
    """What in ``kv_args``' tables does not describe the pools' buffers."""
    buffers: dict[int, tuple[str, int]] = {}  # data_ptr -> (name, nbytes)
    for index, pool in enumerate(pools):
        owner = "draft pool" if index else "pool"
        for attribute, layers in livepools.kv_buffers(pool).items():
            for layer, tensor in enumerate(layers):
                buffers.setdefault(tensor.data_ptr(), (f"{owner} {attribute}[{layer}]", tensor.nbytes))
    problems: list[str] = []
    tables = [("kv", kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens)]
    tables.append(
        (
            "state",
            _flat(getattr(kv_args, "state_data_ptrs", []) or []),
            _flat(getattr(kv_args, "state_data_lens", []) or []),
            _flat(getattr(kv_args, "state_item_lens", []) or []),
        )
    )
    registered = set()
    for name, ptrs, lens, items in tables:
        if not len(ptrs) == len(lens) == len(items):
            problems.append(
                f"{name} tables of unequal length: {len(ptrs)} pointers, {len(lens)} lengths, {len(items)} item lengths"
            )
            continue
        for entry, (ptr, length, item) in enumerate(zip(ptrs, lens, items)):
            found = buffers.get(int(ptr))
            if found is None:
                problems.append(
                    f"{name}_data_ptrs[{entry}] = {ptr:#x} is the start of no buffer of the pools"
                )
                continue
            registered.add(int(ptr))
            label, nbytes = found
            if int(length) != nbytes:
                problems.append(f"{name}_data_lens[{entry}] = {length} bytes, but {label} holds {nbytes}")
            elif int(item) <= 0 or int(length) % int(item):
                problems.append(
                    f"{name}_item_lens[{entry}] = {item} does not divide {label}'s {length} bytes"
                )
    if not kv_args.kv_data_ptrs:
        problems.append("no KV data pointer registered")
    missing = [label for ptr, (label, _) in buffers.items() if ptr not in registered]
    if missing:
        problems.append(f"{len(missing)} buffer(s) of the pools never registered (first: {missing[0]})")
    return problems
