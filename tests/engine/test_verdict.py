"""One verdict for a deployment, whichever command asks.

* ``check.verdict`` turns (static probe, live probe) into the result by the rules of the
  repository's DESIGN.md ("The verdict"); every combination is driven through a real check;
* a defect only the live probe sees (0.5.12, Qwen3-MoE PD without FIA: sglang's own offload
  raises IndexError where the static probe saw nothing) is ``fail`` and exit 1 at auto depth; the
  fixed release passes; ``fix`` plans the fix there, ``--with-fix`` and ``npudoctor run`` cure it;
* ``check``, ``fix`` and ``run`` reach the same decision on every cell of a matrix;
* a deployment no check applies to starts no live child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from npudoctor.engine.check import Probe, verdict
from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.results import Depth, Evidence, Status
from npudoctor.service.evaluate import NO_LIVE_PROBE_APPLIES

from conftest import QUICK_STATES, fixprobe
from support.repo import EXAMPLES
from support.reports import result_of

CHECK = next(c for c in all_checks() if c.id == "NPD001")
MHA_PD = EXAMPLES / "qwen3-moe-pd.yaml"  # FIA off: the NPU MHA pool is page-major


def probe(status: str, summary: str = "", *, stood_in: tuple[str, ...] = ()) -> Probe:
    return Probe(
        Status(status), summary or status, (Evidence(expected="e", observed=summary),), stood_in=stood_in
    )


@pytest.mark.parametrize(
    ("static", "live", "status", "depth"),
    [
        ("pass", "fail", "fail", "live"),  # live saw sglang's own code fail: static missed it
        ("warn", "fail", "fail", "live"),
        ("skip", "fail", "fail", "live"),
        ("fail", "pass", "warn", "live"),  # the simulation may hide what static saw
        ("fail", "fail", "fail", "live"),
        ("pass", "pass", "pass", "live"),
        ("pass", "warn", "pass", "static"),  # live could not tell, static could
        ("fail", "warn", "fail", "static"),
        ("warn", "pass", "pass", "live"),
        ("warn", "skip", "warn", "live"),  # neither could tell
    ],
)
def test_verdict_rules(static, live, status, depth):
    result = verdict(CHECK, probe(static, "static said"), probe(live, "live said"))
    assert (result.status.value, result.depth.value) == (status, depth), result
    if (static, live) == ("pass", "fail"):
        assert any("static depth: pass" in a and "gap in the static probe" in a for a in result.assumptions)


def test_a_probe_that_reached_a_stand_in_is_never_pass():
    live = probe(
        "warn", "cannot tell: the probe reached xgrammar, stood in on this host", stood_in=("xgrammar",)
    )
    assert verdict(CHECK, probe("pass"), live).status is Status.WARN
    assert verdict(CHECK, probe("fail"), live).status is Status.FAIL  # static saw the defect itself
    assert verdict(CHECK, probe("pass"), probe("warn")).status is Status.PASS  # an ordinary cannot-tell


def test_live_not_run_keeps_the_static_verdict_and_says_why():
    result = verdict(CHECK, probe("pass"), None, "sglang does not import here: ModuleNotFoundError")
    assert (result.status, result.depth) == (Status.PASS, Depth.STATIC)
    assert result.assumptions[-1] == "live depth not run: sglang does not import here: ModuleNotFoundError"
    assert verdict(CHECK, None, None, "no child").status is Status.ERROR  # --depth live with no live run


# ----- a live-only failure, end to end on real releases -------------------------------------
def test_live_only_failure_is_fail_and_exit_1(cli, release):
    code, out, err = cli("check", "-f", "json", "--sglang-path", release("0.5.12"), "--config", MHA_PD,
                         "--depth", "auto", "--select", "NPD001")  # fmt: skip
    assert code == 1, err
    result = result_of(json.loads(out), "NPD001")
    assert (result["status"], result["depth"]) == ("fail", "live"), result
    assert "IndexError" in result["evidence"][0]["observed"]
    assert result["evidence"][0]["location"]["path"] == "sglang/srt/mem_cache/memory_pool.py"
    # no static gap any more: the static probe alone sees the page-major view the
    # inherited get_cpu_copy indexes with token slots (mem_cache/memory_pool.py:992), so no note
    assert not any("static depth: pass" in a for a in result["assumptions"])
    code, out, _ = cli("check", "-f", "json", "--sglang-path", release("0.5.12"), "--config", MHA_PD,
                       "--depth", "static", "--select", "NPD001")  # fmt: skip
    static = result_of(json.loads(out), "NPD001")
    assert (code, static["status"]) == (1, "fail")
    assert "sglang/srt/mem_cache/memory_pool.py:992" in json.dumps(static["evidence"])


@pytest.mark.slow
def test_fixed_release_passes_the_same_deployment(cli, release):
    code, out, err = cli("check", "-f", "json", "--sglang-path", release("0.5.13"), "--config", MHA_PD,
                         "--depth", "auto", "--select", "NPD001")  # fmt: skip
    assert code == 0, err
    assert result_of(json.loads(out), "NPD001")["status"] == "pass"


@pytest.mark.slow
def test_fix_plans_and_with_fix_cures_the_live_only_failure(cli, release):
    code, out, err = cli("fix", "-f", "json", "--sglang-path", release("0.5.12"), "--config", MHA_PD,
                         "--select", "NPD001", "--depth", "auto")  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "apply" and "IndexError" not in entry["reason"], entry
    assert entry["reason"].startswith("NPD001 fails here: NPUMHATokenToKVPool"), entry
    code, out, err = cli("check", "-f", "json", "--sglang-path", release("0.5.12"), "--config", MHA_PD,
                         "--depth", "auto", "--select", "NPD001", "--with-fix", "NPD001")  # fmt: skip
    assert code == 0, err
    result = result_of(json.loads(out), "NPD001")
    assert (result["status"], result["depth"]) == ("pass", "live") and result["summary"].startswith(
        "with runtime fix NPD001:"
    ), result


@pytest.mark.slow
def test_run_applies_the_fix_for_the_live_only_failure(release):
    run = (
        sys.executable,
        "-m",
        "npudoctor",
        "run",
        "--verbose",
        "--config",
        str(MHA_PD),
        "--select",
        "NPD001",
        "--",
    )
    result = fixprobe(release("0.5.12"), "spawn", "NPD001", MHA_PD, prefix=run)
    assert result["status"] == "pass" and result["fixes"] == {"NPD001": "applied"}, result
    assert "NPD001: apply: NPD001 fails here" in result["stderr"]


# ----- check, fix and run agree ---------------------------------------------------------------
DEPLOYMENTS = [None, *sorted(EXAMPLES.glob("*.yaml"))]
CONSISTENT = {  # the check's status -> the fix decisions it allows
    "pass": {"not needed"},
    "skip": {"not needed"},
    "fail": {"apply", "refused"},  # refused: a shape the fix was not written for, or --unsafe needed
    "warn": {"refused"},
    "error": {"refused"},
}


@pytest.mark.parametrize("state", QUICK_STATES[:2])
@pytest.mark.parametrize("config", DEPLOYMENTS, ids=lambda c: c.name if c else "no-deployment")
def test_check_fix_and_run_agree(state, config, cli, subject):
    tree = subject(state)
    given = ["--config", str(config)] if config else []
    code, out, err = cli("check", "-f", "json", "--sglang-path", tree, *given)
    assert code in (0, 1), err
    statuses = {r["id"]: r for r in json.loads(out)["results"]}
    code, out, err = cli("fix", "-f", "json", "--sglang-path", tree, *given)
    plan = {entry["id"]: entry for entry in json.loads(out)["plan"]}
    # a fix refused where its check fails (an unsafe one without --unsafe) leaves the defect: exit 1
    refused = [
        i for i, entry in plan.items() if entry["action"] == "refused" and statuses[i]["status"] == "fail"
    ]
    assert code == (1 if refused else 0), err
    for fix_id, entry in plan.items():
        result = statuses[fix_id]
        assert entry["action"] in CONSISTENT[result["status"]], (fix_id, result["status"], entry)
        if entry["action"] == "not needed":
            assert entry["reason"] == f"{fix_id} {result['status']}: {result['summary']}"
        if result["status"] == "fail":
            assert "could not confirm" not in entry["reason"]
    # `run` plans with the installed sglang: the tree goes on PYTHONPATH, as in an image; --verbose
    # says every fix's decision
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "run", "--depth", "static", "--verbose", *given, "--", sys.executable,
         "-c", "pass"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("npudoctor: NPD")]
    assert said == [
        f"npudoctor: {fix_id}: {entry['action']}: {' '.join(entry['reason'].split())}"
        for fix_id, entry in plan.items()
    ]


# ----- no live child where nothing applies ----------------------------------------------------
def test_a_deployment_no_check_applies_to_starts_no_live_child(cli, release, tmp_path):
    config = tmp_path / "qwen2.5-colocated.yaml"
    config.write_text(
        "model: {hf_config: {architectures: [Qwen2ForCausalLM], num_hidden_layers: 28, hidden_size: 3584,\n"
        "  num_attention_heads: 28, num_key_value_heads: 4, head_dim: 128}}\n"
        "roles: {server: {server_args: {tp_size: 2}}}\n"
    )
    for depth in ("auto", "live"):
        code, out, err = cli("check", "-f", "json", "--sglang-path", release("0.5.13"), "--config", config,
                             "--depth", depth)  # fmt: skip
        report = json.loads(out)
        assert code == (1 if report["summary"]["findings"] else 0), err  # a catalog record may apply
        assert report["live"] == {"ran": False, "reason": NO_LIVE_PROBE_APPLIES}
        checks = [
            r for r in report["results"] if CheckKind.of(r["id"]) is CheckKind.DEEP and r["id"] != "NPD000"
        ]
        assert {r["status"] for r in checks} == {"skip"}, report["results"]
