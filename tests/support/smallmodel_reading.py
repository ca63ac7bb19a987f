"""What sglang makes of a model config and of its small model, read in a fresh interpreter:

    python tests/support/smallmodel_reading.py '[[NAME, ORIGINAL_FOLDER, SMALL_FOLDER], ...]'

with a release tree on PYTHONPATH. sglang is imported behind npudoctor's NPU stand-ins
(``npudoctor.live.npusim.simulated_npu``), before anything imports transformers' image processors (their
torchvision check is made once). Prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path


def _sglang_reading(folder: str) -> dict:
    """What sglang 0.5.23 makes of the model in ``folder``: its config class, ModelConfig's attention
    facts, and each layer's kind by the model code's own functions."""
    from sglang.srt.configs.model_config import ModelConfig, is_deepseek_dsa
    from sglang.srt.utils.hf_transformers.config import get_config

    try:
        hf_config = get_config(folder, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - what sglang says of a config it cannot load is the fact
        return {
            "config_class": None,
            "error": f"{type(error).__name__}: {error}".replace(folder, "<folder>")[:300],
        }
    model = ModelConfig(folder)
    text = model.hf_text_config
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None) or heads
    facts = {
        "attention_arch": str(model.attention_arch),
        "head_dim": model.head_dim,
        "v_head_dim": getattr(model, "v_head_dim", None),
        "kv_head_ratio": heads // kv if heads and kv else None,
        "architectures": list(model.hf_config.architectures or []),
        "is_multimodal": bool(model.is_multimodal),
        "dsa": bool(is_deepseek_dsa(text)),
        "quantization": model.quantization,
        **{
            k: getattr(text, k, None)
            for k in ("index_head_dim", "index_n_heads", "index_topk", "kv_lora_rank", "qk_rope_head_dim")
        },
    }
    kinds = [
        _layer_kind_or_error(model.hf_config.architectures[0], text, i) for i in range(text.num_hidden_layers)
    ]
    return {
        "config_class": type(hf_config).__name__,
        "model_config": facts,
        "layer_kinds": kinds,
        "vocab_size": model.vocab_size,
        "token_ids": _token_ids(model.hf_config) | _token_ids(text),
    }


def _token_ids(config) -> dict[str, list[int]]:
    """Every token id the loaded config holds, its class's defaults included (the model embeds them)."""
    found = {}
    for name, value in vars(config).items():
        if name.endswith(("_token_id", "_token_index", "_token_ids")):
            ids = [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int)]
            if ids:
                found[name] = ids
    return found


def _layer_kind_or_error(architecture: str, text, layer: int) -> list:
    """The layer's kind, or the exception sglang's code raises computing it (a config the model would
    not build with, e.g. a DeepseekV3Config without ``moe_layer_freq``)."""
    try:
        return _layer_kind(architecture, text, layer)
    except Exception as error:  # noqa: BLE001 - the model code's own failure is the layer's kind here
        return [f"{type(error).__name__}: {error}"]


def _layer_kind(architecture: str, text, layer: int) -> list:
    """One layer's kind as sglang's model code computes it for ``architecture``."""
    kind = []
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        kind.append(layer_types[layer])
    if architecture.startswith(("DeepseekV3", "DeepseekV32", "DeepseekV2")):
        from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer as decoder

        kind += [
            decoder._is_layer_sparse(text, layer, False),
            decoder._is_layer_sparse(text, layer + 1, False),
        ]
    elif architecture.startswith("Glm4Moe"):
        from sglang.srt.models.glm4_moe import Glm4MoeDecoderLayer as decoder

        kind += [
            decoder._is_layer_sparse(text, layer, False),
            decoder._is_layer_sparse(text, layer + 1, False),
        ]
    elif architecture.startswith("Llama4"):
        from sglang.srt.models.llama4 import Llama4DecoderLayer

        holder = types.SimpleNamespace(config=text)
        kind += [
            Llama4DecoderLayer._is_moe_layer(holder, layer),
            Llama4DecoderLayer._is_moe_layer(holder, layer + 1),
        ]
    elif architecture.startswith("Qwen3Moe"):
        from sglang.srt.models.qwen3_moe import Qwen3MoeDecoderLayer

        # a declaration's repr names module-level singletons by address: the same in one process
        kind += [
            re.sub(r" at 0x[0-9a-f]+", "", repr(stage))
            for stage in Qwen3MoeDecoderLayer.stage_facts(text, layer)
        ]
    elif architecture.startswith("Qwen3Next"):
        kind.append(text.layers_block_type[layer])
    return kind


def _child(pairs: list[list[str]]) -> dict:
    from npudoctor.checks.npd007_dry_run.smallmodel import small_model as shrink
    from npudoctor.live.npusim import simulated_npu

    judged = {}
    with simulated_npu():
        for name, original, small in pairs:
            readings = {"original": _sglang_reading(original), "small": _sglang_reading(small)}
            plan = shrink(json.loads((Path(original) / "config.json").read_text()))  # the plan's layer map
            main = [i for i, label in zip(plan.layer_map, plan.layer_labels) if label != "MTP"]
            readings["small"]["mapped"] = main
            readings["small"]["layer_kinds_by_map"] = readings["small"].get("layer_kinds")
            judged[name] = readings
    return judged


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1])), default=str))
