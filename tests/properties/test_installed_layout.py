"""The checks on an sglang installed as users have it: in a site-packages folder with torch beside it.

An unpacked release tree (what most tests check) holds ``sglang/`` alone. Installed, sglang's
dependencies are its siblings, so a name sglang imports from torch (``torch.cuda.graphs``, the base
of a graph runner) can be found as a file beside the package: it must still be outside what is
checked, as it is in the unpacked tree, not a crash (``'.../torch/cuda/graphs.py' is not in the
subpath of '.../sglang'``) and not a module that changes a verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from npudoctor.static.dataflow import is_imported_from_outside
from npudoctor.static.source import SourceTree

VERSION = "0.5.23"


def check_installed(site, tmp_path, *options: str) -> dict:
    """``npudoctor check`` (a fresh interpreter, the real CLI) on the sglang installed in ``site``:
    its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "npudoctor", "check", "--depth", "static", "-q", "-f", "json", *options],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)


def evidence_paths(report: dict) -> list[str]:
    return [e["location"]["path"] for r in report["results"] for e in r["evidence"] if e.get("location")]


@pytest.mark.parametrize("selection", [("--select", "NPP"), ()], ids=["NPP", "default"])
def test_installed_with_torch_beside_it_judges_as_the_unpacked_release(
    selection, installed_sglang, release, cli, tmp_path
):
    """The installed release gets the verdicts its unpacked tree gets, evidence and all (paths are
    sglang's, relative to the folder holding it), and no check errors."""
    site = installed_sglang(VERSION)
    report = check_installed(site, tmp_path, *selection)
    assert report["target"]["source"] == "installed" and report["target"]["path"] == str(site / "sglang")
    errors = {r["id"]: r["error"] for r in report["results"] if r["status"] == "error"}
    assert not errors
    paths = evidence_paths(report)
    assert all(p.startswith("sglang/") for p in paths), paths
    code, out, err = cli("check", "-q", "-f", "json", "--sglang-path", release(VERSION), *selection)
    assert code in (0, 1), err
    assert report["results"] == json.loads(out)["results"]


def test_a_site_packages_given_as_sglang_path_judges_as_the_unpacked_release(installed_sglang, release, cli):
    """The same folder named with ``--sglang-path`` (the layout ``fix --apply`` records into)."""
    site = installed_sglang(VERSION)
    code, out, err = cli("check", "-q", "-f", "json", "--select", "NPP", "--sglang-path", site)
    assert code in (0, 1), err
    report = json.loads(out)
    assert not [r["error"] for r in report["results"] if r["status"] == "error"]
    code, out, err = cli("check", "-q", "-f", "json", "--select", "NPP", "--sglang-path", release(VERSION))
    assert code in (0, 1), err
    assert report["results"] == json.loads(out)["results"]


def test_a_module_beside_the_package_is_outside_the_tree(installed_sglang):
    """Where torch's files lie beside sglang, its modules are still none of the tree's: they have no
    path in it, and a name imported from one is imported from outside."""
    site = installed_sglang(VERSION)
    assert (site / "torch" / "cuda" / "graphs.py").is_file()
    tree = SourceTree(site / "sglang")
    assert tree.module_path("torch.cuda.graphs") is None and tree.module_path("torch") is None
    assert tree.module_path("sglang.srt.server_args") == site / "sglang" / "srt" / "server_args.py"
    runner = tree.module_path("sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner")
    assert runner is not None and is_imported_from_outside(tree, runner, "torch")
