"""Build the deployment's real sglang KV pools on CPU, small, for live probes.

Pools are built through their real constructors with the deployment's dimensions
(layers of the role's PP stage, KV heads per TP rank, head dims, MLA ranks, indexer dim,
page size) and only a few pages, so a DeepSeek-V3-sized pool costs tens of MB. The
constructor's signature decides which arguments are passed: releases add and rename
parameters, and a required one npudoctor cannot fill is reported, not guessed.

The probes' memory is flat in the model's size. A pool's layers are alike (one constructor loop
makes every layer's buffers, one loop offloads or describes them), so a probe of one pool builds at
most ``PROBED_LAYERS`` of them (``probed_model``), which every real model fills whole (DeepSeek-V3
and Kimi-K2 have 61 layers, Llama-3.1-405B 126), and says in its evidence when it built fewer than the
model has (``sampled_note``). A 2,000-layer config cost 3.4 GB before. A pool whose few pages would
still take more than ``MAX_POOL_BYTES`` (dimensions far beyond a real model's) is not built: the
probe cannot tell (``CannotBuild``), it does not pass.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import Any, TypeVar

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.engine.check import Probe
from npudoctor.lazy import lazy_module
from npudoctor.live import processstate
from npudoctor.results import Status
from npudoctor.static import poolclasses
from npudoctor.static.poolclasses import GENERIC_POOL

torch = lazy_module("torch")  # executed by the first live probe, never by the static depth

GENERIC_POOL_MODULE = "sglang.srt.mem_cache.memory_pool"
PAGES = 4  # pages per pool: enough for scattered indices across page boundaries
# The layers a probe builds of one pool: a real model's whole stage up to this (DeepSeek-V3: 61,
# Llama-3.1-405B: 126), the model's first layers beyond it. The live child's peak grows ~1.4 MB a
# probed layer (DeepSeek-V3's dimensions): 128 layers cost ~180 MB over the import of sglang.
PROBED_LAYERS = 128
# One pool's buffers, at most: 128 layers of DeepSeek-V3 (MLA, 576 values a token) at page size 128
# take 94 MB, of Llama-3-70B's 8 KV heads at TP 1 take 335 MB.
MAX_POOL_BYTES = 512 * 1024 * 1024
T = TypeVar("T")


class CannotBuild(Exception):
    """The pool's constructor needs something the deployment does not say."""


def import_pool_modules() -> None:
    """Import the generic pools and every module that holds an NPU pool class, found in the
    imported sglang's source by what the classes are (``pools.npu_pool_classes``), not by path:
    ``hardware_backend/npu/memory_pool_npu.py`` since 0.5.7, ``Ascend*`` classes in
    ``mem_cache/memory_pool.py`` before."""
    importlib.import_module(GENERIC_POOL_MODULE)
    tree = processstate.imported_tree()
    for family in GENERIC_POOL:
        for cls in poolclasses.npu_pool_classes(tree, family):
            importlib.import_module(cls.module)


def npu_pool_classes(family: str) -> list[type]:
    """Loaded subclasses of the generic pool of ``family`` that live in an NPU module or carry an
    NPU/Ascend name; a class of an import attempt that failed halfway (not what its module now
    holds) is not one."""
    base = getattr(sys.modules[GENERIC_POOL_MODULE], GENERIC_POOL[family])
    found, stack = [], list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        npu = "npu" in cls.__module__ or cls.__name__.startswith(("NPU", "Ascend"))
        if npu and getattr(sys.modules.get(cls.__module__), cls.__name__, None) is cls:
            found.append(cls)
    return sorted(set(found), key=lambda c: c.__name__)


def no_pool_loaded(family: str, assumptions: tuple[str, ...], roles: tuple[str, ...]) -> Probe:
    """A live probe's answer when sglang loaded no NPU pool class of ``family``: cannot tell."""
    return Probe(
        Status.WARN,
        f"no NPU {family.upper()} pool class is loaded from sglang",
        assumptions=assumptions,
        roles=roles,
    )


def probed_model(model: ModelFacts | None) -> ModelFacts | None:
    """``model`` with at most ``PROBED_LAYERS`` layers, for a probe of properties every layer of a
    pool shares (see the module docstring); ``sampled_note`` says what was left out."""
    if model is None or model.num_layers <= PROBED_LAYERS:
        return model
    return dataclasses.replace(model, num_layers=PROBED_LAYERS)


def sampled_note(model: ModelFacts | None) -> str:
    """`` (...)`` for a probe's evidence when ``probed_model`` built fewer layers than the model has;
    empty when it built them all."""
    if model is None or model.num_layers <= PROBED_LAYERS:
        return ""
    return (
        f" (a model of its first {PROBED_LAYERS} of {model.num_layers} layers: every layer's buffers are"
        " built, offloaded and described by the same code, so npudoctor probes at most"
        f" {PROBED_LAYERS})"
    )


def build_pool(
    cls: type,
    model: ModelFacts | None,
    role: RoleFacts,
    dtype: torch.dtype | None = None,
    layers_range: tuple[int, int] | None = None,
) -> Any:
    """An instance of ``cls`` for this role, on CPU, ``PAGES`` pages large, in ``dtype`` (bfloat16).

    ``layers_range`` is one PP stage's ``(start_layer, end_layer)``, end exclusive as sglang's
    model runner passes ``model.end_layer``; by default the role's largest stage, from layer 0."""
    dtype = dtype or torch.bfloat16
    page_size = role.page_size
    first, end = layers_range or (0, _stage_layers(model, role))
    layers = end - first
    heads = max(1, (model.num_kv_heads if model else 8) // max(1, role.tp_size)) if not _is_mla(model) else 1
    known: dict[str, Any] = {
        "size": PAGES * page_size,
        "page_size": page_size,
        "dtype": dtype,
        "layer_num": layers,
        "device": "cpu",
        "enable_memory_saver": False,
        "start_layer": first,
        "end_layer": end if layers_range else layers - 1,
        "head_num": heads,
        "head_dim": model.head_dim if model else 128,
        "v_head_dim": model.v_head_dim if model else 128,
        "kv_lora_rank": (model.kv_lora_rank if model and model.kv_lora_rank else 512),
        "qk_rope_head_dim": (model.qk_rope_head_dim if model and model.qk_rope_head_dim else 64),
        "index_head_dim": model.index_head_dim if model else None,
        "enable_alt_stream": False,
        "enable_kv_cache_copy": False,
    }
    _within_budget(cls, known, layers, _is_mla(model))
    return construct(cls, known)


def _within_budget(cls: type, known: dict[str, Any], layers: int, mla: bool) -> None:
    """``CannotBuild`` when the pool's buffers would take more than ``MAX_POOL_BYTES``: K and V (or
    MLA's latent and rope parts) and the indexer's keys, two bytes a value, for the pool's pages and
    sglang's padding page."""
    tokens = known["size"] + known["page_size"]
    if mla:
        per_token = known["kv_lora_rank"] + known["qk_rope_head_dim"] + (known["index_head_dim"] or 0)
    else:
        per_token = known["head_num"] * (known["head_dim"] + known["v_head_dim"])
    needed = layers * tokens * per_token * 2
    if needed > MAX_POOL_BYTES:
        raise CannotBuild(
            f"a {cls.__name__} of {layers} layer(s), {tokens} token slots and {per_token} values a token"
            f" needs {needed >> 20} MiB, more than the {MAX_POOL_BYTES >> 20} MiB npudoctor builds on CPU"
        )


def construct(cls: type, known: dict[str, Any]) -> Any:
    """``cls(**known)`` restricted to the parameters its constructor has; a required one that
    ``known`` lacks is reported (``CannotBuild``), never guessed. Releases add and rename
    constructor parameters; the signature decides what is passed."""
    kwargs = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in known:
            kwargs[name] = known[name]
        elif parameter.default is inspect.Parameter.empty:
            raise CannotBuild(f"{cls.__name__}.__init__ needs {name!r}, which npudoctor cannot derive")
    return cls(**kwargs)


def kv_buffers(pool: Any) -> dict[str, list[torch.Tensor]]:
    """Per-layer KV tensors of a pool by attribute name (k_buffer, v_buffer, index_k_buffer, ...)."""
    found: dict[str, list[torch.Tensor]] = {}
    for name, value in vars(pool).items():
        if "buffer" not in name or name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[0] == pool.layer_num:
            found[name] = [value[i] for i in range(pool.layer_num)]
        elif (
            isinstance(value, (list, tuple))
            and len(value) == pool.layer_num
            and all(isinstance(t, torch.Tensor) for t in value)
        ):
            found[name] = list(value)
    return found


def token_rows(layer: torch.Tensor, tokens: int) -> torch.Tensor:
    """A per-layer buffer as ``(token slots, bytes-per-token)`` of raw bits, whatever its layout."""
    raw = layer.view(torch.uint8) if layer.element_size() == 1 else layer.view(torch.int16)
    if raw.numel() % tokens:
        raise ValueError(f"a layer buffer of shape {tuple(layer.shape)} does not hold {tokens} token slots")
    return raw.reshape(tokens, -1)


def _is_mla(model: ModelFacts | None) -> bool:
    return bool(model and model.attention.is_mla)


def _stage_layers(model: ModelFacts | None, role: RoleFacts) -> int:
    layers = model.num_layers if model else 4
    return max(1, -(-layers // max(1, role.pp_size)))  # the largest PP stage
