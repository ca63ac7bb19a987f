"""What an operator meets around the report: progress in CI logs, one deployment input
for check/fix/run with one environment rule, hints that repeat the user's own flags, where
``fix --apply`` records and what ``--status`` says next, a tree without the Ascend backend, options
validated before any work, and a closed or vanished stdout. Real releases from PyPI throughout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npudoctor.engine.catalog import all_records

from support.repo import EXAMPLES, REPO
from support.reports import json_report, result_of
from support.trees import overlay_tree

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
QWEN_PD = EXAMPLES / "qwen3-moe-pd.yaml"
QWEN_MODEL = EXAMPLES / "models" / "qwen3-30b-a3b"
NPUDOCTOR = [sys.executable, "-m", "npudoctor"]


def _run(*args, env: dict | None = None, shell: str | None = None) -> subprocess.CompletedProcess:
    """npudoctor in a child with stdout and stderr piped (not a terminal), as in a CI log."""
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environ.update(env or {})
    command = ["bash", "-c", shell] if shell else [*NPUDOCTOR, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=environ, cwd=REPO)


# -- progress -------------------------------------------------------------------------------------


def test_a_run_without_a_terminal_writes_one_progress_line_per_step(release):
    done = _run("check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "--depth", "static",
                "--format", "json")  # fmt: skip
    assert done.returncode == 1, done.stderr
    json.loads(done.stdout)  # the report stays clean on stdout
    lines = done.stderr.splitlines()
    records = len(all_records())
    assert lines and lines[0].startswith(
        f"npudoctor: [0.0 s] checking sglang 0.5.12 (7 check(s), {records} catalog record(s), depth static)"
    )
    quiet = _run("check", "--sglang-path", release("0.5.12"), "--depth", "static", "-f", "json", "--quiet")
    assert quiet.returncode == 1 and quiet.stderr == ""


@pytest.mark.slow
def test_a_live_run_names_the_import_and_every_probe_with_elapsed_seconds(release):
    done = _run("check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "-f", "json")
    assert done.returncode == 1, done.stderr
    steps = [line for line in done.stderr.splitlines() if line.startswith("npudoctor: [")]
    assert any("live probes: importing sglang 0.5.12 on CPU" in s for s in steps), done.stderr
    probed = [r["id"] for r in json.loads(done.stdout)["results"] if r["depth"] == "live"]
    for check_id in probed:
        assert any(f"live probe {check_id}:" in s for s in steps), (check_id, done.stderr)
    seconds = [float(s.split("[")[1].split(" s]")[0]) for s in steps]
    assert seconds == sorted(seconds) and seconds[-1] > 0


# -- one deployment input, one environment rule ---------------------------------------------------

FORMS = {
    "config": ("--config", QWEN_PD),
    "model-path": ("--model-path", QWEN_MODEL, "--disaggregation-mode", "decode"),
    "launch command": ("--", "python", "-m", "sglang.launch_server", "--model-path", QWEN_MODEL,
                       "--disaggregation-mode", "decode"),
}  # fmt: skip


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_reads_the_shells_code_path_variables_unless_isolated(cli, release, monkeypatch, form):
    # NPD002 bites on 0.5.9 with ASCEND_USE_FIA=1 (tests/data/known.yaml) and is not applicable without
    tree = release("0.5.9")
    monkeypatch.setenv("ASCEND_USE_FIA", "1")
    shell = json_report(cli, "--sglang-path", tree, *FORMS[form])
    assert result_of(shell, "NPD002")["status"] == "fail", result_of(shell, "NPD002")
    assert shell["deployment"]["env_from_shell"] == ["ASCEND_USE_FIA"]
    isolated = json_report(cli, "--sglang-path", tree, "--isolated", *FORMS[form])
    assert result_of(isolated, "NPD002")["status"] == "skip", result_of(isolated, "NPD002")
    assert isolated["deployment"]["env_from_shell"] == []


def test_what_the_deployment_sets_wins_over_the_shell(cli, release, monkeypatch):
    monkeypatch.setenv("ASCEND_USE_FIA", "1")
    tree = release("0.5.9")
    flags = json_report(cli, "--sglang-path", tree, *FORMS["model-path"], "--env", "ASCEND_USE_FIA=0")
    assert result_of(flags, "NPD002")["status"] == "skip" and flags["deployment"]["env_from_shell"] == []
    command = json_report(cli, "--sglang-path", tree, "--", "ASCEND_USE_FIA=0", *FORMS["launch command"][1:])
    assert result_of(command, "NPD002")["status"] == "skip"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_fix_takes_the_deployment_as_check_does(cli, release, monkeypatch, form):
    monkeypatch.setenv("ASCEND_USE_FIA", "1")
    tree = release("0.5.9")
    report = json_report(cli, "--sglang-path", tree, *FORMS[form])
    code, out, err = cli("fix", "--format", "json", "--sglang-path", tree, *FORMS[form])
    plan = {row["id"]: row for row in json.loads(out)["plan"]}
    for check_id, row in plan.items():  # the fix decides from check's verdict for the same input
        status = result_of(report, check_id)["status"]
        assert (row["action"] == "not needed") == (status in ("pass", "skip")), (check_id, status, row)
    assert plan["NPD002"]["action"] != "not needed"
    # a fix refused where its check fails (NPD002 is unsafe, no --unsafe here) leaves the defect: exit 1
    refused = [
        i
        for i, row in plan.items()
        if row["action"] == "refused" and result_of(report, i)["status"] == "fail"
    ]
    assert code == (1 if refused else 0), err


def test_run_reads_the_deployment_from_its_options_too(release, tmp_path):
    tree = release("0.5.9")
    env = {"PYTHONPATH": str(tree), "ASCEND_USE_FIA": "1"}
    command = ["--", sys.executable, "-c", "pass"]
    described = _run("run", "--depth", "static", "--unsafe", "-v", *FORMS["model-path"], *command, env=env)
    assert described.returncode == 0, described.stderr
    assert "NPD002: apply" in described.stderr, described.stderr
    isolated = _run("run", "--depth", "static", "--unsafe", "-v", "--isolated", *FORMS["model-path"], *command,
                    env=env)  # fmt: skip
    assert "NPD002: not needed" in isolated.stderr, isolated.stderr


# -- run says what it applies once, and nothing with --quiet when nothing applies ------------------


def test_run_says_what_it_applies_in_one_line(release):
    buggy = _run("run", "--depth", "static", "--", sys.executable, "-c", "pass",
                 env={"PYTHONPATH": str(release("0.5.12"))})  # fmt: skip
    assert buggy.returncode == 0, buggy.stderr
    said = [line for line in buggy.stderr.splitlines() if not line.startswith("npudoctor: [")]
    assert len(said) == 1 and said[0].startswith("npudoctor: applying NPD001"), buggy.stderr


# the command's Python ignores the environment, where the bootstrap of `run` is (PYTHONPATH)
IGNORES_ENVIRONMENT = {
    "python -E": [sys.executable, "-E", "-c", "pass"],
    "python -I": [sys.executable, "-X", "dev", "-sI", "-c", "pass"],
    "env -i": ["env", "-i", sys.executable, "-c", "pass"],
    "env -u PYTHONPATH": ["env", "-u", "PYTHONPATH", sys.executable, "-c", "pass"],
}


@pytest.mark.parametrize("form", sorted(IGNORES_ENVIRONMENT))
def test_run_refuses_to_claim_fixes_a_command_that_ignores_the_environment_never_gets(release, form):
    done = _run("run", "--depth", "static", "--", *IGNORES_ENVIRONMENT[form],
                env={"PYTHONPATH": str(release("0.5.12"))})  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("npudoctor: [")]
    assert len(lines) == 1 and lines[0].startswith("npudoctor: error: run:"), done.stderr
    assert form in lines[0] and "NPD001" in lines[0] and "applying" not in done.stderr, lines[0]


def test_run_reads_python_flags_only_before_the_program(release):
    """``-E`` after ``-c CODE`` is an argument of the code, not a flag of the interpreter."""
    done = _run("run", "--depth", "static", "--", sys.executable, "-W", "ignore", "-c", "pass", "-E",
                env={"PYTHONPATH": str(release("0.5.12"))})  # fmt: skip
    assert done.returncode == 0 and "npudoctor: applying NPD001" in done.stderr, done.stderr


def test_run_without_sglang_names_no_option_run_rejects(tmp_path):
    done = _run(
        "run", "--depth", "static", "--", sys.executable, "-c", "pass", env={"PYTHONPATH": str(tmp_path)}
    )
    assert done.returncode == 4, done.stderr
    assert "no sglang found" in done.stderr and "--sglang-path" not in done.stderr, done.stderr


def test_the_printed_run_command_with_an_env_assignment_works_pasted(cli, release, tmp_path, monkeypatch):
    """``fix`` on a release that loads no plugins prints the ``npudoctor run`` that starts the server
    with the fixes; the user's launch command starts with an assignment (``ASCEND_USE_FIA=1 python
    ...``), which a shell runs, and ``run`` must run it too once pasted."""
    monkeypatch.setenv("NPUDOCTOR_SITE", str(tmp_path))
    launch = ["ASCEND_USE_FIA=1", *FORMS["launch command"][1:]]
    code, out, err = cli("fix", "--apply", "--unsafe", "--sglang-path", release("0.5.9"), "--", *launch)
    assert code == 0, err
    (hint,) = [line.strip() for line in out.splitlines() if line.strip().startswith("npudoctor run ")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"  # the server: says what it was started with
    fake.write_text('#!/bin/sh\necho "started with ASCEND_USE_FIA=$ASCEND_USE_FIA: $*"\n')
    fake.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    done = _run(shell=hint, env={"PATH": path, "PYTHONPATH": str(release("0.5.9"))})
    assert done.returncode == 0, f"{hint}\n{done.stderr}"
    assert done.stdout.startswith("started with ASCEND_USE_FIA=1: -m sglang.launch_server"), done.stdout
    assert "applying NPD002" in done.stderr, done.stderr


def test_run_quiet_says_nothing_when_no_fix_applies(release):
    clean = {"PYTHONPATH": str(release("0.5.23"))}
    quiet = _run(
        "run", "--depth", "static", "--quiet", "--", sys.executable, "-c", "print('served')", env=clean
    )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "served\n", "")
    said = _run("run", "--depth", "static", "--", sys.executable, "-c", "pass", env=clean)
    assert "no runtime fix applies to sglang 0.5.23" in said.stderr


# -- hints repeat the user's own flags -------------------------------------------------------------


def test_the_plan_names_the_apply_command_with_the_users_flags(cli, release):
    tree = release("0.5.12")
    code, out, err = cli("fix", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 0, err
    assert f"npudoctor fix --apply --sglang-path {tree} --config {DEEPSEEK_PD}" in out


def test_the_check_reports_fix_hint_repeats_the_users_flags(cli, release):
    tree = release("0.5.12")
    code, out, err = cli("check", "--sglang-path", tree, "--config", DEEPSEEK_PD)
    assert code == 1, err
    assert f"npudoctor fix --select NPD001,NPD006 --sglang-path {tree} --config {DEEPSEEK_PD}" in out


# -- where fix --apply records, and what --status says next ----------------------------------------


def test_apply_records_beside_the_sglang_it_fixes_and_status_and_revert_find_it(cli, release, tmp_path):
    tree = overlay_tree(release("0.5.12"), tmp_path / "image")  # an unpacked wheel: sglang/ + dist-info
    shutil.copytree(release("0.5.12") / "sglang-0.5.12.dist-info", tree / "sglang-0.5.12.dist-info")
    args = ("--sglang-path", tree, "--config", DEEPSEEK_PD, "--depth", "static")
    code, out, err = cli("fix", "--apply", *args)
    assert code == 0, err
    assert (tree / "npudoctor_fixes_activation-1.dist-info" / "entry_points.txt").is_file()
    assert f"npudoctor fix --revert --sglang-path {tree}" in out
    code, out, err = cli("fix", "--status", *args)
    assert code == 0 and "the record fits" in out, out + err
    code, out, err = cli("fix", "--revert", "--sglang-path", tree)
    assert code == 0 and not (tree / "npudoctor_fixes_activation-1.dist-info").exists(), out + err


def test_apply_to_a_source_tree_refuses_and_names_the_site_to_give(cli, release, tmp_path):
    checkout = overlay_tree(release("0.5.12"), tmp_path)  # sglang/ alone, no dist-info: not an import root
    code, out, err = cli("fix", "--apply", "--sglang-path", checkout, "--config", DEEPSEEK_PD)
    assert code == 2 and out == ""
    assert "a source tree" in err and "give --site DIR" in err
    assert "checking" not in err and "planning" not in err  # refused before the plan ran


def test_status_after_an_upgrade_exits_1_with_the_next_command(cli, release, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    code, out, err = cli("fix", "--apply", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD,
                         "--site", site)  # fmt: skip
    assert code == 0, err
    recorded = json.loads(
        (site / "npudoctor_fixes_activation-1.dist-info" / "npudoctor-fixes.json").read_text()
    )
    # the image moves to 0.5.13: NPD001 and NPD006 are fixed upstream, NPD005 is new (known.yaml)
    args = ("--sglang-path", release("0.5.13"), "--config", DEEPSEEK_PD, "--site", site)
    code, out, err = cli("fix", "--status", *args)
    assert code == 1, out + err
    assert "recorded for sglang 0.5.12; this is sglang 0.5.13" in out
    assert "the record no longer fits; next:" in out
    code, out, err = cli("fix", "--status", "--format", "json", *args)
    status = json.loads(out)
    assert code == 1 and status["fits"] is False
    states = {row["fix_id"]: row["state"] for row in status["status"]}
    assert all(states[fix_id] != "in place" for fix_id in recorded["fixes"]), states
    assert status["next"].startswith("npudoctor fix --apply --select NPD005 --sglang-path"), status["next"]


# -- a tree without the Ascend NPU backend ---------------------------------------------------------


@pytest.fixture
def no_npu_tree(release, tmp_path) -> Path:
    tree = overlay_tree(release("0.5.12"), tmp_path / "gpu-only")
    shutil.rmtree(tree / "sglang/srt/hardware_backend/npu")
    return tree


@pytest.mark.parametrize("command", [("check",), ("check", "-f", "json"), ("fix",), ("fix", "--apply")])
def test_a_tree_without_the_ascend_backend_has_nothing_to_check(cli, no_npu_tree, command):
    code, out, err = cli(*command, "--sglang-path", no_npu_tree)
    assert code == 4 and out == ""
    assert err.strip().endswith(
        "has no Ascend NPU backend (no AscendAttnBackend under sglang/srt): nothing to check"
    )
    assert len(err.strip().splitlines()) == 1


def test_every_release_format_of_the_ascend_backend_is_found(release):
    from npudoctor.target.discovery import discover

    for version in ("0.4.10", "0.5.9", "0.5.23"):  # layers/attention/ (0.4.10), hardware_backend/npu/
        assert discover(release(version)).has_ascend_backend, version


def test_run_without_the_ascend_backend_still_runs_the_command(no_npu_tree):
    done = _run("run", "--depth", "static", "--", sys.executable, "-c", "print('up')",
                env={"PYTHONPATH": str(no_npu_tree)})  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "up\n"), done.stderr
    assert "has no Ascend NPU backend: no runtime fix applies" in done.stderr


# -- options validated before any work; stdout closed or gone ---------------------------------------


@pytest.mark.parametrize(
    "output, message",
    [
        ("missing/report.json", "no such directory"),
        (".", "is a directory"),
        ("/etc/hostname/report.json", "not a directory"),
        ("/proc/report.json", "cannot write"),
    ],
)
def test_a_bad_output_path_is_refused_before_the_run(release, tmp_path, output, message):
    target = output if output.startswith("/") else str(tmp_path / output)
    done = _run(
        "check", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_PD, "-f", "json", "-o", target
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "checking sglang" not in done.stderr  # said before the run, not after it


def test_an_unwritable_step_summary_is_refused_before_the_run(release, tmp_path):
    summary = str(tmp_path / "missing" / "summary.md")
    done = _run(
        "check", "--sglang-path", release("0.5.12"), "-f", "github", env={"GITHUB_STEP_SUMMARY": summary}
    )
    assert done.returncode == 2 and "GITHUB_STEP_SUMMARY=" in done.stderr, done.stderr
    assert "checking sglang" not in done.stderr


@pytest.mark.parametrize("command", ["check --depth static -f json", "fix --depth static", "env", "list"])
def test_a_closed_stdout_exits_2_with_one_line(release, command):
    if command.startswith(("check", "fix")):
        command += f" --sglang-path {release('0.5.12')}"
    done = _run(shell=f"{sys.executable} -m npudoctor {command} >&-")
    assert done.returncode == 2 and done.stderr.startswith("npudoctor: error: standard output is closed")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["explain NPD001", "list", "env", "check --depth static -f json -q"])
def test_a_reader_that_goes_away_ends_the_command_quietly_with_141(release, command):
    if command.startswith("check"):
        command += f" --sglang-path {release('0.5.12')}"
    # `true` exits at once, long before npudoctor writes: every write meets a closed pipe
    done = _run(shell=f"set -o pipefail; {sys.executable} -m npudoctor {command} | true")
    assert (done.returncode, done.stderr) == (141, ""), done.stderr


def test_env_offers_only_the_formats_it_renders(cli):
    code, _, err = cli("env", "-f", "sarif")
    assert code == 2 and "--format: 'sarif' is not one of text, json" in err
    done = _run("env", "--help")
    assert "--format<text|json>" in done.stdout.replace(" ", "") and "sarif" not in done.stdout


def test_help_shows_plain_metavars_and_names_every_deployment_form():
    for command in ("check", "fix", "run", "advise"):
        done = _run(command, "--help", env={"COLUMNS": "100"})
        assert done.returncode == 0
        assert "<list[str]>" not in done.stdout and "<int range>" not in done.stdout, done.stdout
        assert "flags below" not in done.stdout
        text = " ".join(done.stdout.split())
        assert "--isolated" in text and "--model-path" in text and "--config" in text, command
