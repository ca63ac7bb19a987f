"""NPD004 fix (sglang#26705) beyond the generic fix tests: the replacement computes causal
attention for a batch of three requests with cached prefixes on every CP rank (metadata from
sglang's own preparation, the installed method swapped in-process), it reads only fields the
metadata defines (NPD004's static check on the replacement spliced into the tree), it is
needed nowhere on PyPI, it is opt-in (unsafe), and it refuses a shape it was not written for."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import pytest
import yaml

from npudoctor.patching.fixbase import fix_by_id
from npudoctor.target.discovery import discover

from conftest import fixprobe
from support.repo import EXAMPLES
from support.reports import result_of
from support.trees import NPU_BACKEND, method_span, overlay_tree

CP_PREFILL = EXAMPLES / "qwen3-cp-prefill.yaml"
FIXED = ("0.5.9", "0.5.11", "0.5.12", "0.5.13", "0.5.15", "0.5.23")
# Three requests of different lengths, two after a radix-cache hit, lengths with remainders for
# 2 and 4 CP ranks, spanning several pages: a midpoint split of q is wrong for every CP rank.
BATCH = ((0, 45), (133, 158), (7, 61))  # (cached prefix, extend tokens)


def splice(tree: Path, source: str) -> None:
    """Put ``source`` (a function) in place of ``AscendAttnBackend.do_cp_attn_fia`` in ``tree``."""
    target = tree / NPU_BACKEND
    text = target.read_text()
    start, end, indent = method_span(text, "AscendAttnBackend", "do_cp_attn_fia")
    lines = text.splitlines(keepends=True)
    target.unlink()  # hard-linked to the cached release
    target.write_text(
        "".join(lines[: start - 1])
        + textwrap.indent(textwrap.dedent(source), " " * indent)
        + "".join(lines[end:])
    )


def method_of(tree: Path) -> str:
    text = (tree / NPU_BACKEND).read_text()
    start, end, _ = method_span(text, "AscendAttnBackend", "do_cp_attn_fia")
    return "".join(text.splitlines(keepends=True)[start - 1 : end])


def cp4_deployment(directory: Path) -> Path:
    """The scenario's prefill role over 4 CP ranks (tp 8: attention TP 2) with 16-token pages."""
    spec = yaml.safe_load(CP_PREFILL.read_text())
    spec["model"]["config"] = str((EXAMPLES / spec["model"]["config"]).resolve())
    spec["roles"]["prefill"]["server_args"].update(tp_size=8, attn_cp_size=4, page_size=16)
    spec["roles"]["decode"]["server_args"].update(tp_size=8)
    path = directory / "qwen3-cp4-prefill.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def probe(tree: Path, *configs: Path) -> dict:
    """NPD004's live probe (real prepare_context_parallel_metadata, the installed do_cp_attn_fia,
    every CP rank, compared with float64 causal attention) on BATCH for each deployment,
    unpatched, then with the fix in place."""
    several = f"live.SEVERAL = tuple(live.Request(prefix=p, extend=e) for p, e in {BATCH!r})"
    prelude = f"from npudoctor.checks.npd004_cp_metadata_fields import live; {several}"
    return fixprobe(tree, "compare", "NPD004", *configs, options=("--unsafe", "--prelude", prelude))


@pytest.mark.slow
def test_the_replacement_is_causal_attention_for_three_requests_with_prefixes(subject, release, tmp_path):
    """On the cp-gap state the installed method raises on the metadata; swapped for the fix, every
    output row of every CP rank (2 ranks / 128-token pages, 4 ranks / 16-token pages) equals causal
    attention. Released 0.5.13 (upstream's own fixed method) on the same batch is the control."""
    cp4 = cp4_deployment(tmp_path)
    gap = probe(subject("0.5.13+cp-gap"), CP_PREFILL, cp4)
    assert gap["outcome"] == "applied", gap
    for config in (CP_PREFILL, cp4):
        plain, fixed = gap["plain"][str(config)], gap["fixed"][str(config)]
        assert plain["status"] == "fail" and "AttributeError" in " ".join(plain["observed"]), plain
        assert fixed["status"] == "pass", fixed
        assert "batch of 3 requests" in fixed["summary"], fixed["summary"]
        assert any("every output row of every rank matches" in o for o in fixed["observed"]), fixed
    assert "CP ranks 0, 1, 2, 3 of 4" in " ".join(gap["fixed"][str(cp4)]["observed"])

    upstream = probe(release("0.5.13"), CP_PREFILL, cp4)
    assert "fixed" not in upstream  # not needed there: the check passes
    assert all(
        r["status"] == "pass" and "batch of 3 requests" in r["summary"] for r in upstream["plain"].values()
    )


def test_the_replacement_reads_only_fields_the_metadata_defines(cli, subject, tmp_path):
    """NPD004's static check, on the cp-gap tree with the replacement's source where sglang's
    method was: the property the check tests holds for the fix itself."""
    tree = overlay_tree(subject("0.5.13+cp-gap"), tmp_path)
    (replacement,) = fix_by_id("NPD004").implementations().values()
    splice(tree, inspect.getsource(replacement))
    code, out, err = cli(
        "check", "--format", "json", "--select", "NPD004", "--sglang-path", tree, "--config", CP_PREFILL
    )
    result = result_of(json.loads(out), "NPD004")
    assert code == 0 and result["status"] == "pass", (result["summary"], err)
    evidence = result["evidence"][0]  # do_cp_attn_fia's; the other readers of the path follow
    assert "do_cp_attn_fia" in evidence["location"]["symbol"]
    for field in ("total_q_prev_tokens", "actual_seq_q_prev_list", "kv_len_next_list"):
        assert f"cp_meta.{field}" in evidence["observed"]


@pytest.mark.parametrize("version", FIXED)
def test_not_needed_where_the_check_passes(cli, release, version):
    code, out, err = cli(
        "fix", "--format", "json", "--unsafe", "--select", "NPD004", "--sglang-path", release(version),
        "--config", CP_PREFILL,
    )  # fmt: skip
    assert code == 0, err
    (entry,) = json.loads(out)["plan"]
    assert entry["action"] == "not needed" and entry["reason"].startswith("NPD004 pass"), entry


def test_unsafe_needs_the_opt_in(cli, subject):
    def plan(*extra: str) -> dict:
        code, out, err = cli(
            "fix", "--format", "json", *extra, "--select", "NPD004", "--sglang-path",
            subject("0.5.13+cp-gap"), "--config", CP_PREFILL,
        )  # fmt: skip
        assert code == (0 if extra else 1), err  # refused where NPD004 fails: exit 1
        (entry,) = json.loads(out)["plan"]
        return entry

    refused, accepted = plan(), plan("--unsafe")
    assert refused["action"] == "refused" and "--unsafe" in refused["reason"], refused
    assert accepted["action"] == "apply" and accepted["reason"].startswith("NPD004 fails here"), accepted


def test_the_old_body_of_every_release_with_one_is_the_shape_written_for(release, tmp_path):
    """0.5.11 and 0.5.12 ship the same do_cp_attn_fia: 0.5.13 with either is the one cp-gap shape."""
    fix = fix_by_id("NPD004")
    for old in ("0.5.11", "0.5.12"):
        tree = overlay_tree(release("0.5.13"), tmp_path / old)
        splice(tree, method_of(release(old)))
        assert fix.known_release(fix.shape_of_source(discover(tree).tree)) == "0.5.13+cp-gap", old


def test_another_shape_is_refused_with_the_sites_that_differ(cli, release, tmp_path):
    """0.5.15 with the old method has the defect (static fail) but another caller: refused, naming
    forward_extend only (0.5.15's preparation is 0.5.13's)."""
    tree = overlay_tree(release("0.5.15"), tmp_path)
    splice(tree, method_of(release("0.5.12")))
    code, out, err = cli(
        "fix", "--format", "json", "--unsafe", "--select", "NPD004", "--sglang-path", tree,
        "--config", CP_PREFILL,
    )  # fmt: skip
    assert code == 1, err  # a fix refused where its check fails leaves the defect: exit 1
    (entry,) = json.loads(out)["plan"]
    reason = entry["reason"]
    assert entry["action"] == "refused" and "not a shape this fix was written for" in reason, entry
    assert "AscendAttnBackend.forward_extend" in reason
    assert "do_cp_attn_fia (" not in reason and "prepare_context_parallel_metadata" not in reason
    code, out, _ = cli(
        "check", "--format", "json", "--select", "NPD004", "--sglang-path", tree, "--config", CP_PREFILL
    )
    assert result_of(json.loads(out), "NPD004")["status"] == "fail"
