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
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from npudoctor.cli.options import DataFormat
from npudoctor.deployment.redact import REDACTED, is_secret_name, redact_argv, redact_env, redact_value
from npudoctor.formatters import DEFAULT, FORMATS, named
from npudoctor.formatters import NAMES as FORMAT_NAMES

from support.repo import EXAMPLES

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
    "MY_CREDS": "leak-my-creds-0c1d",
    "ASCEND_PAT": "leak-ascend-pat-2e3f",
    "SGLANG_JWT": "leak-sglang-jwt-4a5b",
}
# a JSON Web Token: three base64url parts, the first two JSON objects ({"alg":"HS256"}, {"sub":"leak"})
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJsZWFrIn0.leakJwtSignature88bb"
# values that leak whatever name they come under
VALUE_SECRETS = {
    "HCCL_PROXY_URL": ("http://admin:leak-url-password-0a1b@proxy:3128", "leak-url-password-0a1b"),
    "ASCEND_MODEL_REPO": ("hf_leakLeakLeakLeakLeak0123456789", "hf_leakLeakLeakLeakLeak0123456789"),
    "ASCEND_IDENTITY": (JWT, "leakJwtSignature88bb"),
    "HCCL_UPSTREAM_HEADER": ("Authorization: Bearer leak-bearer-77aa", "leak-bearer-77aa"),
    "HCCL_MIRROR_URL": ("https://leak-url-token-99cc@mirror.example/simple", "leak-url-token-99cc"),
    "SGLANG_PEER": ("admin:leak-schemeless-pw-aadd@peer.example:8000", "leak-schemeless-pw-aadd"),
    "ASCEND_BLOB_URL": ("https://blob.example/w?sig=leak-sig-bbee&creds=leak-creds-ccff", "leak-sig-bbee"),
    "ASCEND_BLOB_URL2": ("https://blob.example/w?creds=leak-creds-ccff&v=1", "leak-creds-ccff"),
}
# each value-shaped secret as the reports show it: the secret gone, the rest kept
VALUE_REDACTED = {
    "ASCEND_IDENTITY": REDACTED,
    "HCCL_UPSTREAM_HEADER": f"Authorization: Bearer {REDACTED}",
    "HCCL_MIRROR_URL": f"https://{REDACTED}@mirror.example/simple",
    "SGLANG_PEER": f"admin:{REDACTED}@peer.example:8000",
    "ASCEND_BLOB_URL": f"https://blob.example/w?sig={REDACTED}&creds={REDACTED}",
    "ASCEND_BLOB_URL2": f"https://blob.example/w?creds={REDACTED}&v=1",
}
ARG_SECRETS = {"--api-key": "leak-server-api-key-11aa", "--admin-api-key": "leak-admin-api-key-22bb"}
# free text that ends up in every format: an ignore entry's reason
REASON_SECRETS = ("leak-reason-password-33cc", "ghp_leakLeakLeakLeakLeakLeak0123456789")
REASON = f"see https://ci-bot:{REASON_SECRETS[0]}@ci.example/issues/7 (token {REASON_SECRETS[1]})"
# JSON-valued server arguments with a credential inside (sglang json.loads them): the flag is no
# secret, a key inside is
JSON_SECRETS = ("leak-json-api-key-44dd", "leak-json-s3-secret-55ee")
JSON_FLAGS = (
    "--json-model-override-args",
    json.dumps({"api_key": JSON_SECRETS[0], "rope_scaling": {"factor": 2}}),
    f"--hicache-storage-backend-extra-config={json.dumps({'secret_access_key': JSON_SECRETS[1], 'bucket': 'b'})}",
)
# a password in a URL given where npudoctor reads a path: the error line names the path
URL_PASSWORD = "leak-url-hunter2-66ff"
ALL_SECRETS = [
    *ENV_SECRETS.values(),
    *(v for _, v in VALUE_SECRETS.values()),
    *ARG_SECRETS.values(),
    *REASON_SECRETS,
    *JSON_SECRETS,
    URL_PASSWORD,
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
    for fmt in FORMAT_NAMES:
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
    assert {name: shared[name] for name in VALUE_REDACTED} == VALUE_REDACTED
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
    for fmt in DataFormat:
        code, out, err = cli("env", "--format", fmt.value)
        assert code == 0, err
        assert_clean(out, err)
    data = json.loads(cli("env", "--format", "json")[1])["environment"]
    for name in ("HF_TOKEN", "SGLANG_API_KEY", "ASCEND_AUTH_COOKIE"):
        assert data[name] == REDACTED
    assert data["HCCL_PROXY_URL"] == f"http://admin:{REDACTED}@proxy:3128"
    assert data["ASCEND_PAT"] == data["SGLANG_JWT"] == REDACTED
    assert {name: data[name] for name in VALUE_REDACTED} == VALUE_REDACTED


def test_fix_plan_record_and_run_plan_hold_no_secret(cli, release, tmp_path, secret_env, monkeypatch):
    config = deployment_yaml(tmp_path)
    tree = release("0.5.12")
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))  # on the server's path: sglang loads the record
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
        timeout=600,
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
        ("MY_CREDS", True),
        ("SERVICE_CRED", True),
        ("ASCEND_PAT", True),
        ("GITLAB_PAT", True),
        ("SGLANG_JWT", True),
        ("sessionJwt", True),
        ("PROXY_BEARER", True),
        ("HTTP_AUTH", True),
        ("sig", True),
        ("X-Goog-Signature", True),
        ("MODEL_PATH", False),
        ("PATH", False),
        ("PYTHONPATH", False),
        ("COMPAT_MODE", False),
        ("SIGNAL_TIMEOUT", False),
        ("ASCEND_DESIGN", False),
        ("author", False),
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


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (JWT, REDACTED),
        (f"token {JWT} expired", f"token {REDACTED} expired"),
        ("Authorization: Bearer abc.def-123", f"Authorization: Bearer {REDACTED}"),
        ("bearer abc123", f"bearer {REDACTED}"),
        ("Authorization: Basic dXNlcjpwdw==", f"Authorization: Basic {REDACTED}"),
        ("Authorization: abc123", f"Authorization: {REDACTED}"),
        ("https://ghtoken123@github.com/o/r.git", f"https://{REDACTED}@github.com/o/r.git"),
        ("https:/tok@h/m", f"https:/{REDACTED}@h/m"),  # a path argument folded the URL
        ("admin:pw123@proxy:3128", f"admin:{REDACTED}@proxy:3128"),
        ("--peer=admin:pw123@10.0.0.1:8000", f"--peer=admin:{REDACTED}@10.0.0.1:8000"),
        ("https://h/x?sig=abc&se=2026", f"https://h/x?sig={REDACTED}&se=2026"),
        ("https://h/x?creds=abc", f"https://h/x?creds={REDACTED}"),
    ],
)
def test_secret_value_shapes(value, shown):
    assert redact_value(value) == shown


@pytest.mark.parametrize(
    "value",
    [
        "/models/deepseek-v3",
        "/data/eyJ-weights/model.safetensors",
        "128",
        "0.5",
        "1:2:3",
        "10.0.0.1:8000",
        "ascend/sglang:0.5.12@sha256:0123abcd",
        "sglang:0.5.12@sha256:0123abcd",
        "user@example.com",
        "git@github.com:o/r.git",
        "https://h/x?max_tokens=5&page=2",
        "bearer of bad news",
        "a.b.c",
        "deepseek-ai/DeepSeek-V3",
    ],
)
def test_ordinary_values_are_kept(value):
    assert redact_value(value) == value


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
    # a value inside a flag word, a URL's query, a URL a path argument folded (https:/)
    assert redact_argv(['--x {"api_key": "a", "n": 1}', '--y=["s", {"token": "b"}]', 'CFG={"password": "c"}']) == [
        '--x {"api_key": "***", "n": 1}', '--y=["s", {"token": "***"}]', 'CFG={"password": "***"}',
    ]  # fmt: skip
    assert redact_value("s3://b/k?X-Amz-Credential=AK&X-Amz-Expires=60&X-Amz-Signature=ab") == (
        f"s3://b/k?X-Amz-Credential={REDACTED}&X-Amz-Expires=60&X-Amz-Signature={REDACTED}"
    )
    assert redact_value("https://h/m?token=x: no such file") == f"https://h/m?token={REDACTED}: no such file"
    assert redact_value("https://h/x?max_tokens=5") == "https://h/x?max_tokens=5"
    assert redact_value("--model-path https:/u:p@h/m: not") == f"--model-path https:/u:{REDACTED}@h/m: not"


def launch_command(*flags: str) -> list[str]:
    return ["python", "-m", "sglang.launch_server", "--model-path", str(MODEL), *flags]


def assert_json_flags_redacted(role: dict) -> None:
    """The JSON-valued flags reached the report (their names, the JSON's shape, the keys that are no
    secret), their secret keys as ``***``: in ``server_args`` and as the flags were written."""
    override = {"api_key": REDACTED, "rope_scaling": {"factor": 2}}
    extra = {"secret_access_key": REDACTED, "bucket": "b"}
    assert json.loads(role["server_args"]["json_model_override_args"]) == override
    assert json.loads(role["server_args"]["hicache_storage_backend_extra_config"]) == extra
    written = {arg.partition(" ")[0].partition("=")[0]: arg for arg in role["unknown_args"]}
    assert json.loads(written["--json-model-override-args"].partition(" ")[2]) == override
    assert json.loads(written["--hicache-storage-backend-extra-config"].partition("=")[2]) == extra


def test_json_valued_flags_are_redacted_in_every_format(cli, release, tmp_path, monkeypatch):
    """A flag whose value is JSON (``--json-model-override-args``, a storage backend's extra config)
    is reported with the secret keys inside redacted, in ``server_args`` and in the flags as written
    (``unknown_args``), whatever the form: a launch command, ``--flag=JSON``, a YAML role's ``args``."""
    tree = release("0.5.12")
    report = every_format(
        cli, tmp_path, monkeypatch, "--sglang-path", tree, "--", *launch_command(*JSON_FLAGS)
    )
    assert_json_flags_redacted(report["deployment"]["roles"][0])

    config = tmp_path / "json-flags.yaml"
    config.write_text(
        json.dumps({"model": {"path": str(MODEL)}, "roles": {"server": {"args": list(JSON_FLAGS)}}})
    )
    report = every_format(cli, tmp_path, monkeypatch, "--sglang-path", tree, "--config", config)
    assert_json_flags_redacted(report["deployment"]["roles"][0])


def test_fix_plan_and_record_of_a_launch_command_hold_no_json_secret(cli, release, tmp_path, monkeypatch):
    """``fix`` (text and JSON), ``fix --apply`` (its output and every file of the record) and
    ``--status`` for a launch command with JSON-valued flags and a secret flag."""
    tree, site = release("0.5.12"), tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))  # on the server's path: sglang loads the record
    command = launch_command(
        *JSON_FLAGS, "--disaggregation-mode", "decode", "--api-key", ARG_SECRETS["--api-key"]
    )
    for extra in ((), ("--format", "json")):
        code, out, err = cli("fix", "--sglang-path", tree, *extra, "--", *command)
        assert code == 0, err
        assert_clean(out, err)
    code, out, err = cli("fix", "--sglang-path", tree, "--apply", "--site", site, "--", *command)
    assert code == 0 and "recorded NPD001" in out, err
    assert_clean(out, err, *(p.read_bytes() for p in site.rglob("*") if p.is_file()))
    code, out, err = cli("fix", "--status", "--sglang-path", tree, "--site", site, "--", *command)
    assert code == 0, err
    assert_clean(out, err)


def test_advise_reports_hold_no_secret(cli, release, tmp_path, monkeypatch):
    """``advise`` (offline: a tree of one's own) reports each release as ``check`` does: no secret
    from the deployment in any of its formats, nor in its step summary."""
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    command = launch_command(*JSON_FLAGS, "--api-key", ARG_SECRETS["--api-key"])
    args = ("--sglang-path", release("0.5.12"), "--select", "NPD", "--depth", "static")
    for fmt in FORMAT_NAMES:
        code, out, err = cli("advise", "--format", fmt, *args, "--", *command)
        assert code in (0, 1), err
        assert_clean(out, err)
        if fmt == "json":
            (row,) = json.loads(out)["releases"]
            role = row["report"]["deployment"]["roles"][0]
            assert_json_flags_redacted(role)
            assert role["server_args"]["api_key"] == REDACTED
    assert_clean(summary.read_bytes())


# A URL with a password where npudoctor wants a local path: every command says the path is not
# one, and none echoes the password.
URL = f"https://user:{URL_PASSWORD}@models.example/m"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("check", "--model-path", URL), id="check"),
        pytest.param(
            ("check", "--", *launch_command("--model-path", URL)[:3], "--model-path", URL), id="command"
        ),
        pytest.param(("fix", "--model-path", URL), id="fix"),
        pytest.param(("fix", "--apply", "--model-path", URL), id="fix-apply"),
        pytest.param(("advise", "--depth", "static", "--model-path", URL), id="advise"),
        pytest.param(("check", "--config", URL), id="config"),
    ],
)
def test_error_lines_redact_url_passwords(cli, release, args):
    command, rest = args[0], args[1:]
    code, out, err = cli(command, "--sglang-path", release("0.5.12"), *rest)
    assert code == 2, err
    assert f"user:{REDACTED}@models.example" in err, err  # the path is named, its password is not
    assert_clean(out, err)


def test_run_error_line_redacts_url_passwords(cli, tmp_path):
    code, out, err = cli("run", "--model-path", URL, "--", sys.executable, "-c", "pass")
    assert code == 2 and f"user:{REDACTED}@models.example" in err, err
    assert_clean(out, err)
    code, out, err = cli("run", "--", f"https://user:{URL_PASSWORD}@example/x", "-V")
    assert code == 127 and f"user:{REDACTED}@example" in err, err
    assert_clean(out, err)


# Terminal control sequences in the user's values: set the window title, clear the screen, a C1
# CSI (what an 8-bit terminal reads as ESC [), rich markup that must print as written.
HOSTILE = "a\x1b]0;pwned\x07b\x1b[2Jc\x9b31md[bold]e[/bold]"
RAW_CONTROLS = ("\x1b", "\x07", "\x9b")


def assert_no_raw_controls(*outputs: str) -> None:
    for output in outputs:
        raw = [c for c in RAW_CONTROLS if c in output]
        assert not raw, f"raw {raw} in:\n{output[:3000]!r}"


def test_terminal_controls_in_values_are_escaped_in_text_output(cli, release, tmp_path):
    """Text for a terminal shows a control character of the user's value escaped (``\\x1b``), never
    raw, and rich markup in a value as written: a YAML path, an environment value (``--env`` and the
    YAML's), a server argument a check quotes, in ``check``, ``fix`` and ``advise``'s text, on stdout
    and in ``--output``, and the error line on stderr. The other formats hold none raw either."""
    tree = release("0.5.12")
    config = tmp_path / f"deploy{HOSTILE.replace('/', '')}.yaml"
    server_args = {"pp_size": 2, "disaggregation_transfer_backend": HOSTILE}
    data = {
        "model": {"path": str(MODEL)},
        "env": {"ASCEND_USE_FIA": "1", "SGLANG_NOTE": HOSTILE},
        "roles": {"prefill": {"server_args": server_args}, "decode": {}},
    }
    config.write_text(json.dumps(data))
    flags = ("--model-path", MODEL, "--disaggregation-mode", "decode", "--env", f"HCCL_NOTE={HOSTILE}")
    for args in (
        ("check", "--sglang-path", tree, "--config", config, "--verbose"),
        ("check", "--sglang-path", tree, *flags),
        ("fix", "--sglang-path", tree, *flags),
        ("advise", "--sglang-path", tree, "--depth", "static", *flags),
    ):
        code, out, err = cli(*args)
        assert code in (0, 1), err
        assert_no_raw_controls(out, err)
        assert r"\x1b]0;pwned" in out and "[bold]e[/bold]" in out, out  # shown, escaped and as written
        if args[0] == "check":
            target = tmp_path / "report.txt"
            code, out, err = cli(*args, "--output", target)
            assert_no_raw_controls(out, err, target.read_text())
            assert r"\x1b[2J" in target.read_text()
            for fmt in (f.name for f in FORMATS if f is not DEFAULT):  # the default: above
                code, out, err = cli(*args, "--format", fmt)
                assert code in (0, 1), err
                assert_no_raw_controls(out, err)

    code, out, err = cli("check", "--sglang-path", tree, "--model-path", tmp_path / HOSTILE)
    assert code == 2 and "not a local model directory" in err, err
    assert_no_raw_controls(out, err)
    assert r"\x1b]0;pwned" in err and "[bold]e[/bold]" in err, err


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to read the pasted command")
def test_a_command_to_paste_holds_the_value_with_its_controls(cli, release):
    """The fix hint repeats the user's ``--env``: a value with control characters is quoted as
    ``$'...'``, so the line shows none raw and, pasted into bash, passes the value as given."""
    env = f"HCCL_NOTE={HOSTILE}"
    code, out, err = cli("check", "--sglang-path", release("0.5.12"), "--model-path", MODEL,
                         "--disaggregation-mode", "decode", "--env", env)  # fmt: skip
    assert code == 1, err
    line = next(line for line in out.splitlines() if line.strip().startswith("npudoctor fix --select"))
    assert_no_raw_controls(line)
    pasted = line.strip()
    words = (
        subprocess.run(
            ["bash", "-c", f'for word in {pasted}; do printf "%s\\0" "$word"; done'], capture_output=True
        )
        .stdout.decode("utf-8", "surrogateescape")
        .split("\0")
    )
    assert env in words, words


# a long word of each shape a pattern could retry at every position, 1 MB each
LONG_WORDS = '("a" * 1_000_000, "?token=" + "a" * 1_000_000, "https://" + "a:" * 500_000)'


def test_redaction_of_a_megabyte_word_finishes():
    """A long value (a long word in an environment value or an argument) is redacted in one pass: no
    pattern tries every position of a long run again (quadratic: a 50 KB word took 9 s, 100 KB 36 s,
    so a megabyte would take an hour; linear, well under a second). In a child, so the 600 s timeout
    guards the run instead of bounding its speed (the time is ``benchmarks/input_limits.py``'s)."""
    code = (
        "from npudoctor.deployment.redact import redact_argv\n"
        f"for value in {LONG_WORDS}:\n"
        "    redact_argv([f'--x={value}', value])\n"
        "print('redacted')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout) == (0, "redacted\n"), done.stderr[-2000:]


def test_terminal_primitives():
    from npudoctor.terminal import printable, shell_join

    assert printable("a\x1b]0;t\x07b\rc\x9bd\u202ee\tf\ng") == "a\\x1b]0;t\\x07b\\rc\\x9bd\\u202ee\tf\ng"
    assert printable("[bold]plain[/bold] /path") == "[bold]plain[/bold] /path"
    assert shell_join(["npudoctor", "it's", "A=x\x1b[2J"]) == "npudoctor 'it'\"'\"'s' $'A=x\\x1b[2J'"
    # a secret redacted for the shell is a variable reference; the same text from a user is quoted
    marked = redact_argv(["HF_TOKEN=t", "--api-key", "k", '--x={"token": "t"}'], for_shell=True)
    assert shell_join(marked) == (
        'HF_TOKEN="${HF_TOKEN:?redacted}" --api-key "${API_KEY:?redacted}" '
        '\'--x={"token": "\'"${TOKEN:?redacted}"\'"}\''
    )
    assert shell_join(['"${API_KEY:?redacted}"']) == "'\"${API_KEY:?redacted}\"'"
    # a megabyte of controls is shown escaped whole (its time is benchmarks/input_limits.py's)
    assert printable("\x1b" * 1_000_000) == "\\x1b" * 1_000_000
    assert shell_join(["\x1b" * 1_000_000]) == "$'" + "\\x1b" * 1_000_000 + "'"


def test_a_malformed_env_flag_does_not_echo_its_value(cli, release):
    """``--env 'DB_PASSWORD hunter2'`` (a space for the ``=``) is refused in one line that names the
    variable and not its value."""
    for pair in (f"DB_PASSWORD {ENV_SECRETS['DB_PASSWORD']}", f"DB_PASSWORD:{ENV_SECRETS['DB_PASSWORD']}"):
        code, out, err = cli(
            "check", "--sglang-path", release("0.5.12"), "--model-path", MODEL, "--env", pair
        )
        assert code == 2 and "DB_PASSWORD" in err and "expected NAME=VALUE" in err, err
        assert_clean(out, err)


def pasted_words(line: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """What bash makes of ``line`` pasted as the arguments of a command, in ``env``: one word a NUL."""
    return subprocess.run(
        ["bash", "-c", f'for word in {line}; do printf "%s\\0" "$word"; done'],
        capture_output=True,
        env={"PATH": os.environ["PATH"], **env},
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to read the pasted command")
def test_a_command_to_paste_refers_to_a_secret_it_does_not_show(cli, release):
    """A redacted secret in a printed command is a variable reference the shell refuses while the
    variable is unset (``"${API_KEY:?...}"``), never ``***``: pasted as it was printed, ``--api-key
    '***'`` would start sglang with the key ``***``. With the variables set, the command gets them."""
    command = [
        f"HF_TOKEN={ENV_SECRETS['HF_TOKEN']}",
        *launch_command("--disaggregation-mode", "decode", "--api-key", ARG_SECRETS["--api-key"]),
    ]
    code, out, err = cli("check", "--sglang-path", release("0.5.12"), "--", *command)
    assert code == 1, err
    assert_clean(out, err)
    line = next(line for line in out.splitlines() if line.strip().startswith("npudoctor fix --select"))
    pasted = line.strip()
    assert "'***'" not in pasted and REDACTED not in pasted, pasted
    refused = pasted_words(pasted, {})
    assert refused.returncode != 0 and refused.stdout == b"", refused  # unset: the shell runs nothing
    names = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", pasted)
    assert "HF_TOKEN" in names and len(names) == 2, pasted
    values = {name: f"value-of-{name}" for name in names}
    words = pasted_words(pasted, values).stdout.decode().split("\0")
    assert "HF_TOKEN=value-of-HF_TOKEN" in words, words
    (key_name,) = set(names) - {"HF_TOKEN"}
    assert words[words.index("--api-key") + 1] == values[key_name], words


PAGE_SIZE_RELEASE = "0.5.23"  # ships NPC011 (--page-size not a multiple of 16), tests/data/catalog


def page_size_model(directory: Path) -> Path:
    model = directory / "model-with-a-directory-name-long-enough-to-reach-the-end-of-the-line"
    model.mkdir()
    config = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_catalog_workaround_does_not_echo_a_token_in_the_config_path(cli, release, tmp_path):
    token = "ghp_leakLeakLeakLeakLeakLeak0123456789"
    folder = tmp_path / token
    folder.mkdir()
    config = folder / "deploy.yaml"
    model = page_size_model(tmp_path)
    config.write_text(
        json.dumps({"model": {"path": str(model)}, "roles": {"server": {"server_args": {"page_size": 1}}}})
    )
    tree = release(PAGE_SIZE_RELEASE)
    for fmt in FORMAT_NAMES:
        code, out, err = cli(
            "check", "--sglang-path", tree, "--select", "NPC011", "--config", config, "--format", fmt
        )
        assert code == 1, err
        assert token not in out and token not in err, out
        if fmt == "json":
            advice = json.loads(out)["results"][0]["remediation"]["advice"]
            assert "server_args.page_size: 128" in advice and f"{REDACTED}/deploy.yaml" in advice, advice


def test_the_workaround_command_is_printed_whole(cli, release, tmp_path, monkeypatch):
    """The catalog workaround's launch command (the user's own, rewritten) is a command to paste:
    at 80 columns it is on one line, whole, not wrapped after ``--model-path``."""
    model = page_size_model(tmp_path)
    command = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--page-size",
        "1",
        "--tp",
        "2",
    ]
    args = ("check", "--sglang-path", release(PAGE_SIZE_RELEASE), "--select", "NPC011")
    code, out, err = cli(*args, "--format", "json", "--", *command)
    advice = json.loads(out)["results"][0]["remediation"]["advice"]
    pasted = advice.partition("your launch command with it: ")[2]
    assert pasted.startswith("python -m sglang.launch_server --model-path "), advice
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli(*args, "--", *command)
    assert code == 1, err
    assert any(line.strip() == pasted for line in out.splitlines()), out


def test_fix_status_keeps_each_site_whole(cli, release, tmp_path, monkeypatch):
    """``fix --status`` at 80 columns: a stale fix's sites (``module:Class.method``, wider than what
    is left of the line) are each on one line, whole."""
    site = tmp_path / "site"
    site.mkdir()
    config = EXAMPLES / "deepseek-v3-pd.yaml"
    code, _, err = cli(
        "fix", "--apply", "--site", site, "--sglang-path", release("0.5.12"), "--config", config
    )
    assert code == 0, err
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli(
        "fix", "--status", "--site", site, "--sglang-path", release("0.5.13"), "--config", config
    )
    assert code == 1 and "stale" in out, err
    monkeypatch.setenv("COLUMNS", "400")
    _, wide, _ = cli(
        "fix", "--status", "--site", site, "--sglang-path", release("0.5.13"), "--config", config
    )
    sites = set(re.findall(r"sglang(?:\.\w+)+:\w+(?:\.\w+)*", wide))
    assert sites, wide
    lines = out.splitlines()
    assert [s for s in sorted(sites) if not any(s in line for line in lines)] == [], out
    assert [line for line in lines if len(line) > 80 and not any(s in line for s in sites)
            and not re.search(r"\bnpudoctor (?:fix|run) ", line) and str(site) not in line] == []  # fmt: skip


# a carriage return (overwrites what a terminal or log viewer showed) and a right-to-left override
# (reorders what is shown: "Trojan Source"), in text the user wrote
SNEAKY = "before\rafter\u202edesrever"


def test_cr_and_bidi_controls_are_escaped_in_every_format(cli, release, tmp_path, monkeypatch):
    """An ignore entry's reason and an environment value with CR and U+202E: no format holds either
    raw (JUnit stays valid XML); the formats people read show them escaped, as the text does."""
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    config = tmp_path / "sneaky.yaml"
    data = {
        "model": {"path": str(MODEL)},
        "env": {"SGLANG_NOTE": SNEAKY},
        "roles": {"decode": {"server_args": {"disaggregation_transfer_backend": SNEAKY}}},
        "ignore": [{"id": "NPD001", "until": "2999-12-31", "reason": SNEAKY}],
    }
    config.write_text(json.dumps(data))
    for fmt in FORMAT_NAMES:
        code, out, err = cli("check", "--sglang-path", release("0.5.12"), "--config", config, "--format", fmt)
        assert code in (0, 1), err
        raw = [c for c in ("\r", "\u202e") if c in out]
        assert not raw, f"{fmt}: raw {raw} in:\n{out[:3000]!r}"
        if fmt == "junit":
            ET.fromstring(out)
        if named(fmt).hints:  # the formats people read, that name commands to paste
            assert r"before\rafter\u202edesrever" in out, f"{fmt}:\n{out[:3000]}"
    assert "\u202e" not in summary.read_text() and "\r" not in summary.read_text()
