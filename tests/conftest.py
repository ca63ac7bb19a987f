"""Shared fixtures: real sglang releases from PyPI, the team's known truths, the CLI."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npudoctor.cli import main

from support.repo import REPO, fetch_sglang
from support.trees import SYNTHETIC_BUILDERS, cp_gap_tree, installed_beside_torch, overlay_tree

# The helpers tests share are modules of tests/support/ (repo, truths, trees, reports): import
# them from there. This file holds the fixtures.


# The quick tier (`-m "not slow"`) runs the live probes on these states only: together a buggy
# and a fixed state for every check, on as few distinct live runs as that takes (0.5.9: NPD001-NPD003
# present, NPD005 absent; 0.5.13: NPD001-NPD003 absent, NPD005 present; the cp-gap state and 0.5.13
# for NPD004); every other state of a sweep is marked slow.
QUICK_STATES = ("0.5.9", "0.5.13", "0.5.13+cp-gap")


def sweep(states, quick=QUICK_STATES) -> list:
    """Parameters over ``states`` (or tuples whose first item is a state) for a test that costs a
    live run or a child interpreter per state: those in ``quick`` (a state, or a whole tuple) run
    in the quick tier, the others are marked slow. The default run (CI) adds the sweep's last
    state (its newest release); the states between are also marked ``sweep`` and run with
    ``--full``."""
    states = list(states)
    params = []
    for index, value in enumerate(states):
        if value in quick or (isinstance(value, tuple) and value[0] in quick):
            params.append(value)
            continue
        marks = [pytest.mark.slow] if index == len(states) - 1 else [pytest.mark.slow, pytest.mark.sweep]
        params.append(pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=marks))
    return params


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        help="run every state of every sweep (the tests marked 'sweep'); without it they are "
        "deselected and the run samples each sweep (npudoctor's CI)",
    )


def pytest_report_header(config):
    if config.getoption("--full"):
        return "npudoctor: --full: every state of every sweep"
    return "npudoctor: each sweep sampled (tests marked 'sweep' deselected; --full runs them)"


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
    on PYTHONPATH, after ``prefix`` (``npudoctor run --``); its JSON report, with its stderr.

    Each distinct run happens once in the whole test run (``fixprobe_results``): a second test, or
    the module fixture of another xdist worker, asking for the same run reads the first one's report."""
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

    def probe() -> dict:
        done = subprocess.run(
            [*command, *options], capture_output=True, text=True, env=environment, cwd=REPO, timeout=timeout
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}

    if not _FIXPROBE_RESULTS:
        return probe()
    # the run, in terms that are the same on every worker: this worker's temporary directory
    # (where module fixtures write deployments) becomes a placeholder, in paths and in file contents
    directory, base = _FIXPROBE_RESULTS["directory"], _FIXPROBE_RESULTS["base"]

    def neutral(text: str) -> str:
        return text.replace(base, "@BASETEMP@")

    contents = [neutral(Path(c).read_text()) if Path(c).is_file() else None for c in configs]
    volatile = ("NPUDOCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST")
    ambient = {k: neutral(v) for k, v in sorted(environment.items()) if k not in volatile}
    key = neutral(json.dumps([[*command, *options], contents, ambient]))
    output = directory / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    with exclusive(output.with_suffix(".lock")):
        if not output.is_file():
            staging = output.with_suffix(".partial")
            staging.write_text(neutral(json.dumps(probe())))
            staging.rename(output)
    return json.loads(output.read_text().replace("@BASETEMP@", base))


# Where ``fixprobe`` keeps the reports of this test run (set by ``fixprobe_results``).
_FIXPROBE_RESULTS: dict = {}


@pytest.fixture(scope="session", autouse=True)
def fixprobe_results(shared_dir, tmp_path_factory):
    """``fixprobe``'s reports, shared by every xdist worker of this run (each costs a fresh
    interpreter importing sglang)."""
    directory = shared_dir / "fixprobe-reports"
    directory.mkdir(exist_ok=True)
    _FIXPROBE_RESULTS.update(directory=directory, base=str(tmp_path_factory.getbasetemp()))
    yield
    _FIXPROBE_RESULTS.clear()


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
    verdict the truths expect. A test that wants one sets it.

    Nor do the processes the tests start see the xdist worker's name (``PYTEST_XDIST_WORKER``,
    which xdist only writes): the runs shared by the workers (``fixprobe``, the live outcomes of
    ``live_zygotes``) are keyed by their environment, and a name that differs per worker made
    every worker compute each of them again."""
    from npudoctor.deployment.load import shell_env

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPUDOCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("npudoctor-cache")))
        patch.delenv("PYTEST_XDIST_WORKER", raising=False)
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
            tree = fetch_sglang.fetch(version)
        SHARED_TREES.add(str(Path(tree).resolve()))
        return tree

    return fetch


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` every test that asks ``live_report`` about a release (or synthetic
    state) it is parametrized by runs on one worker, one after another: that worker's zygote of
    the release (``live_zygotes``) serves them all with one import of sglang. (Before xdist's
    own hook, which reads the groups.)"""
    import re

    if not config.getoption("--full"):
        sampled_out = [item for item in items if item.get_closest_marker("sweep")]
        if sampled_out:
            config.hook.pytest_deselected(items=sampled_out)
            items[:] = [item for item in items if not item.get_closest_marker("sweep")]
    state = re.compile(r"\d+\.\d+\.\d+(\+[\w-]+)?")
    for item in items:
        if "live_report" not in getattr(item, "fixturenames", ()):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        found = next((v for v in params.values() if isinstance(v, str) and state.fullmatch(v)), None)
        if found is not None:
            item.add_marker(pytest.mark.xdist_group(f"sglang-{found}"))


# Trees many tests probe live (the releases, the session's synthetic states): their live runs are
# served by a zygote (``live_zygotes``); a tree a test builds for itself gets a fresh child.
SHARED_TREES: set[str] = set()


@pytest.fixture(scope="session", autouse=True)
def live_zygotes(session_static_cache, shared_dir):
    """This worker's live runs on a shared tree fork from a process that imported the tree's sglang
    once (``npudoctor.live.zygote``), instead of importing it in a fresh child each (~5-10 s); the
    verdicts are the fresh child's. Three trees at a time per worker (each holds ~0.6 GB of
    processes), the least recently used one closed first. A live outcome computed is kept for the
    whole run, for every worker: a test asking for the same run (same tree, checks, fixes, facts)
    at another depth or through another command gets it without probing again.
    ``NPUDOCTOR_TEST_ZYGOTES=0`` runs every live run in a fresh child, as ``npudoctor check`` does."""
    from npudoctor.live import child_process, zygote

    if os.environ.get("NPUDOCTOR_TEST_ZYGOTES", "1") == "0":
        yield None
        return
    memo = shared_dir / "live-outcomes"
    memo.mkdir(exist_ok=True)
    pool = zygote.Pool(limit=3, accepts=lambda root: str(Path(root).resolve()) in SHARED_TREES, memo=memo)
    previous = child_process.serve_from(pool)
    try:
        yield pool
    finally:
        child_process.serve_from(previous)
        pool.close()


@pytest.fixture(scope="session")
def installed_sglang(release, shared_dir):
    """``installed_sglang("0.5.23")`` -> a site-packages folder holding that release installed by
    pip from its cached wheel, with torch beside it, as every real environment has it
    (``support.trees.installed_beside_torch``); put it on ``PYTHONPATH`` to check it as the
    installed sglang, or pass it to ``--sglang-path``. Built once per run, shared by the xdist
    workers; a test must not write into it."""

    def install(version: str) -> Path:
        release(version)  # the wheel, fetched into the release cache once
        wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", version)
        site = shared_dir / f"installed-sglang-{version}"
        with exclusive(shared_dir / f"installed-sglang-{version}.lock"):
            if not (site / "torch").exists():
                staging = shared_dir / f"installed-sglang-{version}.partial"
                shutil.rmtree(staging, ignore_errors=True)
                installed_beside_torch(wheel, staging).rename(site)
        return site

    return install


@pytest.fixture
def overlay(tmp_path):
    """A cheap copy of a release tree (hard links) whose files a test may replace."""

    def make(tree: Path) -> Path:
        return overlay_tree(tree, tmp_path)

    return make


@pytest.fixture
def cp_gap(release, tmp_path) -> Path:
    """The "0.5.13+cp-gap" tree (see ``support.trees.cp_gap_tree``), fresh for each test."""
    return cp_gap_tree(release, tmp_path)


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
            SHARED_TREES.add(str(Path(built[name]).resolve()))
        return built[name]

    return tree


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
