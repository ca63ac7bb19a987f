"""NPD003 fix beyond the generic fix tests: sglang#23893 ported to 0.5.9-0.5.11, and npudoctor's
own fix of the MHA pointer splitter for 0.5.12-0.5.23.

On every release the port is written for, NPD003's live probe (the installed Ascend send_kvcache per
prefill PP stage, real NPU pools on CPU, every recorded address decoded to (layer, kind)) runs
on MLA and MHA deployments, first as sglang ships, then with the fix in place: every stage's
buffers map one to one onto the same layer and kind on decode, with and without decode draft
layers, for even and uneven PP splits and for a decode with the prefill's PP size. The layer
count the replacement slices by is the served model's (two models whose first stage and decode
lists have the same sizes are mapped differently, each right). It is opt-in (unsafe) and refuses
a shape it was not written for.

From 0.5.12 on, MLA pools go through upstream's group-aware splitter (not needed for the MLA
examples), while MHA pools still go through ``get_mha_kv_ptrs_with_pp``, which guesses decode's
V half from layer-count divisibility: Llama-3-70B over prefill PP 3 (26 + 27 + 27) and Qwen3
over ``SGLANG_PP_LAYER_PARTITION=20,28`` land V elsewhere on 0.5.23 still. There the fix replaces
only that splitter (npudoctor's own), and the live probe shows every stage right for MHA with
and without draft layers, MLA and MLA with the indexer alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_npd003_static import write_deployment

from npudoctor.patching.fixbase import fix_by_id
from npudoctor.target.discovery import discover

from conftest import fixprobe, sweep
from support.repo import EXAMPLES, REPO
from support.trees import replace_text
from support.truths import RELEASES, truth_verdict

DEEPSEEK_V3 = EXAMPLES / "deepseek-v3-pd.yaml"  # MLA (K, V), 61 layers, no draft model
DEEPSEEK_V32 = EXAMPLES / "deepseek-v3.2-pd.yaml"  # MLA + NSA indexer (K, V, IK), decode with MTP
QWEN3 = EXAMPLES / "models" / "qwen3-30b-a3b" / "config.json"  # GQA, 48 layers
CONN = "sglang/srt/disaggregation/ascend/conn.py"
# The releases that truth says carry the defect (0.5.10 ships 0.5.11's ascend/conn.py, asserted below).
WRITTEN_FOR = [v for v in RELEASES if truth_verdict(v, "NPD003") == "present"]
ABSENT = [v for v in RELEASES if truth_verdict(v, "NPD003") == "absent"]


def deployment(
    directory: Path, name: str, model: Path, prefill: dict, decode: dict, env: dict | None = None
) -> Path:
    """A PD deployment YAML: ascend transfer, prefill PP 2 unless ``prefill`` says otherwise."""
    roles = {
        "prefill": {
            "server_args": {
                "tp_size": 4,
                "pp_size": 2,
                "disaggregation_mode": "prefill",
                "disaggregation_transfer_backend": "ascend",
                **prefill,
            }
        },
        "decode": {
            "server_args": {
                "tp_size": 4,
                "disaggregation_mode": "decode",
                "disaggregation_transfer_backend": "ascend",
                **decode,
            }
        },
    }
    if env:
        roles["prefill"]["env"] = env
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"model": {"config": str(model)}, "roles": roles}))
    return path


@pytest.fixture(scope="session")
def deployments(tmp_path_factory) -> dict[str, Path]:
    """The deployments probed on each release, by short name; once per worker (session scope): a
    module fixture made again, after the worker ran another module in between, wrote them to
    another directory, and ``fixprobe`` ran the release's probe again for the new paths."""
    directory = tmp_path_factory.mktemp("npd003-fix")
    eagle = {"speculative_algorithm": "EAGLE3"}
    uneven = {"SGLANG_PP_LAYER_PARTITION": "20,28"}
    nextn = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 1}
    # A DeepSeek-V3 whose first PP 2 stage and decode lists have the sizes of the real one's with
    # MTP: 60 layers (30 + 30) and 2 MTP layers give 62 decode layers per buffer group, as
    # 61 + 1 do. Only the served model's layer count tells them apart.
    config = json.loads((EXAMPLES / "models" / "deepseek-v3" / "config.json").read_text())
    config.update(num_hidden_layers=60, num_nextn_predict_layers=2)
    (directory / "ds60").mkdir()
    (directory / "ds60" / "config.json").write_text(json.dumps(config))
    ds60 = directory / "ds60" / "config.json"
    dsv32 = EXAMPLES / "models" / "deepseek-v3.2" / "config.json"
    return {
        "deepseek-v3": DEEPSEEK_V3,  # scenario first: decide() runs on it
        "deepseek-v3.2": DEEPSEEK_V32,
        "deepseek-v3-mtp": deployment(
            directory, "deepseek-v3-mtp", EXAMPLES / "models/deepseek-v3/config.json", {}, nextn
        ),
        "deepseek-60-mtp2": deployment(directory, "deepseek-60-mtp2", ds60, {}, nextn),
        "deepseek-v3.2-pp3": deployment(directory, "deepseek-v3.2-pp3", dsv32, {"pp_size": 3}, nextn),
        "deepseek-v3.2-decode-pp2": deployment(
            directory, "deepseek-v3.2-decode-pp2", dsv32, {}, {"pp_size": 2, **nextn}
        ),
        "qwen3": deployment(directory, "qwen3", QWEN3, {}, {}),
        "qwen3-eagle": deployment(directory, "qwen3-eagle", QWEN3, {}, eagle),
        "qwen3-uneven": deployment(directory, "qwen3-uneven", QWEN3, {}, {}, uneven),
        "qwen3-uneven-eagle": deployment(directory, "qwen3-uneven-eagle", QWEN3, {}, eagle, uneven),
        "qwen3-decode-pp2-eagle": deployment(
            directory, "qwen3-decode-pp2-eagle", QWEN3, {}, {"pp_size": 2, **eagle}
        ),
    }


@pytest.fixture(scope="session")
def probed(release, deployments):
    """``probed(version)`` -> {"plain"/"fixed": {name: result}, ...}, one interpreter per release."""
    cache: dict[str, dict] = {}

    def run(version: str) -> dict:
        if version not in cache:
            raw = fixprobe(
                release(version),
                "compare",
                "NPD003",
                *deployments.values(),
                options=("--unsafe",),
                timeout=1500,
            )
            names = {str(path): name for name, path in deployments.items()}
            cache[version] = {
                "decision": raw["decisions"][str(next(iter(deployments.values())))]["action"],
                **{key: raw[key] for key in ("outcome",) if key in raw},
                **{
                    key: {names[c]: {**r, "stages": _stages(r)} for c, r in raw[key].items()}
                    for key in ("plain", "fixed")
                    if key in raw
                },
            }
        return cache[version]

    return run


def probed_on_one_worker(params: list) -> list:
    """``params`` (``sweep``'s) each in the xdist group of its release's ``probed`` run: the tests
    reading one run go to the worker that makes it (another worker would only wait for it)."""
    grouped = []
    for param in params:
        param = param if hasattr(param, "values") else pytest.param(param)
        marks = [*param.marks, pytest.mark.xdist_group(f"npd003-fix-{param.values[0]}")]
        grouped.append(pytest.param(*param.values, marks=marks, id=param.id))
    return grouped


def _stages(result: dict) -> list[str]:
    return [line for line in result["observed"] if line.startswith("prefill stage")]


def stage_sizes(result: dict) -> list[str]:
    return [line.split(":")[0] for line in result["stages"]]


def test_0510_ships_the_ascend_transfer_code_of_0511(release):
    assert (release("0.5.10") / CONN).read_bytes() == (release("0.5.11") / CONN).read_bytes()
    fix = fix_by_id("NPD003")
    assert fix.known_release(fix.shape_of_source(discover(release("0.5.10")).tree)) == "0.5.10"


@pytest.mark.slow
@pytest.mark.parametrize(
    "version", probed_on_one_worker(sweep(WRITTEN_FOR))
)  # 0.5.9 (no PP handling), 0.5.11
def test_every_stage_maps_one_to_one_with_the_fix(probed, version):
    """MLA (K, V), MLA + indexer, MHA; even and uneven splits; no draft, MTP/EAGLE3 draft on a
    decode of PP 1 or of the prefill's PP size: unpatched, the examples and the uneven MHA splits
    write into other layers or kinds; with the fix, every stage's buffers land one to one."""
    report = probed(version)
    assert report["decision"] == "apply" and report["outcome"] == "applied", report.get("decision")
    plain, fixed = report["plain"], report["fixed"]
    for name in ("deepseek-v3", "deepseek-v3.2", "deepseek-v3-mtp", "deepseek-v3.2-pp3", "qwen3-uneven",
                 "qwen3-uneven-eagle"):  # fmt: skip
        assert plain[name]["status"] == "fail", (name, plain[name]["summary"])
        assert "pairs wrong" in " ".join(plain[name]["stages"]) or "raised" in plain[name]["summary"], name
    for name, result in fixed.items():
        assert result["status"] == "pass", (name, result["summary"], result["stages"])
        assert result["stages"] and all(
            " pairs right, one decode buffer each " in s for s in result["stages"]
        ), name
        assert stage_sizes(result) == stage_sizes(plain[name]), name  # the same stages, judged again
    if version == "0.5.9":  # no PP handling at all: even the even MHA split is wrong unpatched
        assert plain["qwen3"]["status"] == "fail" and "V0 -> K24" in plain["qwen3"]["stages"][0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "version", probed_on_one_worker(sweep(WRITTEN_FOR))
)  # 0.5.9 (no PP handling), 0.5.11
def test_pairs_per_stage_with_the_fix(probed, version):
    """The exact pairs of the first and last buffers of each stage (the probe quotes them)."""
    fixed = probed(version)["fixed"]
    v3, v32, qwen = (
        fixed["deepseek-v3"]["stages"],
        fixed["deepseek-v3.2"]["stages"],
        fixed["qwen3-uneven-eagle"]["stages"],
    )
    assert (
        v3[0].startswith("prefill stage 0 (layers 0-29): 60 of 60 pairs right")
        and "(K0 -> K0 ... V29 -> V29)" in v3[0]
    )
    assert (
        v3[1].startswith("prefill stage 1 (layers 30-60): 62 of 62 pairs right")
        and "(K30 -> K30 ... V60 -> V60)" in v3[1]
    )
    assert "90 of 90 pairs right" in v32[0] and "(K30 -> K30 ... IK60 -> IK60)" in v32[1]
    assert (
        qwen[0].startswith("prefill stage 0 (layers 0-19): 40 of 40 pairs right") and "V19 -> V19" in qwen[0]
    )
    assert (
        qwen[1].startswith("prefill stage 1 (layers 20-47): 56 of 56 pairs right") and "V47 -> V47" in qwen[1]
    )
    pp3 = fixed["deepseek-v3.2-pp3"]["stages"]
    assert [s.split(":")[0] for s in pp3] == [
        "prefill stage 0 (layers 0-19)", "prefill stage 1 (layers 20-39)", "prefill stage 2 (layers 40-60)",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.xdist_group("npd003-fix-0.5.11")  # the run of test_every_stage_maps_one_to_one_with_the_fix
def test_the_decode_layer_count_is_the_served_models(probed):
    """Same pointer counts, different models: stage 0 holds 30 layers (60 pointers) and decode 62
    layers per group (124 pointers) in both, 61 + 1 MTP layer or 60 + 2. 0.5.11's splitter sees
    only the counts, so it maps both the same way: right for 60 + 2 (its divisibility guess lands
    on 60), V0 into the wrong buffer for 61 + 1. The fix reads each served model's layer count
    and maps both right."""
    report = probed("0.5.11")
    plain, fixed = report["plain"], report["fixed"]
    for name in ("deepseek-v3-mtp", "deepseek-60-mtp2"):
        assert plain[name]["stages"][0].startswith("prefill stage 0 (layers 0-29): ")
        first = fixed[name]["stages"][0]
        assert first.startswith("prefill stage 0 (layers 0-29): 60 of 60 pairs right"), first
        assert fixed[name]["status"] == "pass"
    assert (
        plain["deepseek-v3-mtp"]["status"] == "fail" and "V0 -> K60" in plain["deepseek-v3-mtp"]["stages"][0]
    )
    assert plain["deepseek-60-mtp2"]["status"] == "pass"
    assert fixed["deepseek-60-mtp2"]["stages"][1].startswith(
        "prefill stage 1 (layers 30-59): 60 of 60 pairs right"
    )


@pytest.mark.parametrize("version", ABSENT)
def test_not_needed_where_the_check_passes(cli, release, version):
    for config in (DEEPSEEK_V3, DEEPSEEK_V32):
        code, out, err = cli(
            "fix", "--format", "json", "--unsafe", "--select", "NPD003", "--sglang-path", release(version),
            "--config", config,
        )  # fmt: skip
        assert code == 0, err
        (entry,) = json.loads(out)["plan"]
        assert entry["action"] == "not needed" and entry["reason"].startswith("NPD003 pass"), (config, entry)


def test_unsafe_needs_the_opt_in(cli, release):
    def plan(*extra: str) -> dict:
        code, out, err = cli(
            "fix", "--format", "json", *extra, "--select", "NPD003", "--sglang-path", release("0.5.11"),
            "--config", DEEPSEEK_V3,
        )  # fmt: skip
        assert code == (0 if extra else 1), err  # refused where NPD003 fails: exit 1
        (entry,) = json.loads(out)["plan"]
        return entry

    refused, accepted = plan(), plan("--unsafe")
    assert refused["action"] == "refused" and "--unsafe" in refused["reason"], refused
    assert accepted["action"] == "apply" and accepted["reason"].startswith("NPD003 fails here"), accepted


def test_another_shape_is_refused_with_the_sites_that_differ(cli, release, overlay):
    """0.5.11 with another PP layer partition: the defect is still there (static fail), but the
    replacement relies on get_pp_indices; the plan refuses and names it, and only it."""
    tree = overlay(release("0.5.11"))
    replace_text(
        tree / "sglang/srt/distributed/utils.py",
        "base_layers = num_hidden_layers // pp_size",
        "base_layers = max(1, num_hidden_layers // pp_size)",
    )
    code, out, err = cli(
        "fix", "--format", "json", "--unsafe", "--select", "NPD003", "--sglang-path", tree, "--config", DEEPSEEK_V3,
    )  # fmt: skip
    assert code == 1, err  # a fix refused where its check fails leaves the defect: exit 1
    (entry,) = json.loads(out)["plan"]
    reason = entry["reason"]
    assert entry["action"] == "refused" and "not a shape this fix was written for" in reason, entry
    assert "sglang.srt.distributed.utils:get_pp_indices (" in reason
    assert "send_kvcache (" not in reason and "get_global_server_args (" not in reason


MHA_SPLITTER = "sglang.srt.disaggregation.ascend.conn:AscendKVManager.get_mha_kv_ptrs_with_pp"
# Releases whose MHA splitter the fix replaces, where the live probe runs it (tests below).
LATER = ["0.5.12", "0.5.13", "0.5.23"]


def plan_entry(cli, tree, config, *extra: str) -> dict:
    code, out, err = cli(
        "fix", "--format", "json", "--unsafe", "--select", "NPD003", "--sglang-path", tree, "--config", config,
        *extra,
    )  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["plan"]
    return entry


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_the_mha_splitter_of_later_releases_is_what_the_fix_replaces(cli, release, tmp_path, version):
    """0.5.12+ fail an uneven MHA split at the static depth now; the plan installs only the MHA
    splitter (send_kvcache is upstream's, already right for MLA) and says the fix is npudoctor's
    own. An even split with a draft layer (24 + 24, EAGLE3: the guess lands on 48) needs none."""
    llama = write_deployment(tmp_path, "llama-3-70b-pd-pp3")
    entry = plan_entry(cli, release(version), llama, "--depth", "static")
    assert entry["action"] == "apply" and entry["reason"].startswith("NPD003 fails here"), entry
    assert (
        entry["replaces"] == [MHA_SPLITTER]
        and "replaces only AscendKVManager.get_mha_kv_ptrs_with_pp" in entry["reason"]
    )
    even = plan_entry(
        cli, release(version), write_deployment(tmp_path, "qwen3-moe-pd-pp2-eagle"), "--depth", "static"
    )
    assert even["action"] == "not needed", even
    fix = fix_by_id("NPD003")
    assert (
        fix.own
        and "0.5.12-0.5.23" in fix.own
        and fix.known_release(fix.shape_of_source(discover(release(version)).tree)) == version
    )


@pytest.fixture(scope="session")
def later_deployments(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("npd003-later")
    return {
        "llama-3-70b-pd-pp3": write_deployment(directory, "llama-3-70b-pd-pp3"),  # first: decide() runs on it
        "llama-3-70b-pd-pp3-eagle": write_deployment(directory, "llama-3-70b-pd-pp3-eagle"),
        "qwen3-moe-pd-pp2-uneven-eagle": write_deployment(directory, "qwen3-moe-pd-pp2-uneven-eagle"),
        "qwen3-moe-pd-pp2-eagle": write_deployment(directory, "qwen3-moe-pd-pp2-eagle"),
        "deepseek-v3": DEEPSEEK_V3,  # MLA (K, V), no draft
        "deepseek-v3.2": DEEPSEEK_V32,  # MLA + NSA indexer, decode with MTP
    }


@pytest.mark.slow
@pytest.mark.parametrize("version", sweep(LATER, quick=()))
def test_the_mha_splitter_fix_maps_every_stage_on_later_releases(release, later_deployments, version):
    """Unpatched, the uneven MHA splits write V into other layers (with and without a draft layer
    on decode); with the fix every stage of every deployment maps one to one, MLA and MLA with the
    indexer included (their path is upstream's and stays right)."""
    raw = fixprobe(
        release(version),
        "compare",
        "NPD003",
        *later_deployments.values(),
        options=("--unsafe",),
        timeout=1500,
    )
    names = {str(path): name for name, path in later_deployments.items()}
    assert raw["outcome"] == "applied" and raw["patched"] == [MHA_SPLITTER], raw.get("decisions")
    plain = {names[c]: r for c, r in raw["plain"].items()}
    fixed = {names[c]: r for c, r in raw["fixed"].items()}
    for name in ("llama-3-70b-pd-pp3", "llama-3-70b-pd-pp3-eagle", "qwen3-moe-pd-pp2-uneven-eagle"):
        assert plain[name]["status"] == "fail" and "pairs wrong" in " ".join(plain[name]["observed"]), name
    for name in ("qwen3-moe-pd-pp2-eagle", "deepseek-v3", "deepseek-v3.2"):
        assert plain[name]["status"] == "pass", (name, plain[name]["summary"])
    for name, result in fixed.items():
        stages = [line for line in result["observed"] if line.startswith("prefill stage")]
        assert result["status"] == "pass", (name, result["summary"], stages)
        assert stages and all(" pairs right, one decode buffer each " in line for line in stages), name
    llama = [line for line in fixed["llama-3-70b-pd-pp3"]["observed"] if line.startswith("prefill stage")]
    assert (
        llama[0].startswith("prefill stage 0 (layers 0-25): 52 of 52 pairs right")
        and "V25 -> V25" in llama[0]
    )
    assert (
        llama[2].startswith("prefill stage 2 (layers 53-79): 54 of 54 pairs right")
        and "V79 -> V79" in llama[2]
    )
    assert "via get_mha_kv_ptrs_with_pp (npudoctor fix npd003_pp_transfer_map)" in llama[0]


# Runs with 0.5.11 on PYTHONPATH: the replacement's own refusals, on a stand-in manager.
REFUSALS = """
import json, sys
from types import SimpleNamespace
from npudoctor.live.npusim import simulated_npu
with simulated_npu():
    import sglang.srt.disaggregation.utils, sglang.srt.distributed.utils, sglang.srt.server_args as sa
    from npudoctor.fixes import npd003_pp_transfer_map as fix
    sa.set_global_server_args_for_scheduler(SimpleNamespace(get_model_config=lambda: SimpleNamespace(num_hidden_layers=61)))
    def stage(rank, start, ptrs):
        return SimpleNamespace(pp_rank=rank, pp_size=2, kv_args=SimpleNamespace(prefill_start_layer=start))
    found = {}
    cases = {
        "mapped": (stage(1, 30, None), list(range(93)), list(range(186))),
        "wrong start": (stage(1, 31, None), list(range(93)), list(range(186))),
        "partial group": (stage(0, 0, None), list(range(89)), list(range(186))),
        "short decode": (stage(0, 0, None), list(range(90)), list(range(87))),
    }
    for name, (manager, src, dst) in cases.items():
        try:
            found[name] = fix.stage_destinations(manager, src, dst)
        except fix.TransferMapError as error:
            found[name] = "refused: " + str(error)
    # the MHA splitter replacement (0.5.12+): stage 1 (30-60) of 61 layers, decode 61 + 1 draft layer
    found["mha"] = fix.get_mha_kv_ptrs_with_pp(stage(1, 30, None), list(range(62)), list(range(124)))
print(json.dumps(found))
"""


@pytest.mark.slow
def test_the_replacement_refuses_lists_it_cannot_map(release):
    """Pointer counts that are not whole buffer groups of the stage's layers, or a stage start the
    partition does not give, raise instead of guessing; a consistent one maps group by group."""
    env = {**os.environ, "PYTHONPATH": str(release("0.5.11"))}
    done = subprocess.run(
        [sys.executable, "-c", REFUSALS], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # stage 1 of 61 layers (30-60) in 3 groups; decode 62 per group (61 + 1 draft)
    assert found["mapped"] == [g * 61 + layer for g in range(3) for layer in range(30, 61)]
    assert found["wrong start"].startswith("refused: PP rank 1 of 2 starts at layer 30 of 61")
    assert "not whole buffer groups of its 30 layers" in found["partial group"]
    assert found["short decode"].startswith("refused: decode registers 87 KV pointers")
    src_k, src_v, dst_k, dst_v, layers = found["mha"]
    assert (src_k, src_v, layers) == (list(range(31)), list(range(31, 62)), 31)
    assert (dst_k, dst_v) == (list(range(30, 61)), list(range(61 + 30, 61 + 61)))  # V at 61 + layer, not 62


# Every release the fix replaces the MHA splitter on: `npudoctor check --with-fix NPD003` (the live
# child with the fix in place) on Llama-3-70B PP 3 with an EAGLE3 draft layer on decode.
WITH_FIX = [f"0.5.{minor}" for minor in range(12, 24)]  # 0.5.12 ... 0.5.23


@pytest.mark.slow
@pytest.mark.parametrize("version", sweep(WITH_FIX, quick=()))
def test_with_fix_cures_the_llama_split_on_every_later_release(live_report, tmp_path, version):
    """Static fails the split (the installed splitter's arithmetic); with the fix the live probe
    runs sglang's send_kvcache through the replacement and every stage maps one to one."""
    config = write_deployment(tmp_path, "llama-3-70b-pd-pp3-eagle")
    report = live_report(version, config, "--with-fix", "NPD003", "--select", "NPD003", depth="auto")
    result = next(r for r in report["results"] if r["id"] == "NPD003")
    assert (result["status"], result["depth"]) == ("pass", "live"), result["summary"]
    assert result["summary"].startswith("with runtime fix NPD003:")
    assert any("the installed source, read statically: fail" in a for a in result["assumptions"])
    observed = [e["observed"] for e in result["evidence"] if e["observed"].startswith("prefill stage")]
    stages = [line for line in observed if line.endswith("(live, CPU)")]
    assert len(stages) == 3 and all("via get_mha_kv_ptrs_with_pp (npudoctor fix" in s for s in stages), stages
    assert all("pairs wrong" in line for line in observed if line.endswith("(static, evaluated)"))
