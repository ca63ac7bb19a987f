#!/usr/bin/env python3
"""What the runtime fixes cost: interpreter start-up with the `npudoctor run` bootstrap, and
each override's hot path against the upstream fixed method on the same data.

    python benchmarks/fix_overhead.py [--runs 10] [--repeat 20]

* start-up: ``python -c pass`` with the bootstrap on PYTHONPATH and a plan of every fix
  vs without, alternately, median of ``--runs`` each (the bootstrap only puts a finder on
  ``sys.meta_path``; npudoctor is imported at the first lookup of sglang), with bytecode
  caching on (``PYTHONDONTWRITEBYTECODE`` removed) as an installed npudoctor runs: without it
  every start compiles ``sitecustomize.py`` again, which no user pays;
* each fix's hot path: the override as npudoctor installs it (a wrapt wrapper) against the
  upstream fixed method of the release that ships it, on the very same object (e.g. NPD001:
  offload + reload of 1024 slots of a DeepSeek-V3 sized NPU MLA pool from sglang 0.5.13).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from fetch_sglang import fetch  # noqa: E402


def startup(runs: int) -> tuple[float, float]:
    from npudoctor.patching.planfile import BOOTSTRAP_DIR

    with tempfile.TemporaryDirectory() as workdir:
        plan = Path(workdir) / "plan.json"
        from npudoctor.patching.fixbase import all_fixes

        plan.write_text(
            json.dumps({"fixes": {f.id: {"shape": next(iter(f.written_for.values()))} for f in all_fixes()}})
        )
        unset = ("PYTHONPATH", "NPUDOCTOR_RUN_PLAN", "PYTHONDONTWRITEBYTECODE")
        base = {k: v for k, v in os.environ.items() if k not in unset}
        with_bootstrap = {**base, "PYTHONPATH": str(BOOTSTRAP_DIR), "NPUDOCTOR_RUN_PLAN": str(plan)}
        times: dict[str, list[float]] = {"base": [], "bootstrap": []}
        for env in (base, with_bootstrap):  # warm the page cache, write the bytecode
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        for _ in range(runs):  # alternately: a load change on the machine hits both alike
            for name, env in (("base", base), ("bootstrap", with_bootstrap)):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
                times[name].append(time.perf_counter() - start)
        return statistics.median(times["base"]), statistics.median(times["bootstrap"])


# Each hot path runs in a child with the release that ships the upstream fix on PYTHONPATH;
# upstream and override are timed on the very same object, alternately, after a warm-up.
PRELUDE = r"""
import json, statistics, sys, time
import torch
from npudoctor.live import livepools
from npudoctor.patching.activation import _wrapper_of
from npudoctor.deployment.load import from_yaml
from npudoctor.deployment.facts import RoleFacts
from npudoctor.live.npusim import npu_runtime, simulated_npu
from pathlib import Path

repeat = int(sys.argv[1])
facts = from_yaml(Path(sys.argv[2])).facts


def installed(cls, name, replacement, pool):
    # the replacement as npudoctor installs it (a wrapt wrapper of the original), bound to pool
    return _wrapper_of(getattr(cls, name), replacement).__get__(pool, cls)


def race(pair):
    times = {name: [] for name in pair}
    for call in pair.values():
        call()
    for _ in range(repeat):
        for name, call in pair.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def pool_of(family, name, pages):
    livepools.PAGES = pages
    cls = [c for c in livepools.npu_pool_classes(family) if c.__name__ == name][0]
    return cls, livepools.build_pool(cls, facts.model, RoleFacts(name="decode", disaggregation_mode="decode"))
"""

HOT_PATHS = {
    "NPD001": (
        "0.5.13",
        "deepseek-v3-pd.yaml",
        {},
        "get_cpu_copy + load_cpu_copy of 1024 slots, NPU MLA pool, 61 layers",
        r"""
from npudoctor.fixes import npd001_cpu_offload_roundtrip as fix
with simulated_npu():
    livepools.import_pool_modules()
    with npu_runtime():
        cls, pool = pool_of("mla", "NPUMLATokenToKVPool", 32)
        src, dst = (torch.randperm(pool.size)[:1024] + pool.page_size for _ in range(2))
        get, load = (installed(cls, n, getattr(fix, n), pool) for n in ("get_cpu_copy", "load_cpu_copy"))
        print(json.dumps(race({
            "upstream": lambda: pool.load_cpu_copy(pool.get_cpu_copy(src), dst),
            "override": lambda: load(get(src), dst),
        })))
""",
    ),
    "NPD002": (
        "0.5.10",
        "qwen3-moe-pd-fia.yaml",
        {"ASCEND_USE_FIA": "1"},
        "get_contiguous_buf_infos, NPU MHA pool under FIA, 48 layers",
        r"""
from npudoctor.fixes import npd002_transfer_item_lengths as fix
with simulated_npu():
    livepools.import_pool_modules()
    with npu_runtime():
        cls, pool = pool_of("mha", "NPUMHATokenToKVPool", 4)
        override = installed(cls, "get_contiguous_buf_infos", fix.get_contiguous_buf_infos, pool)
        assert override() == pool.get_contiguous_buf_infos()
        print(json.dumps(race({"upstream": pool.get_contiguous_buf_infos, "override": override})))
""",
    ),
    "NPD004": (
        "0.5.13",
        "qwen3-cp-prefill.yaml",
        {},
        "do_cp_attn_fia glue (kernel stubbed), 2 requests, CP rank 0 of 2, 16 q / 2 KV heads x 128",
        r"""
import types
from npudoctor.fixes import npd004_cp_metadata_fields as fix
with simulated_npu():
    from sglang.srt.hardware_backend.npu.attention.ascend_backend import AscendAttnBackend
    with npu_runtime():
        def kernel(query, key, value, **kwargs):  # the glue is what differs, not the kernel
            return torch.zeros(query.shape[0], kwargs["num_heads"], value.shape[-1] // kwargs["num_key_value_heads"]), None
        torch.ops.npu = types.SimpleNamespace(npu_fused_infer_attention_score=kernel)
        heads, kv_heads, dim, page = 16, 2, 128, 128
        prev, nxt = [12, 40], [11, 39]  # local rows of each request's prev and next block
        meta = types.SimpleNamespace(
            total_q_prev_tokens=sum(prev), actual_seq_q_prev_list=prev, actual_seq_q_next_list=nxt,
            kv_len_prev_list=[12, 173], kv_len_next_list=[45, 291],
        )
        backend = types.SimpleNamespace(
            page_size=page, fia_mask=None,
            forward_metadata=types.SimpleNamespace(block_tables=torch.zeros(2, 4, dtype=torch.int32)),
        )
        layer = types.SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=kv_heads, tp_v_head_num=kv_heads,
                                      qk_head_dim=dim, v_head_dim=dim, scaling=dim ** -0.5)
        q = torch.randn(sum(prev) + sum(nxt), heads * dim)
        cache = torch.zeros(8 * page, kv_heads, dim)
        batch = types.SimpleNamespace(attn_cp_metadata=meta)
        upstream = AscendAttnBackend.do_cp_attn_fia
        override = _wrapper_of(upstream, fix.do_cp_attn_fia).__get__(backend, AscendAttnBackend)
        print(json.dumps(race({
            "upstream": lambda: upstream(backend, q, cache, cache, layer, batch),
            "override": lambda: override(q, cache, cache, layer, batch),
        })))
""",
    ),
    "NPD005": (
        "0.5.15",
        "deepseek-v3-pd.yaml",
        {},
        "get_cpu_copy(mamba_indices=None) of 1024 slots, NPU MLA pool, 61 layers (adapter around the same body)",
        r"""
from npudoctor.fixes import npd005_offload_signatures as fix
with simulated_npu():
    livepools.import_pool_modules()
    with npu_runtime():
        cls, pool = pool_of("mla", "NPUMLATokenToKVPool", 32)
        src = torch.randperm(pool.size)[:1024] + pool.page_size
        override = installed(cls, "get_cpu_copy", fix.get_cpu_copy, pool)
        print(json.dumps(race({
            "upstream": lambda: pool.get_cpu_copy(src, mamba_indices=None),
            "override": lambda: override(src, mamba_indices=None),
        })))
""",
    ),
}


def hot_paths(repeat: int) -> list[str]:
    """One line per fix: the override's hot path vs the upstream fixed method on the same object."""
    lines = []
    for fix_id, (release, example, env, what, body) in HOT_PATHS.items():
        environment = {**os.environ, **env, "PYTHONPATH": str(fetch(release))}
        done = subprocess.run(
            [sys.executable, "-c", PRELUDE + body, str(repeat), str(REPO / "examples" / example)],
            capture_output=True, text=True, env=environment,
        )  # fmt: skip
        if done.returncode != 0:
            lines.append(f"{fix_id}: not measured: {done.stderr.strip().splitlines()[-1:]}")
            continue
        times = json.loads(done.stdout.strip().splitlines()[-1])
        lines.append(
            f"{fix_id} {what}: upstream {release} {times['upstream'] * 1000:.3f} ms, override "
            f"{times['override'] * 1000:.3f} ms (ratio {times['override'] / times['upstream']:.2f}; median of {repeat})"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    plain, boot = startup(args.runs)
    print(
        f"python -c pass: {plain * 1000:.1f} ms, with the npudoctor run bootstrap: {boot * 1000:.1f} ms "
        f"(+{(boot - plain) * 1000:.1f} ms, ratio {boot / plain:.2f}; median of {args.runs})"
    )
    for line in hot_paths(args.repeat):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
