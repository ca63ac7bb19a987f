"""The dry run's Triton kernel references against independent computations: sglang's own torch
implementation from the release tree where it ships one (``alloc_extend_naive``), the obvious
formula otherwise; and the argument forms they do not model refused."""

from __future__ import annotations

import ast
import itertools

import pytest
import torch

from npudoctor.live.tritonkernels import (
    TRITON_KERNELS,
    alloc_extend_kernel,
    compute_position_kernel,
    write_req_to_token_pool_triton,
)

NAIVE_ALLOCATOR = "sglang/srt/mem_cache/allocator/paged.py"  # 0.5.23: alloc_extend_naive


def _function_from_tree(path, name: str):
    """The function ``name`` of a release's source file, run as sglang wrote it (only torch in its
    namespace: the module's other imports need packages a CPU host lacks)."""
    module = ast.parse(path.read_text())
    (found,) = [node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == name]
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[found], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def _allocation(page_size: int, requests: list[tuple[int, int]], seed: int):
    """A batch extending each ``(prefix, seq)`` request: the slot of each prefix's last token (its
    page taken from the pages no free list holds) and a shuffled free list of whole pages."""
    generator = torch.Generator().manual_seed(seed)
    pages = torch.randperm(64, generator=generator) + 1
    used, free = pages[: len(requests)], pages[len(requests) :]
    last_loc = torch.tensor(
        [
            int(used[i]) * page_size + (prefix - 1) % page_size if prefix else -1
            for i, (prefix, _) in enumerate(requests)
        ]
    )
    prefix_lens = torch.tensor([prefix for prefix, _ in requests])
    seq_lens = torch.tensor([seq for _, seq in requests])
    return prefix_lens, seq_lens, last_loc, free


@pytest.mark.parametrize(
    ("page_size", "requests"),
    [
        (1, [(0, 5), (3, 4), (2, 9)]),
        (4, [(0, 13), (5, 6), (6, 15), (8, 8), (7, 8)]),
        (16, [(0, 3), (17, 40), (32, 33), (5, 16)]),
    ],
)
def test_alloc_extend_matches_sglangs_naive_allocator(release, page_size, requests):
    naive = _function_from_tree(release("0.5.23") / NAIVE_ALLOCATOR, "alloc_extend_naive")
    for seed in range(3):
        prefix_lens, seq_lens, last_loc, free_pages = _allocation(page_size, requests, seed)
        total = int((seq_lens - prefix_lens).sum())
        expected = torch.full((total,), -7, dtype=torch.int64)
        naive(prefix_lens, seq_lens, last_loc, free_pages, expected, page_size, "cpu")
        got = torch.full((total,), -7, dtype=torch.int64)
        alloc_extend_kernel(
            (len(requests),), prefix_lens, seq_lens, last_loc, free_pages, got, 64, page_size, total
        )
        assert got.tolist() == expected.tolist()


def test_alloc_extend_differs_when_the_free_pages_differ(release):
    """The comparison above can fail: another free list gives other slots."""
    naive = _function_from_tree(release("0.5.23") / NAIVE_ALLOCATOR, "alloc_extend_naive")
    prefix_lens, seq_lens, last_loc, free_pages = _allocation(4, [(5, 14)], 0)
    expected = torch.zeros(9, dtype=torch.int64)
    naive(prefix_lens, seq_lens, last_loc, free_pages, expected, 4, "cpu")
    got = torch.zeros(9, dtype=torch.int64)
    alloc_extend_kernel((1,), prefix_lens, seq_lens, last_loc, free_pages.flip(0), got, 64, 4, 9)
    assert got[:3].tolist() == expected[:3].tolist()  # the prefix's own page: the same slots
    assert got.tolist() != expected.tolist()


@pytest.mark.parametrize("has_prefix", [True, False])
def test_compute_position_is_each_requests_range_after_its_prefix(has_prefix):
    prefix_lens = torch.tensor([0, 7, 3, 600], dtype=torch.int32)
    seq_lens = torch.tensor([5, 1, 0, 700], dtype=torch.int32)
    total = int(seq_lens.sum())
    positions = torch.full((total,), -1, dtype=torch.int64)
    starts = torch.full((4,), -1, dtype=torch.int32)
    compute_position_kernel((4,), positions, starts, prefix_lens, seq_lens, has_prefix)
    offsets = prefix_lens if has_prefix else torch.zeros_like(prefix_lens)
    expected = torch.cat([torch.arange(int(p), int(p) + int(n)) for p, n in zip(offsets, seq_lens)])
    assert positions.tolist() == expected.tolist()
    assert starts.tolist() == [0, 5, 6, 6]


@pytest.mark.parametrize("grid", [(2, 1), lambda meta: (2,), 2])
def test_compute_position_refuses_a_grid_it_does_not_model(grid):
    with pytest.raises(NotImplementedError, match="grid"):
        compute_position_kernel(
            grid,
            torch.zeros(3, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int32),
            torch.zeros(2),
            torch.ones(2),
            True,
        )


def test_write_req_to_token_pool_writes_prefix_then_extension():
    req_to_token = torch.full((5, 12), -1, dtype=torch.int32)
    prefixes = [
        torch.tensor([40, 41, 42], dtype=torch.int64),
        torch.tensor([], dtype=torch.int64),
        torch.tensor([7], dtype=torch.int64),
    ]
    pre_lens = torch.tensor([3, 0, 1])
    seq_lens = torch.tensor([5, 4, 1])
    extend_lens = seq_lens - pre_lens
    out_cache_loc = torch.arange(100, 100 + int(extend_lens.sum()), dtype=torch.int64)
    pointers = torch.tensor([p.data_ptr() for p in prefixes], dtype=torch.uint64)
    rows = torch.tensor([3, 0, 4])
    write_req_to_token_pool_triton(
        (3,),
        req_to_token,
        rows,
        pointers,
        pre_lens,
        seq_lens,
        extend_lens,
        out_cache_loc,
        req_to_token.shape[1],
    )
    expected = torch.full((5, 12), -1, dtype=torch.int32)
    start = 0
    for row, prefix, pre, seq in zip(rows.tolist(), prefixes, pre_lens.tolist(), seq_lens.tolist()):
        expected[row, :pre] = prefix.to(torch.int32)
        expected[row, pre:seq] = out_cache_loc[start : start + seq - pre].to(torch.int32)
        start += seq - pre
    assert torch.equal(req_to_token, expected)


SGLANG_KERNELS = [name for name in sorted(TRITON_KERNELS) if name.startswith("sglang.")]


@pytest.mark.parametrize(
    ("kernel", "release_version"), list(itertools.product(SGLANG_KERNELS, ["0.5.23", "0.5.12"]))
)
def test_each_sglang_kernel_key_names_where_a_release_defines_it(release, kernel, release_version):
    """A reference is found by the kernel's module and name as sglang's path imports it: a key
    that no release defines would never be reached (sgl-kernel-npu's kernels are not in sglang's
    tree, so not checked here)."""
    module, _, name = kernel.rpartition(".")
    source = release(release_version) / (module.replace(".", "/") + ".py")
    defined = source.is_file() and any(
        isinstance(node, ast.FunctionDef) and node.name == name for node in ast.parse(source.read_text()).body
    )
    moved = {
        "0.5.23": "sglang.srt.",  # the kernels moved out of srt/ to sglang/kernels/ops/ by 0.5.23
        "0.5.12": "sglang.kernels.",
    }
    if kernel.startswith(moved[release_version]):
        assert not defined, f"{kernel} is defined in {release_version} too: one key would do"
    else:
        assert defined, f"{release_version} has no {name} in {source}"
