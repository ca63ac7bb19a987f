"""NPD007's small model, judged by sglang 0.5.23's own code on every real config.json the repository holds.

For each config and its small model, sglang's ``get_config`` (transformers' AutoConfig and sglang's own
config classes, as the server loads them) and ``ModelConfig`` read both; the attention kind, head sizes
and the per-layer kinds sglang's model code computes (``DeepseekV2DecoderLayer._is_layer_sparse``,
``Glm4MoeDecoderLayer._is_layer_sparse``, ``Llama4DecoderLayer._is_moe_layer``, ``Qwen3MoeDecoderLayer.
stage_facts``, ``Qwen3NextConfig.layers_block_type``, the config's ``layer_types``) must be the same.
sglang is imported in a child interpreter (the release tree first on its path, behind npudoctor's NPU
stand-ins): ``tests/support/smallmodel_reading.py``.

Several configs of tests/data name no ``model_type``, which neither transformers nor sglang loads: each
is judged as it is (the small one must fail to load alike) and, where transformers registers its
architecture under one model type, once more with that ``model_type`` added.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from npudoctor.checks.npd007_dry_run.smallmodel import describe, small_model

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    [*(REPO / "examples" / "models").rglob("config.json"), *(REPO / "tests" / "data").rglob("config.json")]
)
PARAMETER_BOUND = 128_000_000  # DeepSeek-V3.2: 107 M, 63 M of them its DSA indexers (64 heads of 128 over q_lora_rank 1536, kept)
RELEASE = "0.5.23"
LOST_A_KIND = "deepseek-v3, its small model without dense layers"


def config_id(path: Path) -> str:
    return path.parent.name


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def registered_model_type(architecture: str) -> str | None:
    """The one model type transformers' auto mappings name ``architecture`` under, if one."""
    from transformers.models.auto import modeling_auto

    found = set()
    for name in dir(modeling_auto):
        if name.endswith("_MAPPING_NAMES"):
            for model_type, classes in getattr(modeling_auto, name).items():
                if architecture in (classes if isinstance(classes, (list, tuple)) else [classes]):
                    found.add(model_type)
    return found.pop() if len(found) == 1 else None


def judged_variants() -> list[tuple[str, dict]]:
    """Every config as it is and, where it names no model_type, with the one transformers registers;
    then real configs with the layer-pattern keys of their family's other checkpoints (Gemma 3's 5:1
    sliding/global at 62 layers, MoE on every second layer, a longer dense prefix, interleaved MoE)."""
    variants = []
    for path in CONFIGS:
        config = load(path)
        variants.append((config_id(path), config))
        model_type = registered_model_type((config.get("architectures") or [""])[0])
        if "model_type" not in config and model_type:
            variants.append((f"{config_id(path)}+model_type", {**config, "model_type": model_type}))
    models, data = (
        REPO / "examples" / "models",
        REPO / "tests" / "data" / "properties" / "deployments" / "models",
    )
    patterns = [
        ("gemma3", data, {"model_type": "gemma3_text", "num_hidden_layers": 62, "sliding_window_pattern": 6}),
        ("deepseek-v3", models, {"moe_layer_freq": 2, "first_k_dense_replace": 5}),
        ("glm45air", data, {"first_k_dense_replace": 3}),
        ("qwen3-next-80b-a3b", models, {"full_attention_interval": 3, "num_hidden_layers": 47}),
    ]
    fp8 = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    patterns.append(("deepseek-v3", models, {"quantization_config": fp8}))  # as DeepSeek-V3's own checkpoint
    llama4 = load(models / "llama-4-scout-17b-16e" / "config.json")
    llama4["text_config"] = {**llama4["text_config"], "interleave_moe_layer_step": 2}
    variants.append(("llama-4-scout-17b-16e+interleave_moe_layer_step 2", llama4))
    for name, folder, keys in patterns:
        variants.append((f"{name}+{' '.join(keys)}", {**load(folder / name / "config.json"), **keys}))
    return variants


VARIANTS = judged_variants()
VARIANT_IDS = [name for name, _ in VARIANTS]


def test_the_repository_holds_the_configs_it_should():
    assert {"deepseek-v3.2", "qwen3-next-80b-a3b", "llama-4-scout-17b-16e", "glm45air", "qwen25vl"} <= {
        config_id(p) for p in CONFIGS
    }


@pytest.mark.parametrize("path", CONFIGS, ids=config_id)
def test_the_input_is_untouched_and_the_model_small(path):
    config = load(path)
    before = copy.deepcopy(config)
    small = small_model(config)
    assert config == before
    assert small.config is not config
    assert estimated_parameters(small.config) < PARAMETER_BOUND, describe(small)
    assert len(small.layer_map) == len(small.layer_labels)
    text = (
        small.config.get("text_config", small.config)
        if "num_hidden_layers" not in small.config
        else small.config
    )
    original = config.get("text_config", config) if "num_hidden_layers" not in config else config
    assert text["num_hidden_layers"] <= original["num_hidden_layers"]
    assert text["num_hidden_layers"] + (1 if "MTP" in small.layer_labels else 0) == len(small.layer_map)
    assert all(0 <= i <= original["num_hidden_layers"] for i in small.layer_map)
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if original.get(key):
            assert text[key] >= 1
    vocab = text.get("vocab_size", 10**9)
    for part in (small.config, text):
        for key, value in part.items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                assert all(
                    v < vocab for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)
                )


def test_the_report_names_layers_kinds_and_kept_sizes():
    lines = describe(small_model(load(REPO / "examples/models/deepseek-v3.2/config.json")))
    assert lines[0] == (
        "num_hidden_layers 61 -> 4 (layers 0, 2, 3, 4, 61 of the original: dense, dense, MoE, MoE, MTP)"
    )
    assert "hidden_size 7168 -> 256" in lines
    assert "num_attention_heads 128 -> 16" in lines
    kept = lines[-1]
    for item in (
        "kv_lora_rank 512",
        "q_lora_rank 1536",
        "qk_rope_head_dim 64",
        "index_topk 2048",
        "index_n_heads 64",
    ):
        assert item in kept


def test_a_million_layers_cost_what_a_few_do():
    """The pattern, not the layer count, sets the work: a 10**6- and a 10**9-layer DeepSeek shrink alike."""
    config = load(REPO / "examples/models/deepseek-v3/config.json")
    results = []
    for layers in (10**6, 10**9):
        config["num_hidden_layers"] = layers
        tracemalloc.start()
        small = small_model(config)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1_000_000, peak
        assert estimated_parameters(small.config) < PARAMETER_BOUND
        results.append((small.config["num_hidden_layers"], small.layer_map[:-1]))
    assert results[0] == results[1] == (4, (0, 2, 3, 4))


def test_a_dense_run_of_a_billion_layers_is_cut_without_reading_it():
    config = {**load(REPO / "examples/models/deepseek-v3/config.json"), "num_hidden_layers": 10**9}
    config["first_k_dense_replace"] = 10**9 - 2
    tracemalloc.start()
    small = small_model(config)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak
    assert small.layer_labels == ("dense", "dense", "MoE", "MoE", "MTP")
    assert small.layer_map == (0, 10**9 - 3, 10**9 - 2, 10**9 - 1, 10**9)


@pytest.mark.parametrize(
    "config, message",
    [
        ([], "JSON object"),
        ({"hidden_size": 8}, "num_hidden_layers"),
        ({"num_hidden_layers": "61"}, "positive integer"),
        ({"num_hidden_layers": 4, "layer_types": ["full_attention"] * 10**7}, "layer_types lists 10000000"),
        ({"num_hidden_layers": 4, "num_experts": 8, "decoder_sparse_step": 10**9}, "decoder_sparse_step"),
    ],
    ids=["list", "no-layers", "string-layers", "huge-list", "huge-period"],
)
def test_what_cannot_be_shrunk_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        small_model(config)


def test_widths_stay_multiples_of_the_quantization_block():
    config = load(REPO / "examples/models/deepseek-v3/config.json")
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    small = small_model(config).config
    assert small["quantization_config"] == config["quantization_config"]
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size"):
        assert small[key] % 128 == 0 and small[key] < config[key], key


def test_vision_towers_keep_their_block_kinds():
    """Qwen2.5-VL's windowed and full-attention blocks, Qwen3-VL's deepstack taps: still valid indexes,
    both block kinds still there, as many deepstack taps."""
    text = load(REPO / "examples/models/qwen3-30b-a3b/config.json")
    windowed = {
        "depth": 32,
        "hidden_size": 1280,
        "num_heads": 16,
        "intermediate_size": 3420,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "out_hidden_size": 3584,
    }
    deepstack = {
        "depth": 27,
        "hidden_size": 1152,
        "num_heads": 16,
        "intermediate_size": 4304,
        "deepstack_visual_indexes": [8, 16, 24],
        "out_hidden_size": 2048,
    }
    for vision in (windowed, deepstack):
        small = small_model({**text, "vision_config": vision}).config
        tower = small["vision_config"]
        assert tower["depth"] < vision["depth"]
        assert tower["hidden_size"] // tower["num_heads"] == vision["hidden_size"] // vision["num_heads"]
        assert tower["out_hidden_size"] == small["hidden_size"]
        if "fullatt_block_indexes" in vision:
            full = tower["fullatt_block_indexes"]
            assert full and all(0 <= i < tower["depth"] for i in full) and len(full) < tower["depth"]
        if "deepstack_visual_indexes" in vision:
            taps = tower["deepstack_visual_indexes"]
            assert len(taps) == 3 and all(0 <= i < tower["depth"] for i in taps)


def test_per_layer_lists_follow_the_layers_kept():
    """A list indexed by layer is rewritten for the small layers: a dense layer deep in the stack stays."""
    config = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "mlp_only_layers": [0, 40],
        "layer_types": ["full_attention"] * 47 + ["sliding_attention"],
    }
    small = small_model(config)
    text = small.config
    kinds = {(i in text["mlp_only_layers"], t) for i, t in enumerate(text["layer_types"])}
    original = {(i in config["mlp_only_layers"], t) for i, t in enumerate(config["layer_types"])}
    assert kinds == original
    assert [config["layer_types"][i] for i in small.layer_map] == text["layer_types"]


# --- judged by sglang's code ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def judged(release, tmp_path_factory) -> dict:
    """sglang's reading of every config and its small model (one child interpreter for all)."""
    base = tmp_path_factory.mktemp("smallmodels")
    pairs = []
    for name, config in VARIANTS:
        for side, written in (("original", config), ("small", small_model(config).config)):
            folder = base / side / name
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(written))
        pairs.append([name, str(base / "original" / name), str(base / "small" / name)])
    lost = small_model(load(REPO / "examples/models/deepseek-v3/config.json")).config
    lost["first_k_dense_replace"] = 0  # every layer MoE: the dense kinds are gone
    (base / LOST_A_KIND).mkdir()
    (base / LOST_A_KIND / "config.json").write_text(json.dumps(lost))
    pairs.append([LOST_A_KIND, str(REPO / "examples/models/deepseek-v3"), str(base / LOST_A_KIND)])
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "smallmodel_reading.py"), json.dumps(pairs)],
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(release(RELEASE)),
            "PATH": "/usr/bin:/bin",
            "HOME": str(base),
            "HF_HUB_OFFLINE": "1",
        },
        cwd=base,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", VARIANT_IDS)
def test_sglang_loads_the_small_config_as_the_original(judged, name):
    original, small = judged[name]["original"], judged[name]["small"]
    assert small["config_class"] == original["config_class"], (original, small)
    assert small.get("error") == original.get("error")


@pytest.mark.parametrize("name", VARIANT_IDS)
def test_sglang_sees_the_same_attention_and_layer_kinds(judged, name):
    original, small = judged[name]["original"], judged[name]["small"]
    if "error" in original:
        pytest.skip(f"sglang {RELEASE} does not load the original: {original['error']}")
    for key in (
        "attention_arch",
        "head_dim",
        "v_head_dim",
        "kv_head_ratio",
        "architectures",
        "is_multimodal",
        "index_head_dim",
        "index_n_heads",
        "index_topk",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "dsa",
        "quantization",
    ):
        assert small["model_config"].get(key) == original["model_config"].get(key), key
    assert set(map(tuple, small["layer_kinds"])) == set(map(tuple, original["layer_kinds"]))
    assert small["layer_kinds_by_map"] == [original["layer_kinds"][i] for i in small["mapped"]]


@pytest.mark.parametrize("name", VARIANT_IDS)
def test_every_token_id_sglang_reads_is_in_the_small_vocabulary(judged, name):
    """Including those the config class fills in (Qwen2.5-VL's image and video token ids)."""
    small = judged[name]["small"]
    if "error" in small:
        pytest.skip(f"sglang {RELEASE} does not load it: {small['error']}")
    outside = {
        key: ids for key, ids in small["token_ids"].items() if any(i >= small["vocab_size"] for i in ids)
    }
    assert not outside, (small["vocab_size"], outside)


def test_the_comparison_sees_a_lost_layer_kind(judged):
    """The judgement is not vacuous: a small DeepSeek-V3 without its dense layers reads differently."""
    original, small = judged[LOST_A_KIND]["original"], judged[LOST_A_KIND]["small"]
    assert small["config_class"] == original["config_class"]
    assert set(map(tuple, small["layer_kinds"])) < set(map(tuple, original["layer_kinds"]))


def estimated_parameters(config: dict) -> int:
    """Weights of the small model, counted from its config: embeddings and head, each layer's attention
    (MLA with its DSA indexer, or Q/K/V/O; linear attention's projections where it has them) and its
    FFN, dense or MoE (routed and shared experts), and the vision tower."""
    text = config["text_config"] if "num_hidden_layers" not in config else config
    hidden, vocab = text["hidden_size"], text.get("vocab_size", 512)
    heads = text.get("num_attention_heads", 1)
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    if "kv_lora_rank" in text:
        nope, rope, v_dim = text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"]
        q_rank, kv_rank = text.get("q_lora_rank") or hidden, text["kv_lora_rank"]
        attention = hidden * q_rank + q_rank * heads * (nope + rope) + hidden * (kv_rank + rope)
        attention += kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
        if "index_n_heads" in text:
            attention += (
                q_rank * text["index_n_heads"] * text["index_head_dim"] + hidden * text["index_head_dim"]
            )
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    if "linear_num_value_heads" in text:
        keys = text["linear_num_key_heads"] * text["linear_key_head_dim"]
        values = text["linear_num_value_heads"] * text["linear_value_head_dim"]
        attention = max(attention, hidden * (2 * keys + 2 * values) + values * hidden)
    experts = next(
        (text[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if text.get(k)), 0
    )
    expert_ffn = text.get("moe_intermediate_size") or text.get("intermediate_size", 0)
    shared = (text.get("n_shared_experts") or 0) * expert_ffn + (
        text.get("shared_expert_intermediate_size") or 0
    )
    dense_ffn = max(text.get("intermediate_size", 0), text.get("intermediate_size_mlp", 0))
    ffn = 3 * hidden * max(dense_ffn, experts * expert_ffn + shared) + hidden * experts
    layers = text["num_hidden_layers"] + max(
        text.get("num_nextn_predict_layers") or 0, text.get("mtp_num_hidden_layers") or 0
    )
    total = 2 * vocab * hidden + layers * (attention + ffn)
    vision = config.get("vision_config") or {}
    if vision:
        width = vision.get("hidden_size") or vision.get("embed_dim") or 0
        depth = vision.get("depth") or vision.get("num_hidden_layers") or 0
        total += depth * (4 * width * width + 3 * width * (vision.get("intermediate_size") or 4 * width))
    return total
