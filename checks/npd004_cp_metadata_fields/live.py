"""NPD004's live probe: run one whole CP prefill attention layer of the installed sglang on CPU,
on every CP rank, and judge it against causal attention computed independently.
The batch's CP metadata comes from sglang's own preparation, called the way the release calls it:
the model's ``prepare_context_parallel_metadata`` call (``layers/utils/cp_utils.py``,
0.5.11-0.5.15), evaluated with the ``if`` tests around it in the model file of the deployment's
architecture (e.g. ``can_cp_split(...)`` in ``models/qwen3_moe.py``), and the CP strategy's
``prepare_cp_forward`` (``layers/cp/utils.py``, 0.5.15+: ``get_cp_strategy().build_metadata``)
after its own ``assert`` preconditions; a precondition that refuses a batch of several requests
is recorded (0.5.11/0.5.12 admit one request per CP batch) and the batch shrinks to one request.
Each rank's local q, k and v are taken from the batch as the zigzag layout puts them, by the
metadata's own ``split_list``/``zigzag_index``, padded to the rank's physical length where the
metadata names one (0.5.23 ``per_rank_actual_token``). The layer runs from where the backend
receives them (``AttentionBackend.forward``): the release's own K/V all-gather and save into the
KV pool (``_cp_allgather_and_save_kv_npu`` and what it calls: ``cp_utils`` through 0.5.22, the CP
strategy's ``materialize_full_kv`` on 0.5.23), then the FIA CP attention (``do_cp_attn_fia``).
The pool is the release's ``NPUMHATokenToKVPool``, paged with the deployment's page size, holding
each request's cached prefix in shuffled pages and random garbage everywhere else (the slots the
layer must save the new tokens' K/V to included). The attention-CP group is simulated across the
ranks (``npusim.Collectives``: the ranks run in turn, in passes, until every all-gather returns
the concatenation of what every rank sent). The backend is an ``AscendAttnBackend`` made without
its heavy ``__init__`` (``object.__new__`` + the attributes the path reads) with a layer carrying
the deployment's per-rank head counts and dims, under ``npu_runtime()`` (CPU references of
``npu_fused_infer_attention_score`` and ``npu_scatter_nd_update_``) and ``accelerator_on_cpu()``,
and every output row is compared with full causal attention of its token computed here (float64,
plain torch). An exception sglang raises itself on the way (a ``raise`` in its code, a field the
metadata lacks) fails with the raising file:line and the sglang calls that led there.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.lazy import lazy_module
from npudoctor.live import processstate, sglangexpr
from npudoctor.live.forwardpass import (
    AttentionDims,
    attention_dims,
    calls_recorded,
    extend_forward_batch,
    forward_context,
    radix_attention_layer,
)
from npudoctor.live.locations import Raised, code_location
from npudoctor.live.processstate import (
    attention_cp_group,
    dataclass_instance,
    environment,
    published_server_args,
    sglang_globals_restored,
    unpublished_parallel_name,
    with_parallel,
)
from npudoctor.results import Evidence, Location, Status
from npudoctor.static.dataflow import calls_to, enclosing_tests, functions_named
from npudoctor.static.source import FunctionRef, SourceTree

from .static import cp_strategy_name

torch = lazy_module("torch")  # executed by the first live probe, never by the static depth

# The model-level preparation (0.5.11-0.5.15) and the CP-strategy preparation (0.5.15+).
MODEL_PREPARATION = "prepare_context_parallel_metadata"
STRATEGY_PREPARATION = "prepare_cp_forward"
# 0.5.15 runs prepare_cp_forward only with this switch on (sglang turns it on by itself for
# its CP-v2 model classes, server_args._handle_context_parallelism); 0.5.2x ignores it.
CP_V2_SWITCH = {"SGLANG_ENABLE_CP_V2": "1"}
# Max abs difference allowed between the path's output and the float64 reference (float32 inputs).
TOLERANCE = 1e-4
# Passes over the CP ranks until their simulated all-gathers agree (npusim.Collectives).
MAX_PASSES = 4
# sglang's FIA mask length (AscendAttnMaskBuilder: fia_mask_len = 2048).
FIA_MASK_LEN = 2048
_MLA_MODEL = re.compile(rb"(?i)kv_lora_rank|mla|\bdsa|_dsa|\bnsa|_nsa")


# Modules the live depth imports up front; an import failure of an optional one is kept here.
BACKEND_MODULE = "sglang.srt.hardware_backend.npu.attention.ascend_backend"
MODEL_PACKAGE = "sglang.srt.models."
IMPORT_ERRORS: dict[str, str] = {}


class CannotProbe(Exception):
    """Something the probe needs is not there in a shape npudoctor recognises (not a defect)."""


# ----- the batch ------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """One request of a CP extend batch: ``prefix`` tokens already cached, ``extend`` new ones."""

    prefix: int
    extend: int

    @property
    def total(self) -> int:
        return self.prefix + self.extend

    def __str__(self) -> str:
        return f"{self.extend} tokens" + (
            f" after a cached {self.prefix}-token prefix" if self.prefix else ""
        )


# Two requests of different lengths, block sizes with remainders (45 = 12+11+11+11 for 2 CP
# ranks), the second after a radix-cache hit and spanning several 128-token pages.
SEVERAL = (Request(prefix=0, extend=45), Request(prefix=133, extend=158))
# For releases whose preparation admits one request per CP batch: the one with the prefix.
ONE = (Request(prefix=133, extend=158),)
# The probe's tensors for one batch, at most: the paged K/V cache of the batch's pages and the
# reference attention (float64 scores). Qwen3-30B-A3B at attention TP 1 and page size 128 takes
# ~40 MB; a config's head counts and sizes are not bounded otherwise (a typo of a billion heads).
MAX_WORKLOAD_BYTES = 512 * 1024 * 1024


def workload_bytes(dims: AttentionDims) -> int:
    """What ``workload`` allocates for the larger batch (``SEVERAL``), in bytes."""
    pages = 1 + sum(-(-r.total // dims.page_size) for r in SEVERAL)
    cache = pages * dims.page_size * dims.kv_heads * (dims.head_dim + dims.v_head_dim) * 4
    reference = max(r.extend * r.total for r in SEVERAL) * dims.q_heads * 8 * 2
    queries = sum(r.total for r in SEVERAL) * dims.q_heads * (dims.head_dim + dims.v_head_dim) * 4
    return cache + reference + queries


def describe_batch(batch: tuple[Request, ...]) -> str:
    noun = "request" if len(batch) == 1 else "requests"
    return f"{len(batch)} {noun} ({'; '.join(str(r) for r in batch)})"


# ----- tensors and the independent reference ----------------------------------------------
@dataclass
class Workload:
    """The batch's q, k and v (all extend tokens, batch order), its paged KV cache before the layer
    runs, where the layer must save the extend tokens' K/V, and the reference output."""

    batch: tuple[Request, ...]
    q: torch.Tensor  # (T, Hq, D), T = sum of extend lengths
    k_cache: torch.Tensor  # (slots, Hkv, D): cached prefixes in their pages, garbage elsewhere
    v_cache: torch.Tensor  # (slots, Hkv, Dv)
    block_tables: torch.Tensor  # (bs, pages) int32
    expected: torch.Tensor  # (T, Hq, Dv) float64
    request_of: list[int]  # extend token -> request index
    position_of: list[int]  # extend token -> position in its request's full sequence
    k: torch.Tensor = None  # (T, Hkv, D): the extend tokens' keys, which the layer saves
    v: torch.Tensor = None  # (T, Hkv, Dv)
    slots: torch.Tensor = None  # (T,): the cache slot of each extend token (the batch's out_cache_loc)


def workload(batch: tuple[Request, ...], dims: AttentionDims, seed: int = 0) -> Workload:
    generator = torch.Generator().manual_seed(seed)
    page = dims.page_size
    pages_per_request = [-(-r.total // page) for r in batch]
    total_pages = 1 + sum(pages_per_request)  # page 0 is sglang's reserved padding page
    order = (torch.randperm(total_pages - 1, generator=generator) + 1).tolist()
    width = max(pages_per_request)
    block_tables = torch.zeros(len(batch), width, dtype=torch.int32)
    slots = total_pages * page
    # garbage where no request's KV lives: a read outside a request's pages shows
    k_cache = 10 * torch.randn(slots, dims.kv_heads, dims.head_dim, generator=generator)
    v_cache = 10 * torch.randn(slots, dims.kv_heads, dims.v_head_dim, generator=generator)
    queries, new_keys, new_values, new_slots, expected, request_of, position_of = [], [], [], [], [], [], []
    for index, request in enumerate(batch):
        own = [order.pop() for _ in range(pages_per_request[index])]
        block_tables[index, : len(own)] = torch.tensor(own, dtype=torch.int32)
        token_slots = torch.tensor([own[j // page] * page + j % page for j in range(request.total)])
        keys = torch.randn(request.total, dims.kv_heads, dims.head_dim, generator=generator)
        values = torch.randn(request.total, dims.kv_heads, dims.v_head_dim, generator=generator)
        # only the cached prefix is in the cache before the layer runs; the layer saves the rest
        k_cache[token_slots[: request.prefix]] = keys[: request.prefix]
        v_cache[token_slots[: request.prefix]] = values[: request.prefix]
        new_keys.append(keys[request.prefix :])
        new_values.append(values[request.prefix :])
        new_slots.append(token_slots[request.prefix :])
        q = torch.randn(request.extend, dims.q_heads, dims.head_dim, generator=generator)
        queries.append(q)
        expected.append(causal_attention(q, keys, values, request.prefix, dims.scaling))
        request_of += [index] * request.extend
        position_of += range(request.prefix, request.total)
    return Workload(
        batch,
        torch.cat(queries),
        k_cache,
        v_cache,
        block_tables,
        torch.cat(expected),
        request_of,
        position_of,
        torch.cat(new_keys),
        torch.cat(new_values),
        torch.cat(new_slots),
    )


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, prefix: int, scale: float
) -> torch.Tensor:
    """Full causal attention of one request in float64: query ``i`` (position ``prefix + i``)
    sees keys ``0..prefix + i``; query head ``h`` reads KV head ``h // (Hq / Hkv)``."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    visible = torch.arange(k.shape[0])[None, :] <= (prefix + torch.arange(q.shape[0]))[:, None]
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


# ----- the role's process state ------------------------------------------------------------
def parallel_values(role: RoleFacts, dims: AttentionDims, rank: int) -> dict[str, Any]:
    """This CP rank's view of the role's parallel layout (attention TP rank 0)."""
    return {
        "attn_cp_rank": rank,
        "attn_cp_size": dims.cp_size,
        "attn_tp_rank": 0,
        "attn_tp_size": dims.attn_tp_size,
        "attn_dp_rank": 0,
        "attn_dp_size": 1,
        "tp_rank": rank * dims.attn_tp_size,
        "tp_size": role.tp_size,
        "enable_prefill_cp": role.prefill_context_parallel,
        "cp_strategy": cp_strategy_name(role),
        "enable_cp_tp_group_sharing": False,
        "enable_dp_attention": False,
    }


# ----- finding sglang's CP preparations -------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """An ``if`` test around a preparation call (or an ``assert`` at its top) that must hold."""

    node: ast.expr
    holds_when: bool  # True: the call is in the body; False: in the else branch
    location: Location

    @property
    def text(self) -> str:
        return ast.unparse(self.node)


@dataclass(frozen=True)
class Preparation:
    """One way the release builds ``forward_batch.attn_cp_metadata`` for a CP extend.

    ``call`` and ``conditions`` are sglang's own expressions; they are evaluated with the
    names their module's imports bind (``bindings``: name -> (module, attribute)), so the
    model module itself is never imported (its import chain pulls the model's kernels)."""

    name: str  # the preparation function
    filename: str  # the file the expressions come from, so tracebacks name sglang file:line
    location: Location  # the call (model-level) or the function (strategy)
    conditions: tuple[Condition, ...]
    call: ast.expr  # the expression that prepares the metadata
    bindings: dict[str, tuple[str, str]]
    env: dict[str, str] = field(default_factory=dict)  # switches this preparation needs
    assigns: bool = True  # the call's value is the metadata (model-level); else it sets it itself

    def __str__(self) -> str:
        where = "called at" if self.assigns else "at"
        return f"{self.name} ({where} {self.location.path}:{self.location.line})"

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(module for module, _ in self.bindings.values()))


def find_preparations(tree: SourceTree, model: ModelFacts | None) -> list[Preparation]:
    """Every CP metadata preparation of the release that serves this model's FIA CP path."""
    return _model_preparations(tree, model) + _strategy_preparations(tree)


def import_modules() -> None:
    """Import the NPU attention backend and the modules the CP preparations' names come from,
    before any probe: sglang modules decide ``_is_npu = is_npu()`` at import time, and the
    NPU runtime of the probes (``torch.npu``) must not be there yet. A preparation module
    that fails to import is recorded in ``IMPORT_ERRORS`` and reported by the probe; the
    backend module must import."""
    tree = processstate.imported_tree()
    if tree.module_path(BACKEND_MODULE) is not None:
        importlib.import_module(BACKEND_MODULE)
    try:  # the NPU KV pool the layer saves its K/V to
        from npudoctor.live import livepools

        livepools.import_pool_modules()
    except Exception as error:
        IMPORT_ERRORS["NPU KV pools"] = f"{type(error).__name__}: {error}"
    everyone = _model_preparations(tree, None, every_model=True) + _strategy_preparations(tree)
    for preparation in everyone:
        for module in preparation.modules:
            if module.startswith(MODEL_PACKAGE):
                continue  # never a model module (its import chain pulls the model's kernels)
            try:
                importlib.import_module(module)
            except Exception as error:
                IMPORT_ERRORS[module] = f"{type(error).__name__}: {error}"


def _model_preparations(
    tree: SourceTree, model: ModelFacts | None, every_model: bool = False
) -> list[Preparation]:
    """Calls of the model-level preparation in the model file of the deployment's
    architecture; with no model, in every model file that is not an MLA model (MLA takes
    another CP attention path, so it never reaches ``do_cp_attn_fia``): files that mention
    MLA or its DeepSeek sparse-attention variants (``kv_lora_rank``, ``mla``, ``dsa``, ``nsa``)."""
    calls = calls_to(tree, MODEL_PREPARATION, under="srt/models")
    architectures = set(model.architectures) if model else set()
    files = {c.path for name in architectures for c in tree.find_classes(name, under="srt/models")}
    if every_model:
        chosen = calls
    elif files:
        chosen = [(ref, call) for ref, call in calls if ref.path in files]
    else:
        chosen = [(ref, call) for ref, call in calls if not _MLA_MODEL.search(tree.read(ref.path))]
    found = []
    for ref, call in chosen:
        tests = tuple(
            Condition(node.test, taken, Location(ref.relpath, node.test.lineno, ref.qualname))
            for node, taken in enclosing_tests(ref.node, call)
        )
        local = {a.arg for a in ref.parameters}
        used = sglangexpr.free_names([call, *(t.node for t in tests)]) - local
        found.append(
            Preparation(
                MODEL_PREPARATION,
                str(ref.path),
                Location(ref.relpath, call.lineno, ref.qualname),
                tests,
                call,
                sglangexpr.import_bindings(tree, ref.path, used),
            )
        )
    return found


def _strategy_preparations(tree: SourceTree) -> list[Preparation]:
    """The CP strategy's batch preparation, called as its runner calls it
    (``prepare_cp_forward(forward_batch)``), with the ``assert`` tests at its top as conditions."""
    found = []
    for ref in functions_named(tree, STRATEGY_PREPARATION, under="srt"):
        if ref.owner is not None:
            continue
        asserts = []
        for stmt in ref.node.body:
            if isinstance(stmt, ast.Assert):
                asserts.append(Condition(stmt.test, True, Location(ref.relpath, stmt.lineno, ref.qualname)))
            elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                break
        parameter = ref.parameters[0].arg if ref.parameters else "forward_batch"
        call = ast.parse(f"{ref.name}(forward_batch)", mode="eval").body
        module = tree.module_name(ref.path)
        names = sglangexpr.free_names([a.node for a in asserts]) - {parameter}
        bindings = {name: (module, name) for name in names | {ref.name}}
        renamed = tuple(
            dataclasses.replace(c, node=sglangexpr.renamed(c.node, parameter, "forward_batch"))
            for c in asserts
        )
        found.append(
            Preparation(
                STRATEGY_PREPARATION,
                str(ref.path),
                Location(ref.relpath, ref.line, ref.qualname),
                renamed,
                call,
                bindings,
                dict(CP_V2_SWITCH),
                assigns=False,
            )
        )
    return found


def _evaluate(expression: ast.expr, preparation: Preparation, names: dict[str, Any]) -> Any:
    """Evaluate one expression of the preparation's sglang source as its caller would
    (``sglangexpr.evaluate``); a name from a module that is not loaded: the probe cannot tell."""
    try:
        return sglangexpr.evaluate(
            expression, preparation.filename, preparation.bindings, names, IMPORT_ERRORS
        )
    except sglangexpr.NotLoaded as gap:
        raise CannotProbe(str(gap)) from None


# ----- one CP rank --------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure(Raised):
    """An exception on the CP path (``Raised``), and where on the path it was raised."""

    on_metadata: bool = False  # an AttributeError on the CP metadata object
    stage: str = "attention"  # "preparation", "sharding" (the CP strategy splitting the batch) or "attention"


@dataclass(frozen=True)
class Mismatch:
    """The first output value that differs from full causal attention."""

    request: int
    block: int  # the zigzag block of the request (prev block = rank, next = 2 * cp_size - 1 - rank)
    position: int
    head: int
    expected: float
    got: float
    wrong_rows: int
    rows: int


@dataclass(frozen=True)
class RankResult:
    rank: int
    rows: int = 0  # local query rows compared
    max_error: float = 0.0
    mismatch: Mismatch | None = None
    failure: Failure | None = None
    refused: tuple[Condition, ...] = ()  # conditions that did not hold for this batch
    reached: bool = True  # the layer ran the FIA CP attention (the entry) on this rank


@dataclass
class PreparationRun:
    """What happened for one preparation: the batch that ran, and each rank's result."""

    preparation: Preparation
    batch: tuple[Request, ...] = ()
    refused_several: tuple[Condition, ...] = ()  # why a batch of several requests did not run
    ranks: list[RankResult] = field(default_factory=list)
    not_reached: tuple[Condition, ...] = ()  # conditions that refused even one request


def run_preparation(
    backend_cls: type, method: str, preparation: Preparation, role: RoleFacts, dims: AttentionDims
) -> PreparationRun:
    """Run the CP attention for every CP rank of the role with metadata from ``preparation``:
    a batch of several requests, or one request where the preparation refuses several."""
    with sglang_globals_restored():
        return _run_batches(backend_cls, method, preparation, role, dims)


def _run_batches(
    backend_cls: type, method: str, preparation: Preparation, role: RoleFacts, dims: AttentionDims
) -> PreparationRun:
    run = PreparationRun(preparation)
    for batch in (SEVERAL, ONE):
        load = workload(batch, dims)
        results = _ranks_together(backend_cls, method, preparation, role, dims, load)
        refused = next((r.refused for r in results if r.refused), ())
        if refused:
            if batch is SEVERAL:
                run.refused_several = refused
                continue
            run.not_reached = refused
            return run
        run.batch = batch
        run.ranks = results
        return run
    return run


def _ranks_together(
    backend_cls: type,
    method: str,
    preparation: Preparation,
    role: RoleFacts,
    dims: AttentionDims,
    load: Workload,
) -> list[RankResult]:
    """Every CP rank's layer, run in this process one rank after the other, with the attention-CP
    group's all-gathers simulated across them (``npusim.Collectives``): passes over the ranks until
    every gather returned what every rank sent (``MAX_PASSES``), so each rank's K/V all-gather gets
    its peers' real shares."""
    from npudoctor.live.npusim import Collectives

    collectives = Collectives(dims.cp_size)
    results: list[RankResult] = []
    for _ in range(MAX_PASSES):
        collectives.begin_pass()
        results = [
            _rank_in_role(backend_cls, method, preparation, role, dims, load, rank, collectives)
            for rank in range(dims.cp_size)
        ]
        if collectives.settled():
            return results
    unsettled = Failure(
        "CannotProbe",
        f"the CP ranks' all-gathers still sent other tensors after {MAX_PASSES} passes over the ranks",
        None,
    )
    return [dataclasses.replace(r, failure=r.failure or unsettled, mismatch=None) for r in results]


def _rank_in_role(
    backend_cls: type,
    method: str,
    preparation: Preparation,
    role: RoleFacts,
    dims: AttentionDims,
    load: Workload,
    rank: int,
    collectives: Any,
) -> RankResult:
    from npudoctor.live.npusim import accelerator_on_cpu

    group = collectives.group(rank)

    def probe() -> RankResult:
        collectives.begin_rank(rank)  # a retry of the rank (with_parallel) sends its tensors again
        with (
            environment({**role.env, **preparation.env}),
            published_server_args(role),
            accelerator_on_cpu(),
            attention_cp_group(group),
        ):
            return _run_rank(backend_cls, method, preparation, dims, load, rank)

    try:
        return with_parallel(probe, {**parallel_values(role, dims, rank), "attn_cp_group": group})
    except Exception as error:  # setting up the role's process state failed: not a finding
        return RankResult(rank, failure=failure_of(error, None, stage="preparation"))


def _run_rank(
    backend_cls: type, method: str, preparation: Preparation, dims: AttentionDims, load: Workload, rank: int
) -> RankResult:
    forward_batch = extend_forward_batch(
        [r.prefix for r in load.batch], [r.extend for r in load.batch], load.position_of, load.slots
    )
    names = _caller_names(forward_batch, load, dims, rank)
    try:
        refused = tuple(
            c for c in preparation.conditions if bool(_evaluate(c.node, preparation, names)) != c.holds_when
        )
        if refused:
            return RankResult(rank, refused=refused)
        prepared = _evaluate(preparation.call, preparation, names)
        if preparation.assigns:
            forward_batch.attn_cp_metadata = prepared
        metadata = forward_batch.attn_cp_metadata
    except Exception as error:
        _reraise_parallel(error)
        return RankResult(rank, failure=failure_of(error, None, stage="preparation"))
    try:
        origin, blocks = local_rows(metadata, load, forward_batch)
    except CannotProbe as error:
        return RankResult(rank, failure=failure_of(error, None, stage="preparation"))
    except Exception as error:  # the strategy's own sharding of the batch (sglang's code) raised
        _reraise_parallel(error)
        return RankResult(rank, failure=failure_of(error, metadata, stage="sharding"))

    physical = _physical_rows(metadata, rank, len(origin))
    q, k, v = (
        torch.zeros(physical, *whole.shape[1:]).index_copy_(0, torch.arange(len(origin)), whole[origin])
        for whole in (load.q, load.k, load.v)
    )
    try:
        pool = kv_pool(load, dims)
    except Exception as error:  # the release's pool cannot be built here: not a finding
        return RankResult(rank, failure=failure_of(error, None, stage="preparation"))
    backend = stand_in_backend(backend_cls, load, dims, pool)
    if "token_to_kv_pool" in {f.name for f in dataclasses.fields(forward_batch)}:
        forward_batch.token_to_kv_pool = pool  # 0.5.11/0.5.12 save through the batch's pool
    layer = radix_attention_layer(dims)
    reached = calls_recorded(backend, method)
    from npudoctor.live.npusim import npu_only_imports_bound

    try:
        with forward_context(backend), npu_only_imports_bound():
            output = backend.forward(q.reshape(physical, -1), k, v, layer, forward_batch, save_kv_cache=True)
    except Exception as error:
        _reraise_parallel(error)
        return RankResult(rank, failure=failure_of(error, metadata), reached=bool(reached))
    return dataclasses.replace(compare(output, load, origin, blocks, rank, dims), reached=bool(reached))


def _reraise_parallel(error: Exception) -> None:
    """A missing runtime parallel field is the probe's setup, not a finding: let
    ``with_parallel`` add it and run the rank again."""
    if unpublished_parallel_name(error) is not None:
        raise error


def _caller_names(forward_batch: Any, load: Workload, dims: AttentionDims, rank: int) -> dict[str, Any]:
    """The local names a model's ``forward`` sees where it prepares CP metadata (``self`` holds
    the CP rank and size the model reads from dp_attention at construction)."""
    model = types.SimpleNamespace(
        attn_cp_rank=rank, attn_cp_size=dims.cp_size, cp_rank=rank, cp_size=dims.cp_size
    )
    return {
        "self": model,
        "input_ids": forward_batch.input_ids,
        "positions": forward_batch.positions,
        "forward_batch": forward_batch,
        "input_embeds": None,
        "pp_proxy_tensors": None,
    }


def local_rows(metadata: Any, load: Workload, forward_batch: Any = None) -> tuple[torch.Tensor, list[int]]:
    """The extend tokens (indices into the batch's q) that this rank holds, in its local order,
    and the zigzag block of its request each one is in: the batch's tokens split by
    ``split_list`` (``2 * cp_size`` blocks per request, request after request) and gathered by
    ``zigzag_index``, as sglang's ``cp_split_and_rebuild_data`` / ``shard_hidden_states`` do.
    Metadata without a zigzag layout (the interleave strategy's) is sharded by the strategy's own
    ``shard_hidden_states`` (block 0 for every row)."""
    split_list = getattr(metadata, "split_list", None)
    zigzag_index = getattr(metadata, "zigzag_index", None)
    if (not split_list or not zigzag_index) and forward_batch is not None:
        sharded = _strategy_rows(load, forward_batch)
        if sharded is not None:
            return sharded, [0] * len(sharded)
    if not split_list or not zigzag_index:
        raise CannotProbe(
            f"{type(metadata).__name__} has no zigzag layout (split_list/zigzag_index): "
            "npudoctor models the zigzag (in-seq-split) CP layout only"
        )
    tokens = len(load.request_of)
    if sum(split_list) != tokens:
        raise CannotProbe(f"split_list {split_list} does not cover the batch's {tokens} extend tokens")
    pieces = torch.split(torch.arange(tokens), [int(x) for x in split_list])
    per_request = len(split_list) // len(load.batch)
    chosen = [int(i) for i in zigzag_index]
    blocks = [i % per_request for i in chosen for _ in range(len(pieces[i]))]
    return torch.cat([pieces[i] for i in chosen]), blocks


def _strategy_rows(load: Workload, forward_batch: Any) -> torch.Tensor | None:
    """The rows the selected CP strategy (0.5.14+ ``get_cp_strategy()``) gives this rank: its
    ``shard_hidden_states`` applied to the batch's token numbers (pad rows dropped)."""
    base = sys.modules.get("sglang.srt.layers.cp.base")
    strategy = base.get_cp_strategy() if base is not None and hasattr(base, "get_cp_strategy") else None
    shard = getattr(strategy, "shard_hidden_states", None)
    if not callable(shard):
        return None
    tokens = len(load.request_of)
    numbers = torch.arange(1, tokens + 1, dtype=torch.float32).unsqueeze(1)  # 0 marks a pad row
    local = shard(numbers, forward_batch)
    if not isinstance(local, torch.Tensor):
        return None
    rows = local.reshape(len(local), -1)[:, 0].round().long()
    return rows[rows > 0] - 1


def _physical_rows(metadata: Any, rank: int, logical: int) -> int:
    """Rows of this rank's local hidden states: the logical rows, or more where the metadata pads
    every rank to one physical length (0.5.23 ``pad_logical_token_to_physical``)."""
    per_rank = getattr(metadata, "per_rank_actual_token", None)
    if per_rank and len(per_rank) > rank and int(per_rank[rank]) > logical:
        return int(per_rank[rank])
    return logical


def stand_in_backend(backend_cls: type, load: Workload, dims: AttentionDims, pool: Any = None) -> Any:
    """The installed backend class without its ``__init__`` (it needs a ModelRunner), with the
    attributes the CP prefill layer reads, set as ``__init__``/``init_forward_metadata`` set them for
    a GQA model with FIA and no sliding window, dLLM or sparse offload: ``token_to_kv_pool`` is the
    role's KV pool, ``attn_cp_size`` its CP width."""
    backend = object.__new__(backend_cls)
    module = sys.modules[backend_cls.__module__]
    metadata_cls = getattr(module, "ForwardMetadata", None)
    if metadata_cls is not None and dataclasses.is_dataclass(metadata_cls):
        backend.forward_metadata = dataclass_instance(metadata_cls, {"block_tables": load.block_tables})
    else:
        backend.forward_metadata = types.SimpleNamespace(block_tables=load.block_tables)
    mask_builder = getattr(module, "AscendAttnMaskBuilder", None)
    generate = getattr(mask_builder, "generate_mask_flag", None)
    backend.fia_mask = (
        generate(FIA_MASK_LEN)
        if callable(generate)
        else ~torch.ones(FIA_MASK_LEN, FIA_MASK_LEN, dtype=torch.bool).tril()
    )
    backend.page_size = dims.page_size
    backend.device = torch.device("cpu")
    backend.use_fia = True
    backend.use_mla = False
    backend.attn_cp_size = dims.cp_size
    backend.token_to_kv_pool = pool
    backend.is_dllm_model = False
    backend.is_hybrid_swa = False
    backend.use_sliding_window_kv_pool = False
    backend.enable_sparsity_driven_kv_offload = False
    return backend


# The KV pool sglang's model runner builds for an MHA/GQA model on Ascend.
NPU_MHA_POOL = "NPUMHATokenToKVPool"


def kv_pool(load: Workload, dims: AttentionDims) -> Any:
    """The release's NPU MHA KV pool (``NPU_MHA_POOL``), built through its constructor for one layer
    of the role's per-rank KV heads and head dims and the workload's pages, in float32, holding the
    workload's cache: every request's cached prefix in its pages, garbage everywhere else, the
    slots the layer must save the extend tokens' K/V to included."""
    from npudoctor.live import livepools

    found = [c for c in livepools.npu_pool_classes("mha") if c.__name__ == NPU_MHA_POOL]
    if not found:
        raise CannotProbe(
            f"no {NPU_MHA_POOL} is loaded from this sglang: no KV pool to save the layer's K/V to"
        )
    slots = load.k_cache.shape[0]
    pool = livepools.construct(
        found[0],
        {
            "size": slots - dims.page_size,  # page 0 is the pool's padding page, on top of its size
            "page_size": dims.page_size,
            "dtype": torch.float32,
            "head_num": dims.kv_heads,
            "head_dim": dims.head_dim,
            "v_head_dim": dims.v_head_dim,
            "layer_num": 1,
            "device": "cpu",
            "enable_memory_saver": False,
            "start_layer": 0,
            "end_layer": 0,
            "enable_alt_stream": False,
            "enable_kv_cache_copy": False,
        },
    )
    for buffer, content in ((pool.get_key_buffer(0), load.k_cache), (pool.get_value_buffer(0), load.v_cache)):
        if buffer.numel() != content.numel():
            raise CannotProbe(
                f"{NPU_MHA_POOL} holds {tuple(buffer.shape)} per layer, not the {slots} token slots of the batch"
            )
        buffer.view(content.shape).copy_(content)
    return pool


def compare(
    output: Any, load: Workload, origin: torch.Tensor, blocks: list[int], rank: int, dims: AttentionDims
) -> RankResult:
    """Each local row against full causal attention of the token it holds."""
    rows = len(origin)
    if (
        not isinstance(output, torch.Tensor)
        or output.shape[0] < rows
        or output[:rows].numel() != rows * dims.q_heads * dims.v_head_dim
    ):
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        return RankResult(
            rank,
            rows,
            failure=Failure(
                "ShapeMismatch",
                f"returned {shape} for {rows} query rows of {dims.q_heads} heads x {dims.v_head_dim}",
                None,
            ),
        )
    got = output[:rows].reshape(rows, dims.q_heads, dims.v_head_dim).double()
    expected = load.expected[origin]
    error = (got - expected).abs().nan_to_num(float("inf"))
    max_error = float(error.max()) if error.numel() else 0.0
    wrong = (error.amax(dim=(1, 2)) > TOLERANCE).nonzero().flatten()
    mismatch = None
    if len(wrong):
        row = int(wrong[0])
        head = int(error[row].amax(dim=1).argmax())
        column = int(error[row, head].argmax())
        token = int(origin[row])
        request = load.request_of[token]
        mismatch = Mismatch(
            request=request,
            block=blocks[row],
            position=load.position_of[token],
            head=head,
            expected=float(expected[row, head, column]),
            got=float(got[row, head, column]),
            wrong_rows=len(wrong),
            rows=rows,
        )
    return RankResult(rank, rows, max_error, mismatch)


def failure_of(error: BaseException, metadata: Any, stage: str = "attention") -> Failure:
    """The exception (``Raised``), whether it is an attribute ``metadata`` lacks, and the stage."""
    on_metadata = (
        isinstance(error, AttributeError) and metadata is not None and getattr(error, "obj", None) is metadata
    )
    return Failure.of(error, on_metadata=on_metadata, stage=stage)


# Errors a layer run in the simulation may meet for want of what a real process has (a name an
# NPU-only import binds, a module, an attribute a stand-in lacks): never a finding before the FIA CP
# attention ran.
ENVIRONMENT_ERRORS = (
    "NameError",
    "ImportError",
    "ModuleNotFoundError",
    "AttributeError",
    "NotImplementedError",
)


def backend_method(entry: FunctionRef) -> tuple[type, Any]:
    """The installed class and method that ``entry`` (found in the source) denotes."""
    module = importlib.import_module(entry.tree.module_name(entry.path))
    if entry.owner is None:
        raise CannotProbe(f"{entry.qualname} is not a method of an attention backend class")
    cls = getattr(module, entry.owner.name, None)
    if cls is None or not inspect.isclass(cls):
        raise CannotProbe(
            f"{entry.tree.module_name(entry.path)} has no class {entry.owner.name} once imported"
        )
    function = getattr(cls, entry.name, None)
    if function is None:
        raise CannotProbe(f"the imported {cls.__name__} has no {entry.name}")
    return cls, function


# ----- the verdict ------------------------------------------------------------------------
def probe(
    tree: SourceTree,
    model: ModelFacts | None,
    entries: list[FunctionRef],
    live_roles: list[RoleFacts],
    roles: tuple[str, ...],
    assumptions: tuple[str, ...],
) -> Probe:
    """Run every entry on CPU, for every role and every CP metadata preparation of the release
    that serves ``model``, and judge each run."""
    preparations = find_preparations(tree, model)
    if not preparations:
        return Probe(
            Status.WARN,
            "cannot tell live: no CP metadata preparation of this release was found",
            (
                Evidence(
                    expected=f"sglang's CP metadata preparation ({MODEL_PREPARATION} called from "
                    f"the model, or {STRATEGY_PREPARATION}) to build a batch's metadata",
                    observed="none found under sglang/srt for this model: nothing to run the CP path with",
                ),
            ),
            assumptions,
            roles,
        )
    verdicts: list[LiveVerdict] = []
    for role in live_roles:
        dims = attention_dims(model, role)
        if workload_bytes(dims) > MAX_WORKLOAD_BYTES:
            reason = (
                f"a CP batch of {dims} takes {workload_bytes(dims) >> 20} MiB on CPU, more than the"
                f" {MAX_WORKLOAD_BYTES >> 20} MiB npudoctor allocates for it"
            )
            verdicts += [LiveVerdict(Status.WARN, _cannot_run(entry, reason)) for entry in entries]
            continue
        for entry in entries:
            try:
                backend, function = backend_method(entry)
            except (CannotProbe, ImportError) as reason:
                verdicts.append(LiveVerdict(Status.WARN, _cannot_run(entry, str(reason))))
                continue
            for preparation in preparations:
                skipped = _not_deployed(tree, model, role, preparation)
                if skipped is not None:
                    verdicts.append(skipped)
                    continue
                run = run_preparation(backend, entry.name, preparation, role, dims)
                verdicts.append(_judge_live(run, role, dims, entry, function))
    return _live_probe(verdicts, entries[0], assumptions, roles)


def _not_deployed(
    tree: SourceTree, model: ModelFacts | None, role: RoleFacts, preparation: Preparation
) -> LiveVerdict | None:
    """The CP strategy's preparation is not what the role runs where the release keeps the
    model-level one for models outside its CP-v2 list (``CP_V2_DEFAULT_MODEL_CLASSES``, 0.5.14-0.5.19;
    sglang turns ``SGLANG_ENABLE_CP_V2`` on only for those) and the role does not set the switch: a
    skip saying so (no model given: both run, the worst case)."""
    from .static import CP_V2_SWITCH as CP_V2_ENV
    from .static import cp_v2_models

    if preparation.name != STRATEGY_PREPARATION or model is None or not model.architectures:
        return None
    listed, where = cp_v2_models(tree)
    switch = role.env.get(CP_V2_ENV)
    if listed is None:
        return None
    if switch is not None:
        if str(switch).lower() in ("1", "true", "yes", "on"):
            return None
        why = f"the role sets {CP_V2_ENV}={switch}"
    elif any(a in listed for a in model.architectures):
        return None
    else:
        why = f"{'/'.join(model.architectures)} is not in {_CP_V2_MODELS} ({where}) and the role does not set {CP_V2_ENV}"
    return LiveVerdict(
        Status.SKIP,
        Evidence(
            expected=f"{preparation} to build CP metadata for role {role.name}",
            observed=f"not used for this role (live): {why}, so sglang runs the model-level preparation",
            location=preparation.location,
        ),
    )


_CP_V2_MODELS = "CP_V2_DEFAULT_MODEL_CLASSES"


@dataclass(frozen=True)
class LiveVerdict:
    """One (role, entry, preparation) run judged: its status, its evidence, a summary part."""

    status: Status
    evidence: Evidence
    summary: str = ""
    ran: bool = False  # the CP path ran for a batch (pass or fail), not only set-up trouble


def without_entry(scoped: Probe, entry_points: tuple[str, ...]) -> Probe:
    """The live verdict where the check runs no path (``scoped``: a skip, or the static verdict on a
    source without the FIA CP functions ``entry_points``): a pass (no such function) is confirmed on
    the imported NPU backend classes; anything else stands as it is."""
    if scoped.status is not Status.PASS:
        return scoped
    loaded = [
        cls
        for name, module in list(sys.modules.items())
        if name.startswith("sglang.") and "npu" in name
        for cls in vars(module).values()
        if isinstance(cls, type) and cls.__module__ == name and "Backend" in cls.__name__
    ]
    having = [c for c in loaded if any(hasattr(c, e) for e in entry_points)]
    if having:
        return Probe(
            Status.WARN,
            f"static and live see different code: {having[0].__name__} has {'/'.join(entry_points)} once imported",
            scoped.evidence,
            scoped.assumptions,
            scoped.roles,
        )
    names = ", ".join(sorted({c.__name__ for c in loaded})) or "none"
    observed = (
        scoped.evidence[0].observed + f"; live: the imported NPU backend classes ({names}) have none either"
    )
    return Probe(
        Status.PASS,
        scoped.summary,
        (dataclasses.replace(scoped.evidence[0], observed=observed),),
        scoped.assumptions,
        scoped.roles,
    )


def layer_text(entry: FunctionRef) -> str:
    """What the probe runs of one CP prefill attention layer, from the backend's entry point."""
    backend = entry.owner.name if entry.owner is not None else "the attention backend"
    return f"{backend}.forward from q/k/v: the K/V all-gather and save into the KV pool, then {entry.name}"


def _unreached_text(run: PreparationRun, entry: FunctionRef) -> str:
    unreached = [r.rank for r in run.ranks if not r.reached]
    if not unreached:
        return ""
    return f". The layer did not call {entry.name} on CP rank(s) {', '.join(map(str, unreached))}"


def _cannot_run(entry: FunctionRef, reason: str, location: Location | None = None) -> Evidence:
    return Evidence(
        expected=f"to run the installed {entry.qualname} on CPU",
        observed=f"could not (live): {reason}",
        location=location or Location(entry.relpath, entry.line, entry.qualname),
    )


def _batch_text(run: PreparationRun, dims: AttentionDims) -> str:
    ranks = ", ".join(str(r) for r in range(dims.cp_size))
    return f"batch of {describe_batch(run.batch)}, CP ranks {ranks} of {dims.cp_size}, {dims}"


def _refusal_text(run: PreparationRun) -> str:
    if not run.refused_several:
        return ""
    gates = "; ".join(f"`{c.text}` ({c.location.path}:{c.location.line})" for c in run.refused_several)
    return (
        f". {gates} refused a batch of {len(SEVERAL)} requests (live): this release admits one "
        f"request per CP batch, so the batch probed is one request"
    )


def _judge_live(
    run: PreparationRun,
    role: RoleFacts,
    dims: AttentionDims,
    entry: FunctionRef,
    function: object,
) -> LiveVerdict:
    """A run's ranks -> pass (every row right), fail (a wrong row or a defect exception) or warn."""
    preparation = run.preparation
    if run.not_reached:
        gates = "; ".join(f"`{c.text}` ({c.location.path}:{c.location.line})" for c in run.not_reached)
        return LiveVerdict(
            Status.SKIP,
            Evidence(
                expected=f"{preparation} to build CP metadata for role {role.name}",
                observed=f"not used for this role (live): {gates} is false even for one request",
                location=preparation.location,
            ),
        )
    where = f"role {role.name}, metadata from {preparation}, {_batch_text(run, dims)}"
    failed = [r for r in run.ranks if r.mismatch is not None or r.failure is not None]
    if not failed:
        worst = max(r.max_error for r in run.ranks)
        rows = sum(r.rows for r in run.ranks)
        return LiveVerdict(
            Status.PASS,
            Evidence(
                expected=f"the CP prefill attention layer ({layer_text(entry)}) gives every request, zigzag "
                "block and head the output of full causal attention over the request's whole sequence (max abs "
                f"error <= {TOLERANCE:g}; float32 inputs, float64 reference)",
                observed=f"live, CPU: {where}: every output row of every rank matches; max abs error {worst:.1e} "
                f"over {rows} rows" + _refusal_text(run) + _unreached_text(run, entry),
                location=code_location(function),
            ),
            f"batch of {len(run.batch)} request{'s' if len(run.batch) > 1 else ''}"
            + (", the most the release admits per CP batch" if run.refused_several else "")
            + f", max abs error {worst:.1e}",
            ran=True,
        )
    first = failed[0]
    also = [r.rank for r in failed[1:]]
    also_text = f"; {'rank' if len(also) == 1 else 'ranks'} {', '.join(map(str, also))} too" if also else ""
    if first.mismatch is not None and not first.reached:
        return LiveVerdict(
            Status.WARN,
            _cannot_run(
                entry,
                f"the layer computed other attention without calling {entry.name} (CP rank {first.rank}; "
                f"{where}): npudoctor's stand-in backend may not model the path it took",
            ),
            f"cannot tell: the layer did not run {entry.name}",
        )
    if first.mismatch is not None:
        return _mismatch_verdict(run, first, entry, function, where, also_text)
    failure = first.failure
    if not first.reached:
        # before the FIA CP attention ran (the K/V all-gather and save): what sglang's own code does
        # with its own metadata and the rank's tensors is a finding (an explicit raise, a read of a
        # field the metadata lacks, a None it returned, an operation of its own that fails: e.g. a
        # split by lengths that do not add up), not a name or import the simulation may lack, nor an
        # error of a CPU reference kernel or the simulated group
        defect = (
            failure.on_metadata
            or failure.on_none
            or failure.raised_by_sglang
            or failure.in_sglang_code
            and failure.kind not in ENVIRONMENT_ERRORS
        )
    else:
        defect = (
            failure.on_metadata
            or failure.on_none
            or failure.kind not in ("AttributeError", "NotImplementedError", "CannotProbe")
            or failure.kind == "NotImplementedError"
            and failure.raised_by_sglang
        )
    defect = defect and failure.stage in ("sharding", "attention")
    if not defect:
        return LiveVerdict(
            Status.WARN,
            _cannot_run(
                entry,
                f"{failure} during the {failure.stage}{failure.through} (CP rank {first.rank}; {where}){also_text}",
                failure.location,
            ),
            f"cannot tell: {failure.kind} during the {failure.stage}",
        )
    what = (
        f"reads only fields the CP metadata built by {preparation.name} defines"
        if failure.on_metadata
        else "runs for this batch"
    )
    subject = entry.qualname if first.reached else f"the CP prefill attention layer ({layer_text(entry)})"
    return LiveVerdict(
        Status.FAIL,
        Evidence(
            expected=f"{subject} {what}",
            observed=f"{failure}{failure.through} (live, CPU, CP rank {first.rank}; {where}){also_text}",
            location=failure.location,
        ),
        f"{failure.kind}: {failure.message}",
        ran=True,
    )


def _mismatch_verdict(
    run: PreparationRun,
    rank: RankResult,
    entry: FunctionRef,
    function: object,
    where: str,
    also_text: str,
) -> LiveVerdict:
    m = rank.mismatch
    request = run.batch[m.request]
    return LiveVerdict(
        Status.FAIL,
        Evidence(
            expected=f"request {m.request} ({request}) on CP rank {rank.rank}, zigzag block {m.block}, token at "
            f"position {m.position}, head {m.head}: {m.expected:.6f}, as full causal attention gives",
            observed=f"the layer ({layer_text(entry)}) gave {m.got:.6f} (live, CPU); {m.wrong_rows} of {m.rows} "
            f"rows of that rank differ by more than {TOLERANCE:g} (max abs error {rank.max_error:.3g}); {where}"
            + also_text
            + _refusal_text(run),
            location=code_location(function),
        ),
        f"wrong attention for request {m.request} on CP rank {rank.rank} (max abs error {rank.max_error:.3g})",
        ran=True,
    )


def _live_probe(
    verdicts: list[LiveVerdict], entry: FunctionRef, assumptions: tuple[str, ...], roles: tuple[str, ...]
) -> Probe:
    evidence = tuple(v.evidence for v in verdicts)
    statuses = {v.status for v in verdicts}
    if Status.FAIL in statuses:
        parts = list(dict.fromkeys(v.summary for v in verdicts if v.status is Status.FAIL))
        return Probe(
            Status.FAIL,
            f"live: the FIA context-parallel attention path fails for a CP batch: {'; '.join(parts)}",
            evidence,
            assumptions,
            roles,
        )
    if Status.WARN in statuses or not any(v.ran for v in verdicts):
        parts = [v.summary for v in verdicts if v.status is Status.WARN] or [
            "no CP metadata preparation admitted a batch for this deployment"
        ]
        return Probe(
            Status.WARN, f"cannot tell live: {'; '.join(dict.fromkeys(parts))}", evidence, assumptions, roles
        )
    parts = list(dict.fromkeys(v.summary for v in verdicts if v.status is Status.PASS))
    return Probe(
        Status.PASS,
        f"live: the CP prefill attention layer ({layer_text(entry)}) computes full causal attention on every "
        f"CP rank ({'; '.join(parts)})",
        evidence,
        assumptions,
        roles,
    )
