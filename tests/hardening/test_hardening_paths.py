"""The paths and variables a user gives, when they are not what they seem: a folder the user cannot
enter, a name longer than the file system takes, a config that is a FIFO, a directory or a link
loop, an environment name with ``=`` or a value with a NUL, and a report destination (``-o``,
``$GITHUB_STEP_SUMMARY``) that is the input, inside the checked tree, a FIFO, a link another user
planted or a hard link to someone else's file. Each is one line naming the path (or the variable)
and why, exit 2, before any work; nothing is overwritten that npudoctor did not mean to write.

Static depth, one check where a run is needed: each test costs about a second."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from support.repo import EXAMPLES, REPO
from support.reports import without_progress

DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
QWEN_MODEL = EXAMPLES / "models" / "qwen3-30b-a3b"
NOBODY = 65534
TOO_LONG = "x" * 300  # one path component longer than NAME_MAX (255 on every Linux file system)


def one_error_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    lines = without_progress(err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npudoctor: error:"), err
    return lines[0]


def _npudoctor(
    *args, env: dict | None = None, timeout: float = 600, prefix: list[str] | None = None
) -> subprocess.CompletedProcess:
    environ = {**os.environ, "NPUDOCTOR_NO_CACHE": "1", **(env or {})}
    command = [*(prefix or []), sys.executable, "-m", "npudoctor", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=environ, cwd=REPO, timeout=timeout)


# -- a folder the user cannot enter, a name too long ---------------------------------------------


@pytest.fixture
def locked_folder():
    """(an open folder, a folder in it that the user running npudoctor cannot enter). As root
    (who enters any folder) npudoctor runs as another user (``as_user``); the test is skipped
    where that cannot be done (no ``setpriv``, or the interpreter out of that user's reach)."""
    base = Path(tempfile.mkdtemp(prefix="npudoctor-locked-"))
    base.chmod(0o755)
    locked = base / "locked"
    (locked / "model").mkdir(parents=True)
    (locked / "model" / "config.json").write_text((QWEN_MODEL / "config.json").read_text())
    (locked / "deploy.yaml").write_text("model: {path: model}\n")
    locked.chmod(0o700 if os.geteuid() == 0 else 0o000)
    try:
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("root, and no setpriv to run npudoctor as another user")
            probe = _npudoctor("--version", prefix=as_user())
            if probe.returncode != 0:
                pytest.skip(f"npudoctor cannot start as uid {NOBODY}: {probe.stderr.strip()[-200:]}")
        yield base, locked
    finally:
        locked.chmod(0o700)
        shutil.rmtree(base, ignore_errors=True)


def as_user() -> list[str]:
    """The words that run a command as another user, when this is root (``setpriv``, util-linux)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.mark.parametrize(
    "option, where",
    [
        ("--config", "deploy.yaml"),
        ("--model-path", "model"),
        ("--sglang-path", "sglang"),
        ("-o", "report.json"),
        ("yaml model.config", "model/config.json"),
        ("yaml model.path", "model"),
    ],
)
def test_a_path_in_a_folder_the_user_cannot_enter_exits_2_naming_it(locked_folder, option, where):
    base, locked = locked_folder
    path = locked / where
    if option.startswith("yaml"):
        key = option.split(".")[1]
        deploy = base / "deploy.yaml"
        deploy.write_text(f"model: {{{key}: {path}}}\n")
        deploy.chmod(0o644)
        args = ["--config", deploy]
    else:
        args = [option, path]
    done = _npudoctor("check", "--depth", "static", "-s", "NPD001", *args, prefix=as_user())
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert str(locked) in line and "permission denied" in line.lower(), line


@pytest.mark.parametrize(
    "option",
    ["--config", "--model-path", "--sglang-path", "-o", "yaml model.config", "yaml model.path", "summary"],
)
def test_a_name_too_long_exits_2_naming_it(cli, release, tmp_path, monkeypatch, option):
    path = tmp_path / TOO_LONG
    args = ["--sglang-path", release("0.5.12")] if option != "--sglang-path" else []
    if option.startswith("yaml"):
        deploy = tmp_path / "deploy.yaml"
        deploy.write_text(f"model: {{{option.split('.')[1]}: {TOO_LONG}}}\n")
        args += ["--config", deploy]
    elif option == "summary":
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(path))
        args += ["-f", "github"]
    else:
        args += [option, path]
    code, out, err = cli("check", "-s", "NPD001", *args)
    assert code == 2 and out == "", err
    assert "file name too long" in one_error_line(err).lower()


# -- a config that is not a regular file ------------------------------------------------------------


def _odd_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"odd-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "loop":
        (tmp_path / "odd-loop-back").symlink_to(path)
        path.symlink_to(tmp_path / "odd-loop-back")
    return path


ODD = [("fifo", "a fifo"), ("directory", "a directory"), ("loop", "too many levels of symbolic links")]


@pytest.mark.parametrize("kind, said", ODD)
@pytest.mark.parametrize("given_as", ["--config", "yaml model.config", "--model-path config.json"])
def test_a_config_that_is_not_a_regular_file_says_what_it_is(cli, release, tmp_path, kind, said, given_as):
    if given_as == "--model-path config.json":
        model = tmp_path / "model"
        model.mkdir()
        if kind == "loop":
            (model / "config.json").symlink_to(model / "config.json")
        else:
            _odd_file(model, kind).rename(model / "config.json")
        args = ["--model-path", model]
    elif given_as == "yaml model.config":
        deploy = tmp_path / "deploy.yaml"
        deploy.write_text(f"model: {{config: {_odd_file(tmp_path, kind)}}}\n")
        args = ["--config", deploy]
    else:
        args = ["--config", _odd_file(tmp_path, kind)]
    code, out, err = cli("check", "--sglang-path", release("0.5.12"), "-s", "NPD001", *args)
    assert code == 2 and out == "", err
    line = one_error_line(err)
    assert said in line.lower() and "no such" not in line, line


# -- environment names and values ------------------------------------------------------------------


@pytest.mark.parametrize(
    "form, name",
    [
        ("yaml env name", "A=B"),
        ("yaml role env name", "A=B"),
        ("yaml env value", "NUL_IN_IT"),
        ("yaml role env value", "NUL_IN_IT"),
        ("--env value", "NUL_IN_IT"),
        ("launch command value", "NUL_IN_IT"),
    ],
)
def test_an_env_name_with_equals_or_a_value_with_a_nul_exits_2_naming_it(cli, release, tmp_path, form, name):
    secret = "s3cr3t-value"
    if form.startswith("yaml"):
        key, value = (name, "1") if form.endswith("name") else (name, f"{secret}\\0tail")
        env = f'{{"{key}": "{value}"}}'
        body = f"env: {env}\n" if "role" not in form else f"roles: {{server: {{env: {env}}}}}\n"
        deploy = tmp_path / "deploy.yaml"
        deploy.write_text(f"model: {{path: {QWEN_MODEL}}}\n{body}")
        args = ["--config", deploy]
    elif form == "--env value":
        args = ["--model-path", QWEN_MODEL, "--env", f"{name}={secret}\0tail"]
    else:
        args = [
            "--",
            f"{name}={secret}\0tail",
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            QWEN_MODEL,
        ]
    code, out, err = cli("check", "--sglang-path", release("0.5.12"), "-s", "NPD001", *args)
    assert code == 2 and out == "", err
    line = one_error_line(err)
    assert name in line and secret not in line, line
    assert ("'='" in line) if form.endswith("name") else ("NUL" in line), line


# -- where the report goes ------------------------------------------------------------------------


def test_output_onto_the_deployment_file_is_refused_and_leaves_it(cli, release, tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"model: {{path: {QWEN_MODEL}}}\n")
    before = deploy.read_bytes()
    for given in (deploy, tmp_path / "." / "deploy.yaml"):
        code, out, err = cli("check", "--sglang-path", release("0.5.12"), "--config", deploy, "-o", given)
        assert code == 2 and "--config" in one_error_line(err), err
    link = tmp_path / "hard.yaml"
    os.link(deploy, link)  # the same file under another name
    code, _, err = cli("check", "--sglang-path", release("0.5.12"), "--config", deploy, "-o", link)
    assert code == 2 and "--config" in one_error_line(err), err
    code, _, err = cli("advise", "--config", deploy, "-o", deploy)
    assert code == 2 and "--config" in one_error_line(err), err
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((QWEN_MODEL / "config.json").read_text())
    code, _, err = cli("check", "--sglang-path", release("0.5.12"), "--model-path", model, "-o",
                       model / "config.json")  # fmt: skip
    assert code == 2 and "model config" in one_error_line(err), err
    assert deploy.read_bytes() == before
    assert (model / "config.json").read_text() == (QWEN_MODEL / "config.json").read_text()


def test_output_into_the_checked_tree_is_refused_and_leaves_it(cli, release, overlay):
    tree = overlay(release("0.5.12"))
    source = tree / "sglang" / "srt" / "server_args.py"
    before = source.read_bytes()
    for given in (source, tree / "sglang" / "report.json"):
        code, out, err = cli("check", "--sglang-path", tree, "-s", "NPD001", "-f", "json", "-o", given)
        assert code == 2 and "sglang" in one_error_line(err), err
    assert source.read_bytes() == before and not (tree / "sglang" / "report.json").exists()


@pytest.mark.parametrize("destination", ["-o", "GITHUB_STEP_SUMMARY"])
def test_a_fifo_nobody_reads_is_refused_at_once(release, tmp_path, destination):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = ["-o", fifo] if destination == "-o" else ["-f", "github"]
    env = {"GITHUB_STEP_SUMMARY": str(fifo)} if destination != "-o" else {}
    try:
        done = _npudoctor(
            "check", "--depth", "static", "--sglang-path", release("0.5.12"), "-s", "NPD001", *args,
            env=env, timeout=600,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"npudoctor waited for a reader of the FIFO {destination} for 600 s")
    assert done.returncode == 2, done.stderr
    assert "fifo" in one_error_line(done.stderr).lower()


def test_a_fifo_with_a_reader_and_dev_null_get_the_report(release, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    args = ("check", "--depth", "static", "--sglang-path", release("0.5.12"), "-s", "NPD001", "-f", "json")
    # the reader may open the FIFO a moment after npudoctor looks: wait for it, as a shell would
    for _ in range(50):
        done = _npudoctor(*args, "-o", fifo, timeout=600)
        if done.returncode != 2:
            break
    reader.join(600)
    assert done.returncode == 1, done.stderr
    assert received and '"results"' in received[0]
    assert _npudoctor(*args, "-o", "/dev/null").returncode == 1


def test_output_through_a_link_another_user_planted_is_refused(cli, release, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("planting a link owned by another user needs root")
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    planted = shared / "report.json"
    planted.symlink_to(victim)
    os.lchown(planted, NOBODY, NOBODY)
    code, out, err = cli(
        "check", "--sglang-path", release("0.5.12"), "-s", "NPD001", "-f", "json", "-o", planted
    )
    assert code == 2 and "symbolic link" in one_error_line(err), err
    assert victim.read_text() == "precious\n"


def test_output_onto_a_hard_link_replaces_the_name_not_the_file(cli, release, tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    report = tmp_path / "report.json"
    os.link(victim, report)
    code, out, err = cli(
        "check", "--sglang-path", release("0.5.12"), "-s", "NPD001", "-f", "json", "-o", report
    )
    assert code == 1, err
    assert victim.read_text() == "precious\n"
    assert '"results"' in report.read_text()


def test_output_over_ones_own_file_keeps_its_mode(cli, release, tmp_path):
    report = tmp_path / "report.json"
    report.write_text("old\n")
    report.chmod(0o640)
    code, _, err = cli(
        "check", "--sglang-path", release("0.5.12"), "-s", "NPD001", "-f", "json", "-o", report
    )
    assert code == 1, err
    assert report.stat().st_mode & 0o777 == 0o640 and '"results"' in report.read_text()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("report.json", "npudoctor-cache")]
    assert leftovers == []
