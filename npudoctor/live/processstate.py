"""The process-global state of an sglang role process, set for a live probe and put back after.

sglang's code reads more than its arguments: pools read ``ASCEND_USE_FIA`` from the environment
at construction, 0.5.2x code asks a runtime parallel context for its widths and ranks, and
0.5.11-0.5.15 code reads the scheduler's published ``ServerArgs``, 0.5.2x code the runtime
context's, and sglang's modules keep globals of their own (process groups, a cached CP strategy). A
live probe runs that code in npudoctor's own process, so every check that does sets these the way
the role's process has them, through the helpers here, and restores them afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.static.source import SourceTree

RUNTIME_MODULE = "sglang.srt.runtime_context"
SERVER_ARGS_MODULE = "sglang.srt.server_args"
PROBE_MODEL_NAME = "npudoctor-live-probe"
# The model path of the probes' server arguments. The live child makes it a directory of its own
# scratch (``serve_model_at``, from ``npudoctor.live.sealing.seal``) holding npudoctor's copy of the
# served model's config.json (``serve_model``): sglang code that reads the model path finds the
# deployment's model there, never the user's directory or a model hub.
PROBE_MODEL_PATH = PROBE_MODEL_NAME
T = TypeVar("T")

# sglang raising because the probe has not published what a scheduler process publishes:
# the runtime context's config namespaces (0.5.2x), the legacy global server args (<= 0.5.13)
_UNPUBLISHED = re.compile(r"config namespace '\w+' not published|Global server args is not set yet")
_MISSING_PARALLEL = re.compile(r"parallel (?:name|width) '(\w+)'")
_UNKNOWN_PARALLEL = re.compile(r"unknown parallel field\(s\): \[([^\]]*)\]")


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set; the previous values (or their absence) come back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def in_role(role: RoleFacts, probe: Callable[[], T]) -> T:
    """Run ``probe`` as the role's process would: its environment variables set and, on releases
    with a runtime parallel context, every parallel width the code asks for set to this single
    rank's view (sizes 1, ranks 0)."""
    with environment(role.env):
        return with_parallel(probe)


def single_rank(name: str) -> Any:
    """A parallel value as one rank of a one-rank group sees it: ranks 0, widths 1."""
    return 0 if "rank" in name else 1


def with_parallel(
    probe: Callable[[], T], values: dict[str, Any] | None = None, default: Callable[[str], Any] = single_rank
) -> T:
    """Run ``probe`` with the runtime parallel context (0.5.15+ ``runtime_context.get_parallel``)
    overridden by ``values``. Fields the release does not know are dropped; a field the probed code
    asks for and ``values`` lacks gets ``default(name)`` and the probe runs again. Releases without
    the context run ``probe`` as it is."""
    runtime = sys.modules.get(RUNTIME_MODULE)
    if runtime is None or not hasattr(runtime, "get_parallel"):
        return probe()
    values = dict(values or {})
    leaves: dict[str, Any] = {}  # configured leaves the override refuses: published instead
    while True:
        try:
            with published_parallel_leaves(runtime, leaves), runtime.get_parallel().override(**values):
                return probe()
        except (RuntimeError, ValueError) as error:
            unknown = _UNKNOWN_PARALLEL.search(str(error))
            names = re.findall(r"'(\w+)'", unknown.group(1)) if unknown else []
            if any(name in values for name in names):
                for name in names:
                    if name in values:
                        leaves[name] = values.pop(name)
                continue
            missing = unpublished_parallel_name(error)
            if missing is None or missing in values or len(values) > 64:
                raise
            values[missing] = default(missing)


@contextlib.contextmanager
def published_parallel_leaves(runtime: Any, leaves: dict[str, Any]) -> Iterator[None]:
    """The runtime context's ``parallel`` config bag published with ``leaves`` set, the release's
    declared defaults for its other leaves, as the scheduler's publish wires it
    (``RuntimeContext.set_server_args``: ``self.parallel._config = bags["parallel"]``); unset after.

    Only for the leaves of that namespace the scoped override refuses and while nothing is
    published: 0.5.20's ``override`` takes only widths/ranks/groups, while its
    ``get_cp_strategy`` reads ``get_parallel().enable_prefill_cp``/``cp_strategy`` from the bag
    (0.5.21+ let the override set them; 0.5.14-0.5.19 publish a dataclass ``ServerArgs``). Widths
    a release derives at publish stay unset: the probe states them through the override."""
    context = runtime.get_parallel()
    names = getattr(runtime, "_parallel_config_leaves", None)
    bag_class = getattr(runtime, "_ConfigBag", None)
    if not leaves or getattr(context, "_config", True) is not None or names is None or bag_class is None:
        yield
        return
    declared = set(names())
    if not declared.intersection(leaves):
        yield
        return
    cls = getattr(sys.modules.get(SERVER_ARGS_MODULE), "ServerArgs", None)
    msgspec = sys.modules.get("msgspec")
    if dataclasses.is_dataclass(cls):
        fields: Any = dataclasses.fields(cls)
    elif msgspec is not None and isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        fields = msgspec.structs.fields(cls)  # 0.5.20+: ServerArgs is a msgspec record
    else:
        fields = ()
    absent = (dataclasses.MISSING, getattr(msgspec, "NODEFAULT", dataclasses.MISSING))
    bag = bag_class("parallel")
    for field in fields:
        if field.name not in declared or field.name in leaves:
            continue
        if not any(field.default is a for a in absent):
            bag._set(field.name, field.default)
        elif not any(field.default_factory is a for a in absent):
            bag._set(field.name, field.default_factory())
    for name in declared.intersection(leaves):
        bag._set(name, leaves[name])
    context._config = bag
    try:
        yield
    finally:
        context._config = None


def unpublished_parallel_name(error: BaseException) -> str | None:
    """The parallel value sglang's runtime context was asked for and does not have: named in the
    message, or the ``name`` its reader was called with."""
    named = _MISSING_PARALLEL.search(str(error))
    if named:
        return named.group(1)
    if "not published" not in str(error):
        return None
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        if frame.f_code.co_name == "_read" and isinstance(frame.f_locals.get("name"), str):
            return frame.f_locals["name"]
    return None


def dataclass_instance(cls: type, values: dict[str, Any]) -> Any:
    """An instance of dataclass ``cls`` without running ``__init__``/``__post_init__``: every
    field with a default gets it, ``values`` (only names that are fields) override them.
    A field with no default that is not given stays unset, so a read of it raises."""
    instance = object.__new__(cls)
    names = set()
    for item in dataclasses.fields(cls):
        names.add(item.name)
        if item.default is not dataclasses.MISSING:
            setattr(instance, item.name, item.default)
        elif item.default_factory is not dataclasses.MISSING:
            setattr(instance, item.name, item.default_factory())
    for name, value in values.items():
        if name in names:
            setattr(instance, name, value)
    return instance


def serve_model_at(directory: Path) -> None:
    """Make ``directory`` (created here) the probes' model path (``PROBE_MODEL_PATH``)."""
    global PROBE_MODEL_PATH
    directory.mkdir(parents=True, exist_ok=True)
    PROBE_MODEL_PATH = str(directory)


def serve_model(model: ModelFacts | None) -> None:
    """Put ``model``'s config.json at the probes' model path, once ``serve_model_at`` made it a
    directory: a copy of the deployment's file when the model came from one, else the model facts
    written as an HF config. No model: the directory holds none (a read of it raises, as sglang's
    would for a model directory without a config), not an earlier run's."""
    if not os.path.isabs(PROBE_MODEL_PATH):
        return
    config = Path(PROBE_MODEL_PATH) / "config.json"
    if model is None:
        config.unlink(missing_ok=True)
        return
    data = json.dumps(hf_config(model), indent=2).encode()
    with contextlib.suppress(OSError, ValueError):  # an inline hf_config, a file gone since: the facts
        copied = Path(model.source).read_bytes()
        loaded = json.loads(copied)
        if isinstance(loaded, dict):
            data = copied
            if loaded.get("num_hidden_layers") not in (None, model.num_layers):
                # a probe of fewer layers than the file's (livepools.probed_model): the file says so too
                data = json.dumps({**loaded, "num_hidden_layers": model.num_layers}, indent=2).encode()
    staging = config.with_name(f".config.json.{os.getpid()}")
    staging.write_bytes(data)
    staging.replace(config)


def hf_config(model: ModelFacts) -> dict[str, Any]:
    """An HF config.json of what the model facts know (a model given inline, without a file)."""
    config: dict[str, Any] = {
        "architectures": list(model.architectures),
        "model_type": model.model_type,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "hidden_size": model.num_heads * model.head_dim,
        "head_dim": model.head_dim,
        "v_head_dim": model.v_head_dim,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_rope_head_dim": model.qk_rope_head_dim,
        "qk_nope_head_dim": model.head_dim - model.qk_rope_head_dim if model.qk_rope_head_dim else None,
        "index_head_dim": model.index_head_dim,
        "index_n_heads": model.index_n_heads,
        "sliding_window": model.sliding_window,
        "num_nextn_predict_layers": model.nextn_layers or None,
    }
    return {key: value for key, value in config.items() if value is not None}


def served_model_config(model: ModelFacts) -> Any:
    """The attributes of sglang's ``ModelConfig`` the probe knows from the model facts; the model's
    config.json goes to the probes' model path (``serve_model``), for code that reads it there."""
    serve_model(model)
    return types.SimpleNamespace(
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        v_head_dim=model.v_head_dim,
    )


@contextlib.contextmanager
def published_server_args(role: RoleFacts, model: ModelFacts | None = None) -> Iterator[None]:
    """The role's ``ServerArgs`` published as the scheduler process's global (0.5.11-0.5.15:
    ``set_global_server_args_for_scheduler``, which their ``ModelRunner`` calls), restored after.

    The record is built from the dataclass defaults and the role's arguments without
    ``__post_init__`` (which asks the accelerator and reads the model's files), with the
    release's own legacy-CP normalisation where it has one; its ``model_config``, which
    ``ServerArgs.get_model_config`` memoises, holds the model facts. A release whose
    ``ServerArgs`` is not a dataclass (0.5.2x) reads the runtime context instead: nothing to do."""
    module = sys.modules.get(SERVER_ARGS_MODULE)
    cls = getattr(module, "ServerArgs", None)
    publish = getattr(module, "set_global_server_args_for_scheduler", None)
    if cls is None or publish is None or not dataclasses.is_dataclass(cls):
        yield
        return
    try:
        previous = module.get_global_server_args()
    except Exception:  # not published yet (ValueError), or a retired accessor
        previous = None
    values = {
        **role.server_args,
        "disaggregation_mode": role.disaggregation_mode,
        "model_path": PROBE_MODEL_PATH,
    }
    values.setdefault("attn_cp_size", role.attn_cp_size)
    values.setdefault("page_size", role.page_size)
    args = dataclass_instance(cls, values)
    legacy = getattr(args, "_handle_legacy_cp_arguments", None)
    if callable(legacy):
        legacy()
    if model is not None:
        args.model_config = served_model_config(model)
    publish(args)
    try:
        yield
    finally:
        if previous is not None:
            publish(previous)
        elif hasattr(module, "_global_server_args"):
            module._global_server_args = None
        else:
            reset = getattr(sys.modules.get(RUNTIME_MODULE), "reset_context", None)
            if callable(reset):
                reset()


def with_server_args(role: RoleFacts, call: Callable[[], T], model: ModelFacts | None = None) -> T:
    """Run ``call``; if sglang finds a config namespace unpublished (0.5.23's transfer path
    reads ``get_memory().enable_unified_memory``), publish the role's server arguments as the
    scheduler process has them, run it again, and restore the runtime context afterwards.

    Releases without a runtime context publish them as the legacy global server args
    (``set_global_server_args_for_scheduler``, which their ``ModelRunner`` calls): code that
    asks for them there (a runtime fix reading the served model's ``ModelConfig``) gets the
    role's, with ``model`` as the model config sglang memoises on them."""
    try:
        return call()
    except ValueError as error:
        if not _UNPUBLISHED.search(str(error)):
            raise
    runtime = sys.modules.get(RUNTIME_MODULE)
    server_args_class = importlib.import_module(SERVER_ARGS_MODULE).ServerArgs
    in_context = runtime is not None and hasattr(runtime, "get_context")
    record = dataclasses.is_dataclass(server_args_class)
    if not in_context or record:
        # a dataclass record (<= 0.5.19) is published without its __post_init__, which asks the device
        try:
            with published_server_args(role, model):
                return call()
        except Exception as error:
            if not (in_context and needs_process_state(error)):
                raise
            # 0.5.19's publish resolves the record, which asks the device: set it into the context as is
    context = runtime.get_context()
    accepted = inspect.signature(server_args_class).parameters
    given = {k: v for k, v in role.server_args.items() if k in accepted}
    given["disaggregation_mode"] = role.disaggregation_mode
    given["model_path"] = PROBE_MODEL_PATH  # the deployment's own model is memoised below
    saved = [(part, _state_of(part)) for part in _context_parts(context)]
    try:
        server_args = dataclass_instance(server_args_class, given) if record else server_args_class(**given)
        if model is not None:
            _memoise_model_config(server_args, served_model_config(model))
        context.set_server_args(server_args)
        return call()
    finally:
        for part, state in saved:
            for name, value in state.items():
                setattr(part, name, value)


def _memoise_model_config(server_args: Any, config: Any) -> None:
    """The served model's config where sglang memoises it on the server args: ``model_config``
    (``ServerArgs.get_model_config``, up to 0.5.19) and ``_model_config`` (``model_config_of``,
    0.5.20+), so code asking for the process's model config (``process_model_config``) gets the
    deployment's model instead of reading ``config.json`` from the probe's model path."""
    for name in ("model_config", "_model_config"):
        with contextlib.suppress(AttributeError, TypeError):  # a record that takes no such attribute
            setattr(server_args, name, config)


def _context_parts(context: Any) -> list[Any]:
    """The runtime context objects whose attributes ``set_server_args`` rebinds."""
    flags = getattr(context, "flags", None)
    parts = [context, getattr(context, "parallel", None), getattr(flags, "capture", None)]
    return [part for part in parts if part is not None]


def _state_of(obj: Any) -> dict[str, Any]:
    """An object's attributes: its ``__dict__``, ``__slots__`` and msgspec struct fields."""
    state = dict(getattr(obj, "__dict__", {}))
    names = [name for cls in type(obj).__mro__ for name in _as_names(cls.__dict__.get("__slots__"))]
    names += _as_names(getattr(type(obj), "__struct_fields__", None))
    for name in names:
        if not name.startswith("__") and hasattr(obj, name):
            state[name] = getattr(obj, name)
    return state


def _as_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, (tuple, list)) else []


class _StageGroup:
    """The PP process group of one pipeline stage, as ``get_parallel().pp_group`` exposes it."""

    def __init__(self, rank: int, size: int):
        self.rank_in_group = rank
        self.world_size = size
        self.is_first_rank = rank == 0
        self.is_last_rank = rank == size - 1


@contextlib.contextmanager
def pipeline_stage(role: RoleFacts, stage: int) -> Iterator[None]:
    """On releases with a runtime parallel context (``sglang.srt.runtime_context``), this
    stage's place in the role's pipeline (``pp_size``, ``pp_rank`` and a ``pp_group`` of the
    stage's rank): 0.5.2x reads ``get_parallel().pp_group.is_last_rank``, e.g. to decide whether
    a prefill stage sends draft KV. Releases without the context: nothing."""
    runtime = sys.modules.get(RUNTIME_MODULE)
    if runtime is None or not hasattr(runtime, "get_parallel"):
        yield
        return
    group = _StageGroup(stage, role.pp_size)
    with runtime.get_parallel().override(pp_size=role.pp_size, pp_rank=stage, pp_group=group):
        yield


PARALLEL_STATE_MODULE = "sglang.srt.distributed.parallel_state"


@contextlib.contextmanager
def attention_cp_group(group: Any) -> Iterator[None]:
    """``group`` as the process's attention-CP group (``parallel_state._ATTN_CP``, which
    ``get_attn_cp_group()`` returns through 0.5.22; 0.5.23 reads it from the runtime parallel
    context, where ``with_parallel``'s ``attn_cp_group`` sets it); the previous value back after."""
    module = sys.modules.get(PARALLEL_STATE_MODULE)
    if module is None or not hasattr(module, "_ATTN_CP"):
        yield
        return
    previous = module._ATTN_CP
    module._ATTN_CP = group
    try:
        yield
    finally:
        module._ATTN_CP = previous


@contextlib.contextmanager
def sglang_globals_restored() -> Iterator[None]:
    """Module-level state the probed code sets is put back afterwards, so later probes in the
    same live run see the process as it was: 0.5.15+ ``get_cp_strategy()`` caches the strategy
    it builds in ``layers/cp/base._STRATEGY``. Globals that changed get their old value back
    and new ones are removed, except submodules imported meanwhile (their packages keep them)."""
    before = {
        name: dict(vars(module))
        for name, module in list(sys.modules.items())
        if module is not None and (name == "sglang" or name.startswith("sglang."))
    }
    try:
        yield
    finally:
        for name, saved in before.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            current = vars(module)
            for key in [
                k for k, v in current.items() if k not in saved and not isinstance(v, types.ModuleType)
            ]:
                del current[key]
            for key, value in saved.items():
                if current.get(key, _ABSENT) is not value:
                    current[key] = value


_ABSENT = object()


# What sglang raises when code asks for process state a scheduler sets up and a probe does not:
# the distributed groups (get_pp_group/get_tp_group before init_distributed_environment) and the
# accelerator (0.5.18's get_device: is_npu() is decided at import, before the NPU simulation).
_PROCESS_STATE = re.compile(
    r"group is not initialized|No accelerator \(CUDA, XPU, HPU, NPU, MUSA, MPS\) or platform plugin"
)


def needs_process_state(error: BaseException) -> bool:
    """Whether ``error`` is sglang asking for scheduler-process state the probe did not set up:
    not the deployment's defect, the probe cannot tell (a gap in npudoctor's simulation)."""
    return isinstance(error, (AssertionError, RuntimeError)) and bool(_PROCESS_STATE.search(str(error)))


_imported: list[SourceTree] = []  # the tree of the sglang this process imports, once parsed


def imported_tree() -> SourceTree:
    """The source of the sglang this interpreter imports, one ``SourceTree`` per process: the
    live child's target tree (``use_tree``), so the probes' imports and the probes share its
    parse; else one read from where ``sglang`` is found."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang")
    package_dir = Path(next(iter(spec.submodule_search_locations))).resolve()
    if not _imported or _imported[0].package_dir.resolve() != package_dir:
        _imported[:] = [SourceTree(package_dir)]
    return _imported[0]


def use_tree(tree: SourceTree) -> None:
    """Make ``tree`` (the live child's target, the tree on its ``sys.path``) the imported one."""
    _imported[:] = [tree]
