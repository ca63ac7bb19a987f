"""Fuzzing every input of ``npudoctor check``: whatever a user writes ends in a report (exit 0/1)
or in exit 2 with ONE line on stderr starting ``npudoctor: error:``; never a traceback, never
exit 3 (an internal error), never output a console cannot take.

Inputs: the deployment YAML (structure and values, YAML-only constructs such as anchors, aliases
and tags), the model's config.json (missing, mistyped, negative, zero, bool, huge values;
``text_config`` wrappers), launch command lines after ``--`` (env prefixes, launchers, flags,
``=`` forms, quotes, unicode) and ignore entries (``--ignore`` specs and YAML ``ignore:`` lists);
and for size and time, YAML made of anchors, aliases and merge keys at every place of a deployment
(each example read within a time and memory bound, refused exactly when it crosses the input limits).

Static depth only, on a real release. The tree is parsed once per module (``discover`` hands
out one ``Target``, so its parsed files are reused): each example then costs what the checks
cost, ~0.1 s. The number of examples per test is bounded (``EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import io
import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import npudoctor.target.discovery
from npudoctor.cli import main
from npudoctor.formatters import NAMES as FORMAT_NAMES
from npudoctor.formatters import named
from npudoctor.target.discovery import discover

from support.repo import EXAMPLES as EXAMPLE_DIR

# bounded so the suite stays fast; NPUDOCTOR_FUZZ_EXAMPLES=5000 for a deeper local run
EXAMPLES = int(os.environ.get("NPUDOCTOR_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
CHECK_IDS = ("NPD001", "NPD002", "NPD003", "NPD004", "NPD005")
MODEL_DIR = EXAMPLE_DIR / "models" / "deepseek-v3"


@pytest.fixture(scope="module")
def tree(release):
    """The 0.5.12 release, parsed once for the module: ``discover`` returns one shared ``Target``."""
    path = release("0.5.12")
    shared = discover(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            npudoctor.target.discovery, "discover", lambda sglang_path=None: shared
        )  # subject.resolve's
        yield path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("fuzz")
    (directory / "ok.json").write_text((MODEL_DIR / "config.json").read_text())
    return directory


def invoke(*argv: str) -> tuple[int, bytes, str]:
    """Run the CLI in-process with strict UTF-8 streams (what a CI console is); check the contract."""
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    stdout, stderr = out_bytes.getvalue(), err_bytes.getvalue().decode("utf-8")
    assert "Traceback" not in stderr, stderr
    assert code in (0, 1, 2), f"exit {code}: {stderr}"
    if code == 2:
        assert stderr.startswith("npudoctor: error:") and stderr.count("\n") == 1, stderr
    else:
        stdout.decode("utf-8")  # the report is text a console takes
    return code, stdout, stderr


def check(tree: Path, fmt: str, *argv: str) -> tuple[int, bytes, str]:
    code, out, err = invoke("check", "--depth", "static", "--sglang-path", tree, "--format", fmt, *argv)
    event(f"exit {code}")
    if code in (0, 1):
        _well_formed(fmt, out)
    return code, out, err


def _well_formed(fmt: str, out: bytes) -> None:
    syntax = named(fmt).parsed_as
    if syntax == "json":

        def no_constants(name):
            raise AssertionError(f"{name} is not JSON")

        json.loads(out, parse_constant=no_constants)
    elif syntax == "xml":
        ET.fromstring(out)


# -- values -------------------------------------------------------------------------------------

# text a user may type, unicode and controls included (lone surrogates come through YAML escapes)
texts = st.text(max_size=12) | st.sampled_from(
    ["", " ", "decode", "prefill", "null", "²", "٣", "1e3", "0x10"]
)
huge = st.integers(min_value=2**31, max_value=10**40) | st.integers(max_value=-1, min_value=-(10**40))
ints = st.integers(min_value=-3, max_value=300) | huge | st.sampled_from([0, 1, 2, 4, 61, 128, 2**31 - 1])
scalars = (
    st.none()
    | st.booleans()
    | ints
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts
    | st.dates()
    | st.datetimes()
)
garbage = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts | ints, inner, max_size=3),
    max_leaves=8,
)
SERVER_FIELDS = [
    "tp_size", "pp_size", "dp_size", "attn_cp_size", "page_size", "disaggregation_mode",
    "disaggregation_transfer_backend", "kv_cache_dtype", "attention_backend",
    "prefill_attention_backend", "decode_attention_backend", "speculative_algorithm",
    "enable_prefill_context_parallel", "enable_prefill_cp", "enable_dp_attention", "model_path",
]  # fmt: skip
plausible = st.sampled_from([1, 2, 4, 8, 16, "2", "decode", "prefill", "null", "ascend", "EAGLE", True])
server_args = st.dictionaries(st.sampled_from(SERVER_FIELDS) | texts, plausible | garbage, max_size=5)
FLAGS = [
    "--tp-size", "--tp", "--pp-size", "--pipeline-parallel-size", "--dp-size", "--attn-cp-size",
    "--page-size", "--disaggregation-mode", "--disaggregation-transfer-backend", "--kv-cache-dtype",
    "--attention-backend", "--speculative-algorithm", "--speculative-num-steps",
    "--enable-prefill-context-parallel", "--enable-dp-attention", "--trust-remote-code",
    "--cuda-graph-bs", "--api-key", "--model-path", "--",
]  # fmt: skip
words = (
    st.sampled_from(["1", "2", "16", "0", "-1", "two", "²", "1" * 30, "decode", "prefill", "x y", '"', "'"])
    | texts
)
HF_FIELDS = [
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim",
    "index_n_heads", "sliding_window", "attention_chunk_size", "use_sliding_window", "layer_types",
    "full_attention_interval", "num_nextn_predict_layers", "mtp_num_hidden_layers", "model_type",
    "architectures",
]  # fmt: skip
hf_plausible = st.sampled_from([0, 1, 2, 4, 8, 64, 128, 512, 7168, -1, True, False, None])
hf_values = hf_plausible | hf_plausible | hf_plausible | garbage
hf_config = st.dictionaries(st.sampled_from(HF_FIELDS) | texts, hf_values, max_size=12)
hf_overrides = st.dictionaries(st.sampled_from(HF_FIELDS), hf_values, max_size=3)
# a real config with some fields replaced, dropped, or wrapped in text_config
real_config = json.loads((MODEL_DIR / "config.json").read_text())


@st.composite
def model_configs(draw) -> dict:
    base = copy.deepcopy(real_config) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(HF_FIELDS), max_size=4)):
        base.pop(key, None)
    base.update(draw(hf_overrides if base else hf_config))
    if draw(st.booleans()):
        base = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": base}
        if draw(st.booleans()):
            base["text_config"] = draw(garbage)
    return base


dates = st.dates().map(str) | texts | ints | st.sampled_from(["2026-13-45", "2999-12-31", "20200101", ""])
ignore_entries = st.lists(
    st.fixed_dictionaries(
        {"id": st.sampled_from(CHECK_IDS) | st.sampled_from(["npd001", " NPD002 ", "NPD999", ""]) | garbage},
        optional={"until": dates | st.dates() | garbage, "reason": texts | garbage, "extra": garbage},
    )
    | st.sampled_from(CHECK_IDS)
    | garbage,
    max_size=3,
)
roles = st.dictionaries(
    st.sampled_from(["prefill", "decode", "server", "x"]) | texts,
    st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "server_args": server_args | garbage,
            "args": st.lists(st.sampled_from(FLAGS) | words, max_size=6) | garbage,
            "env": st.dictionaries(texts, texts | garbage, max_size=3) | garbage,
        },
    )
    | garbage,
    max_size=3,
)


@st.composite
def valid_deployments(draw) -> dict:
    """A deployment a user could mean: PD or colocated roles with plausible server args."""
    data: dict = {}
    model = draw(st.sampled_from(["config", "path", "hf_config", "none"]))
    if model == "config":
        data["model"] = {"config": "ok.json"}
    elif model == "path":
        data["model"] = {"path": str(MODEL_DIR)}
    elif model == "hf_config":
        data["model"] = {"hf_config": draw(model_configs())}
    if draw(st.booleans()):
        data["env"] = {"ASCEND_USE_FIA": draw(st.sampled_from(["1", "0", "true"]))}
    names = draw(st.sampled_from([["prefill", "decode"], ["decode"], ["prefill"], ["server"], []]))
    data["roles"] = {}
    for name in names:
        args = {
            "pp_size": draw(st.integers(1, 4)),
            "tp_size": draw(st.sampled_from([1, 8, 16])),
            "page_size": draw(st.sampled_from([1, 16, 128])),
        }
        if name == "prefill" and draw(st.booleans()):
            args["attn_cp_size"] = 2
        if name == "decode" and draw(st.booleans()):
            args["speculative_algorithm"] = "EAGLE"
        if draw(st.booleans()):
            args["disaggregation_transfer_backend"] = "ascend"
        data["roles"][name] = {"server_args": args}
    if draw(st.booleans()):
        data["ignore"] = [{"id": draw(st.sampled_from(CHECK_IDS)), "until": "2999-12-31", "reason": "r"}]
    return data


def _containers(data, path=()):
    """Every (path, container) in nested dicts and lists, the root included."""
    found = [(path, data)]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(value, (dict, list)):
            found += _containers(value, (*path, key))
    return found


@st.composite
def deployments(draw) -> dict:
    """A valid deployment with up to three mutations: a value replaced by garbage or by a
    type-confused twin, a key dropped, an unknown key added."""
    data = draw(valid_deployments())
    for _ in range(draw(st.integers(0, 3))):
        _path, container = draw(st.sampled_from(_containers(data)))
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        operation = draw(st.sampled_from(["garbage", "confuse", "drop", "add"]))
        if operation == "add" or not keys:
            if isinstance(container, dict):
                container[draw(texts | st.sampled_from(SERVER_FIELDS + HF_FIELDS))] = draw(garbage)
            else:
                container.append(draw(garbage))
            continue
        key = draw(st.sampled_from(keys))
        if operation == "drop":
            del container[key]
        elif operation == "garbage":
            container[key] = draw(garbage)
        else:
            value = container[key]
            container[key] = draw(
                st.sampled_from([str(value), [value], {"v": value}, None, True, -1, 0, 2**63, float("nan")])
            )
    return data


def dump(data) -> str:
    """YAML text of ``data``; strings that PyYAML will not emit as such fall back to JSON text
    (YAML is a superset of JSON), with lone surrogates as ``\\ud800`` escapes."""
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError, ValueError):
        return json.dumps(data, default=str)


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


# -- the tests ----------------------------------------------------------------------------------


# The inputs that broke npudoctor when these tests were written (exit 3), replayed on every run.
SMALL_MODEL = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64}


@pytest.mark.slow
@FUZZ
@given(data=deployments(), fmt=st.sampled_from(FORMAT_NAMES))
@example(data={"roles": {"decode": {"server_args": {"pp_size": "²"}}}}, fmt="json")  # isdigit() but not int()
@example(data={"roles": {"decode": {"server_args": {"revision": dt.date(2025, 1, 1)}}}}, fmt="json")
@example(data={"roles": {"decode": {"server_args": {dt.date(2025, 1, 1): 1}}}}, fmt="json")
@example(data={"model": {"hf_config": {**SMALL_MODEL, "architectures": 5}}}, fmt="text")
@example(data={"roles": {"decode": {}}, "ignore": [{"id": "NPD001", "reason": "\ud800"}]}, fmt="text")
@example(data={"roles": {"decode": {}}, "ignore": [{"id": "NPD001", "reason": "\ud800"}]}, fmt="markdown")
@example(data={"roles": {"decode": {}}, "ignore": [{"id": "NPD001", "reason": "\ud800"}]}, fmt="github")
def test_fuzzed_deployment_yaml(tree, workdir, data, fmt):
    check(tree, fmt, "--config", write(workdir / "deploy.yaml", dump(data)))


# YAML-only constructs: anchors and aliases (cycles included), merge keys, explicit and unknown
# tags that safe_load refuses, several documents, bad timestamps, escapes, tabs
YAML_PIECES = [
    "roles: {decode: {server_args: &a {pp_size: 2, self: *a}}}",
    "base: &b {pp_size: 2}\nroles: {decode: {server_args: {<<: *b}}}",
    "roles: &r {decode: {env: *r}}",
    "roles: {decode: {server_args: !!python/object:os.system {}}}",
    "roles: !!python/name:os.system",
    "env: !custom {A: 1}",
    "env: {A: !!binary aGVsbG8=}",
    "roles: {decode: {server_args: {x: !!set {a, b}}}}",
    "roles: {decode: {server_args: {x: !!omap [a: 1]}}}",
    "ignore: [{id: NPD001, until: 2026-13-45}]",
    "ignore: [{id: NPD001, until: !!timestamp 2001-12-14t21:59:43.10-05:00}]",
    'ignore: [{id: NPD001, until: 2999-01-01, reason: "\\ud800\\x00\\u202e"}]',
    "roles:\n\tdecode: {}",
    "---\nroles: {}\n---\nenv: {}",
    "model: {hf_config: &h {num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8, text_config: *h}}",
    "roles: {decode: {server_args: {pp_size: 1" + "0" * 5000 + "}}}",
    "roles: {decode: {server_args: {x: " + "[" * 400 + "]" * 400 + "}}}",
    "env: {? [a] : b}",
    "roles: {decode: {args: *undefined}}",
    "%YAML 1.1\n---\nroles: {decode: {}}",
    "",
    "null",
    "[]",
    "42",
]


@pytest.mark.slow
@FUZZ
@given(
    pieces=st.lists(st.sampled_from(YAML_PIECES), min_size=1, max_size=3),
    noise=st.text(max_size=10),
    fmt=st.sampled_from(FORMAT_NAMES),
)
@example(pieces=["roles: {decode: {server_args: &a {pp_size: 2, self: *a}}}"], noise="", fmt="json")
@example(pieces=["roles: {decode: {server_args: {x: !!binary aGVsbG8=}}}"], noise="", fmt="json")
@example(pieces=["roles: {decode: {server_args: {x: !!set {a, b}}}}"], noise="", fmt="json")
@example(pieces=["ignore: [{id: NPD001, until: 2026-13-45}]"], noise="", fmt="json")  # safe_load: ValueError
@example(pieces=["roles: {decode: {server_args: {pp_size: 1" + "0" * 5000 + "}}}"], noise="", fmt="json")
def test_fuzzed_yaml_text(tree, workdir, pieces, noise, fmt):
    text = "\n".join(pieces)
    if noise:
        cut = len(noise) % (len(text) + 1)
        text = text[:cut] + noise + text[cut:]
    check(tree, fmt, "--config", write(workdir / "raw.yaml", text))


@pytest.mark.slow
@FUZZ
@given(
    config=model_configs() | model_configs() | model_configs() | garbage,
    raw=st.none() | st.none() | st.none() | st.binary(max_size=40),
    roles_text=st.sampled_from(
        [
            "roles: {prefill: {server_args: {pp_size: 2}}, decode: {server_args: {speculative_algorithm: EAGLE}}}",
            "roles: {decode: {env: {ASCEND_USE_FIA: '1'}}}",
            "roles: {prefill: {server_args: {attn_cp_size: 2}}}",
            "",
        ]
    ),
    fmt=st.sampled_from(FORMAT_NAMES),
)
@example(config={**SMALL_MODEL, "architectures": 5}, raw=None, roles_text="", fmt="json")
@example(config={}, raw=b'{"num_hidden_layers": 1' + b"0" * 5000 + b"}", roles_text="", fmt="json")
@example(config={}, raw=b"[" * 100_000 + b"]" * 100_000, roles_text="", fmt="json")
def test_fuzzed_model_config_json(tree, workdir, config, raw, roles_text, fmt):
    body = raw if raw is not None else json.dumps(config, default=str).encode("utf-8", "surrogatepass")
    (workdir / "model.json").write_bytes(body)
    deploy = write(workdir / "model.yaml", "model: {config: model.json}\n" + roles_text)
    check(tree, fmt, "--config", deploy)


env_names = st.sampled_from(
    ["ASCEND_USE_FIA", "HF_TOKEN", "SGLANG_PP_LAYER_PARTITION", "A", "_X1"]
) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
launchers = st.sampled_from(
    [
        ["python", "-m", "sglang.launch_server"],
        ["python3.11", "-u", "-m", "sglang.launch_server"],
        ["/usr/bin/python3", "-m", "sglang.srt.server"],
        ["sglang", "serve"],
        ["env"],
        [],
        ["python", "-m"],
        ["python", "-c", "pass"],
        ["torchrun", "x.py"],
    ]
)


@st.composite
def launch_commands(draw) -> list[str]:
    argv = [f"{name}={value}" for name, value in draw(st.lists(st.tuples(env_names, words), max_size=3))]
    if draw(st.booleans()):
        argv.insert(0, "env")
    argv += draw(launchers)
    if draw(st.booleans()):
        argv += ["--model-path", str(MODEL_DIR)]
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from(FLAGS) | st.text(max_size=6).map(lambda t: "--" + t))
        form = draw(st.sampled_from(["bare", "value", "equals", "values"]))
        if form == "value":
            argv += [flag, draw(words)]
        elif form == "equals":
            argv.append(f"{flag}={draw(words)}")
        elif form == "values":
            argv += [flag, *draw(st.lists(words, max_size=3))]
        else:
            argv.append(flag)
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(words))  # a stray positional word
    return argv


@pytest.mark.slow
@FUZZ
@given(argv=launch_commands(), fmt=st.sampled_from(FORMAT_NAMES))
def test_fuzzed_launch_command(tree, argv, fmt):
    check(tree, fmt, "--", *argv)


@pytest.mark.slow
@FUZZ
@given(
    specs=st.lists(
        st.sampled_from(CHECK_IDS).flatmap(lambda i: st.sampled_from([i, i.lower(), f"{i}:", f" {i} "]))
        | st.tuples(st.sampled_from(CHECK_IDS), dates).map(lambda p: f"{p[0]}:{p[1]}")
        | texts,
        max_size=3,
    ),
    entries=ignore_entries,
    fmt=st.sampled_from(FORMAT_NAMES),
)
def test_fuzzed_ignore_entries(tree, workdir, specs, entries, fmt):
    deploy = write(workdir / "ignore.yaml", dump({"roles": {"decode": {}}, "ignore": entries}))
    argv = [a for spec in specs for a in ("--ignore", spec)]
    check(tree, fmt, "--config", deploy, *argv)


@pytest.mark.slow
@FUZZ
@given(
    env=st.lists(words | st.tuples(env_names, words).map("=".join), max_size=3),
    flags=st.lists(
        st.tuples(st.sampled_from(["--pp-size", "--tp-size", "--page-size", "--disaggregation-mode"]), words),
        max_size=3,
    ),
    model=st.sampled_from([str(MODEL_DIR), str(MODEL_DIR / "config.json"), "/nonexistent", ""]),
    fmt=st.sampled_from(FORMAT_NAMES),
)
def test_fuzzed_model_path_flags(tree, env, flags, model, fmt):
    argv = [
        "--model-path",
        model,
        *[a for pair in flags for a in pair],
        *[a for e in env for a in ("--env", e)],
    ]
    check(tree, fmt, *argv)


# -- size and time: alias-heavy YAML at every place of a deployment -------------------------------

# The documented input limits (README, "Input limits"; npudoctor.deployment.limits)
MAX_YAML_BYTES, MAX_NODES, MAX_TEXT_CHARS, MAX_VALUE_CHARS = 64 * 1024, 5_000, 64 * 1024, 16 * 1024
# Where a generated structure goes ({body}: a flow mapping or list of anchored values), and what
# the body may be there
ALIAS_PLACES = {
    "roles.decode.server_args": ("roles: {{decode: {{server_args: {body}}}}}", "mapping"),
    "roles.prefill.server_args.cuda_graph_bs": (
        "roles: {{prefill: {{server_args: {{pp_size: 2, cuda_graph_bs: {body}}}}}}}",
        "any",
    ),
    "roles.decode.args": ("roles: {{decode: {{args: {body}}}}}", "list"),
    "roles.decode.env": ("roles: {{decode: {{env: {body}}}}}", "mapping"),
    "roles": ("roles: {body}", "mapping"),
    "env": ("env: {body}", "mapping"),
    "model.hf_config": ("model: {{hf_config: {body}}}", "mapping"),
    "model.hf_config.text_config": (
        "model: {{hf_config: {{num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8, text_config: {body}}}}}",
        "any",
    ),
    "model.hf_config.extra": (
        "model: {{hf_config: {{num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8, extra: {body}}}}}",
        "any",
    ),
    "ignore": ("ignore: {body}", "list"),
    "ignore[0].reason": (
        "roles: {{decode: {{}}}}\nignore: [{{id: NPD001, until: 2999-01-01, reason: {body}}}]",
        "any",
    ),
    "top level": ("{body}", "mapping"),
}
# what the templates add to a body, at most
PLACE_NODES, PLACE_CHARS = 20, 120


@st.composite
def alias_heavy_yaml(draw) -> tuple[str, int, int, int]:
    """A deployment with, at one place, ``levels`` anchors each made of ``fan`` aliases of the one
    before (a list, a mapping, or merge keys ``<<``), the first of ``fan`` copies of a leaf: its
    YAML text, and the nodes and characters of text the body stands for with every alias replaced
    by a copy of its anchor (a merged mapping counted as written: ``<<`` and the list of aliases)."""
    template, container = ALIAS_PLACES[draw(st.sampled_from(sorted(ALIAS_PLACES)))]
    kind = draw(st.sampled_from(["list", "mapping", "merge"]))
    levels, fan = draw(st.integers(1, 10)), draw(st.integers(1, 12))
    leaf = draw(
        st.sampled_from(["1", "x", "'v'", "null", "2999-01-01", "--tp-size", "1:2:3"])
        | st.integers(1, MAX_VALUE_CHARS + 2).map(lambda n: "t" * n)
    )
    leaf_chars = len(leaf) - 2 if leaf.startswith("'") else len(leaf)
    keys = [f"k{i}" for i in range(fan)]

    def collection(items: list[str], item: tuple[int, int]) -> tuple[str, int, int]:
        nodes, chars = item
        if kind == "list":
            return "[" + ", ".join(items) + "]", 1 + fan * nodes, fan * chars
        text = "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items)) + "}"
        return text, 1 + fan * (1 + nodes), sum(map(len, keys)) + fan * chars

    text, nodes, chars = collection([leaf] * fan, (1, leaf_chars))
    anchors = [(f"&a0 {text}", nodes, chars)]
    for level in range(1, levels):
        aliases = [f"*a{level - 1}"] * fan
        if kind == "merge":  # {<<: [*a, *a]}: the mapping, the key <<, the list of aliases
            text, nodes, chars = "{<<: [" + ", ".join(aliases) + "]}", 3 + fan * nodes, 2 + fan * chars
        else:
            text, nodes, chars = collection(aliases, (nodes, chars))
        anchors.append((f"&a{level} {text}", nodes, chars))
    if container == "list" or (container == "any" and draw(st.booleans())):
        body = "[" + ", ".join(text for text, _, _ in anchors) + "]"
        nodes, chars = 1 + sum(n for _, n, _ in anchors), sum(c for _, _, c in anchors)
    else:
        body = "{" + ", ".join(f"a{i}: {text}" for i, (text, _, _) in enumerate(anchors)) + "}"
        nodes = 1 + sum(1 + n for _, n, _ in anchors)
        chars = sum(len(f"a{i}") + c for i, (_, _, c) in enumerate(anchors))
    return template.format(body=body), nodes, chars, leaf_chars


@pytest.fixture(scope="module")
def warm_tree(tree):
    """The release with its files parsed and the checks loaded (by one check of a real deployment),
    so an example's time is its own."""
    invoke(
        "check", "--depth", "static", "--sglang-path", tree, "--config", EXAMPLE_DIR / "deepseek-v3-pd.yaml"
    )
    return tree


@pytest.mark.slow
@FUZZ
@given(generated=alias_heavy_yaml(), fmt=st.sampled_from(FORMAT_NAMES))
@example(
    generated=("roles: {decode: {server_args: {a0: &a0 [x, x], a1: &a1 [*a0, *a0]}}}", 13, 10, 1), fmt="json"
)
def test_fuzzed_alias_heavy_yaml_in_bounded_time_and_memory(warm_tree, workdir, generated, fmt):
    """Anchors of anchors, lists and mappings of aliases and chains of merge keys, at every place of
    a deployment: a report, or exit 2 in one line, within 200 MB more than the process held; a
    document larger than the limits with its aliases expanded is refused by them, one below them is
    not. (How long each takes is an event in hypothesis' statistics, not a bound: the time of a
    refusal is ``benchmarks/input_limits.py``'s.)"""
    text, nodes, chars, leaf_chars = generated
    path = write(workdir / "aliases.yaml", text)
    before = _reset_peak_rss()
    start = time.perf_counter()
    code, _out, err = check(warm_tree, fmt, "--config", path)
    seconds, grown = time.perf_counter() - start, _peak_rss() - before
    refused_by_a_limit = code == 2 and "npudoctor reads" in err
    event(f"exit {code}{', a limit' if refused_by_a_limit else ''}")
    event(f"{'under 0.5' if seconds < 0.5 else 'under 1' if seconds < 1 else 'over 1'} s")
    over = nodes > MAX_NODES or chars > MAX_TEXT_CHARS or leaf_chars > MAX_VALUE_CHARS
    if over or len(text.encode()) > MAX_YAML_BYTES:
        assert refused_by_a_limit, err
    elif nodes + PLACE_NODES <= MAX_NODES and chars + PLACE_CHARS <= MAX_TEXT_CHARS:
        assert not refused_by_a_limit, err
    assert grown < 200 * 1024**2, grown


def _reset_peak_rss() -> int:
    """This process's resident size, after making it its peak (Linux: ``/proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _peak_rss()


def _peak_rss() -> int:
    """The most memory this process has held resident since the last reset, in bytes."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def test_the_contract_catches_an_internal_error(tree, monkeypatch):
    """The fuzz tests can fail: an input that reaches a bug (exit 3) breaks the contract."""

    def broken(*_args, **_kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(npudoctor.deployment.load, "from_yaml", broken)
    with pytest.raises(AssertionError, match="exit 3"):
        check(tree, "json", "--config", EXAMPLE_DIR / "deepseek-v3-pd.yaml")


def test_values_of_sglang_own_parser_become_plain_data():
    """At the live depth the launch command is read with sglang's own argparse definitions, whose
    custom types and actions may produce any object: the deployment keeps them as text."""
    import argparse
    import enum

    class Backend(enum.Enum):
        ASCEND = "ascend"

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--disaggregation-transfer-backend", type=Backend)
    parser.add_argument("--pp-size", type=int)
    parser.add_argument("--weird", type=lambda text: object())
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    argv = ["python", "-m", "sglang.launch_server", "--pp-size", "2", "--weird", "x"]
    argv += ["--disaggregation-transfer-backend", "ascend", "--api-key", "k"]
    facts = npudoctor.deployment.load.from_command(argv, parser).facts
    (role,) = facts.to_dict()["roles"]
    assert role["server_args"]["disaggregation_transfer_backend"] == "ascend"
    assert role["server_args"]["weird"].startswith("<object object")
    assert role["pp_size"] == 2 and role["unknown_args"] == ["--api-key", "***"]
    json.dumps(facts.to_dict())
