"""Shared fixtures: real sglang releases from PyPI, the team's known truths, the CLI."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from npudoctor.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TRUTH_FILE = Path(__file__).resolve().parent / "data" / "known.yaml"

_spec = importlib.util.spec_from_file_location("fetch_sglang", REPO / "scripts" / "fetch_sglang.py")
fetch_sglang = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch_sglang)


# The team's verified truths (shared/truth/known.yaml), copied here and extended with every truth
# verified since, each with file:line evidence: a fresh clone tests with nothing beside it.
TRUTH = yaml.safe_load(TRUTH_FILE.read_text())
RELEASES = sorted(TRUTH["releases"], key=lambda v: tuple(int(p) for p in v.split(".")))


# The quick tier (`-m "not slow"`) runs the live probes on these states only: together a buggy
# and a fixed state for every check, on as few distinct live runs as that takes (0.5.9: NPD001-NPD003
# present, NPD005 absent; 0.5.13: NPD001-NPD003 absent, NPD005 present; the cp-gap state and 0.5.13
# for NPD004); every other state of a sweep is marked slow.
QUICK_STATES = ("0.5.9", "0.5.13", "0.5.13+cp-gap")


def sweep(states, quick=QUICK_STATES) -> list:
    """Parameters over ``states`` (or tuples whose first item is a state) for a test that costs a
    live run or a child interpreter per state: those in ``quick`` (a state, or a whole tuple) run
    in the quick tier, the others are marked slow."""
    return [
        value
        if value in quick or (isinstance(value, tuple) and value[0] in quick)
        else pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=pytest.mark.slow)
        for value in states
    ]


def fixprobe(
    tree: Path,
    mode: str,
    check_id: str,
    *configs: Path | str,
    options: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
    env: dict | None = None,
    timeout: int = 900,
) -> dict:
    """Run tests/support/fixprobe.py (MODE CHECK_ID CONFIG... OPTIONS) in a fresh interpreter with ``tree``
    on PYTHONPATH, after ``prefix`` (``npudoctor run --``); its JSON report, with its stderr."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tree), environment.get("PYTHONPATH", "")) if p
    )
    command = [
        *prefix,
        sys.executable,
        str(REPO / "tests" / "support" / "fixprobe.py"),
        mode,
        check_id,
        *map(str, configs),
    ]
    done = subprocess.run(
        [*command, *options], capture_output=True, text=True, env=environment, cwd=REPO, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def truth_verdict(version: str, check_id: str) -> str:
    return TRUTH["releases"][version][check_id]["verdict"]


def truth_present(version: str, check_id: str, family: str | None = None) -> bool:
    """The defect ships in ``version`` and bites the pool ``family`` ("mla"/"mha"; any if None)."""
    truth = TRUTH["releases"][version][check_id]
    return truth["verdict"] == "present" and (family is None or family in truth.get("families", [family]))


def expected_status(version: str, check_id: str, family: str | None = None) -> str:
    """The status the check must give on ``version`` by the truths: fail where the defect bites."""
    return "fail" if truth_present(version, check_id, family) else "pass"


# The pool family of each deployment kind the NPD005 tests probe.
KIND_FAMILY = {"mla": "mla", "gqa": "mha"}

# NPD005: the line of the NPU pool's get_cpu_copy each deployment kind reaches, on the releases
# where the truth says it refuses the allocator's keyword (the truths' evidence names them).
NPD005_POOL_DEFS = {
    "0.5.13": {"mla": "memory_pool_npu.py:483", "gqa": "memory_pool_npu.py:224"},
    "0.5.14": {"mla": "memory_pool_npu.py:508"},
}


def truth_locations(version: str, check_id: str) -> list[str]:
    """``path:line`` references in a truth's evidence; a bare ``:N`` refers to the file before it."""
    text = TRUTH["releases"][version][check_id].get("evidence", "")
    found, current = [], None
    for path, line in re.findall(r"([\w/]+\.py)?:(\d+)", text):
        current = path or current
        if current:
            found.append(f"{current}:{line}")
    return found


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, worker_id) -> Path:
    """A directory every pytest-xdist worker of this run shares (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@contextlib.contextmanager
def exclusive(lock: Path):
    """Hold an exclusive lock on ``lock`` (a file), across the xdist workers."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session", autouse=True)
def session_static_cache(tmp_path_factory):
    """The session's fixtures (shared live runs, built states) write no cache in the user's home,
    and see no code-path variable of the shell the tests were started from: every deployment form
    reads them (``deployment.shell_env``), and a developer's ``ASCEND_USE_FIA=1`` must not turn a
    verdict the truths expect. A test that wants one sets it."""
    from npudoctor.deployment.load import shell_env

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPUDOCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("npudoctor-cache")))
        for name in shell_env():
            patch.delenv(name)
        yield


@pytest.fixture(autouse=True)
def static_cache(tmp_path, monkeypatch) -> Path:
    """Each test its own static-result cache (``npudoctor.target.resultcache``), for itself and the processes it
    starts: a probe one test computed never answers another test (which may patch npudoctor)."""
    directory = tmp_path / "npudoctor-cache"
    monkeypatch.setenv("NPUDOCTOR_CACHE_DIR", str(directory))
    monkeypatch.delenv("NPUDOCTOR_NO_CACHE", raising=False)
    return directory


@pytest.fixture(scope="session")
def release(shared_dir):
    """``release("0.5.12")`` -> directory holding that release's ``sglang/`` (fetched once, cached;
    one xdist worker fetches while the others wait)."""

    def fetch(version: str) -> Path:
        with exclusive(shared_dir / f"fetch-{version}.lock"):
            return fetch_sglang.fetch(version)

    return fetch


def overlay_tree(tree: Path, destination: Path) -> Path:
    """A cheap copy of a release tree (hard links) under ``destination``, whose files a test may replace."""
    copy = destination / "tree"
    shutil.copytree(tree / "sglang", copy / "sglang", copy_function=os.link)
    return copy


@pytest.fixture
def overlay(tmp_path):
    """A cheap copy of a release tree (hard links) whose files a test may replace."""

    def make(tree: Path) -> Path:
        return overlay_tree(tree, tmp_path)

    return make


NPU_BACKEND = "sglang/srt/hardware_backend/npu/attention/ascend_backend.py"


def method_span(source: str, class_name: str, method: str) -> tuple[int, int, int]:
    """First line (decorators included), last line and indentation of ``class_name.method``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                    start = min([item.lineno] + [d.lineno for d in item.decorator_list])
                    return start, item.end_lineno, item.col_offset
    raise AssertionError(f"{class_name}.{method} not found")


def cp_gap_tree(fetch, destination: Path) -> Path:
    """The synthetic "0.5.13+cp-gap" state of known.yaml under ``destination``: the 0.5.13 tree
    (hard-linked) with AscendAttnBackend.do_cp_attn_fia replaced by the 0.5.12 method (scalar
    fields, torch.chunk(q, 2)), spliced by ast line numbers. ``fetch`` is the ``release`` fixture."""
    old_source = (fetch("0.5.12") / NPU_BACKEND).read_text()
    start, end, _ = method_span(old_source, "AscendAttnBackend", "do_cp_attn_fia")
    old_method = textwrap.dedent("".join(old_source.splitlines(keepends=True)[start - 1 : end]))

    tree = overlay_tree(fetch("0.5.13"), destination)
    target = tree / NPU_BACKEND
    source = target.read_text()
    start, end, indent = method_span(source, "AscendAttnBackend", "do_cp_attn_fia")
    lines = source.splitlines(keepends=True)
    spliced = "".join(lines[: start - 1]) + textwrap.indent(old_method, " " * indent) + "".join(lines[end:])
    ast.parse(spliced)  # still valid Python
    target.unlink()  # hard-linked to the cached release: never write through the link
    target.write_text(spliced)
    return tree


@pytest.fixture
def cp_gap(release, tmp_path) -> Path:
    """The "0.5.13+cp-gap" tree (see ``cp_gap_tree``), fresh for each test."""
    return cp_gap_tree(release, tmp_path)


# Source states of known.yaml's "synthetic" section that no wheel ships, and how to build them.
SYNTHETIC_BUILDERS = {"0.5.13+cp-gap": cp_gap_tree}


@pytest.fixture(scope="session")
def subject(release, tmp_path_factory):
    """``subject(name)`` -> the tree of a known.yaml state: a release (fetched) or a synthetic
    state (built once per session from real releases)."""
    built: dict[str, Path] = {}

    def tree(name: str) -> Path:
        if name not in SYNTHETIC_BUILDERS:
            return release(name)
        if name not in built:
            built[name] = SYNTHETIC_BUILDERS[name](release, tmp_path_factory.mktemp(name))
        return built[name]

    return tree


def replace_text(path: Path, old: str, new: str, count: int = 1) -> None:
    """Rewrite one file of an overlay without touching the hard-linked original."""
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not in {path}"
    path.unlink()
    path.write_text(text.replace(old, new, count))


def drop_fia_page_factor(tree: Path) -> None:
    """Rewrite an overlay's NPU pool so its FIA branch of ``get_contiguous_buf_infos`` gives token
    item lengths again (0.5.9's formula: the NPD002 defect) on a fixed release's layout."""
    pool = tree / "sglang/srt/hardware_backend/npu/memory_pool_npu.py"
    source = pool.read_text()
    start = source.index("if self.use_fia:", source.index("def get_contiguous_buf_infos"))
    end = source.index("else:", start)
    replace_text(pool, source[start:end], source[start:end].replace(".nbytes * self.page_size", ".nbytes"))


@pytest.fixture
def cli(capsys):
    """Run ``npudoctor`` in-process; returns (exit code, stdout, stderr).

    ``check`` and ``fix`` run at ``--depth static`` unless the test names a depth: the live
    depth imports sglang in a child (~10 s) and has tests of its own.
    """

    def run(*args: str) -> tuple[int, str, str]:
        argv = [str(a) for a in args]
        if argv[:1] in (["check"], ["fix"]) and "--depth" not in argv:
            split = argv.index("--") if "--" in argv else len(argv)
            argv[split:split] = ["--depth", "static"]
        code = main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def live_report(subject, shared_dir):
    """``live_report(version, config, *extra)`` -> the JSON report of ``npudoctor check --depth
    live`` with every check on that release (or synthetic state, see ``subject``), run once per
    distinct request in the whole test run and shared by the tests, across xdist workers too
    (each live run imports sglang in a child: ~10 s). ``config`` is a deployment YAML or None
    (no deployment: the worst case); ``extra`` are further ``check`` options."""
    reports = shared_dir / "live-reports"
    reports.mkdir(exist_ok=True)

    def run(version: str, config: Path | str | None, *extra: str, depth: str = "live") -> dict:
        key = json.dumps([version, str(config), [str(e) for e in extra], depth])
        output = reports / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
        with exclusive(output.with_suffix(".lock")):
            if not output.is_file():
                staging = output.with_suffix(".partial")
                argv = ["check", "--format", "json", "--depth", depth, "--sglang-path", str(subject(version))]
                argv += ["--output", str(staging)]
                if config is not None:
                    argv += ["--config", str(config)]
                code = main([*argv, *[str(e) for e in extra]])
                if code not in (0, 1):
                    pytest.fail(f"npudoctor {' '.join(argv)} exited {code}")
                staging.rename(output)
        return json.loads(output.read_text())

    return run


PROGRESS_LINE = re.compile(r"npudoctor: \[\d+\.\d s\] ")


def without_progress(err: str) -> str:
    """stderr less the progress lines a run without a terminal writes (``npudoctor.engine.progress``)."""
    return "".join(line for line in err.splitlines(keepends=True) if not PROGRESS_LINE.match(line))


def json_report(cli, *args: str) -> dict:
    code, out, err = cli("check", "--format", "json", *args)
    assert code in (0, 1), f"exit {code}: {err}"
    return json.loads(out)


def result_of(report: dict, check_id: str) -> dict:
    return next(r for r in report["results"] if r["id"] == check_id)
