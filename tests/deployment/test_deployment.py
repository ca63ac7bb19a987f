"""The three ways to describe a deployment give the same facts; model facts come from real configs."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from npudoctor.deployment import load
from npudoctor.deployment.facts import AttentionKind, ModelFacts
from npudoctor.deployment.launch import parse_command
from npudoctor.errors import InputError

from support.repo import EXAMPLES

MODELS = EXAMPLES / "models"


def comparable(role):
    """What the checks read: everything but the raw inputs and the role's label."""
    data = dataclasses.asdict(role)
    for raw in ("name", "server_args", "unknown_args", "given"):
        data.pop(raw)
    return data


def test_launch_command_yaml_and_flags_agree(tmp_path, monkeypatch):
    for name in [k for k in __import__("os").environ if k.startswith(("ASCEND_", "SGLANG_", "HCCL_"))]:
        monkeypatch.delenv(name)
    model_dir = MODELS / "deepseek-v3"
    command = load.from_command(
        [
            "ASCEND_USE_FIA=1",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model_dir),
            "--tp",
            "16",
            "--pipeline-parallel-size=2",
            "--disaggregation-mode",
            "decode",
            "--page-size",
            "128",
            "--trust-remote-code",
            "--cuda-graph-bs",
            "1",
            "2",
            "4",
        ]
    )
    yaml_file = tmp_path / "d.yaml"
    yaml_file.write_text(
        f"model: {{path: {model_dir}}}\nenv: {{ASCEND_USE_FIA: '1'}}\nroles:\n"
        "  decode: {server_args: {tp_size: 16, pp_size: 2, page_size: 128}}\n"
    )
    from_yaml = load.from_yaml(yaml_file)
    args_file = tmp_path / "a.yaml"
    args_file.write_text(
        f"model: {{config: {model_dir}/config.json}}\nroles:\n  decode:\n    env: {{ASCEND_USE_FIA: 'true'}}\n"
        "    args: [--tensor-parallel-size, '16', --pp-size, '2', --disaggregation-mode, decode]\n"
    )
    from_args = load.from_yaml(args_file)
    flags = load.from_flags(
        model_dir, {"tp_size": 16, "pp_size": 2, "disaggregation_mode": "decode"}, {"ASCEND_USE_FIA": "1"}
    )

    reference = comparable(command.facts.roles[0])
    assert reference["tp_size"] == 16 and reference["pp_size"] == 2 and reference["use_fia"] is True
    assert reference["can_offload_kv"] if False else command.facts.roles[0].can_offload_kv
    for other in (from_yaml, from_args, flags):
        role = comparable(other.facts.roles[0])
        role["env"] = reference["env"] = None  # spelled differently ("1" / "true"), same meaning
        assert role == reference
        assert (
            other.facts.model == command.facts.model or other.facts.model.source != command.facts.model.source
        )
    assert command.facts.roles[0].unknown_args == ("--trust-remote-code", "--cuda-graph-bs 1 2 4")
    assert command.facts.roles[0].server_args["cuda_graph_bs"] == ["1", "2", "4"]


@pytest.mark.parametrize(
    ("model", "kind", "layers", "extra"),
    [
        (
            "deepseek-v3",
            AttentionKind.MLA,
            61,
            {
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
                "head_dim": 192,
                "nextn_layers": 1,
            },
        ),
        ("deepseek-v3.2", AttentionKind.MLA_INDEXER, 61, {"index_head_dim": 128, "index_n_heads": 64}),
        (
            "qwen3-30b-a3b",
            AttentionKind.GQA,
            48,
            {"num_kv_heads": 4, "head_dim": 128, "sliding_window": None},
        ),
        (
            "qwen3-next-80b-a3b",
            AttentionKind.GQA,
            48,
            {"hybrid_linear_layers": 36, "head_dim": 256, "nextn_layers": 1},
        ),
    ],
)
def test_model_facts_from_real_configs(model, kind, layers, extra):
    facts = load.model_from_dir(MODELS / model, "test")
    assert facts.attention is kind and facts.num_layers == layers
    for key, value in extra.items():
        assert getattr(facts, key) == value, key


def test_llama4_text_config_and_chunked_window():
    facts = ModelFacts.from_hf_config(
        {
            "architectures": ["Llama4ForConditionalGeneration"],
            "text_config": {
                "num_hidden_layers": 48,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "hidden_size": 5120,
                "attention_chunk_size": 8192,
            },
        },
        "inline",
    )
    assert facts.attention is AttentionKind.GQA and facts.sliding_window == 8192 and facts.num_layers == 48


def test_roles_named_after_pd_side_take_that_mode(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("roles:\n  prefill: {server_args: {pp_size: 2}}\n  decode: {}\n")
    facts = load.from_yaml(path).facts
    assert [r.disaggregation_mode for r in facts.roles] == ["prefill", "decode"]
    assert facts.role("decode").can_offload_kv and not facts.role("prefill").can_offload_kv


def test_draft_layers_from_speculative_decoding():
    model = load.model_from_dir(MODELS / "deepseek-v3", "test")
    from npudoctor.deployment.facts import role_facts

    assert role_facts("decode", {"speculative_algorithm": "nextn"}, {}, model).draft_layers == 1
    assert role_facts("decode", {}, {}, model).draft_layers == 0


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "roles:\n  prefill: {server_args: {disaggregation_mode: decode}}\n",
            "role 'prefill' has disaggregation_mode 'decode'",
        ),
        ("roles:\n  x: {server_args: {disaggregation_mode: both}}\n", "must be null, prefill or decode"),
        ("model: {config: a, path: b}\n", "exactly one of"),
        ("model: {hf_config: {num_hidden_layers: 2}}\n", "missing num_attention_heads"),
        (
            "model: {hf_config: {num_hidden_layers: x, num_attention_heads: 2}}\n",
            "num_hidden_layers must be an integer",
        ),
        ("env: [A]\n", "env: must be a mapping"),
        ("roles:\n  d: {args: [--pp-size]}\n", "roles.d.args"),
        ("ignore: [{id: NPD001, until: someday}]\n", "ignore[0]: expiry 'someday' is not a date"),
        ("- just\n- a list\n", "top level must be a mapping"),
        (  # an alias inside its own anchor: a cycle every reader would follow for ever
            "model: {hf_config: &h {num_hidden_layers: 2, num_attention_heads: 2, text_config: *h}}\n",
            "model.hf_config.text_config refers to a mapping or list that contains it",
        ),
        ("roles:\n  a: &r [--pp-size, 2, *r]\n", "roles.a.2 refers to"),
    ],
)
def test_yaml_errors_name_the_field(tmp_path, yaml_text, message):
    path = tmp_path / "d.yaml"
    path.write_text(yaml_text)
    with pytest.raises(InputError, match=None) as caught:
        load.from_yaml(path)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_launch_command_forms():
    assert parse_command(["sglang", "serve", "--pp-size", "4"]).server_args == {"pp_size": 4}
    assert parse_command(["--pp-size", "4"]).server_args == {"pp_size": 4}
    parsed = parse_command(
        [
            "env",
            "A=1",
            "B=x=y",
            "/usr/bin/python3.11",
            "-u",
            "-m",
            "sglang.launch_server",
            "--enable-dp-attention",
        ]
    )
    assert parsed.env == {"A": "1", "B": "x=y"} and parsed.server_args == {"enable_dp_attention": True}
    with pytest.raises(InputError, match="takes no value"):
        parse_command(["--enable-dp-attention", "yes"])
    with pytest.raises(InputError, match="unexpected argument"):
        parse_command(["--pp-size", "2", "--", "x"])


def test_shared_aliases_are_not_a_cycle_and_cost_their_size(tmp_path):
    """Anchors reused without a cycle are plain YAML (the same server args for two roles), and a
    document of nested aliases is checked in its own size, not its expansion (2**30 leaves here)."""
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "model: {hf_config: {num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8}}\n"
        "roles:\n  prefill: {server_args: &a {tp_size: 2}}\n  decode: {server_args: *a}\n"
    )
    assert load.from_yaml(shared).facts.roles[1].server_args["tp_size"] == 2
    nested = ["x0: &x0 [0, 0]"] + [f"x{i}: &x{i} [*x{i - 1}, *x{i - 1}]" for i in range(1, 30)]
    assert load._cycle(yaml.safe_load("\n".join(nested)), (), ()) is None
