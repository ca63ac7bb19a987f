"""The deployment's model, small: the same architecture and layer structure, sizes a CPU runs in seconds.

The dry run starts sglang's real code on a model built from the deployment's ``config.json``; the
real sizes (7168 wide, 61 layers, a 129280-token vocabulary, 256 experts) would not fit a CPU host.
``small_model`` writes a new config that keeps what selects sglang's code paths and shrinks what
only scales them:

* kept: ``architectures``, ``model_type``, the attention kind (MHA/GQA/MLA and its LoRA ranks and
  head dims, the DSA indexer's ``index_*``), ``head_dim`` (written out where sglang would derive it
  from ``hidden_size``: NPU attention kernels are chosen by head size), RoPE settings, the
  quantization config, dtype, tied embeddings, sliding-window settings, ``max_position_embeddings``,
  ``num_experts_per_tok`` / ``n_group`` / ``topk_group``, the linear-attention head sizes;
* shrunk: ``hidden_size``, the FFN widths, the vocabulary (special token ids past it are moved to its
  top and recorded, with those the config class would fill in: ``_DEFAULT_TOKEN_IDS``), the expert count, the vision/audio towers' depth and width, and the layer count;
* attention heads are kept, so each TP rank keeps its real head count, except where one layer's
  attention weights alone would exceed ``ATTENTION_BUDGET`` (MLA's ``q_b_proj`` at 128 heads is 38 M
  parameters): then heads are halved, keeping the query/KV ratio, down to ``MIN_HEADS`` (a TP size of
  16 still divides them); and where the config class ignores ``head_dim`` and derives it from the
  width (``_HEAD_DIM_FROM_HIDDEN``): there the width must stay heads x head size, so one KV head and its
  query group are kept and the width is theirs.

The layers: every distinct layer kind of the original and every pair of neighbouring kinds (sglang
builds a layer from its own kind and the next one's: ``declare_ffn(sparse, next_layer_sparse)`` in
``DeepseekV2DecoderLayer.stage_facts``) appear in the small model, in the original's order, with as few
layers as the config's own pattern keys can say: the pattern's period is kept, a run of leading dense
layers (``first_k_dense_replace``) is cut to two by whole periods, per-layer lists are rewritten for
the layers kept, and the smallest prefix covering every kind and pair is taken. MTP draft layers
(``num_nextn_predict_layers``, ``mtp_num_hidden_layers``) are kept, one of them. The work is bounded by
the pattern, not the layer count: a config of 10**9 layers is read in a few dozen steps, and per-layer
lists longer than ``MAX_LAYER_LIST`` are refused.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

HIDDEN_SIZE = 256
FFN_SIZE = 128
EXPERT_FFN_SIZE = 64
VOCAB_SIZE = 512
MIN_EXPERTS = 16  # an EP or TP size of up to 16 still gets an expert per rank (Qwen3MoeSparseMoeBlock checks)
ATTENTION_BUDGET = 8_000_000  # parameters of one layer's attention projections
MIN_HEADS = 16
VISION_HEADS = 4
VISION_DEPTH = 2
MAX_PERIOD = 64  # a layer pattern repeating over more layers is refused: the small model would need them all
MAX_LAYER_LIST = 4096  # a per-layer list longer than this is refused, not scanned
# How often a pattern repeats when the config names no period; model types whose sglang code fixes one.
_DEFAULT_PERIODS = {
    # transformers' Gemma3TextConfig: sliding_window_pattern 6 when the config names none
    "gemma3": ("sliding_window_pattern", 6),
    # sglang's Qwen3NextConfig.full_attention_interval default
    "qwen3_next": ("full_attention_interval", 4),
}
# sglang's Llama4Attention: ``use_rope = (layer_id + 1) % 4 != 0``, whatever the config says.
_LLAMA4_NOPE_PERIOD = 4
# Config classes that compute head_dim as hidden_size // num_attention_heads and ignore a head_dim key
# (transformers 5's Qwen2_5_VLTextConfig, Qwen2VLTextConfig): their heads shrink, not their head size.
_HEAD_DIM_FROM_HIDDEN = ("qwen2_5_vl", "qwen2vl", "qwen2_vl")
# Token ids a config class fills in when config.json leaves them out (transformers 5's defaults): written
# out so they can move into the small vocabulary with the others.
_QWEN_VL_TOKEN_IDS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
_DEFAULT_TOKEN_IDS = {
    "qwen2_vl": {**_QWEN_VL_TOKEN_IDS, "bos_token_id": 151643, "eos_token_id": 151645},
    "qwen2_5_vl": {**_QWEN_VL_TOKEN_IDS, "bos_token_id": 151643, "eos_token_id": 151645},
    "qwen3_vl": _QWEN_VL_TOKEN_IDS,
    "qwen3_vl_moe": _QWEN_VL_TOKEN_IDS,
    "llama4": {"boi_token_index": 200080, "eoi_token_index": 200081, "image_token_index": 200092},
    "gemma3": {"boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144},
}
_EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
_KEPT_KEYS = (
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "head_dim",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "num_attention_heads",
    "num_key_value_heads",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "n_shared_experts",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "rope_theta",
    "rope_scaling",
    "partial_rotary_factor",
    "sliding_window",
    "use_sliding_window",
    "attention_chunk_size",
    "max_position_embeddings",
    "quantization_config",
    *_MTP_KEYS,
)


@dataclass(frozen=True)
class Shrunk:
    """One size the small model changes: the key (``text_config.hidden_size`` when nested)."""

    key: str
    original: Any
    small: Any


@dataclass(frozen=True)
class SmallModel:
    """The shrunk config (a new dict), what was shrunk and kept, and for each small layer (the main
    layers, then the MTP draft layers) the index of the original layer it stands for."""

    config: dict
    shrunk: tuple[Shrunk, ...]
    kept: tuple[str, ...]
    layer_map: tuple[int, ...]
    layer_labels: tuple[str, ...]
    original_layers: int


def small_model(config: dict) -> SmallModel:
    """The small model of ``config`` (a parsed HF ``config.json``; left untouched). ValueError when it is
    not an object, names no layer count, or its layer pattern is too large to shrink."""
    if not isinstance(config, dict):
        raise ValueError(f"a model config is a JSON object, not {type(config).__name__}")
    small = copy.deepcopy(config)
    text, prefix = _text_part(small)
    shrunk: list[Shrunk] = []
    layers = _positive_int(text.get("num_hidden_layers"), f"{prefix}num_hidden_layers")
    plan = _layer_plan(text, layers)
    _apply_layer_plan(text, plan, prefix, shrunk)
    mtp_map, mtp_labels = _keep_one_mtp_layer(text, layers, prefix, shrunk)
    _shrink_widths(text, prefix, shrunk)
    for key, value in _DEFAULT_TOKEN_IDS.get(str(small.get("model_type")), {}).items():
        small.setdefault(key, value)
    _remap_token_ids([(small, ""), (text, prefix)] if text is not small else [(small, "")], shrunk)
    for tower in ("vision_config", "audio_config"):
        if isinstance(small.get(tower), dict):
            _shrink_tower(small[tower], tower + ".", text.get("hidden_size"), shrunk)
    changed = {s.key for s in shrunk}
    kept = tuple(
        f"{prefix if key in text else ''}{key} {_brief(text.get(key, small.get(key)))}"
        for key in _KEPT_KEYS
        if (key in text or key in small) and prefix + key not in changed and key not in changed
    )
    return SmallModel(
        config=small,
        shrunk=tuple(shrunk),
        kept=kept,
        layer_map=plan.layer_map + mtp_map,
        layer_labels=plan.labels + mtp_labels,
        original_layers=layers,
    )


def describe(small: SmallModel) -> list[str]:
    """The report's lines: the layer count with the original layers kept and their kinds, every size
    shrunk, then what was kept as is."""
    main = len(small.layer_map) - sum(1 for label in small.layer_labels if label == "MTP")
    layers = ", ".join(map(str, small.layer_map))
    kinds = ", ".join(small.layer_labels)
    lines = [
        f"num_hidden_layers {small.original_layers} -> {main} (layers {layers} of the original: {kinds})"
    ]
    lines += [
        f"{s.key} {_brief(s.original)} -> {_brief(s.small)}"
        for s in small.shrunk
        if not s.key.endswith("num_hidden_layers")
    ]
    if small.kept:
        lines.append("kept: " + ", ".join(small.kept))
    return lines


# --- the layers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    """What sets each layer's kind: functions of the layer index, the leading run of dense layers
    (``offset``), the period after it, and the length of the longest per-layer list."""

    features: tuple[tuple[str, Callable[[int], Hashable]], ...]
    offset: int
    period: int
    listed: int

    def kind(self, index: int) -> tuple:
        return tuple(feature(index) for _, feature in self.features)

    def label(self, index: int) -> str:
        parts = [str(feature(index)) for _, feature in self.features]
        return "/".join(p for p in parts if p) or "decoder"


@dataclass(frozen=True)
class _LayerPlan:
    layers: int
    offset: int
    layer_map: tuple[int, ...]
    labels: tuple[str, ...]


def _pattern(text: dict, layers: int) -> _Pattern:
    """The layer-kind features sglang reads from this config, each a function of the layer index."""
    features: list[tuple[str, Callable[[int], Hashable]]] = []
    periods: list[int] = []
    offset = 0
    listed = 0
    model_type = str(text.get("model_type", "")) + " " + " ".join(map(str, text.get("architectures") or []))

    def period(key: str, default: int | None = None) -> int | None:
        value = text.get(key, default)
        if value in (None, 0):
            return None
        value = _positive_int(value, key)
        if value > MAX_PERIOD:
            raise ValueError(f"{key} {value}: a layer pattern repeating over more than {MAX_PERIOD} layers")
        periods.append(value)
        return value

    def per_layer(key: str) -> list | None:
        nonlocal listed
        value = text.get(key)
        if not isinstance(value, (list, str)) or not value:
            return None
        if len(value) > MAX_LAYER_LIST:
            raise ValueError(
                f"{key} lists {len(value)} layers: more than the {MAX_LAYER_LIST} npudoctor reads"
            )
        listed = max(listed, min(len(value), layers))
        return list(value)

    experts = next((text[k] for k in _EXPERT_COUNT_KEYS if text.get(k) is not None), None)
    if (
        experts and "first_k_dense_replace" in text
    ):  # DeepseekV2DecoderLayer/Glm4MoeDecoderLayer._is_layer_sparse
        offset = min(_non_negative_int(text["first_k_dense_replace"], "first_k_dense_replace"), layers)
        freq = period("moe_layer_freq") or 1
        features.append(("MoE", lambda i: "MoE" if i >= offset and i % freq == 0 else "dense"))
    elif experts and "interleave_moe_layer_step" in text:  # Llama4DecoderLayer._is_moe_layer
        step = period("interleave_moe_layer_step")
        features.append(("MoE", lambda i: "MoE" if step is None or (i + 1) % step == 0 else "dense"))
    elif experts:
        step = period("decoder_sparse_step") or 1
        dense = set(per_layer("mlp_only_layers") or ())
        features.append(("MoE", lambda i: "dense" if i in dense or (i + 1) % step else "MoE"))
    types = per_layer("layer_types")
    if types is not None:
        features.append(("layer_types", lambda i: types[i] if i < len(types) else ""))
    blocks = per_layer("layers_block_type")
    if blocks is not None:
        features.append(("layers_block_type", lambda i: blocks[i] if i < len(blocks) else ""))
    default = next((d for name, d in _DEFAULT_PERIODS.items() if name in model_type.lower()), (None, None))
    interval = period(
        "full_attention_interval", default[1] if default[0] == "full_attention_interval" else None
    )
    if interval and blocks is None and types is None:
        features.append(
            ("attention", lambda i: "full attention" if (i + 1) % interval == 0 else "linear attention")
        )
    sliding = period("sliding_window_pattern", default[1] if default[0] == "sliding_window_pattern" else None)
    if sliding and types is None:
        features.append(("sliding", lambda i: "global" if (i + 1) % sliding == 0 else "sliding"))
    if "llama4" in model_type.lower():
        no_rope = per_layer("no_rope_layers")
        if no_rope is not None:
            features.append(("rope", lambda i: "NoPE" if i < len(no_rope) and not no_rope[i] else "RoPE"))
        else:
            nope = period("nope_layer_interval", _LLAMA4_NOPE_PERIOD)
            features.append(("rope", lambda i: "NoPE" if (i + 1) % nope == 0 else "RoPE"))
    return _Pattern(tuple(features), offset, math.lcm(*periods) if periods else 1, listed)


def _layer_plan(text: dict, layers: int) -> _LayerPlan:
    """The fewest layers that show every layer kind and every pair of neighbouring kinds the original
    has, in its order: the leading dense run cut by whole periods (each cut tried), then the layers
    after it; checked against the same features read from the small config."""
    pattern = _pattern(text, layers)
    wanted = _kinds_and_pairs(pattern, layers)
    offset, period = pattern.offset, pattern.period
    plans = []
    for small_offset in range(min(offset, period + 2), -1, -1):
        if (offset - small_offset) % period or (small_offset == 0 < offset):
            continue
        cut = offset - small_offset

        def source(j: int, cut: int = cut, small_offset: int = small_offset) -> int:
            return j if j < small_offset - 1 else j + cut  # the original layer small layer j stands for

        kinds: list[tuple] = []
        seen: set = set()
        for j in range(min(layers - cut, pattern.listed + small_offset + 2 * period + 2)):
            kinds.append(pattern.kind(source(j)))
            seen.update([kinds[-1], *([(kinds[-2], kinds[-1])] if j else [])])
            if seen >= wanted:
                plan = _LayerPlan(
                    layers=j + 1,
                    offset=small_offset,
                    layer_map=tuple(source(k) for k in range(j + 1)),
                    labels=tuple(pattern.label(source(k)) for k in range(j + 1)),
                )
                if _plan_holds(text, plan, kinds):
                    plans.append(plan)
                break
    if not plans:  # pragma: no cover - the uncut plan always holds: it is the original's own prefix
        raise ValueError("npudoctor cannot write this layer pattern with fewer layers")
    return min(plans, key=lambda plan: plan.layers)  # the first of the fewest: the longest dense run kept


def _kinds_and_pairs(pattern: _Pattern, layers: int) -> set:
    """Every layer kind of the original and every pair of neighbours, read where they can differ: the
    listed layers and a period past them, and a period either side of the end of the dense run (the
    kinds repeat with the period everywhere else). Bounded by the lists and the period, not the layer
    count."""
    found: set = set()
    spans = [(0, pattern.listed + pattern.period + 1)]
    spans.append((pattern.offset - pattern.period - 1, pattern.offset + pattern.period + 1))
    for start, stop in spans:
        kinds = [pattern.kind(i) for i in range(max(0, start), min(layers, stop))]
        found.update(kinds, zip(kinds, kinds[1:]))
    return found


def _plan_holds(text: dict, plan: _LayerPlan, kinds: list[tuple]) -> bool:
    """Whether the small config, read by the same features, has exactly the planned kinds."""
    trial = dict(text)
    _apply_layer_plan(trial, plan, "", [])
    small = _pattern(trial, plan.layers)
    return [small.kind(j) for j in range(plan.layers)] == kinds


def _apply_layer_plan(text: dict, plan: _LayerPlan, prefix: str, shrunk: list[Shrunk]) -> None:
    """Write the plan's layer count, leading dense run and per-layer lists into ``text``."""
    _set(text, "num_hidden_layers", plan.layers, prefix, shrunk)
    if "first_k_dense_replace" in text and plan.offset != text["first_k_dense_replace"]:
        _set(text, "first_k_dense_replace", plan.offset, prefix, shrunk)
    for key in ("layer_types", "layers_block_type", "no_rope_layers"):
        value = text.get(key)
        if isinstance(value, list) and value:
            _set(text, key, [value[i] for i in plan.layer_map if i < len(value)], prefix, shrunk)
    if isinstance(text.get("mlp_only_layers"), list) and text["mlp_only_layers"]:
        dense = set(text["mlp_only_layers"])
        _set(text, "mlp_only_layers", [j for j, i in enumerate(plan.layer_map) if i in dense], prefix, shrunk)
    for key in ("max_window_layers",):  # a layer index threshold: the first small layer past it
        if isinstance(text.get(key), int) and not isinstance(text[key], bool):
            small = next((j for j, i in enumerate(plan.layer_map) if i >= text[key]), plan.layers)
            _set(text, key, small, prefix, shrunk)


def _keep_one_mtp_layer(text: dict, layers: int, prefix: str, shrunk: list[Shrunk]) -> tuple[tuple, tuple]:
    """MTP draft layers: one kept where the original has any (sglang's GLM-4 MoE MTP asserts one);
    they stand for the original's layers after its main ones."""
    for key in _MTP_KEYS:
        count = text.get(key)
        if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
            if count != 1:
                _set(text, key, 1, prefix, shrunk)
            return (layers,), ("MTP",)
    return (), ()


# --- the sizes ---------------------------------------------------------------------------------------


def _shrink_widths(text: dict, prefix: str, shrunk: list[Shrunk]) -> None:
    unit = _quantization_unit(text)
    heads = text.get("num_attention_heads")
    hidden = text.get("hidden_size")
    mla = "kv_lora_rank" in text
    attention_sized = isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and not mla
    if attention_sized and _derives_head_dim(text):
        _shrink_heads_with_width(text, hidden // heads, prefix, shrunk)
        hidden = None  # the width follows the heads
    elif attention_sized and "head_dim" not in text:
        text["head_dim"] = hidden // heads  # what sglang derives from the real width, written out
    if isinstance(hidden, int) and hidden > HIDDEN_SIZE:
        _set(text, "hidden_size", _multiple(HIDDEN_SIZE, unit), prefix, shrunk)
    for key, size in (
        ("intermediate_size", FFN_SIZE),
        ("intermediate_size_mlp", FFN_SIZE),
        ("moe_intermediate_size", EXPERT_FFN_SIZE),
        ("shared_expert_intermediate_size", EXPERT_FFN_SIZE),
    ):
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > _multiple(size, unit):
            _set(text, key, _multiple(size, unit), prefix, shrunk)
    _shrink_experts(text, prefix, shrunk)
    _shrink_heads(text, prefix, shrunk)
    vocab = text.get("vocab_size")
    if isinstance(vocab, int) and vocab > VOCAB_SIZE:
        _set(text, "vocab_size", VOCAB_SIZE, prefix, shrunk)


def _derives_head_dim(text: dict) -> bool:
    """Whether the config class computes head_dim from hidden_size, whatever the config says."""
    names = [str(text.get("model_type", "")), *map(str, text.get("architectures") or [])]
    return any(kind in name.lower() for name in names for kind in _HEAD_DIM_FROM_HIDDEN)


def _shrink_heads_with_width(text: dict, head_dim: int, prefix: str, shrunk: list[Shrunk]) -> None:
    """Where the width sets the head size: one KV head with its query group, the width their size."""
    heads, kv_heads = (
        text["num_attention_heads"],
        text.get("num_key_value_heads") or text["num_attention_heads"],
    )
    group = heads // kv_heads if kv_heads and heads % kv_heads == 0 else heads
    if group < heads:
        _set(text, "num_attention_heads", group, prefix, shrunk)
        if "num_key_value_heads" in text:
            _set(text, "num_key_value_heads", 1, prefix, shrunk)
    if text["hidden_size"] != group * head_dim:
        _set(text, "hidden_size", group * head_dim, prefix, shrunk)


def _shrink_experts(text: dict, prefix: str, shrunk: list[Shrunk]) -> None:
    """At least ``MIN_EXPERTS`` and the top-k, a multiple of ``n_group``, enough in ``topk_group``
    groups for the top-k (grouped top-k picks its experts from those groups)."""
    topk = text.get("num_experts_per_tok") or 1
    groups = text.get("n_group") or 1
    chosen_groups = text.get("topk_group") or groups
    needed = max(MIN_EXPERTS, topk, groups * math.ceil(topk / max(1, min(chosen_groups, groups))))
    needed = _multiple(needed, groups)
    for key in _EXPERT_COUNT_KEYS:
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > needed:
            _set(text, key, needed, prefix, shrunk)


def _shrink_heads(text: dict, prefix: str, shrunk: list[Shrunk]) -> None:
    """Halve the heads (and KV heads with them) while one layer's attention weights exceed the budget."""
    heads, kv_heads = text.get("num_attention_heads"), text.get("num_key_value_heads")
    if not isinstance(heads, int) or heads <= 0:
        return
    new_heads, new_kv = heads, kv_heads if isinstance(kv_heads, int) and kv_heads > 0 else None
    while _attention_parameters(text, new_heads, new_kv) > ATTENTION_BUDGET and new_heads // 2 >= MIN_HEADS:
        if new_heads % 2 or (new_kv is not None and new_kv > 1 and new_kv % 2):
            break
        new_heads //= 2
        if new_kv is not None and new_kv > 1:
            new_kv //= 2
    if new_heads != heads:
        _set(text, "num_attention_heads", new_heads, prefix, shrunk)
        if new_kv is not None and new_kv != kv_heads:
            _set(text, "num_key_value_heads", new_kv, prefix, shrunk)


def _attention_parameters(text: dict, heads: int, kv_heads: int | None) -> int:
    hidden = text.get("hidden_size") or HIDDEN_SIZE
    if "kv_lora_rank" in text:  # MLA: q_a/q_b (or q_proj), kv_a, kv_b, o_proj
        nope, rope = text.get("qk_nope_head_dim") or 0, text.get("qk_rope_head_dim") or 0
        v_dim, kv_rank = text.get("v_head_dim") or 0, text.get("kv_lora_rank") or 0
        q_rank = text.get("q_lora_rank")
        q = (hidden * q_rank + q_rank * heads * (nope + rope)) if q_rank else hidden * heads * (nope + rope)
        return q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
    head_dim = text.get("head_dim") or hidden // heads
    return hidden * head_dim * (2 * heads + 2 * (kv_heads or heads))


def _remap_token_ids(parts: list[tuple[dict, str]], shrunk: list[Shrunk]) -> None:
    """Token ids the small vocabulary does not hold move to its top, distinct ids kept distinct, one
    mapping for the text config and its multimodal wrapper (``image_token_index`` sits at the top)."""
    vocab = next((p["vocab_size"] for p, _ in reversed(parts) if isinstance(p.get("vocab_size"), int)), None)
    if vocab is None:
        return
    keyed = [(part, prefix, key) for part, prefix in parts for key in part if _is_token_id_key(key)]
    ids = sorted({i for part, _, key in keyed for i in _ids(part[key]) if i >= vocab})
    moved = {original: vocab - len(ids) + rank for rank, original in enumerate(ids)}
    for part, prefix, key in keyed:
        value = part[key]
        if isinstance(value, list):
            new = [moved.get(v, v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        else:
            new = moved.get(value, value) if isinstance(value, int) and not isinstance(value, bool) else value
        if new != value:
            _set(part, key, new, prefix, shrunk)


def _is_token_id_key(key: str) -> bool:
    return key.endswith(("_token_id", "_token_index", "_token_ids"))


def _shrink_tower(tower: dict, prefix: str, text_hidden: int | None, shrunk: list[Shrunk]) -> None:
    """A vision or audio encoder: its depth to ``VISION_DEPTH`` (full-attention block indexes moved to
    the last small block, deepstack indexes kept in number), ``VISION_HEADS`` heads of the real head
    size, a small FFN, and its output width the small text model's."""
    depth_key = next(
        (k for k in ("depth", "num_hidden_layers", "encoder_layers", "num_layers") if k in tower), None
    )
    if depth_key is not None:
        depth = _positive_int(tower[depth_key], prefix + depth_key)
        deepstack = [
            i for i in tower.get("deepstack_visual_indexes") or [] if isinstance(i, int) and i < depth
        ]
        small_depth = min(depth, max(VISION_DEPTH, len(deepstack) + 1))
        if small_depth != depth:
            _set(tower, depth_key, small_depth, prefix, shrunk)
        full = tower.get("fullatt_block_indexes")
        if isinstance(full, list) and full:
            in_range = [i for i in full if isinstance(i, int) and i < depth]
            windowed = len(in_range) < depth
            new_full = (
                [small_depth - 1] if in_range and windowed else list(range(small_depth)) if in_range else []
            )
            _set(tower, "fullatt_block_indexes", new_full, prefix, shrunk)
        if deepstack:
            _set(
                tower,
                "deepstack_visual_indexes",
                list(range(small_depth - len(deepstack), small_depth)),
                prefix,
                shrunk,
            )
    heads_key = next(
        (k for k in ("num_heads", "num_attention_heads", "encoder_attention_heads") if k in tower), None
    )
    width_key = next((k for k in ("hidden_size", "embed_dim", "d_model") if k in tower), None)
    if heads_key and width_key and isinstance(tower[heads_key], int) and tower[heads_key] > VISION_HEADS:
        head_size = tower[width_key] // tower[heads_key]
        _set(tower, heads_key, VISION_HEADS, prefix, shrunk)
        _set(tower, width_key, VISION_HEADS * head_size, prefix, shrunk)
    for key in ("intermediate_size", "encoder_ffn_dim"):
        if isinstance(tower.get(key), int) and tower[key] > FFN_SIZE:
            _set(tower, key, FFN_SIZE, prefix, shrunk)
    for key in ("out_hidden_size", "output_dim"):
        if key in tower and isinstance(text_hidden, int) and tower[key] != text_hidden:
            _set(tower, key, text_hidden, prefix, shrunk)


# --- helpers -----------------------------------------------------------------------------------------


def _text_part(config: dict) -> tuple[dict, str]:
    """The part holding the decoder (``text_config`` of a multimodal wrapper) and its key prefix."""
    nested = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(nested, dict) and "num_hidden_layers" in nested:
        return nested, "text_config."
    if "num_hidden_layers" not in config:
        raise ValueError("the model config names no num_hidden_layers (nor does its text_config)")
    return config, ""


def _quantization_unit(text: dict) -> int:
    """Shrunk widths stay multiples of the quantization's block or group size (an fp8 block of 128)."""
    quant = text.get("quantization_config")
    unit = 32
    if isinstance(quant, dict):
        for value in (quant.get("weight_block_size"), quant.get("group_size")):
            for size in value if isinstance(value, list) else [value]:
                if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 1024:
                    unit = math.lcm(unit, size)
    return unit


def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _multiple(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _positive_int(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} is {value!r}, not a positive integer")
    return value


def _non_negative_int(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a non-negative integer")
    return value


def _set(part: dict, key: str, value: Any, prefix: str, shrunk: list[Shrunk]) -> None:
    shrunk.append(Shrunk(prefix + key, part.get(key), value))
    part[key] = value


def _brief(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
