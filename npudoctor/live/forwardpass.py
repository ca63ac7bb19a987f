"""One forward pass of sglang's model runner, stood in around the code a live probe runs.

A probe that runs an attention backend's ``forward`` needs what the model runner hands it: a real
``ForwardBatch`` of the batch (``extend_forward_batch``), the forward context the runner publishes
around a forward (``forward_context``), and the fields of the ``RadixAttention`` layer with the
role's per-rank attention sizes (``AttentionDims``, ``radix_attention_layer``). ``calls_recorded``
tells whether the pass reached a given method of an object.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.lazy import lazy_module
from npudoctor.live.processstate import dataclass_instance

torch = lazy_module("torch")  # executed by the first live probe, never by the static depth

FORWARD_BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"
FORWARD_CONTEXT_MODULE = "sglang.srt.model_executor.forward_context"


@dataclass(frozen=True)
class AttentionDims:
    """Per-rank attention sizes of one role: what ``RadixAttention`` holds in the real server."""

    q_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    cp_size: int
    attn_tp_size: int

    @property
    def scaling(self) -> float:
        return self.head_dim**-0.5

    def __str__(self) -> str:
        return (
            f"{self.q_heads} q heads / {self.kv_heads} KV heads x {self.head_dim} per rank "
            f"(attention TP {self.attn_tp_size}), page size {self.page_size}"
        )


def attention_dims(model: ModelFacts | None, role: RoleFacts) -> AttentionDims:
    """Heads per attention-TP rank: sglang splits tp_size into attention DP x CP x TP
    (``dp_attention.compute_dp_attention_world_info``: attn_tp = tp / attn_dp / attn_cp);
    KV heads are replicated when there are fewer than attention-TP ranks. No model: a GQA
    layer of 32 query and 4 KV heads of 128."""
    dp_attention = str(role.server_args.get("enable_dp_attention", "")).lower() in ("true", "1")
    attn_dp = role.dp_size if dp_attention else 1
    attn_tp = max(1, role.tp_size // attn_dp // max(1, role.attn_cp_size))
    heads = model.num_heads if model else 32
    kv_heads = model.num_kv_heads if model else 4
    return AttentionDims(
        q_heads=max(1, heads // attn_tp),
        kv_heads=max(1, kv_heads // attn_tp),
        head_dim=model.head_dim if model else 128,
        v_head_dim=model.v_head_dim if model else 128,
        page_size=role.page_size,
        cp_size=role.attn_cp_size,
        attn_tp_size=attn_tp,
    )


def extend_forward_batch(
    prefix_lens: list[int], extend_lens: list[int], positions: list[int], out_cache_loc: Any
) -> Any:
    """A real ``ForwardBatch`` of a pure extend (prefill) of requests with ``prefix_lens`` tokens
    cached and ``extend_lens`` new ones, made without its ``__init__`` (dataclass defaults for the
    rest): ``positions`` of the new tokens in their sequences, ``out_cache_loc`` the KV slots the
    layers save them to."""
    module = importlib.import_module(FORWARD_BATCH_MODULE)
    totals = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    values = {
        "forward_mode": module.ForwardMode.EXTEND,
        "batch_size": len(totals),
        "input_ids": torch.zeros(sum(extend_lens), dtype=torch.int64),
        "req_pool_indices": torch.arange(len(totals)),
        "seq_lens": torch.tensor(totals),
        "seq_lens_cpu": torch.tensor(totals),
        "seq_lens_sum": sum(totals),
        "extend_seq_lens": torch.tensor(extend_lens),
        "extend_seq_lens_cpu": list(extend_lens),
        "extend_prefix_lens": torch.tensor(prefix_lens),
        "extend_prefix_lens_cpu": list(prefix_lens),
        "extend_num_tokens": sum(extend_lens),
        "positions": torch.tensor(positions),
        "out_cache_loc": out_cache_loc.to(torch.int64),
        "attn_cp_metadata": None,
        "global_num_tokens_cpu": None,
    }
    return dataclass_instance(module.ForwardBatch, values)


@contextlib.contextmanager
def forward_context(backend: Any) -> Iterator[None]:
    """The forward context the model runner publishes around a forward (0.5.13+
    ``model_executor/forward_context.py``: ``get_token_to_kv_pool()`` reads the backend's pool
    there), with ``backend``; the previous one back afterwards. Releases without it: nothing."""
    module = sys.modules.get(FORWARD_CONTEXT_MODULE)
    context_cls = getattr(module, "ForwardContext", None)
    setter = getattr(module, "set_forward_context", None)
    if context_cls is None or setter is None:
        yield
        return
    previous = setter(context_cls(attn_backend=backend))
    try:
        yield
    finally:
        setter(previous)


def radix_attention_layer(dims: AttentionDims, layer_id: int = 0) -> Any:
    """The ``RadixAttention`` fields an attention backend reads, with the role's per-rank sizes:
    full attention, no sliding window, logit cap or KV scales."""
    return types.SimpleNamespace(
        tp_q_head_num=dims.q_heads,
        tp_k_head_num=dims.kv_heads,
        tp_v_head_num=dims.kv_heads,
        qk_head_dim=dims.head_dim,
        v_head_dim=dims.v_head_dim,
        head_dim=dims.head_dim,
        scaling=dims.scaling,
        layer_id=layer_id,
        is_cross_attention=False,
        sliding_window_size=-1,
        logit_cap=0.0,
        k_scale=None,
        v_scale=None,
    )


def calls_recorded(obj: Any, method: str) -> list[bool]:
    """Record (in the list returned) whether the pass reaches ``method`` on ``obj``: the installed
    method (or a fix's replacement), shadowed by an instance attribute that notes the call."""
    reached: list[bool] = []
    original = getattr(obj, method)

    def traced(*args: Any, **kwargs: Any) -> Any:
        reached.append(True)
        return original(*args, **kwargs)

    setattr(obj, method, traced)
    return reached
