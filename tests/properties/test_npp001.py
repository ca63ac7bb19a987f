"""NPP001 (attribute resolution on the NPU path) on real wheels and on overlays of the newest.

The known instance: sglang#25249. ``NPUMLATokenToKVPool`` inherits ``MLATokenToKVPool.get_cpu_copy``,
which reads ``self.kv_buffer``; the NPU pool's ``__init__`` skips ``MLATokenToKVPool.__init__``
(``super(MLATokenToKVPool, self).__init__``) and never assigns it, so a PD decode server dies with
AttributeError at its first retraction. The release that ships it and the line come from the
triage file (``tests/data/properties/NPP001.yaml``), which a person read in the wheel; the
releases that override the copy methods must pass. On 0.5.23 the same property must fail when the
override is removed again, and stay silent when the code is refactored without changing what it
does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from npudoctor.deployment.load import from_yaml
from npudoctor.engine.check import Check
from npudoctor.engine.registry import discover as discover_checks
from npudoctor.results import Status
from npudoctor.target.discovery import discover

REPO = Path(__file__).resolve().parents[2]
TRIAGE = yaml.safe_load((REPO / "tests/data/properties/NPP001.yaml").read_text())
KNOWN = {entry["name"]: entry for entry in TRIAGE["known"]}
MLA_DECODE = REPO / "examples" / "deepseek-v3-pd.yaml"
GQA_DECODE = REPO / "examples" / "qwen3-moe-pd.yaml"
NPU_POOLS = "sglang/srt/hardware_backend/npu/memory_pool_npu.py"


def npp001() -> Check:
    return next(c for c in discover_checks("npudoctor.checks", "CHECK", Check) if c.id == "NPP001")


_RELEASES: dict[
    str, object
] = {}  # a release's parsed tree, shared by the tests of a worker (never an overlay's)


def judge(tree: Path, deployment: Path = MLA_DECODE, shared: bool = False):
    """NPP001's probe; ``shared``: the tree is a cached release, parsed once for every test here."""
    if shared:
        target = _RELEASES.setdefault(str(tree), discover(tree / "sglang"))
        return npp001().static(target, from_yaml(deployment).facts)
    target = discover(tree / "sglang")
    try:
        return npp001().static(target, from_yaml(deployment).facts)
    finally:
        target.release()


def locations(probe) -> list[str]:
    return [f"{e.location.path}:{e.location.line}" for e in probe.evidence if e.location]


def _quick_first(versions) -> list:
    """The newest of ``versions`` in the quick tier, the others slow."""
    *older, newest = sorted(versions, key=lambda v: tuple(int(p) for p in v.split(".")))
    return [pytest.param(v, marks=pytest.mark.slow) for v in older] + [newest]


@pytest.mark.parametrize("version", _quick_first(KNOWN["mla-pool-kv-buffer"]["sites"]))
def test_the_mla_pool_reads_kv_buffer_it_never_assigns(release, version):
    """sglang#25249 where the wheel ships it: fail at the inherited copy method's read."""
    probe = judge(release(version), shared=True)
    assert probe.status is Status.FAIL, probe.summary
    assert KNOWN["mla-pool-kv-buffer"]["sites"][version] in locations(probe)
    assert "kv_buffer" in probe.summary or any("kv_buffer" in e.observed for e in probe.evidence)


@pytest.mark.parametrize("version", _quick_first(KNOWN["mla-pool-kv-buffer"]["fixed"]))
def test_releases_that_override_the_copy_pass(release, version):
    probe = judge(release(version), shared=True)
    assert probe.status is Status.PASS, (probe.summary, locations(probe))


def test_a_deployment_that_never_retracts_does_not_reach_the_copy(release):
    """Only a PD decode server offloads KV to the CPU: the same release with a prefill-only role."""
    version = _quick_first(KNOWN["mla-pool-kv-buffer"]["sites"])[-1]  # the tree the quick test parsed
    facts = from_yaml(MLA_DECODE).facts
    prefill_only = type(facts)(
        facts.model, tuple(r for r in facts.roles if r.disaggregation_mode == "prefill"), "test"
    )
    target = _RELEASES.setdefault(str(release(version)), discover(release(version) / "sglang"))
    probe = npp001().static(target, prefill_only)
    assert probe.status is Status.PASS, (probe.summary, locations(probe))


def _method_span(text: str, cls: str, method: str) -> tuple[int, int]:
    """Character span of ``def method`` inside ``class cls`` (up to the next def at that indent)."""
    start_cls = re.search(rf"^class {cls}\b.*$", text, re.M).start()
    match = re.compile(rf"^    def {method}\(", re.M).search(text, start_cls)
    end = re.compile(r"^    (def |@)|^\S", re.M).search(text, match.end())
    return match.start(), end.start() if end else len(text)


def _rewrite(tree: Path, rel: str, change) -> None:
    path = tree / rel
    text = path.read_text()
    path.unlink()  # hard-linked to the cached release
    path.write_text(change(text))


def test_newest_fails_again_when_the_npu_override_is_removed(release, overlay):
    """0.5.23 with the NPU MLA pool's get_cpu_copy deleted: the base method's kv_buffer read is
    reached again, so the defect is back, at the base method's own line."""
    tree = overlay(release("0.5.23"))

    def drop(text: str) -> str:
        start, end = _method_span(text, "NPUMLATokenToKVPool", "get_cpu_copy")
        return text[:start] + text[end:]

    _rewrite(tree, NPU_POOLS, drop)
    probe = judge(tree)
    assert probe.status is Status.FAIL, probe.summary
    base = (tree / "sglang/srt/mem_cache/memory_pool.py").read_text().splitlines()
    for location in locations(probe):
        path, line = location.rsplit(":", 1)
        assert path == "sglang/srt/mem_cache/memory_pool.py"
        assert "self.kv_buffer" in base[int(line) - 1]


def test_newest_stays_silent_when_the_override_names_its_instance_otherwise(release, overlay):
    """A refactor that keeps behaviour: the override's first parameter renamed (``pool`` for
    ``self``); the names it reads resolve as before, for the MLA and the GQA deployment."""
    tree = overlay(release("0.5.23"))

    def rename(text: str) -> str:
        start, end = _method_span(text, "NPUMLATokenToKVPool", "get_cpu_copy")
        body = re.sub(r"\bself\b", "pool", text[start:end])
        return text[:start] + body + text[end:]

    _rewrite(tree, NPU_POOLS, rename)
    assert judge(tree).status is Status.PASS
    assert judge(tree, GQA_DECODE).status is Status.PASS
