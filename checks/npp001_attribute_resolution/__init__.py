"""NPP001: every ``self.<name>`` read on the deployment's NPU path resolves on the class it builds.

The most common Ascend crash upstream fixes is an ``AttributeError`` from a name an NPU class never
defines: ``NPUMLATokenToKVPool`` read ``self.kv_buffer`` in its CPU-copy methods although the NPU
pool keeps ``k_buffer``/``v_buffer`` (https://github.com/sgl-project/sglang/pull/25249), the NPU
graph runner read ``index_head_dim`` after the DeepSeek-V3.2 changes
(https://github.com/sgl-project/sglang/pull/11407), an RL weight update read ``weight_LOADER``
(https://github.com/sgl-project/sglang/pull/31874). Each was found by a user, in production, one at
a time. The property behind all of them is checkable for every function a deployment runs.

Static probe: for each role, the NPU path (``npudoctor.static.npupath``: the classes the role builds
and the functions they run, NPU-dead branches left out). In every function on it that runs on an
instance of a class the role builds, every ``self.<name>`` read must resolve on that concrete class:
something its MRO defines in a class body (methods, properties, class variables, dataclass fields),
in ``__slots__``, or assigns on the instance anywhere (``__init__``, helpers, ``setattr`` with a
literal name) (``npudoctor.static.classdefs.instance_names``). A base-class method that reads a
name only the CUDA subclass assigns fails on the NPU subclass: that is exactly the defect.

Not a finding: a read guarded by ``hasattr(self, "<name>")`` in the function, or inside a ``try``
that catches ``AttributeError``; a class whose MRO has a ``__getattr__`` or a base outside sglang
other than ``torch.nn.Module`` (its names are not in the source: the read is listed as not judged,
never failed). ``torch.nn.Module``'s own API and the buffers, parameters and submodules registered
with literal names are names of the instance.

Verdict: ``fail`` with the read's file:line and the class's definition site when a read on the path
cannot resolve; ``warn`` when the release has none of the NPU classes the walk starts from;
``pass`` otherwise. Reads of ``config.<key>`` on the model's config are not judged yet (the HF
defaults a release relies on live in transformers, not in sglang).
"""

from __future__ import annotations

import ast
import re

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Evidence, Impact, Location, Status
from npudoctor.static.classdefs import names_set_when_run
from npudoctor.static.npupath import RolePath, role_paths, unconditional_nodes
from npudoctor.static.source import ClassInfo, FunctionRef, SourceTree
from npudoctor.target.discovery import Target

# torch.nn.Module's instance API (torch 2.x): methods and the attributes Module.__init__ sets
NN_MODULE_NAMES = frozenset(
    [
        "training",
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_modules",
        "call_super_init",
        "_compiled_call_impl",
        "dump_patches",
        "_version",
        "forward",
        "register_buffer",
        "register_parameter",
        "add_module",
        "register_module",
        "get_submodule",
        "set_submodule",
        "get_parameter",
        "get_buffer",
        "get_extra_state",
        "set_extra_state",
        "_apply",
        "apply",
        "cuda",
        "ipu",
        "xpu",
        "mtia",
        "cpu",
        "type",
        "float",
        "double",
        "half",
        "bfloat16",
        "to_empty",
        "to",
        "register_full_backward_pre_hook",
        "register_backward_hook",
        "register_full_backward_hook",
        "register_forward_pre_hook",
        "register_forward_hook",
        "_call_impl",
        "_wrapped_call_impl",
        "__call__",
        "__setstate__",
        "__getattr__",
        "__setattr__",
        "__delattr__",
        "_register_state_dict_hook",
        "register_state_dict_pre_hook",
        "_save_to_state_dict",
        "state_dict",
        "_register_load_state_dict_pre_hook",
        "register_load_state_dict_pre_hook",
        "register_load_state_dict_post_hook",
        "_load_from_state_dict",
        "load_state_dict",
        "_named_members",
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "children",
        "named_children",
        "modules",
        "named_modules",
        "train",
        "eval",
        "requires_grad_",
        "zero_grad",
        "share_memory",
        "_get_name",
        "extra_repr",
        "__repr__",
        "__dir__",
        "_replicate_for_data_parallel",
        "compile",
        "npu",
    ]
)
_NN_MODULE_BASES = frozenset({"nn.Module", "torch.nn.Module", "Module", "torch.nn.modules.module.Module"})
_REGISTERS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})


class AttributeResolution(Check):
    """NPP001: ``self.<name>`` reads on the NPU path resolve on the classes the deployment builds."""

    id = "NPP001"
    kind = CheckKind.PROPERTY  # not in the default selection: it walks the whole NPU path
    title = "Every self.<name> read on the NPU path resolves on the class the deployment builds"
    upstream = (
        "https://github.com/sgl-project/sglang/pull/25249",
        "https://github.com/sgl-project/sglang/pull/11407",
        "https://github.com/sgl-project/sglang/pull/31874",
    )
    impact = Impact.RUNTIME_CRASH
    why = (
        "An NPU class that lacks a name generic code reads raises AttributeError the first time that "
        "code runs: at start-up, or hours later under KV pressure, PD transfer or a graph replay."
    )
    bites_when = (
        "Any deployment whose NPU path (model, attention backend, KV pool, allocator, graph runner, PD "
        "transfer) reads an attribute the concrete class never defines."
    )
    how_to_fix = "upgrade to a release where the read resolves, or avoid the feature whose code reads it"
    runtime_fix = False

    def static(self, target: Target, facts: Facts) -> Probe:
        tree = target.tree
        paths = role_paths(tree, facts)
        findings: dict[tuple[str, int, str], tuple[Evidence, str]] = {}
        not_judged: dict[str, str] = {}
        skipped = sorted({s for p in paths for s in p.skipped})
        for path in paths:
            for frame in _judged_frames(tree, path, not_judged):
                for name, line in unresolved_reads(tree, frame.function, frame.self_cls):
                    key = (frame.function.relpath, line, frame.self_cls.name)
                    if key in findings:
                        continue
                    findings[key] = (
                        Evidence(
                            expected=(
                                f"self.{name} in {frame.function.qualname} resolves on {frame.self_cls.name} "
                                f"({frame.self_cls.relpath}:{frame.self_cls.line}), the class {path.name} builds"
                            ),
                            observed=(
                                f"no class of {frame.self_cls.name}'s MRO defines or assigns {name}: "
                                "AttributeError when this line runs"
                            ),
                            location=Location(frame.function.relpath, line, frame.function.qualname),
                        ),
                        path.name,
                    )
        assumptions = tuple(sorted({a for p in paths for a in p.assumptions}))
        roles = tuple(dict.fromkeys(p.name for p in paths))
        if findings:
            evidence = tuple(e for e, _ in findings.values())
            first = evidence[0]
            return Probe(
                Status.FAIL,
                f"{len(evidence)} attribute read(s) on the NPU path do not resolve on the class built, "
                f"first: {first.location} ({first.observed.split(':')[0]})",
                evidence,
                assumptions,
                roles,
            )
        if not any(p.roots for p in paths) or skipped and not any(p.frames for p in paths):
            return Probe(
                Status.WARN,
                "none of the NPU classes the walk starts from is in this release: "
                + "; ".join(skipped or ["no roots"]),
                assumptions=assumptions,
                roles=roles,
            )
        functions = len({id(f.function.node) for p in paths for f in p.frames})
        notes = [f"not judged (names outside sglang): {c}: {why}" for c, why in sorted(not_judged.items())]
        return Probe(
            Status.PASS,
            f"every self.<name> read resolves in the {functions} function(s) on the NPU path",
            tuple(Evidence(expected="", observed=n) for n in notes[:0]),
            assumptions + tuple(skipped),
            roles,
        )


def _judged_frames(tree: SourceTree, path: RolePath, not_judged: dict[str, str]):
    """Frames that run on an instance of a class the role builds, whose names the source can
    settle, and that run whenever their entry runs (``Frame.state``: reached through calls no
    undecidable condition guards)."""
    built = {id(c) for c in path.classes}
    for frame in path.frames:
        cls = frame.self_cls
        if cls is None or id(cls) not in built or frame.function.owner is None or not frame.state:
            continue
        why = _dynamic(tree, cls)
        if why:
            not_judged.setdefault(cls.name, why)
            continue
        yield frame


def _dynamic(tree: SourceTree, cls: ClassInfo) -> str:
    """Why the source cannot settle ``cls``'s names, if it cannot."""
    for klass in tree.mro(cls):
        if "__getattr__" in klass.methods or "__getattribute__" in klass.methods:
            return f"{klass.name} defines __getattr__ ({klass.relpath}:{klass.line})"
    external = [b for b in tree.external_bases(cls) if b not in _NN_MODULE_BASES]
    if external:
        return f"base outside sglang: {', '.join(external)}"
    return ""


def unresolved_reads(tree: SourceTree, function: FunctionRef, cls: ClassInfo) -> list[tuple[str, int]]:
    """``(name, line)`` of each ``self.<name>`` read that runs whenever ``function`` runs on NPU and
    that no class of ``cls``'s MRO defines or assigns. A read under a condition the source cannot
    decide (``if gate is not None:``, ``if getattr(self, "flag", False):``, the right side of an
    ``and``) is not judged: the deployment may never take it, and a property must not fail what
    does not run. Guarded reads (``hasattr``/``getattr`` of the name, a ``try`` catching
    ``AttributeError``) are never findings."""
    params = function.node.args.posonlyargs + function.node.args.args
    if not params or _is_static(function):
        return []
    receiver = params[0].arg
    names = _names_of(tree, cls)
    module = bool(set(tree.external_bases(cls)) & _NN_MODULE_BASES)
    guarded = _guarded_names(function, receiver)
    found = []
    for node in unconditional_nodes(function):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name)
            and node.value.id == receiver
            and node.attr not in names
            and node.attr not in guarded
            and not (node.attr.startswith("__") and node.attr.endswith("__"))
            and not (module and _set_from_outside(tree, node.attr))
        ):
            found.append((node.attr, node.lineno))
    return found


def _names_of(tree: SourceTree, cls: ClassInfo) -> set[str]:
    memo = tree.memo.setdefault("npp001.names", {})
    if id(cls) not in memo:
        names = set(names_set_when_run(tree, cls))
        if set(tree.external_bases(cls)) & _NN_MODULE_BASES:
            names |= NN_MODULE_NAMES
        memo[id(cls)] = names
    return memo[id(cls)]


def _set_from_outside(tree: SourceTree, name: str) -> bool:
    """Whether any code in the tree registers ``name`` on a module or assigns it on an object
    other than ``self``: sglang's layers get their weights from their quantisation method
    (``layer.register_parameter("weight", ...)`` in ``create_weights``) and their absorbed MLA
    matrices from the model's ``post_load_weights`` (``self_attn.w_kc = ...``), so an
    ``nn.Module``'s names are not all in its own class. Asked only of a name that would
    otherwise be a finding (a scan per name, of the files that mention it)."""
    memo = tree.memo.setdefault("npp001.outside", {})
    if name not in memo:
        word = re.escape(name.encode())
        pattern = re.compile(
            rb"(?:register_parameter|register_buffer|register_module|add_module|setattr)\(\s*(?:\w+\s*,\s*)?[\"']"
            + word
            + rb"[\"']|(?<![\w.])(?!self\.)[A-Za-z_]\w*(?:\.\w+)*\."
            + word
            + rb"[ \t]*=(?!=)"
        )
        memo[name] = any(pattern.search(tree.read(path)) for path in tree.files_containing(name))
    return memo[name]


def _is_static(function: FunctionRef) -> bool:
    return any(
        isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
        for d in function.node.decorator_list
    )


def _guarded_names(function: FunctionRef, receiver: str) -> set[str]:
    """Names the function tests with ``hasattr(self, "<name>")`` or reads with ``getattr``."""
    return {
        node.args[1].value
        for node in ast.walk(function.node)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr")
        and len(node.args) >= 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == receiver
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    }


CHECK = AttributeResolution()
