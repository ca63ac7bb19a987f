"""Input limits: a deployment description of any size is read in bounded time and memory, or
refused in one line (exit 2) that names the file, where in it, and the limit crossed.

The inputs come from files anyone on a shared machine may have written: 2 KB of YAML anchors expand
to 10**9 values (a "billion laughs") once something walks them, a chain of merge keys (``<<``) does
the same inside PyYAML's constructor (PyYAML 6.0 to 6.0.3; 6.0.4 drops the duplicate pairs). The bombs run in a child capped at 2 GiB of address space
(and 600 s, a guard), so a reader without limits fails the test instead of exhausting the machine.
A test here asserts what is refused and where the reading stopped, never how fast: the time a
refusal takes is ``benchmarks/input_limits.py``'s, printed as a ratio.

The figures below are the documented limits (README, "Input limits"); ``test_the_limits_are_the_
documented_ones`` ties them to ``npudoctor.deployment.limits``."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import npudoctor
from npudoctor.deployment import load
from npudoctor.deployment.launch import parse_command
from npudoctor.errors import InputError

from support.repo import EXAMPLES
from support.reports import without_progress

# the npudoctor this test imports: a child runs the same code
CODE = Path(npudoctor.__file__).resolve().parents[1]
MEMORY = 2 * 1024**3  # a child's address space: a bomb that expands fails, it cannot eat the machine
TIMEOUT = 600  # seconds: a guard against a reader that hangs (a FIFO, a bomb walked), not a bound

MAX_YAML_BYTES = 64 * 1024
MAX_NODES = 5_000
MAX_TEXT_CHARS = 64 * 1024
MAX_VALUE_CHARS = 16 * 1024
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 100
# the largest .py file npudoctor reads from a tree: sglang's largest is ~250 KB (server_args.py)
MAX_SOURCE_BYTES = 4 * 1024 * 1024
PROBED_LAYERS = 128  # a live probe's pool: every layer of a real model, the first 128 of a larger one
# the server sizes that size the live depth's work, and the most each may be
MAX_SERVER_SIZES = {"tp_size": 1024, "dp_size": 1024, "attn_cp_size": 64, "page_size": 1024}

MODEL_DIR = EXAMPLES / "models" / "deepseek-v3"
PROPERTY_DEPLOYMENTS = Path(__file__).resolve().parents[1] / "data" / "properties" / "deployments"
SMALL_MODEL = "num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8"


def laughs(levels: int = 9, fan: int = 10) -> str:
    """A flow mapping of anchors, each a list of ``fan`` aliases of the one before: ``fan**levels``
    values in ~60 bytes a level."""
    parts = ["l0: &l0 [" + ", ".join(["lol"] * fan) + "]"]
    parts += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan) + "]" for i in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


def merges(levels: int = 8, fan: int = 10) -> str:
    """A flow mapping of anchors, each merging the one before ``fan`` times (``<<: [*m0, *m0, ...]``):
    PyYAML's constructor before 6.0.4 copies the merged pairs, duplicates included, so the last holds
    ``fan**levels``. Measured as written, it crosses the limits whatever the PyYAML."""
    parts = ["m0: &m0 {" + ", ".join(f"k{i}: {i}" for i in range(fan)) + "}"]
    parts += [f"m{i}: &m{i} {{<<: [" + ", ".join([f"*m{i - 1}"] * fan) + "]}" for i in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


BOMBS = {
    "aliases in roles.decode.server_args": f"roles: {{decode: {{server_args: {laughs()}}}}}",
    "aliases in model.hf_config": f"model: {{hf_config: {{{SMALL_MODEL}, extra: {laughs()}}}}}",
    "merge keys in roles.prefill.server_args": f"roles: {{prefill: {{server_args: {merges()}}}}}",
    "merge keys in env": f"env: {merges()}",
    "merge keys in ignore": f"ignore: [{merges()}]",
}


def npudoctor_child(*args: str | Path, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess:
    """``npudoctor ARGS`` in a child capped at ``MEMORY`` and ``TIMEOUT``."""

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (CODE, *pythonpath)))}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "npudoctor", *map(str, args)],
            capture_output=True,
            text=True,
            env=environ,
            cwd=CODE,
            timeout=TIMEOUT,
            preexec_fn=cap_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"npudoctor {' '.join(map(str, args[:3]))} ... still running after {TIMEOUT} s")
    return done


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = without_progress(done.stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith("npudoctor: error:"), done.stderr[-2000:]
    return lines[0]


def refusal(call, *args) -> str:
    """The ``InputError`` message ``call(*args)`` raises."""
    with pytest.raises(InputError) as caught:
        call(*args)
    return str(caught.value)


# -- the bombs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("place", BOMBS)
def test_a_yaml_bomb_is_refused_in_one_line(tmp_path, release, place):
    """2 KB of anchors or merge keys in any part of a deployment: ``check`` says which limit the
    expansion crosses and where, before any of it is built (on a real release: the report would
    walk what the checks did not)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMBS[place] + "\n")
    assert bomb.stat().st_size < 2048
    tree = release("0.5.12")
    done = npudoctor_child("check", "--depth", "static", "--sglang-path", tree, "--config", bomb)
    line = one_error_line(done)
    assert str(bomb) in line and f"more than {MAX_NODES} values" in line and "aliases expanded" in line, line
    assert f"{bomb}: {place.split(' in ')[1]}" in line, line  # where the expansion crossed the limit
    # the reading itself, without starting npudoctor (safe in this process: the child refused it)
    message = refusal(load.from_yaml, bomb)
    assert f"npudoctor: error: {message}" == line


def test_run_refuses_a_yaml_bomb_before_the_command_and_runs_it_with_a_fine_deployment(tmp_path, release):
    """``run`` reads its deployment through the same loader: a bomb is refused and the command does
    not start; a real deployment still starts it."""
    tree = release("0.5.12")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMBS["aliases in roles.decode.server_args"] + "\n")
    command = ("--", sys.executable, "-c", "print('up')")
    done = npudoctor_child("run", "--depth", "static", "--config", bomb, *command, pythonpath=(tree,))
    line = one_error_line(done)
    assert done.stdout == "" and "roles.decode.server_args" in line, (done.stdout, line)
    fine = EXAMPLES / "deepseek-v3-pd.yaml"
    done = npudoctor_child("run", "--depth", "static", "--config", fine, *command, pythonpath=(tree,))
    assert (done.returncode, done.stdout) == (0, "up\n"), done.stderr


# -- the sizes, each just above its limit ------------------------------------------------------------


def test_a_deployment_file_larger_than_the_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("roles: {decode: {}}\n" + "#" * MAX_YAML_BYTES + "\n")
    message = refusal(load.from_yaml, path)
    assert str(path) in message and "64 KiB" in message, message


@pytest.mark.parametrize(
    ("template", "where"),
    [
        ("roles: {{decode: {{server_args: {{x: {value}}}}}}}", "roles.decode.server_args.x"),
        ("env: {{A: {value}}}", "env.A"),
        ("model: {{hf_config: {{{model}, model_type: {value}}}}}", "model.hf_config.model_type"),
        ("roles: {{decode: {{args: [--served-model-name, {value}]}}}}", "roles.decode.args[1]"),
        ("ignore: [{{id: NPD001, until: 2999-01-01, reason: {value}}}]", "ignore[0].reason"),
        # an int in base 60 (1:2:3): PyYAML's constructor is quadratic in its length
        ("roles: {{decode: {{server_args: {{x: 1{sexagesimal}}}}}}}", "roles.decode.server_args.x"),
    ],
)
def test_a_value_longer_than_the_limit_is_refused_with_its_key(tmp_path, template, where):
    path = tmp_path / "long.yaml"
    value = "a" * (MAX_VALUE_CHARS + 1)
    path.write_text(
        template.format(value=value, model=SMALL_MODEL, sexagesimal=":1" * (MAX_VALUE_CHARS // 2))
    )
    message = refusal(load.from_yaml, path)
    assert f"{str(path)}: {where}:" in message and f"longer than {MAX_VALUE_CHARS}" in message, message
    assert value not in message  # the value itself is not echoed


def test_a_document_with_more_values_than_the_limit_is_refused_as_it_is_read(tmp_path):
    """No alias: a file just under the size limit that lists 30,000 values. PyYAML's parser costs
    50 to 120 µs a value; the reading stops at the limit instead of at the end of the file."""
    path = tmp_path / "many.yaml"
    path.write_text("roles: {decode: {server_args: {x: [" + "0," * 30_000 + "]}}}\n")
    assert path.stat().st_size < MAX_YAML_BYTES
    message = refusal(load.from_yaml, path)
    assert "roles.decode.server_args.x[" in message and f"more than {MAX_NODES} values" in message, message
    stopped_at = int(message.split("roles.decode.server_args.x[")[1].split("]")[0])
    assert stopped_at < MAX_NODES, message  # the item the count crossed the limit at, not the file's last


def test_a_document_nested_deeper_than_the_limit_is_refused_with_its_key(tmp_path):
    """PyYAML composes recursively: a deep document is refused by the nesting limit, named, before
    Python's stack runs out; one nested to the limit reads."""
    path = tmp_path / "deep.yaml"
    prefix = "model: {hf_config: {" + SMALL_MODEL + ", x: "  # x's value at level 4 (the top mapping: 1)
    path.write_text(prefix + "[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3) + "}}\n")
    load.from_yaml(path)
    path.write_text(prefix + "[" * 400 + "]" * 400 + "}}\n")
    message = refusal(load.from_yaml, path)
    assert f"{path}: model.hf_config.x" + "[0]" * (MAX_DEPTH - 3) + ":" in message, message
    assert f"nests deeper than {MAX_DEPTH} levels" in message, message


def test_aliases_of_a_long_text_count_as_often_as_they_are_used(tmp_path):
    path = tmp_path / "text.yaml"
    text = "a" * MAX_VALUE_CHARS
    path.write_text(
        f"env: {{A: &t {text}}}\nroles: {{decode: {{server_args: {{x: [{', '.join(['*t'] * 20)}]}}}}}}\n"
    )
    message = refusal(load.from_yaml, path)
    assert (
        "roles.decode.server_args.x[" in message
        and f"more than {MAX_TEXT_CHARS} characters of text" in message
    ), message


def test_a_model_config_larger_than_the_limit_is_refused_unread(tmp_path):
    config = tmp_path / "config.json"
    body = (MODEL_DIR / "config.json").read_text()
    config.write_text(body + " " * (MAX_CONFIG_BYTES + 1 - len(body.encode())))
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("model: {config: config.json}\n")
    message = refusal(load.from_yaml, deploy)
    assert message.startswith(f"{config}: ") and "4 MiB" in message, message
    assert load.model_from_config_file(MODEL_DIR / "config.json").num_layers == 61


def test_the_report_does_not_copy_the_model_config(tmp_path):
    """A config.json within the limit may hold a million values (a per-module quantization table
    grows so): the report's deployment section leaves the file out, and never copies it first."""
    config = tmp_path / "config.json"
    data = json.loads((MODEL_DIR / "config.json").read_text())
    data["quantization_config"] = {"ignore": [0] * 1_000_000}
    config.write_text(json.dumps(data, separators=(",", ":")))
    assert config.stat().st_size < MAX_CONFIG_BYTES
    facts = load.from_flags(config, {}, {}).facts
    tracemalloc.start()
    try:
        report = facts.to_dict()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024**2, peak  # a copy of the million-entry list alone is 8 MB
    assert report["model"]["num_layers"] == 61 and "hf_config" not in report["model"]


def test_a_launch_command_word_longer_than_the_limit_is_refused():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "k" * (MAX_VALUE_CHARS + 1)]
    message = refusal(parse_command, argv)
    assert message.startswith("launch command: word 5 ") and f"longer than {MAX_VALUE_CHARS}" in message
    assert "kkkk" not in message  # a value is not echoed (it may be a secret)


def test_a_launch_command_of_more_words_than_the_limit_is_refused():
    argv = [f"A{i}=1" for i in range(MAX_NODES)] + ["python", "-m", "sglang.launch_server", "--pp-size", "2"]
    message = refusal(parse_command, argv)
    assert message.startswith(f"launch command: {MAX_NODES + 5} words, more than {MAX_NODES}"), message


def test_an_env_flag_longer_than_the_limit_is_refused(cli, release):
    tree = release("0.5.12")
    code, out, err = cli(
        "check", "--sglang-path", tree, "--model-path", MODEL_DIR, "--env", "A=" + "v" * MAX_VALUE_CHARS
    )
    assert code == 2 and out == "", err
    line = without_progress(err).strip()
    assert line.startswith("npudoctor: error: --env: word 1 ") and "\n" not in line, err


def test_the_limits_are_the_documented_ones():
    from npudoctor.deployment import limits

    assert (limits.MAX_YAML_BYTES, limits.MAX_NODES, limits.MAX_TEXT_CHARS) == (
        MAX_YAML_BYTES,
        MAX_NODES,
        MAX_TEXT_CHARS,
    )
    assert (limits.MAX_VALUE_CHARS, limits.MAX_CONFIG_BYTES, limits.MAX_DEPTH) == (
        MAX_VALUE_CHARS,
        MAX_CONFIG_BYTES,
        MAX_DEPTH,
    )
    from npudoctor.live import livepools
    from npudoctor.static import source

    assert limits.MAX_SERVER_SIZES == MAX_SERVER_SIZES
    assert (source.MAX_SOURCE_BYTES, livepools.PROBED_LAYERS) == (MAX_SOURCE_BYTES, PROBED_LAYERS)


def test_real_deployments_are_far_below_the_limits():
    """Every example deployment reads as before, and the largest of them is well inside each limit."""
    from npudoctor.deployment import limits

    deployments = sorted(EXAMPLES.glob("*.yaml")) + sorted(PROPERTY_DEPLOYMENTS.glob("*.yaml"))
    assert len(deployments) > 10
    for path in deployments:
        load.from_yaml(path)
        measured = limits.MeasuredLoader(path.read_text(), str(path))
        measured.get_single_node()
        assert measured.nodes < MAX_NODES // 30 and measured.chars < MAX_TEXT_CHARS // 30, (
            path,
            measured.nodes,
        )
        assert path.stat().st_size < MAX_YAML_BYTES // 30


# -- the sglang tree: only regular files of bounded size are read --------------------------------------

PLANTED = "sglang/srt/planted.py"  # a module of the tree the static depth reads (every .py is)


def static_check(tree: Path) -> tuple[subprocess.CompletedProcess, float, dict]:
    """``check --depth static`` on ``tree`` in a capped child: its result, wall time and JSON report."""
    done = npudoctor_child(
        "check",
        "--depth",
        "static",
        "--format",
        "json",
        "--sglang-path",
        tree,
        "--config",
        EXAMPLES / "deepseek-v3-pd.yaml",
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    return done, report


def errored(report: dict) -> list[str]:
    return [r["id"] for r in report.get("results", []) if r["status"] == "error"]


@pytest.mark.parametrize(
    "plant",
    [
        # a FIFO (anyone who can write to a shared tree can make one): opening it waits for a writer
        # forever
        pytest.param(os.mkfifo, id="fifo"),
        # a link to /dev/zero reads forever (2.7 GB before the child ran out, uncapped)
        pytest.param(lambda path: path.symlink_to("/dev/zero"), id="dev-zero-link"),
    ],
)
def test_a_py_that_is_not_a_regular_file_is_not_read(tmp_path, release, overlay, plant):
    """A ``.py`` that is not a regular file is not opened, and the checks judge the rest of the tree."""
    tree = overlay(release("0.5.12"))
    plant(tree / PLANTED)
    done, report = static_check(tree)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert not errored(report), errored(report)
    assert report["target"]["unread"] == [f"{PLANTED}: not a regular file"], report["target"]


def test_a_py_larger_than_the_limit_is_skipped_with_a_note(tmp_path, release, overlay):
    """A regular ``.py`` larger than any real module (a planted 5 MB file) is not read: the report
    says it was skipped, and the checks judge the rest of the tree."""
    tree = overlay(release("0.5.12"))
    big = tree / PLANTED
    big.write_bytes(b"# " + b"x" * MAX_SOURCE_BYTES + b"\nclass AscendAttnBackend: pass\n")
    done, report = static_check(tree)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert not errored(report), errored(report)
    assert report["target"]["unread"] == [f"{PLANTED}: larger than 4 MiB"], report["target"]


def test_a_dangling_py_link_does_not_turn_the_checks_into_errors(tmp_path, release, overlay):
    """A ``.py`` symlink whose target is gone (a half-removed checkout): skipped, not an error result."""
    tree = overlay(release("0.5.12"))
    (tree / PLANTED).symlink_to(tmp_path / "gone.py")
    done, report = static_check(tree)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert not errored(report), errored(report)
    assert report["target"]["unread"] == [f"{PLANTED}: a dangling link"], report["target"]
    # and the verdicts are those of the tree without the link
    (tree / PLANTED).unlink()
    _, clean = static_check(tree)
    assert [(r["id"], r["status"]) for r in report["results"]] == [
        (r["id"], r["status"]) for r in clean["results"]
    ]


# -- the live depth: memory flat in the model's size, parallel sizes bounded -----------------------------


def deployment_with_layers(tmp_path: Path, layers: int) -> Path:
    """examples/deepseek-v3-pd.yaml (prefill PP 2, decode TP 16) with a model of ``layers`` layers."""
    folder = tmp_path / f"layers-{layers}"
    folder.mkdir()
    config = json.loads((MODEL_DIR / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(config))
    deploy = folder / "deploy.yaml"
    deploy.write_text((EXAMPLES / "deepseek-v3-pd.yaml").read_text().replace("models/deepseek-v3/", ""))
    return deploy


def live_child(*args: str | Path) -> subprocess.CompletedProcess:
    """``npudoctor ARGS`` in a fresh process (its live child its own, not a zygote's fork)."""
    environ = {**os.environ, "PYTHONPATH": str(CODE), "NPUDOCTOR_NO_CACHE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "npudoctor", *map(str, args)],
        capture_output=True, text=True, env=environ, cwd=CODE, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_the_live_depth_memory_is_flat_in_the_model_layers(tmp_path, release):
    """A model config of 2,000 layers took 3.4 GB in the live child (~1.4 MB a layer: every probe's
    pools held every layer), 20,000 tried to allocate 13 GB. The probes are flat in the layer count:
    the child's peak over its import stays within a small factor of a real 61-layer model's, and the
    evidence says when fewer layers than the model's were probed."""
    tree = release("0.5.13")
    grown, reports = {}, {}
    for layers in (61, 2000):
        done = live_child(
            "check", "--depth", "live", "--format", "json", "--sglang-path", tree,
            "--config", deployment_with_layers(tmp_path, layers), "-s", "NPD",
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr[-2000:]
        report = json.loads(done.stdout)
        live = report["live"]
        grown[layers] = live["peak_rss_mb"] - live["import_rss_mb"]
        assert not [r["id"] for r in report["results"] if r["status"] == "error"], report["results"]
        reports[layers] = report
    # a real model's layers are all probed (up to 128): 2,000 cost what 128 do, ~2x DeepSeek-V3's 61
    assert grown[2000] < 2.5 * grown[61] + 50, grown
    statuses = {size: {r["id"]: r["status"] for r in reports[size]["results"]} for size in reports}
    assert statuses[2000] == statuses[61], statuses  # the same verdicts as the real model's
    sampled = json.dumps(reports[2000]["results"])
    assert "first 128 of 2000 layers" in sampled and "of its 2000 layers" in sampled  # said so


@pytest.mark.parametrize("key", sorted(MAX_SERVER_SIZES))
def test_a_parallel_size_beyond_its_limit_is_refused_with_its_key(tmp_path, release, key):
    """``attn_cp_size: 2147483647`` passed the 32-bit check and took the live child to 6 GB (NPD004's
    probe runs every CP rank): each size that sizes the probes' work is bounded, exit 2 naming it."""
    most = MAX_SERVER_SIZES[key]
    deploy = tmp_path / "deploy.yaml"

    def write(size: int) -> None:
        deploy.write_text(
            f"model: {{config: {MODEL_DIR / 'config.json'}}}\nroles: {{prefill: {{server_args: {{{key}: {size}}}}}}}\n"
        )

    write(2**31 - 1)
    done = npudoctor_child("check", "--depth", "live", "--sglang-path", release("0.5.13"), "--config", deploy)
    line = one_error_line(done)
    assert f"{key} {2**31 - 1} is larger than {most}" in line and "roles.prefill" in line, line
    write(most)  # the limit itself is accepted as far as this input goes
    load.from_yaml(deploy)


# a model config's sizes far beyond a real model's (the 32-bit check admits them), each in the
# tensors of one live probe, and what the probe then says: NPD001's pools (an MLA latent rank),
# NPD004's CP batch (query heads), NPD005's hybrid pool (mamba layers, whose ids are the config's)
OVERSIZED = {
    "a pool of a 16384-wide MLA latent": (
        "deepseek-v3-pd.yaml", "deepseek-v3", {"kv_lora_rank": 16384}, "NPD001", "more than the 512 MiB"
    ),
    "a CP batch of 2048 query heads": (
        "qwen3-cp-prefill.yaml", "qwen3-30b-a3b", {"num_attention_heads": 2048}, "NPD004", "more than the 512 MiB"
    ),
    "a hybrid pool of 480 layers": (
        "qwen3-next-decode.yaml", "qwen3-next-80b-a3b", {"num_hidden_layers": 480}, "NPD005", "at most 128 layers"
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", OVERSIZED)
def test_a_probe_of_oversized_dimensions_cannot_tell_within_bounded_memory(tmp_path, release, case):
    """A pool or a batch that would take more than 512 MiB, or a hybrid pool of more layers than
    npudoctor probes, is not built (1.3 GB and more before, any size the config asked for): the
    probe cannot tell, and says why."""
    example, model, changes, check, said = OVERSIZED[case]
    config = json.loads((EXAMPLES / "models" / model / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text((EXAMPLES / example).read_text().replace(f"models/{model}/", ""))
    done = live_child(
        "check", "--depth", "live", "--format", "json", "--sglang-path", release("0.5.13"),
        "--config", deploy, "-s", check,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(done.stdout)
    grown = report["live"]["peak_rss_mb"] - report["live"]["import_rss_mb"]
    assert grown < 400, report["live"]
    result = next(r for r in report["results"] if r["id"] == check)
    assert result["status"] == "warn", (result["status"], result["summary"])
    assert said in json.dumps(result["evidence"]), result["evidence"]


def test_npd003_maps_a_model_split_as_the_deployment_or_cannot_tell():
    """Beyond ``PROBED_LAYERS`` NPD003 probes a model cut to at most that many layers, split by
    sglang into as many stages with as many one layer longer; where that split is not the
    deployment's (an explicit ``SGLANG_PP_LAYER_PARTITION``, more stages than layers probed) it
    cannot tell. A real model is probed whole."""
    from npudoctor.checks.npd003_pp_transfer_map.live import mapped_model
    from npudoctor.deployment.facts import role_facts

    model = load.model_from_config_file(MODEL_DIR / "config.json")
    prefill = role_facts("prefill", {"pp_size": 3}, {}, model)
    assert mapped_model(model, prefill) == (model, "")  # 61 layers: the real split
    big = dataclasses.replace(model, num_layers=2003)  # 2003 = 3 * 667 + 2: two stages one layer longer
    probed, note = mapped_model(big, prefill)
    assert probed.num_layers == 3 * 42 + 2 == PROBED_LAYERS, note
    assert "128 of its 2003 layers" in note and "2 of them one layer longer" in note, note
    explicit = role_facts("prefill", {"pp_size": 3}, {"SGLANG_PP_LAYER_PARTITION": "1000,1000,3"}, big)
    assert mapped_model(big, explicit)[0] is None
    assert mapped_model(big, role_facts("prefill", {"pp_size": 200}, {}, big))[0] is None
