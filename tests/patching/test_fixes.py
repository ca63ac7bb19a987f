"""Runtime fixes on real releases: needed only where the check fails, proven by the check's live
probe, reversible to the exact original objects, delivered in-process, through `npudoctor run`
(a real spawn child) and through sglang's own plugin loader; records leave no residue."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from npudoctor.patching.fixbase import all_fixes

from conftest import fixprobe, sweep
from support.repo import EXAMPLES, REPO
from support.trees import overlay_tree, replace_text
from support.truths import RELEASES, TRUTH, truth_verdict

# The deployment each fix is proven on: one where its check's defect bites.
SCENARIOS = {
    "NPD001": EXAMPLES / "deepseek-v3.2-pd.yaml",
    "NPD002": EXAMPLES / "qwen3-moe-pd-fia.yaml",
    "NPD003": EXAMPLES / "deepseek-v3.2-pd.yaml",
    "NPD004": EXAMPLES / "qwen3-cp-prefill.yaml",
    "NPD005": EXAMPLES / "deepseek-v3-pd.yaml",
    "NPD006": EXAMPLES / "deepseek-v3-pd.yaml",
}
FIX_IDS = sorted(SCENARIOS)


def buggy(fix_id: str) -> list[str]:
    """Releases, then synthetic source states, where known.yaml says the defect is present."""
    synthetic = [name for name, truths in TRUTH.get("synthetic", {}).items() if fix_id in truths]
    return [v for v in RELEASES if truth_verdict(v, fix_id) == "present"] + [
        name for name in synthetic if TRUTH["synthetic"][name][fix_id]["verdict"] == "present"
    ]


def fixed(fix_id: str) -> list[str]:
    return [v for v in RELEASES if truth_verdict(v, fix_id) == "absent"]


def test_every_fix_has_a_scenario_and_a_check():
    ids = {f.id for f in all_fixes()}
    assert ids == set(SCENARIOS), "each fix needs a deployment it is proven on"
    for fix in all_fixes():
        assert fix.check.id == fix.id
        assert fix.upstream or fix.own, "a fix ports an upstream pull request or says it is npudoctor's own"
        assert fix.upstream is None or fix.upstream.startswith("https://github.com/sgl-project/sglang/pull/")
        assert fix.replaces and fix.written_for


@pytest.mark.parametrize("fix_id", FIX_IDS)
def test_explain_names_where_the_fix_comes_from(cli, fix_id):
    """A user deciding on an unsafe override must see whether it ports upstream's fix or is npudoctor's own."""
    from npudoctor.patching.fixbase import fix_by_id

    fix = fix_by_id(fix_id)
    code, out, _ = cli("explain", fix_id)
    text = " ".join(out.split())
    assert code == 0 and "Runtime fix" in text and fix.safety.value in text
    assert (fix.upstream in text) if fix.upstream else ("port of" not in text)
    assert ("npudoctor's own fix" in text) == bool(fix.own)


@pytest.mark.parametrize("fix_id", FIX_IDS)
def test_written_for_matches_the_real_releases(fix_id, subject):
    """The shape table is read from real wheels; a stale entry would refuse a release it was written for."""
    from npudoctor.patching.fixbase import fix_by_id
    from npudoctor.target.discovery import discover

    fix = fix_by_id(fix_id)
    for label, shape in fix.written_for.items():
        for version in label.split(", "):
            assert fix.shape_of_source(discover(subject(version)).tree) == shape, version


# each (fix id, buggy state) imports sglang in a child: slow; every buggy state of a fix with --full
@pytest.mark.parametrize(
    ("fix_id", "version"), [p for f in FIX_IDS for p in sweep([(f, v) for v in buggy(f)], quick=())]
)
def test_buggy_release_fixed_in_process_then_reverted(fix_id, version, subject):
    result = fixprobe(subject(version), "inprocess", fix_id, SCENARIOS[fix_id])
    assert result["decision"] == "apply", result
    assert result["with_fix"]["status"] == "pass", result
    assert result["after_revert"]["status"] == "fail", result
    assert result["patched"] and result["restored"], result


@pytest.mark.parametrize("fix_id", FIX_IDS)
def test_fixed_release_needs_no_fix(fix_id, cli, release):
    version = fixed(fix_id)[-1]
    code, out, err = cli(
        "fix", "--format", "json", "--select", fix_id, "--sglang-path", release(version),
        "--config", SCENARIOS[fix_id],
    )  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "not needed" and f"{fix_id} pass" in entry["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("fix_id", FIX_IDS)
def test_with_fix_turns_the_live_check_green(fix_id, live_report):
    version = buggy(fix_id)[-1]
    plain = next(r for r in live_report(version, SCENARIOS[fix_id])["results"] if r["id"] == fix_id)
    fixed_run = live_report(
        version, SCENARIOS[fix_id], "--with-fix", fix_id, "--select", fix_id, depth="auto"
    )
    result = next(r for r in fixed_run["results"] if r["id"] == fix_id)
    assert plain["status"] == "fail"
    assert (result["status"], result["depth"]) == ("pass", "live"), result
    assert result["summary"].startswith(f"with runtime fix {fix_id}:")
    assert any("the installed source, read statically: fail" in a for a in result["assumptions"])


@pytest.mark.slow  # the bootstrap is one for every fix: the default run proves it on the first and last
@pytest.mark.parametrize("fix_id", sweep(FIX_IDS, quick=FIX_IDS[:1]))
def test_npudoctor_run_reaches_a_spawned_child(fix_id, subject, live_report):
    from npudoctor.patching.fixbase import Safety, fix_by_id

    version = buggy(fix_id)[0]  # the oldest: no plugin loader, only the bootstrap can deliver it
    run = [
        sys.executable,
        "-m",
        "npudoctor",
        "run",
        "--config",
        str(SCENARIOS[fix_id]),
        "--select",
        fix_id,
        *(["--unsafe"] if fix_by_id(fix_id).safety is Safety.UNSAFE else []),
        "--",
    ]
    result = fixprobe(subject(version), "spawn", fix_id, SCENARIOS[fix_id], prefix=tuple(run))
    assert result["status"] == "pass" and result["fixes"] == {fix_id: "applied"}, result
    # the control: the same live probe in a child without the bootstrap (npudoctor check's own)
    unpatched = next(r for r in live_report(version, SCENARIOS[fix_id])["results"] if r["id"] == fix_id)
    assert unpatched["status"] == "fail" and unpatched["depth"] == "live", unpatched


@pytest.mark.slow
def test_kill_switch_leaves_every_process_unpatched(release):
    run = [sys.executable, "-m", "npudoctor", "run", "--config", str(SCENARIOS["NPD001"]), "--"]
    result = fixprobe(
        release("0.5.12"),
        "spawn",
        "NPD001",
        SCENARIOS["NPD001"],
        prefix=tuple(run),
        env={"NPUDOCTOR_DISABLE_FIXES": "1"},
    )
    assert result["status"] == "fail" and result["fixes"] == {}
    assert "NPUDOCTOR_DISABLE_FIXES is set" in result["stderr"]


def _tree_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        digest.update(str(path.relative_to(directory)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> tuple[Path, Path]:
    """A new virtual environment (python, site-packages) that sees this checkout's npudoctor
    and its dependencies through a .pth file, as an image with npudoctor installed would."""
    root = tmp_path_factory.mktemp("env")
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    ours = [p for p in sys.path if p.endswith("site-packages")]
    # addsitedir also runs that directory's .pth files: the editable install's finder among them
    lines = [f"import site; site.addsitedir({p!r})" for p in ours]
    (site / "npudoctor-test-deps.pth").write_text("\n".join(lines) + "\n")
    return python, site


@pytest.mark.slow
def test_apply_records_beside_sglang_reaches_its_plugin_loader_and_revert_leaves_it_identical(
    fresh_env, release, tmp_path
):
    python, site = fresh_env
    wheel = release(buggy("NPD001")[-1])
    # the image: an unpacked wheel (sglang/ and its dist-info) that the server imports by PYTHONPATH
    tree = overlay_tree(wheel, tmp_path)
    for dist_info in wheel.glob("sglang-*.dist-info"):
        shutil.copytree(dist_info, tree / dist_info.name)
    before, site_before = _tree_hash(tree), _tree_hash(site)
    target = ["--sglang-path", str(tree)]
    npudoctor = [python, "-m", "npudoctor", "fix", *target, "--config", str(SCENARIOS["NPD001"])]
    applied = subprocess.run([*npudoctor, "--apply"], capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert "loads the plugin 'npudoctor'" in applied.stdout
    assert (tree / "npudoctor_fixes_activation-1.dist-info").is_dir()  # where sglang is imported from
    assert _tree_hash(site) == site_before  # not this interpreter's site-packages, where no sglang is
    again = subprocess.run([*npudoctor, "--apply"], capture_output=True, text=True)  # idempotent
    assert again.returncode == 0 and len(list(tree.glob("npudoctor_fixes_activation-*"))) == 1

    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = subprocess.run(
        [python, str(REPO / "tests" / "support" / "fixprobe.py"), "plugin", "NPD001", str(SCENARIOS["NPD001"])],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["status"] == "pass" and result["fixes"] == {"NPD001": "applied"}, result

    status = subprocess.run([*npudoctor, "--status"], capture_output=True, text=True)
    assert status.returncode == 0 and "NPD001  in place" in status.stdout, status.stdout + status.stderr
    reverted = subprocess.run([*npudoctor[:3], "fix", "--revert", *target], capture_output=True, text=True)
    assert reverted.returncode == 0, reverted.stderr
    assert _tree_hash(tree) == before


def test_an_unknown_shape_is_refused_with_the_sites_that_differ(cli, release, overlay):
    tree = overlay(release("0.5.12"))
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    replace_text(pool, "self.index_head_dim = index_head_dim", "self.index_head_dim = index_head_dim or None")
    code, out, err = cli(
        "fix",
        "--format",
        "json",
        "--sglang-path",
        tree,
        "--config",
        SCENARIOS["NPD001"],
        "--select",
        "NPD001",
    )
    assert code == 1, err  # a fix refused where its check fails leaves the defect: exit 1
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "refused"
    assert (
        "NPUMLATokenToKVPool.__init__" in entry["reason"]
        and "not a shape this fix was written for" in entry["reason"]
    )


def test_truth_lists_the_releases_fixes_are_proven_on():
    for fix_id in FIX_IDS:
        assert buggy(fix_id) and fixed(fix_id), f"known.yaml needs a buggy and a fixed release for {fix_id}"
    assert TRUTH["releases"]
