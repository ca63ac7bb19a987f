"""The CLI contract: exit codes, one-line errors without tracebacks, ignores, --fail-on, outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import npudoctor.service.runner
from npudoctor.engine.catalog import all_records
from npudoctor.engine.kinds import CheckKind
from npudoctor.formatters import NAMES as FORMAT_NAMES
from npudoctor.results import SCHEMA_VERSION

from support.notorch import WITHOUT_TORCH
from support.repo import EXAMPLES, REPO, default_check_ids
from support.reports import json_report, result_of

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"


def test_json_contract(cli, release):
    report = json_report(cli, "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD)
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["target"]["version"] == "0.5.12"
    assert report["target"]["path"].endswith("sglang")
    ids = [r["id"] for r in report["results"]]
    assert ids == default_check_ids(CheckKind.DEEP) + [
        r.id for r in all_records()
    ]  # the checks, then the catalog
    for result in report["results"]:
        assert {"id", "title", "status", "depth", "evidence", "remediation", "summary"} <= set(result)
    assert report["deployment"]["model"]["num_layers"] == 61
    findings = [r["id"] for r in report["results"] if r["status"] == "fail"]
    assert [f for f in findings if CheckKind.of(f) is CheckKind.DEEP] == [
        "NPD001",
        "NPD006",
    ]  # known.yaml, 0.5.12
    assert report["summary"]["findings"] == len(findings)


def test_exit_codes_follow_findings(cli, release):
    assert cli("check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD)[0] == 1
    assert cli("check", "--sglang-path", release("0.5.23"), "--config", DEEPSEEK_PD)[0] == 0


def test_text_report_names_the_evidence(cli, release, tmp_path):
    out = tmp_path / "report.txt"
    code, stdout, _ = cli("check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "-o", out)
    assert code == 1 and stdout == ""
    text = out.read_text()
    assert "NPD001" in text and "FAIL" in text and "memory_pool.py:1832" in text


def test_select_runs_only_the_named_checks(cli, release):
    report = json_report(cli, "--sglang-path", release("0.5.12"), "--select", "npd001")
    assert [r["id"] for r in report["results"]] == ["NPD001"]


def test_ignore_until_a_future_date_passes_the_gate(cli, release):
    args = ("--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--format", "json")
    # 0.5.12 has NPD001 and NPD006 on DeepSeek-V3 PD (known.yaml): both accepted
    code, out, _ = cli(
        "check", *args, "--select", "NPD", "--ignore", "NPD001:2999-01-01", "--ignore", "NPD006:2999-01-01"
    )
    assert code == 0
    assert result_of(json.loads(out), "NPD001")["ignored"]


def test_expired_ignore_is_a_finding(cli, release):
    args = ("--sglang-path", release("0.5.23"), "--config", DEEPSEEK_PD, "--format", "json")
    code, out, _ = cli("check", *args, "--ignore", "NPD001:2020-01-01")
    assert code == 1
    expired = result_of(json.loads(out), "NPD001-ignore-expired")
    assert expired["status"] == "fail" and "2020-01-01" in expired["summary"]


def test_yaml_ignore_list_with_reason(cli, release, tmp_path):
    config = tmp_path / "deploy.yaml"
    config.write_text(
        DEEPSEEK_PD.read_text().replace("models/", str(EXAMPLES / "models") + "/")
        + "ignore:\n  - {id: NPD001, until: 2999-12-31, reason: patched in our image}\n"
        + "  - {id: NPD006, until: 2999-12-31, reason: patched in our image}\n"
    )
    code, out, _ = cli("check", "--sglang-path", release("0.5.12"), "--config", config, "--format", "json",
                       "--select", "NPD001", "--select", "NPD006")  # fmt: skip
    assert code == 0
    assert "patched in our image" in result_of(json.loads(out), "NPD001")["ignored"]


def test_fail_on_warn_counts_warnings(cli, release, overlay):
    tree = overlay(release("0.5.23"))
    (tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py").unlink()
    base = ("check", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert cli(*base)[0] == 0
    assert cli(*base, "--fail-on", "warn")[0] == 1


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("bad_yaml", ("--config", "{tmp}/bad.yaml"), "invalid YAML at line"),
        ("no_file", ("--config", "{tmp}/missing.yaml"), "no such deployment file"),
        ("missing_model", ("--config", "{tmp}/missing_model.yaml"), "no such model config file"),
        ("bad_json", ("--config", "{tmp}/bad_json.yaml"), "not valid JSON"),
        (
            "bad_field",
            ("--config", "{tmp}/bad_field.yaml"),
            "roles.decode: pp_size must be a positive integer",
        ),
        ("unknown_key", ("--config", "{tmp}/unknown_key.yaml"), "unknown key(s) rolez"),
        (None, ("--select", "NPD999"), "unknown check id NPD999"),
        (None, ("--ignore", "NPD001:tomorrow"), "is not a date"),
        (None, ("--ignore", "XYZ"), "unknown check id XYZ"),
        (None, ("--sglang-path", "{tmp}"), "not an sglang tree"),
        (None, ("--sglang-path", "{tmp}/nope"), "no such directory"),
        (None, ("--format", "pdf"), "'pdf' is not one of"),
        (None, ("--bogus",), "No such option: --bogus"),
        (None, ("--", "bash", "-c", "true"), "cannot read"),
        (None, ("--", "python", "-m", "vllm.entrypoints"), "not sglang.launch_server"),
        (None, ("--", "python", "-m", "sglang.launch_server", "--pp-size", "two"), "--pp-size expects int"),
        (None, ("--model-path", "{tmp}"), "no such model config file"),
        (None, ("--pp-size", "2"), "go with --model-path"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, release, tmp_path, setup, args, message):
    files = {
        "bad_yaml": ("bad.yaml", "roles: [unclosed\n"),
        "missing_model": ("missing_model.yaml", "model: {config: nowhere/config.json}\n"),
        "bad_json": ("bad_json.yaml", "model: {config: c.json}\n"),
        "bad_field": ("bad_field.yaml", "roles:\n  decode: {server_args: {pp_size: two}}\n"),
        "unknown_key": ("unknown_key.yaml", "rolez: {}\n"),
    }
    if setup in files:
        name, text = files[setup]
        (tmp_path / name).write_text(text)
    (tmp_path / "c.json").write_text("{not json")
    argv = [a.replace("{tmp}", str(tmp_path)) if isinstance(a, str) else a for a in args]
    if "--sglang-path" not in argv:
        argv = ["--sglang-path", str(release("0.5.12")), *argv]
    code, out, err = cli("check", *argv)
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_no_sglang_exits_4(tmp_path):
    """In this interpreter sglang is not installed: the installed-target path finds nothing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "check"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 4, done.stderr
    assert "no sglang found" in done.stderr and "Traceback" not in done.stderr


def test_installed_sglang_is_found_without_importing_it(release, tmp_path):
    """A release on sys.path with its .dist-info is what an installed sglang looks like."""
    tree = release("0.5.12")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = "import sys, json; from npudoctor.cli import main; rc = main(['check', '--format', 'json', '--depth', 'static', '--select', 'NPD001']); print('sglang' in sys.modules, file=sys.stderr); sys.exit(rc)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["target"] == {
        "version": "0.5.12",
        "path": str(tree / "sglang"),
        "source": "installed",
        "unread": [],
    }
    assert done.stderr.strip().endswith("False")  # sglang was never imported


def test_internal_error_exits_3_without_traceback(cli, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(npudoctor.service.runner, "run", broken)
    code, _, err = cli("check")
    assert code == 3
    assert "internal error: RuntimeError: boom" in err and "Traceback" not in err


def test_help_documents_exit_codes():
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "check", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for code in ("0 no finding", "1 findings", "2 usage", "3 internal", "4 nothing to check"):
        assert code in text


def test_list_and_explain(cli):
    code, out, _ = cli("list")
    assert code == 0 and all(f"NPD00{i}" in out for i in range(0, 6))
    code, out, _ = cli("explain", "npd001")
    assert code == 0 and "pull/25249" in out and "When it bites" in out
    code, _, err = cli("explain", "NPD404")
    assert code == 2 and "unknown check id" in err


def test_env_redacts_secrets(cli, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    monkeypatch.setenv("ASCEND_USE_FIA", "1")
    code, out, _ = cli("env", "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert data["environment"]["HF_TOKEN"] == "***" and data["environment"]["ASCEND_USE_FIA"] == "1"
    assert "hf_supersecret" not in out
    assert data["torch_npu"] == "not installed"


def test_deployment_env_secrets_are_redacted_in_reports(cli, release, tmp_path):
    config = tmp_path / "d.yaml"
    config.write_text("env: {MOONCAKE_API_KEY: s3cr3t, ASCEND_USE_FIA: '1'}\nroles:\n  decode: {}\n")
    code, out, _ = cli("check", "--sglang-path", release("0.5.12"), "--config", config, "--format", "json")
    assert "s3cr3t" not in out
    assert json.loads(out)["deployment"]["roles"][0]["env"]["MOONCAKE_API_KEY"] == "***"


def test_console_script_is_installed():
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "npudoctor"), "--version"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.startswith("npudoctor ")
    assert (REPO / "checks").is_dir()


def test_every_format_on_a_real_run(cli, release, tmp_path, monkeypatch):
    import xml.etree.ElementTree as ET

    import jsonschema
    import xmlschema

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    base = ("check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--format")
    outputs = {}
    for name in FORMAT_NAMES:
        code, out, _ = cli(*base, name, "--output", tmp_path / f"report.{name}")
        assert code == 1 and out == ""
        outputs[name] = (tmp_path / f"report.{name}").read_text()

    xmlschema.XMLSchema(str(REPO / "tests/data/junit-10.xsd")).validate(outputs["junit"])
    case = next(
        c
        for c in ET.fromstring(outputs["junit"]).iter("testcase")
        if c.get("classname") == "npudoctor.NPD001"
    )
    assert case.find("failure") is not None and "memory_pool.py:1832" in case.find("failure").text

    sarif = json.loads(outputs["sarif"])
    sarif_schema = json.loads((REPO / "tests/data/sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(sarif_schema).validate(sarif)
    findings = {result["ruleId"]: result for result in sarif["runs"][0]["results"]}
    # the defects of 0.5.12 on DeepSeek-V3 PD (known.yaml); the catalog's records follow the checks
    assert sorted(f for f in findings if CheckKind.of(f) is CheckKind.DEEP) == ["NPD001", "NPD006"]
    finding = findings["NPD001"]
    assert finding["level"] == "error"
    region = finding["locations"][0]["physicalLocation"]
    # the release cache lies outside the checkout (the working directory here): an absolute file URI
    pool = Path(os.path.realpath(release("0.5.12"))) / "sglang/srt/mem_cache/memory_pool.py"
    assert region["artifactLocation"] == {"uri": pool.as_uri()}
    assert region["region"]["startLine"] == 1832

    assert "::error file=sglang/srt/mem_cache/memory_pool.py,line=1832," in outputs["github"]
    assert "| **NPD001**" in summary.read_text() and "FAIL" in summary.read_text()
    assert "| FAIL |" in outputs["markdown"]
    assert "memory_pool.py:1832" in outputs["text"]
    assert result_of(json.loads(outputs["json"]), "NPD001")["status"] == "fail"


def test_static_depth_never_executes_torch(release, tmp_path):
    """The live helpers import torch lazily: a static check (~1 s) must not pay for it (~1-2 s)."""
    code = (
        "import sys; from npudoctor.cli import main; "
        f"rc = main(['check', '--depth', 'static', '--format', 'json', '--sglang-path', {str(release('0.5.12'))!r}]); "
        "torch = sys.modules.get('torch'); "
        "print('torch executed' if torch is not None and type(torch).__name__ != '_LazyModule' else 'no torch', "
        "file=sys.stderr); sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().endswith("no torch")


@pytest.mark.parametrize(
    ("command", "code"), [(("check", "--depth", "static"), 1), (("list",), 0), (("fix",), 0)]
)
def test_static_check_list_and_fix_plan_run_without_torch(release, tmp_path, command, code):
    """The static depth, the list of checks and the fix plan never need torch (the README promises
    static on a slim CI image); 0.5.12 has NPD001, so check exits 1 and the plan lists its fix."""
    args = [*command, "--sglang-path", str(release("0.5.12")), "--config", str(DEEPSEEK_PD)]
    if command == ("list",):
        args = ["list"]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == code, done.stderr
    assert "torch" not in done.stderr, done.stderr
    if command[0] != "list":
        assert "NPD001" in done.stdout


@pytest.mark.parametrize("workspace", ["trees", "elsewhere"])
def test_github_annotations_link_into_the_workspace(cli, release, tmp_path, monkeypatch, workspace):
    """In a workflow whose workspace holds the checked tree, annotations name the file from the
    workspace root, so GitHub links it; a tree elsewhere keeps the sglang-relative path."""
    tree = release("0.5.12")
    prefix = f"{tree.name}/" if workspace == "trees" else ""
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tree.parent if workspace == "trees" else tmp_path))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    code, out, _ = cli("check", "--sglang-path", tree, "--config", DEEPSEEK_PD, "--format", "github")
    assert code == 1
    assert f"::error file={prefix}sglang/srt/mem_cache/memory_pool.py,line=1832," in out
