"""The gate's severity (issue 34, item 5): every check and catalog record names its impact (what the
defect does where it bites); a crash or silent wrong output fails the gate, a leak or a performance
loss warns unless ``--fail-on`` (or the deployment YAML's ``fail_on``) names its impact, and every
format says the impact.

NPC134 (the NPU graph's update thread opens a context on NPU 0: about 1 GB there at 16 ranks) is a
leak that bites nearly every multi-rank graph deployment of the releases that ship it; NPC072 (PP 2
deadlocks on NPU) is a hang, on the same releases, for the same deployment with --pp-size 2. Both run
on the real wheels through the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from npudoctor.engine.catalog import CatalogRecord, all_records
from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.formatters import FORMATS
from npudoctor.results import Impact

from support.notorch import WITHOUT_TORCH
from support.repo import EXAMPLES, REPO
from support.reports import result_of, without_progress

TRUTHS = Path(__file__).resolve().parents[1] / "data" / "catalog"
LEAK, HANG = "NPC134", "NPC072"


def _deployment(tmp_path: Path, *, pp: int = 1, fail_on: list[str] | None = None) -> Path:
    """NPC134's own trigger (tests/data/catalog/NPC134.yaml: a multi-rank graph server), with
    --pp-size ``pp`` and the YAML's ``fail_on``."""
    spec = yaml.safe_load((TRUTHS / f"{LEAK}.yaml").read_text())["trigger"]
    spec["roles"]["server"]["server_args"]["pp_size"] = pp
    if fail_on is not None:
        spec["fail_on"] = fail_on
    path = tmp_path / f"deploy-pp{pp}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _shipping(record_id: str, version: str) -> None:
    """The record's releases, derived from the wheels, say ``version`` ships the defect."""
    (record,) = [r for r in all_records() if r.id == record_id]
    assert version in record.releases["affected"], f"{record_id} is not in {version} by its derived ranges"


def _check(cli, tree: Path, deployment: Path, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli("check", "--sglang-path", tree, "--config", deployment, "-f", "json", *args)
    return code, json.loads(out), err


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16"])
def test_a_leak_warns_and_passes_the_gate_by_default(cli, release, tmp_path, version):
    _shipping(LEAK, version)
    code, report, err = _check(cli, release(version), _deployment(tmp_path), "--select", LEAK)
    leak = result_of(report, LEAK)
    assert (leak["status"], leak["impact"]) == ("warn", "leak"), leak
    assert any("--fail-on leak" in note for note in leak["assumptions"])
    assert code == 0, err
    assert report["fail_on"] == "fail" and "leak" not in report["failing_impacts"]


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16"])
def test_a_crash_still_fails_beside_the_leak(cli, release, tmp_path, version):
    _shipping(HANG, version)
    code, report, _ = _check(cli, release(version), _deployment(tmp_path, pp=2), "--select", f"{LEAK},{HANG}")
    hang, leak = result_of(report, HANG), result_of(report, LEAK)
    assert (hang["status"], hang["impact"]) == ("fail", "runtime-crash")
    assert leak["status"] == "warn"
    assert code == 1
    assert report["summary"]["findings"] == 1


@pytest.mark.parametrize(
    "how", [("--fail-on", "leak"), ("--fail-on", "fail,leak"), ("--fail-on", "leak,performance"), "yaml"]
)
def test_fail_on_an_impact_makes_the_leak_fail(cli, release, tmp_path, how):
    tree = release("0.5.13")
    if how == "yaml":
        code, report, err = _check(
            cli, tree, _deployment(tmp_path, fail_on=["fail", "leak"]), "--select", LEAK
        )
    else:
        code, report, err = _check(cli, tree, _deployment(tmp_path), "--select", LEAK, *how)
    assert result_of(report, LEAK)["status"] == "fail"
    assert code == 1, err
    assert "leak" in report["failing_impacts"] and report["fail_on"] == "fail"


def test_fail_on_warn_still_counts_every_warn(cli, release, tmp_path):
    """The existing meaning of --fail-on warn: the leak stays a warn, and a warn is a finding."""
    code, report, _ = _check(
        cli, release("0.5.13"), _deployment(tmp_path), "--select", LEAK, "--fail-on", "warn"
    )
    assert result_of(report, LEAK)["status"] == "warn"
    assert code == 1 and report["summary"]["findings"] == 1


def test_the_command_line_wins_over_the_yaml(cli, release, tmp_path):
    deployment = _deployment(tmp_path, fail_on=["leak"])
    code, report, _ = _check(cli, release("0.5.13"), deployment, "--select", LEAK, "--fail-on", "fail")
    assert (result_of(report, LEAK)["status"], code) == ("warn", 0)


@pytest.mark.parametrize("where", ["cli", "yaml"])
def test_an_unknown_word_is_an_input_error(cli, release, tmp_path, where):
    if where == "cli":
        code, out, err = cli("check", "--sglang-path", release("0.5.13"), "--config", _deployment(tmp_path),
                             "--fail-on", "leaks")  # fmt: skip
    else:
        code, out, err = cli("check", "--sglang-path", release("0.5.13"), "--config",
                             _deployment(tmp_path, fail_on=["crash"]))  # fmt: skip
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert ("leaks" if where == "cli" else "crash") in line and "leak, performance" in line


def test_every_format_says_the_impact(cli, release, tmp_path):
    tree, deployment = release("0.5.13"), _deployment(tmp_path, pp=2)
    select = ("--select", f"{LEAK},{HANG}")
    args = ("check", "--sglang-path", tree, "--config", deployment, *select)

    _, sarif, _ = cli(*args, "-f", "sarif")
    by_rule = {r["ruleId"]: r for r in json.loads(sarif)["runs"][0]["results"]}
    assert (by_rule[LEAK]["level"], by_rule[LEAK]["properties"]["impact"]) == ("warning", "leak")
    assert (by_rule[HANG]["level"], by_rule[HANG]["properties"]["impact"]) == ("error", "runtime-crash")

    _, junit, _ = cli(*args, "-f", "junit")
    cases = {c.get("name").split()[0]: c for c in ET.fromstring(junit).iter("testcase")}
    assert cases[HANG].find("failure").get("type") == "runtime-crash"
    assert cases[LEAK].find("failure") is None and "impact: leak" in cases[LEAK].find("system-out").text

    _, text, _ = cli(*args, "-f", "text")
    assert f"{LEAK} WARN leak" in text and f"{HANG} FAIL runtime-crash" in text
    _, text, _ = cli(*args, "-f", "text", "--fail-on", "leak")
    assert f"{LEAK} FAIL leak" in text and "(leak failing)" in text

    _, github, _ = cli(*args, "-f", "github")
    (annotation,) = [line for line in github.splitlines() if f"title={LEAK} " in line]
    assert annotation.startswith("::warning ") and "impact: leak" in annotation


def test_every_check_and_record_names_an_impact():
    checks = all_checks()
    assert all(isinstance(c.impact, Impact) for c in checks)
    leaks_or_slow = {c.id for c in checks if c.impact in (Impact.LEAK, Impact.PERFORMANCE)}
    assert LEAK in leaks_or_slow and all(CheckKind.of(i) is CheckKind.CATALOG for i in leaks_or_slow)


def test_a_record_without_an_impact_is_refused():
    (record,) = [r for r in all_records() if r.id == LEAK]
    data = yaml.safe_load((REPO / record.where).read_text())
    del data["impact"]
    with pytest.raises(ValueError, match="impact must be one of"):
        CatalogRecord(data, "test")


# -- exit 5: --depth live where the live depth is unavailable (issue 34, item 6) ---------------------

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"


def _without_torch(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *map(str, args)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)  # fmt: skip


def test_depth_live_without_a_live_depth_exits_5_not_1(release, tmp_path):
    """torch missing: every check the live depth was asked for could not run. Not a defect (1), not a
    pass (0): 5, with one line saying why; the report is still written."""
    done = _without_torch(tmp_path, "check", "--depth", "live", "--select", "NPD", "-f", "json",
                          "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD)  # fmt: skip
    assert done.returncode == 5, done.stderr
    report = json.loads(done.stdout)
    assert report["live"]["ran"] is False
    findings = [r for r in report["results"] if r["status"] in ("fail", "error")]
    assert findings and all((r["status"], r["depth"]) == ("error", "live") for r in findings)
    (line,) = [line for line in without_progress(done.stderr).splitlines() if line.strip()]
    assert line.startswith("npudoctor: could not check as asked: the live depth is unavailable")
    assert "Traceback" not in done.stderr


def test_a_defect_beside_the_unavailable_live_depth_still_exits_1(release, tmp_path):
    """The catalog's records read the source at every depth: a crash they find is a finding (1), so a
    gate that treats 5 as an install problem never passes a defect."""
    done = _without_torch(tmp_path, "check", "--depth", "live", "-f", "json", "--sglang-path",
                          release("0.5.12"), "--config", DEEPSEEK_PD)  # fmt: skip
    report = json.loads(done.stdout)
    real = [r["id"] for r in report["results"] if r["status"] == "fail"]
    assert real, "the deployment has a catalogued crash on 0.5.12"
    assert done.returncode == 1, done.stderr


# -- hints that lead somewhere (issue 34, item 6) ------------------------------------------------------

VENV_BIN = Path(sys.executable).parent  # the repo's npudoctor console script
UNSAFE = {"NPD002": "qwen3-moe-pd-fia.yaml", "NPD003": "llama3-70b-pp3-pd.yaml"}  # 0.5.9 has both
HINTED_FORMATS = tuple(f.name for f in FORMATS if f.hints)


def _pasted(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``command`` pasted into bash with the venv's npudoctor first on PATH, fix records in tmp_path."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "NPUDOCTOR_SITE": str(tmp_path),
    }
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("fix_id", sorted(UNSAFE))
def test_the_hint_for_an_unsafe_fix_names_unsafe_and_pasted_plans_it(cli, release, tmp_path, fix_id):
    """The fix line under a finding whose fix is unsafe: pasted as printed, the plan marks the fix
    apply and exits 0 (it used to print "refused" for the --unsafe it left out)."""
    tree, config = release("0.5.9"), EXAMPLES / UNSAFE[fix_id]
    for output_format in HINTED_FORMATS:
        code, out, _ = cli("check", "--sglang-path", tree, "--config", config, "--select", fix_id,
                           "-f", output_format)  # fmt: skip
        assert code == 1
        (line,) = {m.group(0) for m in re.finditer(r"npudoctor fix --select \S+[^\n`%<]*", out)}
        assert "--unsafe" in line.split(), (output_format, line)
    done = _pasted(line, tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in done.stdout.splitlines() if r.startswith(fix_id)]
    assert row.split()[1] == "apply", done.stdout


@pytest.mark.parametrize("apply", [False, True], ids=["plan", "apply"])
def test_a_fix_refused_where_its_check_fails_exits_1_with_one_line(
    cli, release, tmp_path, monkeypatch, apply
):
    monkeypatch.setenv("NPUDOCTOR_SITE", str(tmp_path))
    args = [
        "fix",
        "--select",
        "NPD002",
        "--sglang-path",
        release("0.5.9"),
        "--config",
        EXAMPLES / UNSAFE["NPD002"],
    ]
    code, _, err = cli(*args, *(["--apply"] if apply else []))
    assert code == 1
    (line,) = [line for line in without_progress(err).splitlines() if line.strip()]
    assert line.startswith("npudoctor: refused NPD002: ") and "--unsafe" in line
    pasted = line.split(": ")[-1]  # the command that applies it
    assert pasted.startswith("npudoctor fix --apply --select NPD002 --unsafe"), pasted
    assert _pasted(pasted, tmp_path).returncode == 0


def _k8s_like(tmp_path: Path) -> Path:
    """The shipped Kubernetes example's deployment before item 6: DeepSeek-V3 PD, prefill PP 2."""
    model = tmp_path / "models" / "DeepSeek-V3"
    model.mkdir(parents=True)
    (model / "config.json").write_text((EXAMPLES / "models" / "deepseek-v3" / "config.json").read_text())
    spec = {
        "model": {"path": str(model)},
        "roles": {
            "prefill": {"server_args": {"tp_size": 8, "pp_size": 2, "disaggregation_mode": "prefill",
                                        "disaggregation_transfer_backend": "ascend"}},
            "decode": {"server_args": {"tp_size": 16, "disaggregation_mode": "decode",
                                       "disaggregation_transfer_backend": "ascend"}},
        },
    }  # fmt: skip
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("apply", [False, True], ids=["plan", "apply"])
def test_fix_lists_the_findings_no_fix_cures(cli, release, tmp_path, monkeypatch, apply):
    """0.5.12 with prefill PP 2: NPD001 and NPD006 have fixes, NPC072 (the PP 2 deadlock) has none.
    `fix` and `fix --apply` say so, with the release that fixes it and the workaround, and that the
    gate stays red; the gate agrees."""
    monkeypatch.setenv("NPUDOCTOR_SITE", str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    tree, deployment = release("0.5.12"), _k8s_like(tmp_path)
    extra = ["--apply"] if apply else []
    code, out, err = cli("fix", "--sglang-path", tree, "--config", deployment, "-f", "json", *extra)
    assert code == 0, err
    uncured = {u["id"]: u for u in json.loads(out)["uncured"]}
    _, gate, _ = _check(cli, tree, deployment)
    red = {
        r["id"]
        for r in gate["results"]
        if r["status"] == "fail" and CheckKind.of(r["id"]) is CheckKind.CATALOG
    }
    assert red and set(uncured) == red, (uncured, red)
    assert uncured[HANG]["fixed_in"] and "workaround" in uncured[HANG]["advice"]
    code, out, _ = cli("fix", "--sglang-path", tree, "--config", deployment, *extra)
    flat = " ".join(out.split())
    assert "no runtime fix cures" in flat and "stays red" in flat and HANG in flat
