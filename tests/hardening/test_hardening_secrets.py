"""Secrets never leak: credential-looking environment values and server arguments, given through
the deployment YAML (shared and role env, server_args, args), a launch command's env prefix and
flags, ``--env``, and the process environment, appear in no report format (text, json, junit,
sarif, github and its step summary, markdown), not in ``npudoctor env``, not in what ``npudoctor
fix`` records or ``npudoctor run`` hands its processes, not in error lines. Each test also shows
that the secret's channel reached npudoctor (its name is reported, its value is ``***``), so a
test cannot pass because a value was silently dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npudoctor.deployment.redact import REDACTED, is_secret_name, redact_argv, redact_env, redact_value

from support.repo import EXAMPLES

FORMATS = ("text", "json", "junit", "sarif", "github", "markdown")
MODEL = EXAMPLES / "models" / "deepseek-v3"

# name -> a value unique enough that finding it anywhere means it leaked
ENV_SECRETS = {
    "HF_TOKEN": "leak-hf-token-4f1c",
    "AWS_SECRET_ACCESS_KEY": "leak-aws-secret-9d2e",
    "MY_API_KEY": "leak-my-api-key-7a3b",
    "DB_PASSWORD": "leak-db-password-1e8f",
    "GITHUB_TOKEN": "leak-github-token-6c0d",
    "GOOGLE_APPLICATION_CREDENTIALS": "leak-credentials-2b7a",
    "SGLANG_API_KEY": "leak-sglang-api-key-5e9c",
    "ASCEND_AUTH_COOKIE": "leak-ascend-cookie-8f4a",
    "mooncakeSessionToken": "leak-camel-token-3d6b",
}
# values that leak whatever name they come under
VALUE_SECRETS = {
    "HCCL_PROXY_URL": ("http://admin:leak-url-password-0a1b@proxy:3128", "leak-url-password-0a1b"),
    "ASCEND_MODEL_REPO": ("hf_leakLeakLeakLeakLeak0123456789", "hf_leakLeakLeakLeakLeak0123456789"),
}
ARG_SECRETS = {"--api-key": "leak-server-api-key-11aa", "--admin-api-key": "leak-admin-api-key-22bb"}
# free text that ends up in every format: an ignore entry's reason
REASON_SECRETS = ("leak-reason-password-33cc", "ghp_leakLeakLeakLeakLeakLeak0123456789")
REASON = f"see https://ci-bot:{REASON_SECRETS[0]}@ci.example/issues/7 (token {REASON_SECRETS[1]})"
ALL_SECRETS = [
    *ENV_SECRETS.values(),
    *(v for _, v in VALUE_SECRETS.values()),
    *ARG_SECRETS.values(),
    *REASON_SECRETS,
]


def assert_clean(*outputs: str | bytes) -> None:
    for output in outputs:
        text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
        leaked = [secret for secret in ALL_SECRETS if secret in text]
        assert not leaked, f"leaked {leaked} in:\n{text[:3000]}"


@pytest.fixture
def secret_env(monkeypatch):
    """Every secret also in the process environment (``from_command`` reads code-path variables
    from it, ``npudoctor env`` lists it)."""
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    for name, (value, _) in VALUE_SECRETS.items():
        monkeypatch.setenv(name, value)


def deployment_yaml(directory: Path) -> Path:
    env = {name: value for name, value in ENV_SECRETS.items()}
    env.update({name: value for name, (value, _) in VALUE_SECRETS.items()})
    env["ASCEND_USE_FIA"] = "1"
    data = {
        "model": {"path": str(MODEL)},
        "env": dict(list(env.items())[:5]),
        "roles": {
            "prefill": {
                "server_args": {
                    "pp_size": 2,
                    "api_key": ARG_SECRETS["--api-key"],
                    "watermark_config": json.dumps({"key": ARG_SECRETS["--admin-api-key"]}),
                },
                "env": dict(list(env.items())[5:]),
            },
            "decode": {
                "args": [
                    "--disaggregation-mode",
                    "decode",
                    "--api-key",
                    ARG_SECRETS["--api-key"],
                    f"--admin-api-key={ARG_SECRETS['--admin-api-key']}",
                ]
            },
        },
    }
    data["ignore"] = [{"id": "NPD001", "until": "2999-12-31", "reason": REASON}]
    path = directory / "secrets.yaml"
    path.write_text(json.dumps(data))  # YAML is a superset of JSON
    return path


def every_format(cli, tmp_path, monkeypatch, *args) -> dict:
    """The report in every format (stdout and --output), the step summary; returns the JSON one."""
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report = None
    for fmt in FORMATS:
        split = args.index("--") if "--" in args else len(args)
        before, after = list(args[:split]), list(args[split:])
        code, out, err = cli("check", "--format", fmt, *before, *after)
        assert code in (0, 1), err
        assert_clean(out, err)
        target = tmp_path / f"report.{fmt}"
        code, out, err = cli("check", "--format", fmt, "--output", target, *before, *after)
        assert code in (0, 1), err
        assert_clean(out, err, target.read_bytes())
        if fmt == "json":
            report = json.loads(target.read_text())
    assert_clean(summary.read_bytes())
    return report


def test_yaml_env_and_server_args_are_redacted_in_every_format(
    cli, release, tmp_path, monkeypatch, secret_env
):
    config = deployment_yaml(tmp_path)
    report = every_format(cli, tmp_path, monkeypatch, "--sglang-path", release("0.5.12"), "--config", config)
    prefill, decode = report["deployment"]["roles"]
    shared = {**prefill["env"], **decode["env"]}
    for name in ENV_SECRETS:
        assert shared[name] == REDACTED, name  # the channel reached the report, redacted
    assert shared["HCCL_PROXY_URL"] == f"http://admin:{REDACTED}@proxy:3128"
    assert shared["ASCEND_MODEL_REPO"] == REDACTED
    assert shared["ASCEND_USE_FIA"] == "1"  # not a secret: kept
    assert prefill["server_args"]["api_key"] == REDACTED
    assert json.loads(prefill["server_args"]["watermark_config"]) == {"key": REDACTED}
    assert decode["server_args"]["api_key"] == REDACTED and decode["server_args"]["admin_api_key"] == REDACTED
    assert decode["unknown_args"] == [f"--api-key {REDACTED}", f"--admin-api-key={REDACTED}"]
    assert prefill["server_args"]["pp_size"] == 2  # not a secret: kept
    ignored = next(r for r in report["results"] if r["id"] == "NPD001")["ignored"]
    assert ignored.startswith(f"see https://ci-bot:{REDACTED}@ci.example/issues/7 (token {REDACTED})")


def test_launch_command_env_prefix_and_flags_are_redacted(cli, release, tmp_path, monkeypatch, secret_env):
    command = [
        *(f"{name}={value}" for name, value in ENV_SECRETS.items()),
        f"HCCL_PROXY_URL={VALUE_SECRETS['HCCL_PROXY_URL'][0]}",
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(MODEL),
        "--disaggregation-mode",
        "decode",
        "--api-key",
        ARG_SECRETS["--api-key"],
        f"--admin-api-key={ARG_SECRETS['--admin-api-key']}",
    ]
    report = every_format(cli, tmp_path, monkeypatch, "--sglang-path", release("0.5.12"), "--", *command)
    (role,) = report["deployment"]["roles"]
    for name in ENV_SECRETS:
        assert role["env"][name] == REDACTED, name
    assert role["env"]["ASCEND_MODEL_REPO"] == REDACTED  # from the process environment
    assert role["server_args"]["api_key"] == REDACTED
    assert role["unknown_args"] == [f"--api-key {REDACTED}", f"--admin-api-key={REDACTED}"]


def test_env_flags_are_redacted(cli, release, tmp_path, monkeypatch):
    pairs = [f"{name}={value}" for name, value in ENV_SECRETS.items()]
    args = ["--sglang-path", release("0.5.12"), "--model-path", MODEL, "--disaggregation-mode", "decode"]
    report = every_format(cli, tmp_path, monkeypatch, *args, *[a for p in pairs for a in ("--env", p)])
    (role,) = report["deployment"]["roles"]
    assert all(role["env"][name] == REDACTED for name in ENV_SECRETS)


def test_npudoctor_env_redacts_the_process_environment(cli, secret_env):
    for fmt in ("text", "json"):
        code, out, err = cli("env", "--format", fmt)
        assert code == 0, err
        assert_clean(out, err)
    data = json.loads(cli("env", "--format", "json")[1])["environment"]
    for name in ("HF_TOKEN", "SGLANG_API_KEY", "ASCEND_AUTH_COOKIE"):
        assert data[name] == REDACTED
    assert data["HCCL_PROXY_URL"] == f"http://admin:{REDACTED}@proxy:3128"


def test_fix_plan_record_and_run_plan_hold_no_secret(cli, release, tmp_path, secret_env):
    config = deployment_yaml(tmp_path)
    tree = release("0.5.12")
    site = tmp_path / "site"
    site.mkdir()
    for extra in ((), ("--format", "json")):
        code, out, err = cli("fix", "--sglang-path", tree, "--config", config, *extra)
        assert code == 0, err
        assert_clean(out, err)
    code, out, err = cli("fix", "--sglang-path", tree, "--config", config, "--apply", "--site", site)
    assert code == 0 and "recorded NPD001" in out, err
    assert_clean(out, err, *(p.read_bytes() for p in site.rglob("*") if p.is_file()))
    code, out, err = cli("fix", "--status", "--sglang-path", tree, "--site", site)
    assert code == 0, err
    assert_clean(out, err)

    # what `npudoctor run` hands every process: the plan file and the environment it adds
    show = "import os; print(open(os.environ['NPUDOCTOR_RUN_PLAN']).read())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "run", "--config", str(config), "--", sys.executable, "-c", show],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert '"NPD001"' in done.stdout  # the plan was handed over
    assert_clean(done.stdout, done.stderr)


def test_error_lines_do_not_echo_secrets(cli, release):
    token = ENV_SECRETS["HF_TOKEN"]
    code, _, err = cli("run", "--", f"HF_TOKEN={token}", "python", "-c", "pass")
    assert code == 127 and f"HF_TOKEN={REDACTED}" in err, err
    assert_clean(err)
    code, _, err = cli(
        "check", "--sglang-path", release("0.5.12"), "--", "env", "-i", f"HF_TOKEN={token}", "python", "-V"
    )
    assert code == 2 and "cannot read" in err, err
    assert_clean(err)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("MY_API_KEY", True),
        ("DB_PASSWORD", True),
        ("GITHUB_TOKEN", True),
        ("SERVICE_CREDENTIALS", True),
        ("apiKey", True),
        ("HFTOKEN", True),
        ("api_key", True),
        ("admin-api-key", True),
        ("ASCEND_USE_FIA", False),
        ("max_prefill_tokens", False),
        ("tokenizer_path", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("page_size", False),
        ("kv_cache_dtype", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_redaction_primitives():
    assert redact_env({"HF_TOKEN": "x", "A": "https://u:p@h/x"}) == {
        "HF_TOKEN": REDACTED,
        "A": f"https://u:{REDACTED}@h/x",
    }
    assert redact_value("ghp_" + "a" * 36) == REDACTED
    assert redact_value("AKIAABCDEFGHIJKLMNOP") == REDACTED
    assert redact_value('{"nested": {"api_key": "x", "page": 1}}') == json.dumps(
        {"nested": {"api_key": REDACTED, "page": 1}}
    )
    assert redact_argv(["--api-key", "a", "b", "--tp", "2", "TOKEN=x", "--api-key=c", "--hf-token d"]) == [
        "--api-key", REDACTED, REDACTED, "--tp", "2", f"TOKEN={REDACTED}", f"--api-key={REDACTED}", f"--hf-token {REDACTED}",
    ]  # fmt: skip
