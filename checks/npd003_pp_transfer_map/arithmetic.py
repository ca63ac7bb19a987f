"""NPD003's layer arithmetic at the static depth: the PP split and the MHA pointer splitter, run
from the release's own source without importing sglang.

Two small pure functions decide where an MHA prefill stage's K/V pointers go on decode:

* ``get_pp_indices(num_hidden_layers, pp_rank, pp_size)`` (``distributed/utils.py``): the
  stage's layers, from ``SGLANG_PP_LAYER_PARTITION`` or the release's default rule (the last
  stage took the remainder up to 0.5.5, the last ``remainder`` stages one extra layer since
  0.5.6);
* ``get_mha_kv_ptrs_with_pp(src_kv_ptrs, dst_kv_ptrs)`` (``disaggregation/common/conn.py``,
  0.5.10 to 0.5.23 at least): halves both lists into K and V and, when decode's list is longer,
  guesses where decode's V half starts from ``dst_layers % stage_layers``.

Both are taken from the target's source with ``ast`` and executed alone, each in a namespace
that holds only a few builtins (and, for the partition, the role's environment in place of
``os``): no sglang module is imported, and a function that needs anything else (another
sglang function, an attribute of the manager the model does not give) raises
``CannotEvaluate`` instead of being guessed. The splitter runs on lists of labels instead of
addresses, laid out as ``_init_kv_manager`` registers them (decode of PP 1: ``[K_0..K_T-1,
V_0..V_T-1, K_draft.., V_draft..]``; decode with the prefill's PP size: the stage's layers,
with the draft pool's after them on the last stage), and its result is paired the way the
Ascend ``send_kvcache`` MHA branch pairs it (``src_k[i] -> dst_k[i]``, ``src_v[i] -> dst_v[i]``
for ``i`` in ``range(layers_current_pp_stage)``). The live probe runs the real code on real
pools; tests hold the two to agreement on several splits and releases.
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys
import types
from dataclasses import dataclass, field

from npudoctor.static.source import FunctionRef, SourceTree

PP_MODULE = "sglang.srt.distributed.utils"
_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "len", "range", "min", "max", "int", "sum", "list", "tuple", "zip", "enumerate", "getattr",
        "hasattr", "isinstance", "str", "sorted", "abs", "ValueError", "RuntimeError", "IndexError",
        "AssertionError", "TypeError", "KeyError",
    )
}  # fmt: skip


_MAX_LAYERS = 10_000  # far above any served model: a larger count is not a model npudoctor evaluates


class CannotEvaluate(Exception):
    """The release's function cannot be run alone on the modelled inputs."""


@dataclass(frozen=True)
class Split:
    """The deployment's layer arithmetic: the model's layers, both roles' PP sizes, decode's
    draft layers and the prefill role's environment (``SGLANG_PP_LAYER_PARTITION``)."""

    num_layers: int
    prefill_pp: int
    decode_pp: int
    draft_layers: int
    env: dict[str, str] = field(default_factory=dict)
    model: str = ""


@dataclass
class StageOutcome:
    """What one prefill stage's MHA pointers map to, as the release's splitter computes it."""

    stage: int
    start: int
    end: int
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (source, destination) labels
    raised: str = ""  # what send_kvcache would raise (an index past decode's slice)
    lines: list[int] = field(default_factory=list)  # splitter lines executed

    @property
    def buffers(self) -> int:
        return 2 * (self.end - self.start)

    @property
    def wrong(self) -> list[tuple[str, str]]:
        return [(s, t) for s, t in self.pairs if s != t]

    @property
    def unsent(self) -> int:
        return self.buffers - len(self.pairs)

    @property
    def right(self) -> bool:
        targets = [t for _, t in self.pairs]
        return not self.raised and not self.wrong and not self.unsent and len(set(targets)) == len(targets)


def run_alone(node: ast.FunctionDef, filename: str, names: dict | None = None):
    """The function ``node`` compiled alone (no decorators, no annotations; original line
    numbers), with only ``names`` and a few builtins as its globals."""
    node = copy.deepcopy(node)
    node.decorator_list = []
    node.returns = None
    arguments = node.args
    for arg in [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        arguments.vararg,
        arguments.kwarg,
    ]:
        if arg is not None:
            arg.annotation = None
    module = ast.Module(body=[node], type_ignores=[])
    namespace = {"__builtins__": _SAFE_BUILTINS, **(names or {})}
    exec(compile(module, filename, "exec"), namespace)  # defines the function only
    return namespace[node.name]


def partition_function(tree: SourceTree) -> tuple[ast.FunctionDef, str, str] | None:
    """``(def, path, relpath)`` of the release's ``get_pp_indices``."""
    path = tree.module_path(PP_MODULE)
    module = tree.parse(path) if path else None
    for node in module.body if module else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_pp_indices":
            return node, str(path), tree.relpath(path)
    return None


def stage_ranges(tree: SourceTree, split: Split) -> tuple[list[tuple[int, int]], str]:
    """Each prefill stage's ``(start, end)`` from the release's ``get_pp_indices``, and where it is."""
    if (
        not 0 < split.prefill_pp <= split.num_layers <= _MAX_LAYERS
        or not 0 <= split.draft_layers <= _MAX_LAYERS
    ):
        raise CannotEvaluate(
            f"{split.num_layers} layers (+ {split.draft_layers} draft) over prefill PP {split.prefill_pp}: "
            "not a split npudoctor evaluates"
        )
    found = partition_function(tree)
    if found is None:
        raise CannotEvaluate(f"no get_pp_indices in {PP_MODULE}")
    node, path, relpath = found
    env = dict(split.env)
    os_stand_in = types.SimpleNamespace(getenv=lambda name, default=None: env.get(name, default), environ=env)
    function = run_alone(node, path, {"os": os_stand_in})
    try:
        ranges = [
            tuple(function(split.num_layers, rank, split.prefill_pp)) for rank in range(split.prefill_pp)
        ]
    except Exception as error:
        raise CannotEvaluate(
            f"get_pp_indices ({relpath}:{node.lineno}) raised {type(error).__name__}: {error}"
        ) from error
    return ranges, f"{relpath}:{node.lineno}"


def _labels(kind: str, layers, draft: bool = False) -> list[str]:
    return [f"{kind}{layer}" + (" (draft)" if draft else "") for layer in layers]


def decode_list(split: Split, stage: int, start: int, end: int) -> list[str]:
    """Decode's pointer list as its ``_init_kv_manager`` registers it: main pool [K.., V..],
    then the draft pool's [K.., V..] (numbered after the model's layers)."""
    total, draft = split.num_layers, range(split.num_layers, split.num_layers + split.draft_layers)
    if split.decode_pp == 1:
        main = range(total)
        with_draft = True
    else:  # decode with the prefill's PP size: the same stage, the draft on the last one
        main = range(start, end)
        with_draft = stage == split.prefill_pp - 1
    listed = _labels("K", main) + _labels("V", main)
    if with_draft and split.draft_layers:
        listed += _labels("K", draft, True) + _labels("V", draft, True)
    return listed


def mha_stage(splitter: FunctionRef, split: Split, stage: int, start: int, end: int) -> StageOutcome:
    """Run the release's MHA splitter for one prefill stage and pair its result as the Ascend
    ``send_kvcache`` does."""
    outcome = StageOutcome(stage, start, end)
    source = _labels("K", range(start, end)) + _labels("V", range(start, end))
    target = decode_list(split, stage, start, end)
    kv_args = types.SimpleNamespace(
        prefill_start_layer=start, prefill_end_layer=end, prefill_pp_size=split.prefill_pp
    )  # what the prefill's _init_kv_manager sets for an MHA pool
    manager = types.SimpleNamespace(kv_args=kv_args, pp_size=split.prefill_pp, pp_rank=stage)
    function = run_alone(splitter.node, str(splitter.path))
    code = function.__code__

    def trace(frame, event, arg):
        if frame.f_code is code:
            if event == "line":
                outcome.lines.append(frame.f_lineno)
            return trace
        return None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = function(manager, source, target)
    except (AttributeError, NameError) as error:  # something the function alone does not have
        raise CannotEvaluate(f"{splitter.qualname} reads {error}, which the model does not give") from error
    except Exception as error:
        outcome.raised = f"{type(error).__name__}: {error}"
        return outcome
    finally:
        sys.settrace(previous)
    if not (isinstance(result, tuple) and len(result) == 5):
        raise CannotEvaluate(f"{splitter.qualname} returned {type(result).__name__}, not 5 values")
    src_k, src_v, dst_k, dst_v, count = result
    try:
        for layer in range(count):  # send_kvcache's MHA branch: K pairs, then V pairs
            outcome.pairs.append((src_k[layer], dst_k[layer]))
        for layer in range(count):
            outcome.pairs.append((src_v[layer], dst_v[layer]))
    except IndexError as error:
        outcome.raised = f"IndexError: {error} (pair {len(outcome.pairs)} of {outcome.buffers})"
    return outcome


def assignment_line(splitter: FunctionRef, outcome: StageOutcome, name: str) -> int | None:
    """The executed line that assigned ``name`` last (the branch the splitter took)."""
    executed = set(outcome.lines)
    lines = [
        node.lineno
        for node in ast.walk(splitter.node)
        if isinstance(node, ast.Assign)
        and node.lineno in executed
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return max(lines) if lines else None
