"""npudoctor.static.walker.AlwaysRaises: a function that raises whatever it is passed, through the
functions it always calls, and only when the raise is unconditional.

The witness is sglang 0.5.20-0.5.22: the legacy CP algorithms were removed from
``layers/utils/cp_utils.py``, which kept their names as import-only shims whose body is
``_deprecated_platform_cp()`` (a ``raise ValueError``), while the NPU backend's
``_cp_allgather_and_save_kv_npu`` still calls ``cp_all_gather_rerange_kv_cache`` before every FIA CP
prefill attention. None of those bodies is itself a ``raise``: only the transitive question sees
that the call dies. 0.5.19 has the real all-gather; 0.5.23 gathers through the CP strategy
(``materialize_full_kv``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from npudoctor.static.dataflow import functions_named
from npudoctor.static.source import FunctionRef, SourceTree
from npudoctor.static.walker import AlwaysRaises, CallResolver, always_raises
from npudoctor.target.discovery import discover

CP_UTILS = "sglang/srt/layers/utils/cp_utils.py"
BACKEND = "sglang/srt/hardware_backend/npu/attention/ascend_backend.py"


def function(tree: SourceTree, name: str, path: str | None = None) -> FunctionRef:
    (found,) = [f for f in functions_named(tree, name, under="srt") if path is None or f.relpath == path]
    return found


def line_of(path: Path, needle: str, after: str = "") -> int:
    """The 1-based line of the first ``needle`` at or after the first line holding ``after``."""
    lines = path.read_text().splitlines()
    start = next(n for n, text in enumerate(lines) if after in text)
    return next(n for n, text in enumerate(lines[start:], start + 1) if needle in text)


# ----- real releases ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.5.20", "0.5.22"])
def test_the_kv_all_gather_of_the_npu_backend_always_raises_through_the_cp_utils_stub(release, version):
    root = release(version)
    tree = discover(root).tree
    site = always_raises(function(tree, "_cp_allgather_and_save_kv_npu"))
    assert site is not None
    raise_line = line_of(root / CP_UTILS, "raise ValueError(")
    assert [(f.qualname, f.relpath, line) for f, line in site.chain] == [
        (
            "_cp_allgather_and_save_kv_npu",
            BACKEND,
            line_of(root / BACKEND, "kv_full = cp_all_gather_rerange_kv_cache("),
        ),
        (
            "cp_all_gather_rerange_kv_cache",
            CP_UTILS,
            line_of(
                root / CP_UTILS, "_deprecated_platform_cp()", after="def cp_all_gather_rerange_kv_cache("
            ),
        ),
        ("_deprecated_platform_cp", CP_UTILS, raise_line),
    ]
    assert site.text.startswith("raise ValueError('Prefill CP on")
    assert "does `raise ValueError(" in site.path_text() and f"at {CP_UTILS}:{raise_line}" in site.path_text()


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_the_kv_all_gather_that_gathers_does_not(release, version):
    tree = discover(release(version)).tree
    assert always_raises(function(tree, "_cp_allgather_and_save_kv_npu")) is None
    backend = function(tree, "forward_extend", BACKEND)
    assert AlwaysRaises(CallResolver(tree))(backend, backend.owner) is None


def test_a_step_a_strategy_does_not_implement_raises_in_its_own_body(release):
    """0.5.23's InterleaveCPStrategy.materialize_full_kv is ``raise NotImplementedError(...)``; the
    abstract base method it overrides is not counted (an abstract method's body never runs)."""
    tree = discover(release("0.5.23")).tree
    (interleave,) = [
        f
        for f in functions_named(tree, "materialize_full_kv", under="srt")
        if f.owner.name == "InterleaveCPStrategy"
    ]
    site = always_raises(interleave, interleave.owner)
    assert site is not None and len(site.chain) == 1 and "NotImplementedError" in site.text
    (base,) = [
        f
        for f in functions_named(tree, "materialize_full_kv", under="srt")
        if f.owner.name == "ContextParallelStrategy"
    ]
    assert always_raises(base, base.owner) is None


# ----- what counts as unconditional ------------------------------------------------------------------
MODULE = '''
import abc


def refuse():
    """Only raises."""
    raise RuntimeError("no")


def stub(x):
    refuse()


def via_assignment(x):
    y = x + 1
    value = stub(y)
    return value


def in_both_branches(x):
    if x:
        raise ValueError("a")
    else:
        stub(x)


def in_one_branch(x):
    if x:
        raise ValueError("a")
    return x


def after_an_early_return(x):
    if x:
        return 1
    refuse()


def in_a_loop(xs):
    for x in xs:
        refuse()


def swallowed(x):
    try:
        refuse()
    except RuntimeError:
        return None


def reraised(x):
    try:
        refuse()
    except RuntimeError:
        raise


def in_a_conditional_expression(x):
    return refuse() if x else x


def short_circuited(x):
    return x or refuse()


def in_a_lambda(x):
    f = lambda: refuse()  # noqa: E731
    return f


def generator(x):
    refuse()
    yield x


def assert_false(x):
    assert False, "never"


if abc:
    def platform():
        raise NotImplementedError
else:
    def platform():
        return 1


class Base(abc.ABC):
    @abc.abstractmethod
    def step(self):
        raise NotImplementedError

    def run(self):
        return self.step()


class Refuses(Base):
    def step(self):
        raise NotImplementedError("not here")


class Works(Base):
    def step(self):
        return 1
'''


@pytest.fixture
def toy(tmp_path) -> SourceTree:
    package = tmp_path / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "srt" / "toy.py").write_text(textwrap.dedent(MODULE))
    return SourceTree(package)


@pytest.mark.parametrize(
    ("name", "chain"),
    [
        ("refuse", ["refuse"]),
        ("stub", ["stub", "refuse"]),
        ("via_assignment", ["via_assignment", "stub", "refuse"]),
        ("in_both_branches", ["in_both_branches"]),
        ("reraised", ["reraised", "refuse"]),
        ("assert_false", ["assert_false"]),
    ],
)
def test_every_path_ends_in_a_raise(toy, name, chain):
    site = always_raises(function(toy, name))
    assert site is not None and [f.qualname for f, _ in site.chain] == chain


@pytest.mark.parametrize(
    "name",
    [
        "in_one_branch",
        "after_an_early_return",
        "in_a_loop",
        "swallowed",
        "in_a_conditional_expression",
        "short_circuited",
        "in_a_lambda",
        "generator",
        "platform",  # defined twice, under an `if`: which one runs is not known statically
    ],
)
def test_a_raise_that_may_not_run_does_not_count(toy, name):
    definitions = functions_named(toy, name, under="srt")
    assert definitions and all(always_raises(f) is None for f in definitions)


def test_a_virtual_call_always_raises_only_if_every_implementation_does(toy):
    run = [f for f in functions_named(toy, "run", under="srt")][0]
    refuses = toy.find_classes("Refuses")[0]
    works = toy.find_classes("Works")[0]
    assert always_raises(run, refuses) is not None  # self.step() on a Refuses
    assert always_raises(run, works) is None
