"""The release list kept in the release cache (``pypi-sglang.json``) is written and read only in a
cache proven private, never through a link, and a copy that cannot be read is a miss.

The index is served here by a local HTTP server (``releases.INDEX_URL`` pointed at it): what is
tested is the keeping and the reading, with the answer PyPI would give. As root, ``os.chown`` to
another uid stands for the other user who owns the cache folder and planted the links."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npudoctor.target import releases

from support.repo import EXAMPLES, fetch_sglang

DEEPSEEK = EXAMPLES / "deepseek-v3-pd.yaml"
NOBODY = 65534  # another user's id, for what a root test plants as someone else
IS_ROOT = os.geteuid() == 0
ON_THE_INDEX = ["0.5.12", "0.5.13", "0.5.13.post1"]
PLANTED = ["9.9.9"]  # what a planted copy says: never a release the run should believe
VICTIM = "a file of the victim's choice\n"


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's name)
        body = json.dumps({"releases": {v: [{"yanked": False}] for v in ON_THE_INDEX}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(monkeypatch) -> Iterator[None]:
    """The package index answers ``ON_THE_INDEX``, from this machine."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(releases, "INDEX_URL", f"http://127.0.0.1:{server.server_port}/pypi/sglang/json")
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_index(monkeypatch):
    """The package index cannot be reached (a port nobody listens on)."""
    monkeypatch.setattr(releases, "INDEX_URL", "http://127.0.0.1:9/pypi/sglang/json")


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim" / "chosen.txt"
    path.parent.mkdir()
    path.write_text(VICTIM)
    return path


def planted_copy(tmp_path: Path, age: float = 0) -> Path:
    """A release list saying ``PLANTED``, ``age`` seconds old, outside the cache."""
    path = tmp_path / "planted" / "pypi-sglang.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PLANTED) + "\n")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def staging_name(cache: Path) -> Path:
    """Where today's npudoctor stages the list it keeps: this process's id, known in advance."""
    return cache / f"pypi-sglang.{os.getpid()}.partial"


def kept(cache: Path) -> list[str]:
    listing = cache / "pypi-sglang.json"
    assert not listing.is_symlink() and listing.is_file()
    return json.loads(listing.read_text())


# -- no write through a link, no read of one ---------------------------------------------------------


def test_a_link_at_the_staging_name_is_not_written_through(tmp_path, index, victim):
    cache = tmp_path / "cache"
    cache.mkdir()
    staging_name(cache).symlink_to(victim)
    versions, note = releases.index_versions(cache)
    assert victim.read_text() == VICTIM, "the release list was written through a planted link"
    assert versions == ["0.5.12", "0.5.13"] and note == ""
    assert kept(cache) == ON_THE_INDEX


def test_a_link_at_the_index_is_neither_read_nor_written_through(tmp_path, index):
    """A fresh ``pypi-sglang.json`` that is a link: not believed (the index is asked), and the
    list kept replaces the link, not what it points to."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = planted_copy(tmp_path)
    (cache / "pypi-sglang.json").symlink_to(elsewhere)
    versions, _ = releases.index_versions(cache)
    assert versions == ["0.5.12", "0.5.13"], "the release list was read through a link"
    assert json.loads(elsewhere.read_text()) == PLANTED
    assert kept(cache) == ON_THE_INDEX


@pytest.mark.skipif(not IS_ROOT, reason="planting a copy as another user needs root")
def test_a_copy_another_user_wrote_is_not_believed(tmp_path, index):
    cache = tmp_path / "cache"
    cache.mkdir()
    listing = cache / "pypi-sglang.json"
    listing.write_text(json.dumps(PLANTED) + "\n")
    os.chown(listing, NOBODY, NOBODY)
    versions, _ = releases.index_versions(cache)
    assert versions == ["0.5.12", "0.5.13"]
    assert kept(cache) == ON_THE_INDEX and listing.stat().st_uid == os.geteuid()


@pytest.mark.skipif(not IS_ROOT, reason="a cache folder of another user's needs root")
def test_a_cache_another_user_owns_is_neither_written_nor_read(tmp_path, index, victim):
    """The cache folder is another user's, who planted links at the staging name and at the list
    (two days old: the index is asked again and its answer kept): nothing is written there,
    nothing read from there; the run has the index's answer, and says it was not kept and why."""
    cache = tmp_path / "cache"
    cache.mkdir()
    staging_name(cache).symlink_to(victim)
    (cache / "pypi-sglang.json").symlink_to(planted_copy(tmp_path, age=2 * 24 * 3600))
    for path in (cache, staging_name(cache), cache / "pypi-sglang.json"):
        os.lchown(path, NOBODY, NOBODY)
    before = sorted(p.name for p in cache.iterdir())
    versions, note = releases.index_versions(cache)
    assert victim.read_text() == VICTIM, "root wrote through a link another user planted"
    assert versions == ["0.5.12", "0.5.13"]
    assert "not kept" in note and "belongs to uid 65534" in note, note
    assert sorted(p.name for p in cache.iterdir()) == before
    assert (cache / "pypi-sglang.json").is_symlink()


@pytest.mark.skipif(not IS_ROOT, reason="a cache folder of another user's needs root")
def test_published_releases_reads_no_copy_another_user_owns(tmp_path, index):
    """The scripts' reader of the list (every release, post-releases too) is held to the same proof."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "pypi-sglang.json").write_text(json.dumps(PLANTED) + "\n")
    os.chown(cache, NOBODY, NOBODY)
    os.chown(cache / "pypi-sglang.json", NOBODY, NOBODY)
    assert releases.published_releases("0.5.12", cache) == ON_THE_INDEX


# -- a copy that cannot be read is a miss ---------------------------------------------------------------


CORRUPT = {
    "not-json": b'["0.5.12", "0.5.1',
    "not-a-list": b'{"0.5.12": 1}\n',
    "not-names": b"[1, 2, null]\n",
    "not-text": b"\xff\xfe\x00[",
    "empty": b"",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_copy_is_asked_again(tmp_path, index, kind):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "pypi-sglang.json").write_bytes(CORRUPT[kind])  # fresh: today's code would believe it
    versions, note = releases.index_versions(cache)
    assert versions == ["0.5.12", "0.5.13"] and note == ""
    assert kept(cache) == ON_THE_INDEX


def test_a_corrupt_copy_and_no_index_is_one_line_exit_2(cli, tmp_path, monkeypatch, no_index):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "pypi-sglang.json").write_bytes(CORRUPT["not-json"])
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(cache))
    code, out, err = cli("advise", "--config", DEEPSEEK, "--select", "NPD006", "--releases", "0.5.12")
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "cannot read the release list" in err and "pypi-sglang.json" in err, err


def test_advise_over_a_corrupt_copy_asks_the_index_and_checks(cli, release, tmp_path, monkeypatch, index):
    """``advise`` (in-process, the index local) with a corrupt kept list: the index is asked again,
    the release checked (NPD006 fails on 0.5.12: exit 1), the list kept again whole."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    release("0.5.12")
    wheel = fetch_sglang._releases.find_wheel(fetch_sglang.cache_dir() / "wheels", "0.5.12")
    os.link(wheel, cache / "wheels" / wheel.name)  # had from the cache, no download
    (cache / "pypi-sglang.json").write_bytes(CORRUPT["not-json"])
    monkeypatch.setenv("NPUDOCTOR_SGLANG_CACHE", str(cache))
    code, out, err = cli(
        "advise", "-f", "json", "--config", DEEPSEEK, "--select", "NPD006", "--releases", "0.5.12"
    )
    assert code == 1, err
    (row,) = json.loads(out)["releases"]
    assert row["error"] is None and row["report"]["results"][0]["status"] == "fail"
    assert kept(cache) == ON_THE_INDEX
