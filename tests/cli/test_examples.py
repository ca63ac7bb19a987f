"""Every example in examples/, run as users run it, against real sglang releases.

* each deployment YAML loads and checks cleanly (exit 0 or 1, never 2/3, no ``error`` result)
  on every known release and synthetic state;
* for the defect each example exercises: the verdict on a buggy and a fixed state is the
  team's known truth (``shared/truth/known.yaml``), and the exit code gates on it;
* the hybrid examples (sliding window, mamba): what the checks say, with the reason;
* the launch-command example and the CI snippets (GitHub Actions, GitLab CI, Kubernetes)
  are executed: their ``npudoctor check`` commands run against a real tree, their exit-code
  gates are run with every documented code, the step summary is written.

``check`` runs at ``--depth static`` (the ``cli`` fixture's default): the live probes have
tests of their own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from npudoctor.engine.kinds import CheckKind

from conftest import sweep
from support.repo import EXAMPLES, REPO, default_check_ids
from support.reports import result_of
from support.truths import RELEASES, TRUTH, truth_present

CI = EXAMPLES / "ci"
DEPLOYMENTS = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
SYNTHETIC = sorted(TRUTH.get("synthetic", {}))
STATES = [*RELEASES, *SYNTHETIC]
STATUS_OF = {"present": "fail", "absent": "pass"}  # a truth's verdict -> the check's status
EXIT_CODES = {0, 1, 2, 3, 4, 5}  # README "Exit codes"
VENV_BIN = Path(sys.executable).parent


def truth(state: str, check_id: str) -> str:
    section = TRUTH["synthetic"] if state in SYNTHETIC else TRUTH["releases"]
    return section[state][check_id]["verdict"]


def check_json(cli, tree: Path, *args: str) -> tuple[int, dict]:
    code, out, err = cli("check", "--format", "json", "--sglang-path", tree, *args)
    assert code in (0, 1), f"npudoctor check {' '.join(map(str, args))} exited {code}: {err}"
    return code, json.loads(out)


def run_example(cli, subject, example: str, state: str, *args: str) -> tuple[int, dict]:
    return check_json(cli, subject(state), "--config", EXAMPLES / example, *args)


def statuses(report: dict) -> dict[str, str]:
    """The deep checks' statuses; the catalog's records on the examples: tests/catalog/test_examples.py."""
    return {r["id"]: r["status"] for r in report["results"] if CheckKind.of(r["id"]) is CheckKind.DEEP}


def _release_key(state: str) -> tuple[int, ...]:
    return tuple(int(part) for part in state.split("+")[0].split("."))  # a synthetic state: its release


def refused_names(example: str, state: str) -> list[str]:
    """The names ``example`` passes (server_args keys, args flags) that known.yaml's ``server_args``
    says ``state``'s release does not accept: NPD000 must fail on exactly these."""
    spec = yaml.safe_load((EXAMPLES / example).read_text())
    refused = set()
    for role in spec["roles"].values():
        passed = set((role or {}).get("server_args") or {})
        passed |= {str(a) for a in (role or {}).get("args") or [] if str(a).startswith("--")}
        for name, accepted in TRUTH["server_args"].items():
            first, last = accepted["accepted"].split("..")
            inside = _release_key(first) <= _release_key(state) <= _release_key(last)
            if (name in passed or accepted["flag"] in passed) and not inside:
                refused.add(name)
    return sorted(refused)


# ---------------------------------------------------------------------------------------------
# Every deployment loads, on every state


def test_every_example_is_documented():
    readme = (EXAMPLES / "README.md").read_text()
    shipped = DEPLOYMENTS + ["launch-command.sh"] + [f"ci/{p.name}" for p in sorted(CI.iterdir())]
    assert len(DEPLOYMENTS) >= 6
    for name in shipped:
        assert f"`{name}`" in readme, f"examples/README.md does not list {name}"


@pytest.mark.parametrize("example", DEPLOYMENTS)
def test_model_config_is_plain_json_without_weights(example):
    spec = yaml.safe_load((EXAMPLES / example).read_text())["model"]
    config = EXAMPLES / spec["config"]
    assert config.parent.parent == EXAMPLES / "models"
    assert sorted(p.name for p in config.parent.iterdir()) == ["config.json"]
    assert isinstance(json.loads(config.read_text()), dict)


@pytest.mark.parametrize("state", sweep(STATES))
@pytest.mark.parametrize("example", DEPLOYMENTS)
def test_example_loads_and_checks_cleanly(cli, subject, example, state):
    code, report = run_example(cli, subject, example, state)
    assert report["deployment"]["source"] == f"yaml:{EXAMPLES / example}"
    assert report["deployment"]["model"] is not None
    results = statuses(report)
    assert sorted(results) == ["NPD000", "NPD001", "NPD002", "NPD003", "NPD004", "NPD005", "NPD006"]
    every = {r["status"] for r in report["results"]}  # the catalog's records too
    assert "error" not in every, report["results"]
    assert code == (1 if "fail" in every else 0)
    # the release accepts the example's argument names, or NPD000 names each one it refuses
    refused = refused_names(example, state)
    npd000 = result_of(report, "NPD000")
    assert npd000["status"] == ("fail" if refused else "pass"), npd000["summary"]
    for name in refused:
        assert f"no ServerArgs field {name} (known in " in npd000["summary"]


# ---------------------------------------------------------------------------------------------
# The defect each example exercises: buggy and fixed state, verdict = known truth

TRUTH_CASES = [
    # example, check, buggy state, fixed state
    ("deepseek-v3-pd.yaml", "NPD001", "0.5.12", "0.5.23"),  # MLA pool without offload methods
    ("deepseek-v3-pd.yaml", "NPD001", "0.5.12", "0.5.13"),  # ... fixed in 0.5.13
    ("deepseek-v3-pd.yaml", "NPD003", "0.5.11", "0.5.12"),  # prefill PP 2 -> decode PP 1
    ("deepseek-v3-pd.yaml", "NPD005", "0.5.13", "0.5.15"),  # NPU MLA override lacks mamba_indices
    ("deepseek-v3.2-pd.yaml", "NPD003", "0.5.11", "0.5.23"),  # indexer buffers, draft layer
    ("deepseek-v3.2-pd.yaml", "NPD001", "0.5.12", "0.5.13"),
    ("qwen3-moe-pd-fia.yaml", "NPD002", "0.5.9", "0.5.23"),  # FIA items: one token, not one page
    ("qwen3-moe-pd-fia.yaml", "NPD005", "0.5.13", "0.5.23"),  # NPU MHA override lacks mamba_indices
    ("qwen3-cp-prefill.yaml", "NPD004", "0.5.13+cp-gap", "0.5.23"),  # scalar CP fields, chunk(q, 2)
    ("qwen3-cp-prefill.yaml", "NPD004", "0.5.13+cp-gap", "0.5.13"),  # the same release, fixed method
    ("qwen3-cp-prefill.yaml", "NPD002", "0.5.9", "0.5.11"),
    ("deepseek-v3-pd.yaml", "NPD006", "0.5.12", "0.5.13"),  # state tables read index_k_buffer = None
]


@pytest.mark.parametrize(
    "example, check_id, buggy, fixed", TRUTH_CASES, ids=[f"{e}-{c}-{b}-{f}" for e, c, b, f in TRUTH_CASES]
)
def test_example_verdicts_are_the_known_truths(cli, subject, example, check_id, buggy, fixed):
    assert (truth(buggy, check_id), truth(fixed, check_id)) == ("present", "absent"), "case list is stale"
    for state, exit_code in ((buggy, 1), (fixed, 0)):
        # Only this check: the exit code is its gate (1 = finding, 0 = none at or above --fail-on).
        code, report = run_example(cli, subject, example, state, "--select", check_id)
        result = result_of(report, check_id)
        assert result["status"] == STATUS_OF[truth(state, check_id)], (state, result["summary"])
        assert code == exit_code, (state, result["summary"])
        if result["status"] == "fail":
            # the evidence points into the checked sglang, and names the fix
            assert any(
                (e.get("location") or {}).get("path", "").startswith("sglang/srt/")
                for e in result["evidence"]
            )
            assert result["remediation"]["fix_id"] == check_id


# examples that are one of known.yaml's "deployments" (truths for that deployment only)
DEPLOYMENT_TRUTHS = {"llama3-70b-pp3-pd.yaml": "llama-3-70b-pd-pp3"}


@pytest.mark.parametrize("example", DEPLOYMENTS)
def test_no_example_fails_on_the_newest_release(cli, subject, example):
    """On the newest release every defect is absent (known.yaml): no example fails a defect check
    there, but where a defect known for that deployment only is still present (NPD003's MHA splitter
    for Llama-3-70B over PP 3: the example that shows it). NPD000 fails only where the newest release
    refuses an argument name the example passes: the CP example's 0.5.10-0.5.19 spelling
    (enable_prefill_context_parallel, prefill_cp_mode) is gone from 0.5.20 on, so that server would
    not start (known.yaml, server_args)."""
    newest = RELEASES[-1]
    _, report = run_example(cli, subject, example, newest)
    own = TRUTH["deployments"].get(DEPLOYMENT_TRUTHS.get(example, ""), {})
    for result in report["results"]:
        if CheckKind.of(result["id"]) is not CheckKind.DEEP:
            continue  # a catalog record: tests/catalog/test_examples.py follows the derived ranges
        if newest in own.get(result["id"], {}):
            expected = "fail" if own[result["id"]][newest]["verdict"] == "present" else "pass"
            assert result["status"] == expected, result
            continue
        if result["id"] == "NPD000":
            refused = refused_names(example, newest)
            assert result["status"] == ("fail" if refused else "pass"), result
            assert refused == (
                ["enable_prefill_context_parallel", "prefill_cp_mode"]
                if example == "qwen3-cp-prefill.yaml"
                else []
            )
            continue
        assert truth(newest, result["id"]) == "absent"
        assert result["status"] != "fail", result


@pytest.mark.parametrize(
    "state, status",
    [
        ("0.5.9", "fail"),
        ("0.5.10", "pass"),
        ("0.5.13+cp-gap", "pass"),
        ("0.5.15", "pass"),
        ("0.5.23", "fail"),
    ],
)
def test_cp_example_on_releases_without_its_cp_spelling(cli, subject, state, status):
    """examples/qwen3-cp-prefill.yaml uses the CP names of 0.5.10-0.5.19 (known.yaml, server_args):
    0.5.9 predates them and 0.5.20 removed them. There the server refuses to start, and NPD000 says
    so with the releases that know the names and the release's ServerArgs as file:line."""
    example = "qwen3-cp-prefill.yaml"
    assert (status == "fail") == bool(refused_names(example, state))
    code, report = run_example(cli, subject, example, state, "--select", "NPD000")
    result = result_of(report, "NPD000")
    assert (result["status"], code) == (status, 1 if status == "fail" else 0), result["summary"]
    release = state.split("+")[0]
    if status == "fail":
        assert result["summary"] == (
            f"sglang {release} has no ServerArgs field enable_prefill_context_parallel (known in 0.5.10..0.5.19) "
            "and no ServerArgs field prefill_cp_mode (known in 0.5.10..0.5.19): the server would refuse to start"
        )
        assert result["roles"] == ["prefill"]
        assert result["remediation"]["fix_id"] is None  # no runtime fix: the remedy is the spelling
    location = result["evidence"][0]["location"]
    assert location["path"] == "sglang/srt/server_args.py" and location["symbol"] == "ServerArgs"
    line = (subject(state) / location["path"]).read_text().splitlines()[location["line"] - 1]
    assert line.startswith("class ServerArgs")


# ---------------------------------------------------------------------------------------------
# Hybrid models: sliding window (Llama-4-Scout) and linear attention (Qwen3-Next)

SWA = "llama4-scout-swa-pd.yaml"


def test_swa_example_reads_the_text_config(cli, subject):
    """Llama4's config.json nests the language model under text_config: the facts must come
    from there (48 layers, 8 KV heads of 128, attention_chunk_size 8192), not from the wrapper."""
    _, report = run_example(cli, subject, SWA, "0.5.23", "--select", "NPD001")
    model = report["deployment"]["model"]
    assert (model["architectures"], model["model_type"]) == (
        ["Llama4ForConditionalGeneration"],
        "llama4_text",
    )
    assert (model["attention"], model["num_layers"], model["num_heads"]) == ("gqa", 48, 40)
    assert (model["num_kv_heads"], model["head_dim"], model["sliding_window"]) == (8, 128, 8192)
    assert model["hybrid_linear_layers"] == 0
    roles = {r["name"]: r for r in report["deployment"]["roles"]}
    assert roles["decode"]["disaggregation_mode"] == "decode" and roles["decode"]["pp_size"] == 1


def test_swa_example_before_callers_pass_keywords(cli, release):
    # 0.5.10 (known.yaml: NPD005 absent, callers pass no keywords): the scheduler calls
    # get_cpu_copy(token_indices) without keywords (managers/schedule_batch.py:1230), and the
    # ascend branch of the model runner builds SWAKVPool over NPUMHATokenToKVPool with
    # SWATokenToKVPoolAllocator: nothing to bind wrongly -> pass, and the path is named.
    _, report = check_json(cli, release("0.5.10"), "--config", EXAMPLES / SWA)
    result = result_of(report, "NPD005")
    assert result["status"] == "pass", result["summary"]
    for name in ("SWATokenToKVPoolAllocator", "SWAKVPool", "NPUMHATokenToKVPool"):
        assert name in result["summary"]
    # the MHA pool inherits MHATokenToKVPool's offload methods, which index its page-major k_buffer
    # (no FIA here) with token slots: NPD001's mha-page-major layout truth for 0.5.10 (known.yaml)
    assert TRUTH["releases"]["0.5.10"]["NPD001"]["layouts"]["mha-page-major"]["verdict"] == "present"
    assert result_of(report, "NPD001")["status"] == "fail"


def test_swa_example_where_the_npu_mha_override_is_narrow(cli, subject):
    # 0.5.13 (known.yaml: NPD005 present): NPUMHATokenToKVPool.get_cpu_copy(self, indices) has no
    # mamba_indices, and the paged allocator passes it -> the GQA example fails. On the SWA path the
    # allocator hands mamba_indices= to SWAKVPool, which accepts it and calls
    # self.full_kv_pool.get_cpu_copy(indices) / self.swa_kv_pool.get_cpu_copy(...) without it
    # (mem_cache/swa_memory_pool.py:223-226): the narrow override is built but never handed the
    # keyword on this deployment's retraction -> warn, not fail. Sliding window is why.
    assert truth("0.5.13", "NPD005") == "present"
    code, report = run_example(cli, subject, SWA, "0.5.13", "--select", "NPD005")
    swa = result_of(report, "NPD005")
    assert swa["status"] == "warn", swa["summary"]
    assert code == 0  # a warn is no finding under the default --fail-on fail
    assert "not on the calls this deployment makes" in swa["summary"]
    narrow = [
        e
        for e in swa["evidence"]
        if (e.get("location") or {}).get("symbol") == "NPUMHATokenToKVPool.get_cpu_copy"
    ]
    assert narrow and "mamba_indices" in narrow[0]["observed"]

    code, report = run_example(cli, subject, "qwen3-moe-pd-fia.yaml", "0.5.13", "--select", "NPD005")
    assert result_of(report, "NPD005")["status"] == "fail"
    assert code == 1


def test_swa_example_on_the_newest_release_warns_about_a_dropped_keyword(cli, subject):
    # 0.5.23 (NPD005 absent): every override on the path binds, but SWAKVPool receives
    # mamba_indices= and does not pass it to NPUMHATokenToKVPool, which accepts it (and ignores it
    # today). A dropped keyword the next level does not read is a warn by the check's rule, so it
    # blocks only a --fail-on warn gate.
    code, report = run_example(cli, subject, SWA, "0.5.23", "--select", "NPD005")
    result = result_of(report, "NPD005")
    assert result["status"] == "warn", result["summary"]
    assert "SWAKVPool" in result["summary"] and "mamba_indices" in result["summary"]
    assert code == 0
    code, _ = run_example(cli, subject, SWA, "0.5.23", "--select", "NPD005", "--fail-on", "warn")
    assert code == 1
    code, _ = run_example(
        cli, subject, SWA, "0.5.23", "--select", "NPD005", "--fail-on", "warn", "--ignore", "NPD005"
    )
    assert code == 0


@pytest.mark.parametrize("state", ["0.5.12", "0.5.23"])
def test_swa_example_other_checks(cli, subject, state):
    # NPD001 in 0.5.12 bites this GQA model too, beyond sglang#25249's MLA pool: without FIA its NPU MHA pool is
    # page-major and the inherited MHATokenToKVPool.get_cpu_copy indexes it with token slots
    # (IndexError live, mem_cache/memory_pool.py:992 statically) -> fail; 0.5.23 -> pass. No FIA, no PP,
    # no CP in this deployment: NPD002/3/4 do not apply. Both releases accept its arguments.
    _, report = run_example(cli, subject, SWA, state)
    assert statuses(report) == {
        "NPD000": "pass",
        "NPD001": "fail" if state == "0.5.12" else "pass",
        "NPD002": "skip",
        "NPD003": "skip",
        "NPD004": "skip",
        "NPD005": "warn",
        "NPD006": "pass",  # the decode server's GQA pool tables build (no state tables on the NPU MHA pool)
    }


@pytest.mark.parametrize("state, expected", [("0.5.13", "warn"), ("0.5.15", "pass")])
def test_hybrid_mamba_example(cli, subject, state, expected):
    # Qwen3-Next decode: NPUPagedTokenToKVPoolAllocator -> HybridLinearKVPool -> NPUMHATokenToKVPool.
    # 0.5.13: HybridLinearKVPool takes mamba_indices and copies the mamba state itself, calling
    # self.full_kv_pool.get_cpu_copy(indices) without it, so the narrow NPU MHA override is built but
    # not reached with the keyword -> warn. 0.5.15: the NPU overrides accept mamba_indices=None and
    # HybridLinearKVPool consumes the keyword (reads it) -> pass.
    _, report = run_example(cli, subject, "qwen3-next-decode.yaml", state, "--select", "NPD005")
    result = result_of(report, "NPD005")
    assert result["status"] == expected, result["summary"]
    assert report["deployment"]["model"]["hybrid_linear_layers"] == 36  # 48 layers, full every 4th


# ---------------------------------------------------------------------------------------------
# The deployment given as a launch command


def _tool_env(**extra: str) -> dict[str, str]:
    """The environment of a shell step: npudoctor on PATH, no code-path variables from this host."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("ASCEND_", "SGLANG_", "HCCL_", "PYTORCH_NPU_", "TASK_QUEUE_", "GITHUB_", "NPUDOCTOR_")
        )
    }
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "state, npd002, npd005",
    [("0.5.9", "fail", "pass"), ("0.5.13", "pass", "fail"), ("0.5.15", "pass", "pass")],
)
def test_launch_command_example(subject, tmp_path, state, npd002, npd005):
    """examples/launch-command.sh runs as a user runs it (from another directory, npudoctor on PATH)."""
    assert (STATUS_OF[truth(state, "NPD002")], STATUS_OF[truth(state, "NPD005")]) == (npd002, npd005)
    done = subprocess.run(
        [
            "sh",
            str(EXAMPLES / "launch-command.sh"),
            "--sglang-path",
            str(subject(state)),
            "--depth",
            "static",
            "--format",
            "json",
        ],
        cwd=tmp_path,
        env=_tool_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(done.stdout)
    failing = [r["id"] for r in report["results"] if r["status"] == "fail"]  # the catalog's records too
    assert done.returncode == (1 if failing else 0), done.stderr
    assert ("NPD002" in failing, "NPD005" in failing) == (npd002 == "fail", npd005 == "fail")
    assert report["deployment"]["source"] == "command"
    (role,) = report["deployment"]["roles"]
    assert role["disaggregation_mode"] == "decode" and role["use_fia"] is True  # from the VAR=value prefix
    assert role["env"] == {"ASCEND_USE_FIA": "1"}
    assert "--host 0.0.0.0" in role["unknown_args"]  # kept, not rejected
    assert report["deployment"]["model"]["model_type"] == "qwen3_moe"
    assert (result_of(report, "NPD002")["status"], result_of(report, "NPD005")["status"]) == (npd002, npd005)


# ---------------------------------------------------------------------------------------------
# CI snippets: parse, run their commands against a real tree, run their exit-code gates


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml", "kubernetes.yaml"])
def test_ci_snippets_parse(name):
    documents = list(yaml.safe_load_all((CI / name).read_text()))
    assert documents and all(isinstance(d, dict) for d in documents)
    text = (CI / name).read_text()
    for code in sorted(EXIT_CODES):  # every exit code is commented
        assert re.search(rf"#\s+{code}\s+\S", text), f"{name}: exit code {code} not explained"


def _workspace(tmp_path: Path, tree: Path) -> Path:
    """What the CI job's working directory holds after checkout and the install step: the repository's
    examples and the unpacked sglang wheel at ./sglang-tree (a link to the cached release)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    (work / "sglang-tree").symlink_to(tree, target_is_directory=True)
    return work


def _bash(script: str, cwd: Path, env: dict[str, str], shell_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "--noprofile", "--norc", *shell_flags.split(), "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _npudoctor_commands(script: str) -> list[list[str]]:
    """The ``npudoctor ...`` command lines of a shell script (continuations joined)."""
    joined = script.replace("\\\n", " ")
    return [
        shlex.split(line.strip().split("||")[0])
        for line in joined.splitlines()
        if line.strip().startswith("npudoctor ")
    ]


def _github_job() -> tuple[dict, dict[str, dict]]:
    workflow = yaml.safe_load((CI / "github-actions.yml").read_text())
    (job,) = workflow["jobs"].values()
    return workflow, job


def test_github_workflow_shape():
    workflow, job = _github_job()
    assert "on" in workflow, "a bare `on:` is the boolean true to YAML 1.1 parsers"
    assert workflow["permissions"]["checks"] == "write"  # the JUnit publisher creates a check run
    steps = job["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert 'pip install "$NPUDOCTOR_WHEEL"' in runs
    commands = [c for s in steps for c in _npudoctor_commands(s.get("run", ""))]
    formats = [c[c.index("--format") + 1] for c in commands]
    assert sorted(formats) == ["github", "junit"]
    junit = commands[formats.index("junit")]
    assert junit[junit.index("-o") + 1] == "npudoctor.xml"
    publish = next(s for s in steps if "junit" in s.get("uses", ""))
    assert publish["with"]["report_paths"] == "npudoctor.xml" and publish["if"] == "always()"
    gate = next(s for s in steps if s.get("id") == "gate")
    assert gate["if"] == "always()" and "steps.check.outputs.code" in gate["env"]["NPUDOCTOR_EXIT"]
    # the report and summary steps never fail the job themselves: the gate does, after publishing
    order = [s.get("id") or s.get("uses", "").split("@")[0] for s in steps]
    assert order.index("check") < order.index("mikepenz/action-junit-report") < order.index("gate")


def _expand_github(value: str, outputs: dict[str, dict[str, str]]) -> str:
    def step_output(match: re.Match) -> str:
        return outputs.get(match.group(1), {}).get(match.group(2), "")

    expanded = re.sub(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.([\w-]+)\s*\}\}", step_output, value)
    assert "${{" not in expanded, f"expression this test cannot evaluate: {value}"
    return expanded


def _run_github_job(tmp_path: Path, tree: Path) -> tuple[dict[str, subprocess.CompletedProcess], Path, dict]:
    """Run the workflow's shell steps after the install step, as the runner would: bash -eo pipefail,
    the workflow and step env, $GITHUB_OUTPUT per step, $GITHUB_STEP_SUMMARY per job."""
    workflow, job = _github_job()
    work = _workspace(tmp_path, tree)
    summary = tmp_path / "step_summary.md"
    outputs: dict[str, dict[str, str]] = {}
    done: dict[str, subprocess.CompletedProcess] = {}
    steps = job["steps"]
    install = next(i for i, s in enumerate(steps) if s.get("id") == "install")
    for index, step in enumerate(steps[install + 1 :]):
        if "run" not in step:
            continue
        key = step.get("id") or f"step{index}"
        output_file = tmp_path / f"output-{key}"
        output_file.write_text("")
        env = {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}
        env = {k: _expand_github(str(v), outputs) for k, v in env.items()}
        env = _tool_env(
            **env, GITHUB_OUTPUT=str(output_file), GITHUB_STEP_SUMMARY=str(summary), GITHUB_ACTIONS="true"
        )
        done[key] = _bash(step["run"], work, env, "-eo pipefail")
        outputs[key] = dict(
            line.split("=", 1) for line in output_file.read_text().splitlines() if "=" in line
        )
    return done, summary, outputs


@pytest.mark.parametrize("state", sweep(["0.5.12", "0.5.23"], quick=("0.5.12",)))
def test_github_job_runs(subject, tmp_path, state):
    """The example's deployment (deepseek-v3-pd) on 0.5.12 has NPD001 (known.yaml): the JUnit report
    and the annotations name it, the summary table lands in $GITHUB_STEP_SUMMARY and the gate fails the
    job with 1. On 0.5.23 nothing is present: the gate passes."""
    workflow, _ = _github_job()
    assert workflow["env"]["NPUDOCTOR_CONFIG"] == "examples/deepseek-v3-pd.yaml"
    buggy = state == "0.5.12"
    assert truth(state, "NPD001") == ("present" if buggy else "absent")
    done, summary, outputs = _run_github_job(tmp_path, subject(state))

    assert done["check"].returncode == 0, done["check"].stderr  # the code is kept, not raised
    assert outputs["check"]["code"] == ("1" if buggy else "0")
    junit = ET.parse(tmp_path / "work" / "npudoctor.xml").getroot()
    cases = {c.get("name").split()[0]: c for c in junit.iter("testcase")}
    assert sorted(c for c in cases if CheckKind.of(c) is CheckKind.DEEP) == default_check_ids(CheckKind.DEEP)
    assert (cases["NPD001"].find("failure") is not None) is buggy

    annotate = done["annotate"]
    assert annotate.returncode == 0, annotate.stderr
    errors = [line for line in annotate.stdout.splitlines() if line.startswith("::error ")]
    assert any("NPD001" in line for line in errors) is buggy
    assert annotate.stdout.splitlines()[-1].startswith(f"npudoctor: sglang {state}")
    rows = {}  # the Markdown table appended to $GITHUB_STEP_SUMMARY: | **ID** title | STATUS | summary |
    for line in summary.read_text().splitlines():
        match = re.match(r"\| \*\*(NPD\d+)\*\* [^|]* \| (\w+) \|", line)
        if match:
            rows[match.group(1)] = match.group(2)
    assert sorted(rows) == ["NPD000", "NPD001", "NPD002", "NPD003", "NPD004", "NPD005", "NPD006"]
    assert rows["NPD001"] == ("FAIL" if buggy else "PASS")

    assert done["gate"].returncode == (1 if buggy else 0), done["gate"].stdout
    if buggy:
        assert done["gate"].stdout.startswith("::error title=npudoctor::known sglang defects")


def test_github_job_input_error_is_not_a_finding(subject, tmp_path):
    """A deployment path that does not exist: the check step keeps npudoctor's exit 2, and the gate
    fails the job with its own message and code 2, not as a finding."""
    workflow, job = _github_job()
    work = _workspace(tmp_path, subject("0.5.23"))
    check = next(s for s in job["steps"] if s.get("id") == "check")
    output = tmp_path / "output"
    output.write_text("")
    env = {**workflow["env"], "NPUDOCTOR_CONFIG": "examples/no-such-deployment.yaml"}
    done = _bash(check["run"], work, _tool_env(**env, GITHUB_OUTPUT=str(output)), "-eo pipefail")
    assert done.returncode == 0, done.stderr
    assert "no-such-deployment.yaml" in done.stderr and "Traceback" not in done.stderr
    code = dict(line.split("=", 1) for line in output.read_text().splitlines())["code"]
    assert code == "2"
    gate = next(s for s in job["steps"] if s.get("id") == "gate")
    result = _bash(gate["run"], work, _tool_env(NPUDOCTOR_EXIT=code), "-eo pipefail")
    assert result.returncode == 2 and "usage or input error" in result.stdout


@pytest.mark.parametrize("code", sorted(EXIT_CODES) + ["", "130"])
def test_github_gate_distinguishes_every_exit_code(tmp_path, code):
    _, job = _github_job()
    gate = next(s for s in job["steps"] if s.get("id") == "gate")
    result = _bash(gate["run"], tmp_path, _tool_env(NPUDOCTOR_EXIT=str(code)), "-eo pipefail")
    expected = {"0": 0, "1": 1, "2": 2, "3": 3, "4": 4, "5": 5}.get(str(code), 1)
    assert result.returncode == expected, result.stdout
    messages = {
        "0": "no finding",
        "1": "known sglang defects",
        "2": "usage or input error",
        "3": "internal error",
        "4": "no sglang installed",
        "5": "the live depth is unavailable",
    }
    assert messages.get(str(code), "did not run") in result.stdout
    if expected:
        assert result.stdout.startswith("::error ")  # an annotation, not just a log line


def _gitlab_job() -> dict:
    (job,) = yaml.safe_load((CI / "gitlab-ci.yml").read_text()).values()
    return job


def test_gitlab_job_shape():
    job = _gitlab_job()
    assert job["artifacts"]["reports"]["junit"] == "npudoctor.xml"
    assert job["artifacts"]["when"] == "always"  # the report survives the failing gate
    assert any('pip install "$NPUDOCTOR_WHEEL"' in line for line in job["before_script"])
    (command,) = [c for line in job["script"] for c in _npudoctor_commands(line)]
    assert command[command.index("--format") + 1] == "junit"
    assert command[command.index("-o") + 1] == "npudoctor.xml"


@pytest.mark.parametrize("state", sweep(["0.5.12", "0.5.23"], quick=("0.5.12",)))
def test_gitlab_job_runs(subject, tmp_path, state):
    """The script section (after before_script installed and unpacked) runs as GitLab's bash runner
    runs it; the job's exit code is npudoctor's, the JUnit report is written either way."""
    job = _gitlab_job()
    work = _workspace(tmp_path, subject(state))
    env = _tool_env(**{k: str(v) for k, v in job["variables"].items()})
    result = _bash("\n".join(job["script"]), work, env, "-eo pipefail")
    buggy = truth(state, "NPD001") == "present"
    assert result.returncode == (1 if buggy else 0), result.stdout + result.stderr
    assert ("known sglang defects" in result.stdout) is buggy
    junit = ET.parse(work / "npudoctor.xml").getroot()
    failed = {c.get("name").split()[0] for c in junit.iter("testcase") if c.find("failure") is not None}
    assert ("NPD001" in failed) is buggy


@pytest.mark.parametrize("code", sorted(EXIT_CODES))
def test_gitlab_job_ends_with_each_exit_code(tmp_path, code):
    """Every documented exit code reaches GitLab unchanged, after its own message (npudoctor stubbed)."""
    job = _gitlab_job()
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "npudoctor").write_text(f"#!/bin/sh\nexit {code}\n")
    (stub / "npudoctor").chmod(0o755)
    env = _tool_env(**{k: str(v) for k, v in job["variables"].items()})
    env["PATH"] = f"{stub}{os.pathsep}{env['PATH']}"
    result = _bash("\n".join(job["script"]), tmp_path, env, "-eo pipefail")
    assert result.returncode == code
    assert result.stdout.startswith("npudoctor: ")
    assert len({_gitlab_message(job, c) for c in EXIT_CODES}) == len(EXIT_CODES)


def _gitlab_message(job: dict, code: int) -> str:
    match = re.search(rf"^\s*{code}\) echo \"([^\"]+)\"", "\n".join(job["script"]), re.MULTILINE)
    assert match, f"no message for exit code {code}"
    return match.group(1)


def _init_containers(deployment: dict) -> dict[str, dict]:
    """The Deployment's initContainers by name: ``npudoctor-fix`` (records the fixes), then
    ``npudoctor`` (the gate)."""
    containers = deployment["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in containers] == ["npudoctor-fix", "npudoctor"]
    return {c["name"]: c for c in containers}


def _k8s() -> tuple[dict, dict]:
    documents = list(yaml.safe_load_all((CI / "kubernetes.yaml").read_text()))
    kinds = {d["kind"]: d for d in documents}
    assert sorted(kinds) == ["ConfigMap", "Deployment"]
    return kinds["ConfigMap"], kinds["Deployment"]


def test_kubernetes_manifest_wiring():
    config_map, deployment = _k8s()
    spec = deployment["spec"]["template"]["spec"]
    assert (
        deployment["spec"]["selector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"]
    )
    inits = _init_containers(deployment)
    init = inits["npudoctor"]
    (server,) = spec["containers"]
    for each in inits.values():
        assert each["image"] == server["image"], "the check must see the server image's sglang"
    argv = init["command"] + init["args"]
    assert argv[:2] == ["npudoctor", "check"]
    assert argv[argv.index("--fail-on") + 1] == "fail"
    assert "--sglang-path" not in argv  # the image's installed sglang
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    # a retried init container reads its verdicts back: both keep them in the pod's emptyDir
    for each in inits.values():
        env = {v["name"]: v["value"] for v in each.get("env", [])}
        cache = next(m for m in each["volumeMounts"] if m["mountPath"] == env["NPUDOCTOR_CACHE_DIR"])
        assert "emptyDir" in volumes[cache["name"]] and not cache.get("readOnly")
    assert volumes["deployment"]["configMap"]["name"] == config_map["metadata"]["name"]
    config_path = Path(argv[argv.index("--config") + 1])
    assert str(config_path.parent) == mounts["deployment"] and config_path.name in config_map["data"]
    # the deployment in the ConfigMap describes the server the pod starts
    described = yaml.safe_load(config_map["data"][config_path.name])
    server_args = server["command"] + server["args"]
    decode = described["roles"]["decode"]["server_args"]
    assert server_args[:3] == ["python", "-m", "sglang.launch_server"]
    assert server_args[server_args.index("--disaggregation-mode") + 1] == decode["disaggregation_mode"]
    assert int(server_args[server_args.index("--tp-size") + 1]) == decode["tp_size"]
    assert server_args[server_args.index("--model-path") + 1] == described["model"]["path"]
    assert described["model"]["path"].startswith(mounts["models"] + "/")


@pytest.mark.parametrize("state", sweep(["0.5.12", "0.5.23"], quick=("0.5.12",)))
def test_kubernetes_init_container_runs(cli, subject, tmp_path, state):
    """The initContainer's exact argv, with the pod's mounts mapped to local directories (the ConfigMap
    key as a file, the model volume holding DeepSeek-V3's public config.json) and the image's sglang
    given as --sglang-path: exit 1 (pod blocked) where NPD001 is present for this decode server."""
    config_map, deployment = _k8s()
    init = _init_containers(deployment)["npudoctor"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    local = {mounts["deployment"]: tmp_path / "configmap", mounts["models"]: tmp_path / "models"}
    local[mounts["deployment"]].mkdir()
    for key, text in config_map["data"].items():
        (local[mounts["deployment"]] / key).write_text(_relocate(text, local))
    model_dir = Path(_relocate(yaml.safe_load(config_map["data"]["deployment.yaml"])["model"]["path"], local))
    model_dir.mkdir(parents=True)
    shutil.copy(EXAMPLES / "models" / "deepseek-v3" / "config.json", model_dir / "config.json")

    argv = [_relocate(a, local) for a in init["command"] + init["args"]]
    assert argv[0] == "npudoctor"
    code, out, err = cli(*argv[1:], "--sglang-path", subject(state), "--format", "json")
    buggy = truth(state, "NPD001") == "present"
    assert code == (1 if buggy else 0), err
    report = json.loads(out)
    assert result_of(report, "NPD001")["status"] == ("fail" if buggy else "pass")
    assert {r["name"] for r in report["deployment"]["roles"]} == {"prefill", "decode"}


def test_kubernetes_pod_starts_once_the_fixes_it_records_cure_the_deployment(
    cli, release, tmp_path, monkeypatch
):
    """The pod's initContainers in order, each with its exact argv and environment (the pod's mounts
    mapped to local directories, the image's sglang given as --sglang-path): npudoctor-fix records the
    fixes this decode server needs where the server's PYTHONPATH finds them, and the gate judges the
    deployment with them applied: they cure every finding of the checks (0.5.12: NPD001,
    sglang#25249, and NPD006, sglang#25383, by the truths), no catalogued crash is left (NPC134, a
    leak, warns), so the gate passes and sglang starts: the pod does not stay in Init. A retried
    gate (kubelet restarts an init container that fails) reads the live verdict back from the pod's
    cache volume instead of running the live probes again."""
    state = "0.5.12"
    present = [c for c in ("NPD001", "NPD006") if truth_present(state, c, "mla")]
    assert present and not [c for c in ("NPD002", "NPD003", "NPD004", "NPD005") if truth_present(state, c)]
    config_map, deployment = _k8s()
    inits = _init_containers(deployment)
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for c in inits.values() for m in c["volumeMounts"]}
    local = {
        mounts[name]: tmp_path / name
        for name in ("deployment", "models", "npudoctor-fixes", "npudoctor-cache")
    }
    for directory in local.values():
        directory.mkdir()
    for key, text in config_map["data"].items():
        (local[mounts["deployment"]] / key).write_text(_relocate(text, local))
    model_dir = Path(_relocate(yaml.safe_load(config_map["data"]["deployment.yaml"])["model"]["path"], local))
    model_dir.mkdir(parents=True)
    shutil.copy(EXAMPLES / "models" / "deepseek-v3" / "config.json", model_dir / "config.json")

    monkeypatch.delenv("NPUDOCTOR_NO_CACHE", raising=False)

    def start(name: str) -> tuple[int, dict, str]:
        init = inits[name]
        for variable in init.get("env", []):
            monkeypatch.setenv(variable["name"], _relocate(variable["value"], local))
        argv = [_relocate(a, local) for a in init["command"] + init["args"]]
        assert argv[0] == "npudoctor" and "--depth" not in argv
        code, out, err = cli(
            *argv[1:], "--sglang-path", release(state), "--depth", "auto", "--format", "json"
        )
        return code, json.loads(out), err

    reports = {}
    for name in inits:  # in order; the live depth, as in the pod (no --depth given)
        code, reports[name], err = start(name)
        assert code == 0, f"{name}: exit {code}: {err}"  # the pod goes on to the next container
        assert not [r["id"] for r in reports[name].get("results", []) if r["status"] == "fail"]
    assert sorted(reports["npudoctor-fix"]["applied"]) == present
    assert reports["npudoctor-fix"]["uncured"] == []  # nothing the fixes leave red
    gate = reports["npudoctor"]
    judged = [fix_id for fix_id, taken in gate["recorded_fixes"]["fixes"].items() if taken["judged"]]
    assert judged == present and all(result_of(gate, c)["status"] == "pass" for c in present)
    assert gate["live"]["ran"] and not gate["live"]["from_cache"]
    assert {
        r["id"]: r["status"] for r in gate["results"] if r["status"] != "pass" and r["status"] != "skip"
    } == {"NPC134": "warn"}
    code, retried, _ = start("npudoctor")  # kubelet restarts the gate: the verdict comes back from the cache
    assert code == 0 and retried["live"]["from_cache"] is True

    # sglang's processes find the record on the server's PYTHONPATH: its plugin entry point
    path = {v["name"]: v["value"] for v in server.get("env", [])}["PYTHONPATH"]
    assert path == mounts["npudoctor-fixes"]
    plugins = (
        "import importlib.metadata as m; print([e.value for e in m.entry_points(group='sglang.srt.plugins')])"
    )
    found = subprocess.run([sys.executable, "-S", "-c", plugins], capture_output=True, text=True,
                           env={"PYTHONPATH": _relocate(path, local)}, check=True)  # fmt: skip
    assert "npudoctor.patching.activation:sglang_plugin" in found.stdout


def _relocate(text: str, local: dict[str, Path]) -> str:
    for mount, directory in local.items():
        text = text.replace(mount, str(directory))
    return text


def test_snippets_point_at_real_examples():
    """The deployment the CI snippets check is one of the examples, so the tests above ran it."""
    workflow, _ = _github_job()
    for config in (workflow["env"]["NPUDOCTOR_CONFIG"], _gitlab_job()["variables"]["NPUDOCTOR_CONFIG"]):
        assert (REPO / config).is_file() and config.startswith("examples/")
