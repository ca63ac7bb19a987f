"""Fault injection: whatever breaks around npudoctor (no sglang, an sglang that does not import, a
broken torch_npu, a release laid out differently, a check that raises, an unwritable or damaged
fix record, a command that cannot run, a live child that crashes), the outcome is a clear
per-check ``error``/``skip``/``warn`` result or a documented exit code, never a traceback.

Static unless the fault is in the live child (those runs import sglang in a child, ~10 s each)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from npudoctor.engine.kinds import CheckKind
from npudoctor.engine.registry import all_checks
from npudoctor.patching import records
from npudoctor.patching.planfile import BOOTSTRAP_DIR

from conftest import sweep
from support.repo import EXAMPLES
from support.reports import json_report, result_of, without_progress
from support.trees import replace_text

NPU = "sglang/srt/hardware_backend/npu"
MEMORY_POOL = "sglang/srt/mem_cache/memory_pool.py"
DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"
DEEPSEEK_32_PD = EXAMPLES / "deepseek-v3.2-pd.yaml"  # NPD001's fix applies on 0.5.12
QWEN_FIA_PD = EXAMPLES / "qwen3-moe-pd-fia.yaml"
QWEN_CP = EXAMPLES / "qwen3-cp-prefill.yaml"


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = without_progress(err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npudoctor: error:"), err
    return lines[0]


def statuses(report: dict) -> dict[str, str]:
    """The deep checks' statuses (the catalog's records follow them in every report)."""
    return {r["id"]: r["status"] for r in report["results"] if CheckKind.of(r["id"]) is CheckKind.DEEP}


# -- no sglang ----------------------------------------------------------------------------------


def test_no_installed_sglang_exits_4(cli, monkeypatch):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("an sglang is installed in this interpreter")
    for argv in (("check",), ("check", "--depth", "live"), ("fix",), ("fix", "--status")):
        code, out, err = cli(*argv)
        assert code == 4 and out == "", err
        assert err.strip() == (
            "npudoctor: error: no sglang found: it is not installed in this interpreter "
            "(use --sglang-path to check an unpacked wheel or a source checkout; "
            "--python PATH to check the environment sglang runs in)"
        )


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("empty dir", "not an sglang tree"),
        ("a file", "not a directory"),
        ("missing", "no such directory"),
        ("sglang without srt", "not an sglang tree"),
        ("srt without __init__", "not an sglang tree"),
        ("python/ without sglang", "not an sglang tree"),
    ],
)
def test_sglang_path_that_is_not_a_tree_exits_2(cli, tmp_path, layout, message):
    path = tmp_path / "target"
    if layout == "a file":
        path.write_text("sglang")
    elif layout == "empty dir":
        path.mkdir()
    elif layout == "sglang without srt":
        (path / "sglang").mkdir(parents=True)
        (path / "sglang" / "__init__.py").write_text("")
    elif layout == "srt without __init__":
        (path / "sglang" / "srt").mkdir(parents=True)
    elif layout == "python/ without sglang":
        (path / "python" / "vllm").mkdir(parents=True)
    for argv in (("check",), ("check", "--depth", "live"), ("fix",)):
        code, out, err = cli(*argv, "--sglang-path", path)
        assert code == 2 and out == "", err
        assert message in one_error_line(err)


# -- an sglang whose import raises --------------------------------------------------------------


@pytest.fixture
def broken_import(release, overlay) -> Path:
    """0.5.12 whose mem_cache/memory_pool.py (imported by every live probe) raises at import."""
    tree = overlay(release("0.5.12"))
    replace_text(
        tree / MEMORY_POOL, "import abc\n", "import abc\nraise ImportError('injected: libfoo.so missing')\n"
    )
    return tree


LIVE_CHECKS = {
    "NPD001",
    "NPD002",
    "NPD003",
    "NPD005",
    "NPD006",
}  # in scope for DeepSeek-V3 PD (no CP: NPD004 skips)
INJECTED = "sglang does not import here: ImportError: injected: libfoo.so missing"


@pytest.mark.slow
def test_sglang_that_does_not_import_keeps_the_static_result(cli, broken_import):
    """Each check whose modules do not import loses its own live probe, keeps its static verdict
    and says why; the report names every check that lost it."""
    report = json_report(cli, "--depth", "auto", "--sglang-path", broken_import, "--config", DEEPSEEK_PD)
    assert set(report["live"]["not_run"]) == LIVE_CHECKS
    assert all(reason.startswith(INJECTED) for reason in report["live"]["not_run"].values())
    assert statuses(report) == {
        "NPD000": "pass",
        "NPD001": "fail",
        "NPD002": "skip",
        "NPD003": "pass",
        "NPD004": "skip",
        "NPD005": "pass",
        "NPD006": "fail",
    }
    for result in report["results"]:
        assert result["depth"] == "static"
        if result["id"] in LIVE_CHECKS:
            assert any(a.startswith(f"live depth not run: {INJECTED}") for a in result["assumptions"])


@pytest.mark.slow
def test_sglang_that_does_not_import_at_depth_live_is_an_error_per_check(cli, broken_import):
    code, out, err = cli(
        "check", "--format", "json", "--depth", "live", "--sglang-path", broken_import, "--config", DEEPSEEK_PD
    )  # fmt: skip
    assert code == 1, err  # error results are findings
    report = json.loads(out)
    assert {r["id"] for r in report["results"] if r["status"] == "error"} == LIVE_CHECKS
    assert statuses(report)["NPD004"] == "skip"  # out of the deployment's scope: no probe to lose
    for result in report["results"]:
        if result["id"] in LIVE_CHECKS:
            assert result["summary"].startswith(f"live depth unavailable: {INJECTED}")


# -- a torch_npu whose import raises ------------------------------------------------------------


@pytest.mark.slow
def test_broken_torch_npu_counts_as_no_npu_and_live_still_runs(cli, release, tmp_path, monkeypatch):
    """A torch_npu that raises at import (a driver mismatch, a missing libascendcl.so) is no real
    NPU: the live child simulates one and runs the probes."""
    marker = tmp_path / "torch_npu-was-imported"
    package = tmp_path / "site" / "torch_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "raise RuntimeError('injected: libascendcl.so: cannot open shared object file')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")]))
    report = json_report(
        cli,
        "--depth",
        "live",
        "--sglang-path",
        release("0.5.9"),
        "--config",
        QWEN_FIA_PD,
        "--select",
        "NPD002",
    )
    assert marker.exists()  # the child did try the broken torch_npu
    assert report["live"]["ran"] is True, report["live"]
    result = result_of(report, "NPD002")
    assert (result["status"], result["depth"]) == ("fail", "live"), result  # 0.5.9 has the defect


# -- a release laid out differently than any known one ------------------------------------------


def _rename_everywhere(tree: Path, old: str, new: str) -> None:
    for path in (tree / "sglang" / "srt").rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        if old in text:
            path.unlink()  # hard-linked to the cached release: never write through the link
            path.write_text(text.replace(old, new), encoding="utf-8", errors="surrogateescape")


LAYOUTS = {
    # mutation -> (deployment, the checks that must then say "cannot tell")
    "NPU pool file deleted": (DEEPSEEK_PD, ("NPD001", "NPD002", "NPD005", "NPD006")),
    "generic MLA pool renamed": (DEEPSEEK_32_PD, ("NPD001", "NPD002", "NPD005", "NPD006")),
    "generic MHA pool renamed": (QWEN_FIA_PD, ("NPD001", "NPD002", "NPD005", "NPD006")),
    "send_kvcache renamed": (DEEPSEEK_32_PD, ("NPD003",)),
    "get_contiguous_buf_infos renamed": (QWEN_FIA_PD, ("NPD002", "NPD006")),
    "ContextParallelMetadata renamed": (QWEN_CP, ("NPD004",)),
    "do_cp_attn_fia renamed": (QWEN_CP, ("NPD004",)),
}


def _mutate(tree: Path, layout: str) -> None:
    if layout == "NPU pool file deleted":
        (tree / NPU / "memory_pool_npu.py").unlink()
    elif layout == "generic MLA pool renamed":
        _rename_everywhere(tree, "MLATokenToKVPool", "MLAKVCachePool")
    elif layout == "generic MHA pool renamed":
        _rename_everywhere(tree, "MHATokenToKVPool", "MHAKVCachePool")
    elif layout == "send_kvcache renamed":
        _rename_everywhere(tree, "def send_kvcache(", "def transfer_kv(")
    elif layout == "get_contiguous_buf_infos renamed":
        _rename_everywhere(tree, "get_contiguous_buf_infos", "buffer_infos")
    elif layout == "ContextParallelMetadata renamed":
        _rename_everywhere(tree, "ContextParallelMetadata", "CPMetadata")
    elif layout == "do_cp_attn_fia renamed":
        _rename_everywhere(tree, "do_cp_attn_fia", "run_cp_attention")


@pytest.mark.parametrize(
    "version", sweep(["0.5.12", "0.5.23"], quick=("0.5.12",))
)  # a buggy and a fixed release
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_unknown_layout_is_cannot_tell_never_a_pass(cli, release, overlay, version, layout):
    config, blind = LAYOUTS[layout]
    tree = overlay(release(version))
    _mutate(tree, layout)
    report = json_report(cli, "--sglang-path", tree, "--config", config)
    for check_id in blind:
        result = result_of(report, check_id)
        assert result["status"] == "warn", (layout, result)
        said = " ".join([result["summary"], *(e["observed"] for e in result["evidence"])])
        assert any(words in said for words in ("cannot tell", "not one npudoctor recognises", "not found")), (
            said
        )
        assert result["remediation"]["fix_id"] == check_id
    # the gate sees it with --fail-on warn
    code, _, err = cli("check", "--sglang-path", tree, "--config", config, "--fail-on", "warn")
    assert code == 1, err


def test_moved_and_renamed_npu_pool_is_still_found(cli, release, overlay):
    """A new file and new class names for the NPU pools: found by inheritance, the verdict stands."""
    tree = overlay(release("0.5.12"))
    moved = tree / NPU / "kv" / "ascend_pools.py"
    moved.parent.mkdir()
    text = (tree / NPU / "memory_pool_npu.py").read_text()
    (tree / NPU / "memory_pool_npu.py").unlink()
    moved.write_text(
        text.replace("NPUMLATokenToKVPool", "AscendMLAKVCache").replace(
            "NPUMHATokenToKVPool", "AscendMHAKVCache"
        )
    )
    result = result_of(json_report(cli, "--sglang-path", tree, "--config", DEEPSEEK_PD), "NPD001")
    assert result["status"] == "fail" and "AscendMLAKVCache" in result["summary"], result


# -- a check that raises ------------------------------------------------------------------------


@pytest.fixture
def npd002_raises(monkeypatch):
    check = next(c for c in all_checks() if c.id == "NPD002")

    def broken(self, target, facts):
        raise RuntimeError("injected: the check itself is broken")

    monkeypatch.setattr(type(check), "static", broken)


def test_a_check_that_raises_is_an_error_and_the_others_run(cli, release, npd002_raises):
    args = ("check", "--format", "json", "--sglang-path", release("0.5.23"), "--config", QWEN_FIA_PD)
    code, out, err = cli(*args)
    assert code == 1 and "Traceback" not in err  # an error counts at --fail-on fail
    report = json.loads(out)
    broken = result_of(report, "NPD002")
    assert (
        broken["status"] == "error"
        and broken["error"] == "RuntimeError: injected: the check itself is broken"
    )
    assert "test_hardening_faults.py" in broken["summary"]  # where it raised
    assert statuses(report) == {
        "NPD000": "pass",
        "NPD001": "pass",
        "NPD002": "error",
        "NPD003": "skip",
        "NPD004": "skip",
        "NPD005": "pass",
        "NPD006": "pass",
    }
    assert (
        cli(*args, "--ignore", "NPD002:2999-01-01")[0] == 0
    )  # accepted: the gate passes, the error stays visible
    assert cli(*args, "--select", "NPD001")[0] == 0
    code, out, err = cli(
        "fix",
        "--format",
        "json",
        "--sglang-path",
        release("0.5.9"),
        "--config",
        QWEN_FIA_PD,
        "--select",
        "NPD002",
    )
    assert code == 0, err  # the fix for a check that cannot run is refused, not applied blindly
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "refused" and "error" in entry["reason"]


# -- the state directory of `npudoctor fix --apply` ---------------------------------------------


def _apply(cli, release, site: Path | None, *extra: str):
    args = ["fix", "--sglang-path", release("0.5.12"), "--config", DEEPSEEK_32_PD, "--apply", *extra]
    if site is not None:
        args += ["--site", site]
    return cli(*args)


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(directory, os.W_OK):  # root writes anywhere: a read-only file system then
        directory = Path("/proc")
    yield directory
    if directory != Path("/proc"):
        directory.chmod(stat.S_IRWXU)


def test_apply_into_a_read_only_dir_exits_2(cli, release, read_only_dir):
    code, out, err = _apply(cli, release, read_only_dir)
    assert code == 2, err
    assert "cannot write to" in one_error_line(err) and "--site DIR" in err


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_apply_into_no_directory_exits_2(cli, release, tmp_path, monkeypatch, kind):
    site = tmp_path / "state"
    if kind == "a file":
        site.write_text("")
    assert "not a directory" in one_error_line(_apply(cli, release, site)[2])
    monkeypatch.setenv(records.SITE_ENV, str(site))  # NPUDOCTOR_SITE pointing nowhere
    code, _, err = _apply(cli, release, None)
    assert code == 2 and "not a directory" in one_error_line(err)
    code, out, err = cli("fix", "--status", "--sglang-path", release("0.5.12"))
    assert code in (0, 1) and "no fix is recorded" in out, err  # 1: a fix is needed, none recorded
    code, out, err = cli("fix", "--revert")
    assert code == 0 and "nothing to revert" in out, err


# -- a damaged fix record -----------------------------------------------------------------------

DAMAGE = {
    "garbage bytes": b"\x00\xff{not json",
    "empty file": b"",
    "a list": b"[]",
    "no fixes": b'{"schema": 1}',
    "fix entry is text": b'{"fixes": {"NPD001": "apply"}}',
    "shape is a list": b'{"fixes": {"NPD001": {"shape": ["x"]}}}',
    "site is not a module path": b'{"fixes": {"NPD001": {"shape": {"../../etc/passwd": "x"}}}}',
    "unknown fix id": b'{"fixes": {"rm -rf": {"shape": {"sglang.srt.x:Y.z": "x"}}}}',
    "replaces is text": b'{"fixes": {"NPD001": {"shape": {"sglang.srt.x:Y.z": "x"}, "replaces": "a:b"}}}',
    "nested too deep": b"[" * 100000 + b"]" * 100000,
}


@pytest.fixture
def recorded(cli, release, tmp_path) -> Path:
    """A real record (NPD001 on 0.5.12) in a fresh site directory."""
    site = tmp_path / "site"
    site.mkdir()
    code, out, err = _apply(cli, release, site)
    assert code == 0 and "recorded NPD001" in out, err
    return site


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_record_status_exits_2_revert_removes_it_plugin_survives(cli, release, recorded, damage):
    plan = recorded / records.DIST_INFO / records.PLAN_FILE
    plan.write_bytes(DAMAGE[damage])
    code, out, err = cli("fix", "--status", "--sglang-path", release("0.5.12"), "--site", recorded)
    assert code == 2 and out == "", err
    assert "`npudoctor fix --revert` removes it" in one_error_line(err)

    # sglang's plugin loader calls the entry point in every scheduler: it logs once, never raises
    load_twice = (
        "import importlib.metadata as m, sys\n"
        f"sys.path.insert(0, {str(recorded)!r})\n"
        "[ep] = [e for e in m.entry_points(group='sglang.srt.plugins') if e.name == 'npudoctor']\n"
        "plugin = ep.load(); plugin(); plugin()\n"
        "print('sglang goes on')\n"
    )
    done = subprocess.run([sys.executable, "-c", load_twice], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout == "sglang goes on\n", done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("npudoctor: runtime fixes not applied:"), (
        done.stderr
    )

    code, out, err = cli("fix", "--revert", "--site", recorded)
    assert code == 0 and "removed" in out, err
    assert list(recorded.iterdir()) == []


def test_revert_without_record_file_list_still_removes_it_but_keeps_foreign_files(cli, recorded):
    record = recorded / records.DIST_INFO
    (record / "RECORD").unlink()
    (record / "notes.txt").write_text("mine")
    code, _, err = cli("fix", "--revert", "--site", recorded)
    assert code == 2 and "notes.txt" in one_error_line(err) and "not removed" in err
    (record / "notes.txt").unlink()
    code, out, err = cli("fix", "--revert", "--site", recorded)
    assert code == 0 and list(recorded.iterdir()) == [], err


def test_revert_of_a_record_that_is_a_file_exits_2(cli, tmp_path):
    (tmp_path / records.DIST_INFO).write_text("not a directory")
    code, _, err = cli("fix", "--revert", "--site", tmp_path)
    assert code == 2 and "not removed" in one_error_line(err)
    assert (tmp_path / records.DIST_INFO).is_file()


# -- npudoctor run and the activation it delivers -----------------------------------------------


def test_run_a_command_that_does_not_exist_exits_127(cli):
    code, out, err = cli("run", "--", "no-such-command-npudoctor", "--flag")
    assert code == 127 and out == ""
    assert "command not found: no-such-command-npudoctor" in one_error_line(err)


@pytest.mark.parametrize("kind", ["not executable", "a directory"])
def test_run_a_command_that_cannot_execute_exits_126(cli, tmp_path, kind):
    path = tmp_path / "server.sh"
    if kind == "a directory":
        path.mkdir()
    else:
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o644)
    code, _, err = cli("run", "--", str(path))
    assert code == 126, err
    assert "cannot execute" in one_error_line(err)


@pytest.fixture
def fake_sglang(tmp_path) -> Path:
    """A directory with an importable ``sglang`` package: the bootstrap arms at its first import."""
    root = tmp_path / "fake"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    return root


def _child(fake_sglang: Path, **env: str) -> subprocess.CompletedProcess:
    """A Python child as `npudoctor run` starts it: the bootstrap first on PYTHONPATH."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NPUDOCTOR_")}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(BOOTSTRAP_DIR), str(fake_sglang), os.environ.get("PYTHONPATH", "")]
    )
    environment.update(env)
    code = "import sglang, sglang as again; print('child ran'); raise SystemExit(7)"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=600
    )


@pytest.mark.parametrize(
    "plan",
    ["missing", "garbage", "wrong schema", "a directory"],
)
def test_bootstrap_with_a_bad_plan_runs_the_child_with_one_line(fake_sglang, tmp_path, plan):
    path = tmp_path / "plan.json"
    if plan == "garbage":
        path.write_bytes(b"\x00{{{")
    elif plan == "wrong schema":
        path.write_text('{"fixes": {"NPD001": {"shape": 3}}}')
    elif plan == "a directory":
        path.mkdir()
    done = _child(fake_sglang, NPUDOCTOR_RUN_PLAN=str(path))
    assert done.returncode == 7 and done.stdout == "child ran\n", done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"npudoctor: runtime fixes not applied: cannot read {path}")


def test_kill_switch_runs_the_child_unpatched_with_one_line(fake_sglang, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"fixes": {"NPD001": {"shape": {"sglang.srt.x:Y.z": "abc"}}}}')
    done = _child(fake_sglang, NPUDOCTOR_RUN_PLAN=str(path), NPUDOCTOR_DISABLE_FIXES="1")
    assert done.returncode == 7 and done.stdout == "child ran\n", done.stderr
    assert done.stderr == "npudoctor: NPUDOCTOR_DISABLE_FIXES is set: no runtime fix is applied\n"


def test_run_passes_the_command_exit_code_through_with_the_kill_switch(release):
    env = {**os.environ, "PYTHONPATH": str(release("0.5.12")), "NPUDOCTOR_DISABLE_FIXES": "1"}
    command = [sys.executable, "-m", "npudoctor", "run", "--config", str(DEEPSEEK_32_PD), "--"]
    child = [sys.executable, "-c", "import sys; print('served'); sys.exit(5)"]
    done = subprocess.run([*command, *child], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 5 and done.stdout == "served\n", done.stderr
    assert "Traceback" not in done.stderr
    # it says the fixes are off, and neither plans (a live run) nor claims any
    assert "NPUDOCTOR_DISABLE_FIXES is set: fixes are disabled" in done.stderr, done.stderr
    assert "applying" not in done.stderr and "planning" not in done.stderr, done.stderr


# -- the live child crashing --------------------------------------------------------------------

CRASHES = {
    "segfault": ("import ctypes; ctypes.string_at(0)", "the live run was killed by SIGSEGV"),
    "killed": (
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        "the live run was killed by SIGKILL",
    ),
    "os._exit": ("import os; os._exit(3)", "the live run exited 3"),
    "exit 0 without an answer": ("import os; os._exit(0)", "the live run exited 0"),
}


@pytest.mark.parametrize("crash", sweep(sorted(CRASHES), quick=()))
def test_live_child_crash_keeps_the_static_result(cli, release, overlay, crash):
    """NPD002's live probe calls the NPU MHA pool's get_contiguous_buf_infos: it dies there."""
    code_line, reason = CRASHES[crash]
    tree = overlay(release("0.5.12"))
    replace_text(
        tree / NPU / "memory_pool_npu.py",
        "        # layer_num x [seq_len, head_num, head_dim]\n",
        f"        {code_line}\n",
    )
    report = json_report(
        cli, "--depth", "auto", "--sglang-path", tree, "--config", QWEN_FIA_PD, "--select", "NPD002"
    )
    assert report["live"]["ran"] is False and report["live"]["reason"].startswith(reason), report["live"]
    result = result_of(report, "NPD002")
    assert (result["status"], result["depth"]) == ("pass", "static"), result  # 0.5.12 has the FIA branch
    assert any(a.startswith(f"live depth not run: {reason}") for a in result["assumptions"])


@pytest.mark.slow
def test_native_writes_to_stdout_do_not_corrupt_the_live_answer(cli, release, overlay):
    """Native code (CANN, a C extension) writing to fd 1 while a probe runs: the answer survives."""
    tree = overlay(release("0.5.12"))
    replace_text(
        tree / NPU / "memory_pool_npu.py",
        "        # layer_num x [seq_len, head_num, head_dim]\n",
        "        import os; os.write(1, b'\\x80\\x04 native library says hello\\n')\n",
    )
    report = json_report(
        cli, "--depth", "auto", "--sglang-path", tree, "--config", QWEN_FIA_PD, "--select", "NPD002"
    )
    assert report["live"]["ran"] is True, report["live"]
    assert result_of(report, "NPD002")["depth"] == "live"


def test_apply_over_a_broken_leftover_exits_2_and_leaves_nothing_behind(cli, release, tmp_path):
    """A dangling symlink where the record goes: the rename fails, the staging copy is removed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / records.DIST_INFO).symlink_to(tmp_path / "gone")
    code, _, err = _apply(cli, release, site)
    assert code == 2 and "cannot write the fix record" in one_error_line(err)
    assert [p.name for p in site.iterdir()] == [records.DIST_INFO]
    code, _, err = cli("fix", "--revert", "--site", site)
    assert code == 2 and "not removed" in one_error_line(err)
