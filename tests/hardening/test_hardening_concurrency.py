"""The fix record under concurrency and failure: several ``fix --apply`` at once, a reader (``fix
--status``, sglang's plugin) during re-applies, a ``fix`` killed mid-write, ``--apply --select``
over a record of other fixes, a ``--revert`` whose directory refuses the removal.

The writers and readers are real processes on a real record (NPD001 on 0.5.12, written by ``fix
--apply``): the children call ``npudoctor.patching.records`` (and, for the reader, the plugin's
own ``installed_plan``) in tight loops, so a window of a few microseconds is hit in a second."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import npudoctor
from npudoctor.patching import records

from support.filesystem import immutable, unwritable
from support.repo import EXAMPLES
from support.reports import without_progress

DEEPSEEK_32_PD = EXAMPLES / "deepseek-v3.2-pd.yaml"  # NPD001's fix applies on 0.5.12
DEEPSEEK_PD = EXAMPLES / "deepseek-v3-pd.yaml"  # NPD001's and NPD006's apply on 0.5.12
RECORD_FILES = {"METADATA", "entry_points.txt", records.PLAN_FILE, "INSTALLER", "RECORD"}


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = without_progress(err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npudoctor: error:"), err
    return lines[0]


def child_env() -> dict[str, str]:
    """The environment of a child that imports this npudoctor (the tree under test, first)."""
    root = str(Path(npudoctor.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


def python(code: str, *args, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        **popen,
    )


def others(site: Path) -> list[str]:
    """What the site directory holds besides the record: staging or retired folders, a lock file."""
    return sorted(p.name for p in site.iterdir() if p.name != records.DIST_INFO)


def intact(site: Path) -> dict[str, bytes]:
    """The record's files and their bytes (the record must hold all of them)."""
    record = site / records.DIST_INFO
    files = {p.name: p.read_bytes() for p in record.iterdir()}
    assert set(files) == RECORD_FILES, sorted(files)
    return files


@pytest.fixture(scope="module")
def document(release, tmp_path_factory) -> dict:
    """The record document ``fix --apply`` writes for NPD001 on 0.5.12 (once for the module)."""
    directory = tmp_path_factory.mktemp("first-apply")
    argv = ["fix", "-q", "--apply", "--depth", "static", "--sglang-path", release("0.5.12")]
    argv += ["--config", DEEPSEEK_32_PD, "--site", directory]
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", *map(str, argv)], capture_output=True, text=True, env=child_env()
    )
    assert done.returncode == 0 and "recorded NPD001" in done.stdout, done.stderr
    return records.read(directory)


@pytest.fixture
def site(document, tmp_path, monkeypatch) -> Path:
    """A site directory holding that record, as ``fix --apply`` wrote it, on the PYTHONPATH a server
    started here has (sglang's plugin loading finds the record: ``fix --status`` says it fits)."""
    directory = tmp_path / "site"
    directory.mkdir()
    records.write(document, directory)
    monkeypatch.setenv("PYTHONPATH", str(directory))
    return directory


def apply(cli, release, site: Path, *extra, config: Path = DEEPSEEK_32_PD):
    return cli(
        "fix", "--apply", "--sglang-path", release("0.5.12"), "--config", config, "--site", site, *extra
    )


# -- several writers at once --------------------------------------------------------------------

WRITER = """
import json, sys, time
from pathlib import Path
from npudoctor.errors import InputError
from npudoctor.patching import records
site, barrier, count = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
document = records.read(site)
(barrier / sys.argv[4]).touch()  # imported and read: ready
while not (barrier / "go").exists():
    time.sleep(0.001)
failed = []
for index in range(count):
    try:
        records.write({**document, "created": f"{sys.argv[4]}-{index}"}, site)
    except InputError as error:
        failed.append(str(error))
print(json.dumps(failed))
"""


def test_writers_at_once_all_succeed_and_leave_one_record_and_nothing_else(site, tmp_path):
    """Four processes rewriting the record 40 times each, started together (each says it is ready,
    having imported npudoctor, and waits for the go): every write succeeds, the record is whole, and
    no staging or retired folder (or lock file) is left beside it."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    writers = [python(WRITER, site, barrier, 40, name) for name in "abcd"]
    guard = time.monotonic() + 600  # a guard for a writer that never gets ready, not a bound
    while not all((barrier / name).exists() for name in "abcd"):
        assert all(w.poll() is None for w in writers), [
            w.communicate() for w in writers if w.poll() is not None
        ]
        assert time.monotonic() < guard, "the writers did not get ready in 600 s"
        time.sleep(0.01)
    (barrier / "go").touch()
    failures = []
    for writer in writers:
        out, err = writer.communicate(timeout=600)
        assert writer.returncode == 0, err
        failures += json.loads(out)
    assert failures == []
    assert others(site) == []
    intact(site)
    assert records.read(site)["created"].rpartition("-")[2] == "39"  # one writer's last write


# -- a reader during re-applies -----------------------------------------------------------------

READER = """
import importlib.metadata as metadata, json, sys
from pathlib import Path
site, ready, stop, enough = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
from npudoctor.errors import InputError
from npudoctor.patching import records
from npudoctor.patching.planfile import installed_plan
sys.path[:] = [str(site)]  # as sglang would find the record, and fast: no other distribution
reads, missed = 0, {"status": 0, "damaged": 0, "entry point": 0, "plugin plan": 0}
ready.touch()
while not stop.exists():
    reads += 1
    if reads == 1000:
        enough.touch()  # the writer rewrites until the reader has read this often
    try:
        if records.read(site) is None:  # what `fix --status` reads
            missed["status"] += 1
    except InputError:
        missed["damaged"] += 1
    # what sglang's plugin loader and then the plugin read
    if not [e for e in metadata.entry_points(group="sglang.srt.plugins") if e.name == "npudoctor"]:
        missed["entry point"] += 1
    try:
        installed_plan()
    except Exception:
        missed["plugin plan"] += 1
print(json.dumps({"reads": reads, "missed": missed}))
"""


def test_a_reader_sees_the_old_record_or_the_new_one_during_re_applies(site, tmp_path):
    """``fix --status`` and sglang's plugin read the record without any lock while it is rewritten
    (300 times at least, and until the reader has read 1000 times): every read finds a whole record
    (the old one or the new one), never none. (The reader's ``sys.path`` is the site alone, so
    sglang's plugin lookup reads it fast.)"""
    ready, stop, enough = tmp_path / "reader-ready", tmp_path / "reader-stop", tmp_path / "reader-1000"
    reader = python(READER, site, ready, stop, enough)
    guard = time.monotonic() + 600  # guards against a reader that hangs, not a bound
    while not ready.exists():
        assert reader.poll() is None and time.monotonic() < guard, (
            reader.stderr.read() if reader.stderr else ""
        )
        time.sleep(0.01)
    document, index = records.read(site), 0
    while index < 300 or not enough.exists():
        assert reader.poll() is None and time.monotonic() < guard, (
            reader.stderr.read() if reader.stderr else ""
        )
        records.write({**document, "created": str(index)}, site)
        index += 1
    stop.touch()
    out, err = reader.communicate(timeout=600)
    assert reader.returncode == 0, err
    seen = json.loads(out)
    assert seen["reads"] >= 1000, seen  # the reader did read while the record was rewritten
    assert seen["missed"] == {"status": 0, "damaged": 0, "entry point": 0, "plugin plan": 0}, seen
    assert others(site) == []


# -- a fix killed mid-write ---------------------------------------------------------------------

CRASH = """
import os, shutil, signal, sys
from pathlib import Path
from npudoctor.patching import records
site, operation = Path(sys.argv[1]), sys.argv[2]
document = {"fixes": {"NPD001": {"shape": {"sglang.srt.x:Y.z": "abc"}}}}

def killed(*args, **kwargs):  # SIGKILL: no handler, no finally runs
    os.kill(os.getpid(), signal.SIGKILL)

if operation == "revert":
    shutil.rmtree = killed  # the record's files are being deleted
    records.remove(site)
else:
    os.replace = os.rename = killed  # the new record is written and about to go into place
    records.write(document, site)
"""


@pytest.fixture(params=["first apply", "re-apply", "revert"])
def crashed(request, site) -> Path:
    """The site directory as a ``fix`` SIGKILLed mid-write leaves it."""
    if request.param == "first apply":
        for path in (site / records.DIST_INFO).iterdir():
            path.unlink()
        (site / records.DIST_INFO).rmdir()
    child = python(CRASH, site, request.param.split()[-1])
    child.communicate(timeout=600)
    assert child.returncode == -9  # it did die mid-write
    return site


@pytest.mark.parametrize("after", ["apply", "revert", "status"])
def test_the_next_fix_cleans_what_a_killed_fix_left(cli, release, crashed, after):
    site = crashed
    if after == "apply":
        code, _, err = apply(cli, release, site)
        assert code == 0, err
        intact(site)
    elif after == "revert":
        code, _, err = cli("fix", "--revert", "--site", site)
        assert code == 0, err
        assert not (site / records.DIST_INFO).exists()
    else:
        argv = ["--sglang-path", release("0.5.12"), "--config", DEEPSEEK_32_PD, "--site", site]
        code, _, err = cli("fix", "--status", *argv)
        assert code in (0, 1), err
        if (site / records.DIST_INFO).exists():
            intact(site)
    assert others(site) == []


def test_leftovers_someone_else_put_there_stay(cli, tmp_path):
    """Only npudoctor's own staging folders are removed: a folder of that name holding other files
    is not npudoctor's and stays."""
    site = tmp_path / "site"
    (site / ".npudoctor-old-mine" / "notes").mkdir(parents=True)
    (site / ".npudoctor-new-x").write_text("a file, not a staging folder")
    code, out, err = cli("fix", "--revert", "--site", site)
    assert code == 0 and "nothing to revert" in out, err
    assert others(site) == [".npudoctor-new-x", ".npudoctor-old-mine"]


@contextlib.contextmanager
def lock_held(site: Path):
    """The record's lock, held as a live ``fix`` holds it while it writes."""
    import fcntl

    with (site / records.LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def test_status_leaves_a_live_writers_staging_folder_alone(cli, release, site):
    """A staging folder is a leftover only when no ``fix`` holds the lock: one that does is writing it."""
    staging = site / f"{records.STAGING_PREFIX}live"
    staging.mkdir()
    (staging / "METADATA").write_text("being written")
    argv = ["--sglang-path", release("0.5.12"), "--config", DEEPSEEK_32_PD, "--site", site]
    with lock_held(site):
        code, _, err = cli("fix", "--status", *argv)
        assert code == 0 and staging.is_dir(), err
    code, _, err = cli("fix", "--status", *argv)
    assert code == 0 and others(site) == [], err  # its writer is gone: a leftover now


def test_a_fix_that_cannot_have_the_lock_says_so(cli, site, monkeypatch):
    """A ``fix`` stopped while it holds the lock (Ctrl-Z): the next one waits ``LOCK_TIMEOUT``, then
    exits 2 saying who holds what, and changes nothing."""
    monkeypatch.setattr(records, "LOCK_TIMEOUT", 0.3)
    with lock_held(site):
        code, _, err = cli("fix", "--revert", "--site", site)
    assert code == 2 and "another process has held" in one_error_line(err), err
    intact(site)


# -- --apply --select over a record of other fixes ----------------------------------------------


def test_apply_select_says_which_recorded_fixes_it_drops(cli, release, tmp_path):
    directory = tmp_path / "site"
    directory.mkdir()
    code, out, err = apply(cli, release, directory, config=DEEPSEEK_PD)
    assert code == 0 and "recorded NPD001, NPD006" in out, err
    assert "no longer recorded" not in out

    code, out, err = apply(cli, release, directory, "--select", "NPD006", config=DEEPSEEK_PD)
    assert code == 0, err
    assert "recorded NPD006 in" in out
    lines = out.splitlines()
    said = next(i for i, line in enumerate(lines) if "no longer recorded" in line)
    assert "NPD001" in lines[said] and "not selected" in lines[said], out
    assert "--apply --select NPD001,NPD006" in lines[said + 1], out  # the command that keeps it
    assert sorted(records.read(directory)["fixes"]) == ["NPD006"]

    code, out, err = apply(
        cli, release, directory, "--select", "NPD001", "--format", "json", config=DEEPSEEK_PD
    )
    assert code == 0, err
    applied = json.loads(out)
    assert applied["applied"] == ["NPD001"] and applied["dropped"] == {"NPD006": "not selected"}, applied


@pytest.mark.parametrize("blocked", ["RECORD", records.PLAN_FILE])
def test_an_apply_that_cannot_write_the_record_leaves_the_previous_one_as_it_was(
    cli, release, tmp_path, blocked
):
    """An ``--apply`` that fails half-way through replacing the record's files (one of them cannot be
    replaced) exits 2 and leaves every file of the record it found, the plan first: the fixes
    recorded before are all still recorded."""
    directory = tmp_path / "site"
    directory.mkdir()
    code, out, err = apply(cli, release, directory, "--depth", "static", config=DEEPSEEK_PD)
    assert code == 0 and "recorded NPD001, NPD006" in out, err
    before = intact(directory)
    with immutable(directory / records.DIST_INFO / blocked):
        code, out, err = apply(cli, release, directory, "--depth", "static", "--select", "NPD001",
                               config=DEEPSEEK_PD)  # fmt: skip
        assert code == 2 and out == "", err
        assert "cannot write the fix record" in one_error_line(err)
    assert intact(directory) == before
    assert sorted(records.read(directory)["fixes"]) == ["NPD001", "NPD006"]
    assert others(directory) == []


# -- a --revert that cannot finish --------------------------------------------------------------


def test_revert_that_cannot_remove_the_record_leaves_it_whole(cli, release, site):
    status = [
        "fix",
        "--status",
        "--sglang-path",
        release("0.5.12"),
        "--config",
        DEEPSEEK_32_PD,
        "--site",
        site,
    ]
    before_files, before_status = intact(site), cli(*status)
    with unwritable(site):
        code, out, err = cli("fix", "--revert", "--site", site)
        assert code == 2 and out == "", err
        assert intact(site) == before_files
        line = one_error_line(err)
        assert "cannot remove" in line and "unchanged" in line, line
        assert cli(*status) == before_status
    import importlib.metadata

    # what pip lists: the record by its name, never a nameless ("None") distribution
    names = [d.metadata["Name"] for d in importlib.metadata.distributions(path=[str(site)])]
    assert names == [records.DIST_NAME]
    assert others(site) == []
    code, out, err = cli("fix", "--revert", "--site", site)
    assert code == 0 and list(site.iterdir()) == [], err


# -- apply, revert and status at once, through the command line ---------------------------------


@pytest.mark.slow
def test_apply_revert_and_status_at_once_from_the_command_line(release, tmp_path):
    """Four ``fix --apply``, two ``--revert`` and two ``--status`` started together on one site
    directory: each exits as documented (0; status 0 or 1, never 2), and the directory holds a whole
    record or none, and nothing else. (End to end: their writes rarely meet, as each plans first;
    the tests above make them meet.)"""
    site = tmp_path / "site"
    site.mkdir()
    common = ["--sglang-path", release("0.5.12"), "--site", site]
    commands = [
        *[["--apply", "--depth", "static", "--config", DEEPSEEK_32_PD, *common]] * 4,
        *[["--revert", *common]] * 2,
        *[["--status", "--depth", "static", "--config", DEEPSEEK_32_PD, *common]] * 2,
    ]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "npudoctor", "fix", "-q", *map(str, argv)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for argv in commands
    ]
    for argv, child in zip(commands, children):
        _, err = child.communicate(timeout=600)
        allowed = (0, 1) if argv[0] == "--status" else (0,)
        assert child.returncode in allowed, (argv[0], err)
        assert "Traceback" not in err
    assert others(site) == []
    if (site / records.DIST_INFO).exists():
        intact(site)
        assert records.read(site) is not None
