"""The ``Fix`` base class: an upstream fix ported as a runtime override, and when to apply it.

A fix is the runtime side of one check (same id, one module in ``npudoctor/fixes/``, the
repo's ``fixes/``, defining ``FIX = SomeFix()``). It names the functions it replaces
(``replaces``) and the code its replacements rely on (``anchors``), the upstream pull
request it ports and its safety. Before anything is patched, ``npudoctor.service.planning.decide`` asks two
questions of the target:

1. does the target have the defect? The fix's own check must say ``fail`` for the deployment
   (its verdict at the depth asked, ``auto`` by default: the one ``npudoctor check`` gives; a
   release without the defect gets no patch: "not needed");
2. is the code the shape the fix was written for? The *shape* is a fingerprint of every
   replaced and anchor function as the target resolves it (through the class MRO, so an
   inherited method counts), hashed from its normalised ``ast`` (formatting, comments
   and docstrings do not count). It must equal the shape of a release the fix was
   written and tested against (``written_for``); any other shape is refused with the
   functions that differ.

The processes that patch (sglang plugin, ``npudoctor run`` bootstrap, the live child)
recompute the shape from the imported code and patch only if it still equals the one
``decide`` accepted, so an sglang upgraded after ``npudoctor fix --apply`` is left alone.

Which of the ``replaces`` sites are installed is asked of the code too (``installs``): all of
them by default; a fix whose sites upstream repaired one release at a time skips the ones the
code already gets right (sglang 0.5.14 widened one NPU pool's offload signature, 0.5.15 the
other), so ``decide``, the record and the patching process install exactly the sites that
need it. A replacement that only has to run the code it replaces differently (a wider
signature around the same body) is marked ``calls_original`` and receives that original.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from npudoctor.static.source import FunctionNode, SourceTree, body_without_docstring

if TYPE_CHECKING:
    from npudoctor.engine.check import Check

MISSING = "missing"  # the shape of a site that does not exist in the target
_Replacement = TypeVar("_Replacement", bound=Callable)


def calls_original(replacement: _Replacement) -> _Replacement:
    """Mark a replacement that runs the implementation it replaces.

    It is called as ``replacement(original, self, *args, **kwargs)``, ``original`` being the
    replaced function bound to the instance; callers, and ``inspect.signature``, see the rest
    of its signature (``npudoctor.patching.activation`` installs it that way)."""
    replacement.calls_original = True  # type: ignore[attr-defined]
    return replacement


class Safety(str, enum.Enum):
    SAFE = "safe"  # only adds a missing method or widens a signature
    UNSAFE = "unsafe"  # changes the behaviour of code that runs today


@dataclass(frozen=True)
class Site:
    """``module:Qual.name``: a module-level function or a class attribute, resolved through the MRO."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: str) -> Site:
        module, _, qualname = text.partition(":")
        return cls(module, qualname)

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


class Fix:
    """Base of every fix. Subclasses set the metadata and ``implementations``."""

    id: ClassVar[str]
    title: ClassVar[str]
    upstream: ClassVar[str | None]  # the pull request the replacements port; None: nothing is ported
    # Where no upstream pull request fixes the defect (it still ships in the newest release), the
    # replacement is npudoctor's own: the property it restores and the releases it serves.
    own: ClassVar[str] = ""
    safety: ClassVar[Safety]
    replaces: ClassVar[tuple[str, ...]]  # "module:Class.method" sites the fix installs
    anchors: ClassVar[tuple[str, ...]] = ()  # further sites the replacements rely on (fingerprinted only)
    # release -> {site: shape}: the code each release ships, read from the real wheels.
    written_for: ClassVar[dict[str, dict[str, str]]]

    def implementations(self) -> dict[str, Callable]:
        """``{site: replacement}`` for every site in ``replaces``; called in the patching process."""
        raise NotImplementedError

    def installs(self, functions: dict[str, FunctionNode | None]) -> tuple[str, ...]:
        """The sites of ``replaces`` to install in code whose sites (replaced and anchors) are
        ``functions`` (each as the target resolves it, None where absent): every one by default.
        Asked only of a shape ``written_for`` knows; a fix overrides it when some of its sites
        are already right in some of those releases."""
        return self.replaces

    def installs_in_source(self, tree: SourceTree) -> tuple[str, ...]:
        """``installs`` for the target's source files (no import)."""
        return self.installs({str(site): _static_node(tree, site) for site in self.sites})

    def installs_in_modules(self) -> tuple[str, ...]:
        """``installs`` for the imported modules (in the patching process)."""
        return self.installs({str(site): _live_node(site) for site in self.sites})

    @property
    def provenance(self) -> str:
        """Where the replacements come from: the upstream pull request they port, and the part
        that is npudoctor's own (no upstream fix to port)."""
        parts = [f"port of {self.upstream}"] if self.upstream else []
        if self.own:
            parts.append(f"npudoctor's own fix (no upstream pull request): {self.own}")
        return "; ".join(parts)

    @property
    def sites(self) -> tuple[Site, ...]:
        return tuple(Site.parse(s) for s in self.replaces + self.anchors)

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.module for s in self.sites))

    @property
    def check(self) -> Check:
        from npudoctor.engine.registry import all_checks

        return next(c for c in all_checks() if c.id == self.id)

    def shape_of_source(self, tree: SourceTree) -> dict[str, str]:
        """The shape of every site as the target's source files define it (no import)."""
        return {str(site): _static_shape(tree, site) for site in self.sites}

    def shape_of_modules(self) -> dict[str, str]:
        """The shape of every site as the imported modules define it (in the patching process)."""
        return {str(site): _live_shape(site) for site in self.sites}

    def known_release(self, shape: dict[str, str]) -> str | None:
        """The releases whose code has exactly this shape, if any."""
        matches = [release for release, known in self.written_for.items() if known == shape]
        return ", ".join(matches) if matches else None

    def differences(self, shape: dict[str, str]) -> list[str]:
        """Sites whose shape matches no release this fix was written for."""
        return [
            site
            for site, value in shape.items()
            if all(known.get(site) != value for known in self.written_for.values())
        ]


def all_fixes() -> list[Fix]:
    """Every fix module in ``npudoctor.fixes``, ordered by id."""
    from npudoctor.engine.registry import discover

    return discover("npudoctor.fixes", "FIX", Fix)


def fix_by_id(fix_id: str) -> Fix:
    """The fix with this id, importing only its own module (``npdXXX_*``)."""
    from npudoctor.engine.registry import module_names

    for name in module_names("npudoctor.fixes", prefix=fix_id.lower() + "_"):
        fix = getattr(importlib.import_module(name), "FIX", None)
        if isinstance(fix, Fix) and fix.id == fix_id:
            return fix
    raise KeyError(f"no fix module for {fix_id}")


def shape_of_node(node: FunctionNode) -> str:
    """A short hash of a function's normalised ``ast``: no positions, comments or docstring."""
    node = _without_docstring(node)
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


def _without_docstring(node: FunctionNode) -> FunctionNode:
    body = body_without_docstring(node)
    if len(body) != len(node.body):
        node = ast.parse(ast.unparse(node)).body[0]  # a copy, the tree's node stays intact
        node.body = body_without_docstring(node) or [ast.Pass()]
    return node


def _static_shape(tree: SourceTree, site: Site) -> str:
    node = _static_node(tree, site)
    return MISSING if node is None else shape_of_node(node)


def _static_node(tree: SourceTree, site: Site) -> FunctionNode | None:
    """The ``def`` of ``site`` in the target's source (through the MRO for a method), or None."""
    path = tree.module_path(site.module)
    if path is None:
        return None
    owner, _, name = site.qualname.rpartition(".")
    if not owner:
        module = tree.parse(path)
        found = [
            n
            for n in (module.body if module else [])
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ]
        return found[-1] if found else None
    classes = [c for c in tree.classes_in(path) if c.name == owner]
    if not classes:
        return None
    method = tree.lookup(tree.mro(classes[-1]), name)
    return method.node if method else None


def _live_shape(site: Site) -> str:
    node = _live_node(site)
    return MISSING if node is None else shape_of_node(node)


def _live_node(site: Site) -> FunctionNode | None:
    """The ``def`` of ``site`` as the imported module has it (the original's, where a fix is
    installed: ``inspect.getsource`` unwraps), or None."""
    module = sys.modules.get(site.module) or importlib.import_module(site.module)
    owner, _, name = site.qualname.rpartition(".")
    scope = module
    for part in owner.split(".") if owner else ():
        scope = getattr(scope, part, None)
        if scope is None:
            return None
    if isinstance(scope, type):
        definer = next((k for k in scope.__mro__ if name in vars(k)), None)
        function = vars(definer)[name] if definer is not None else None
    else:
        function = vars(scope).get(name)
    function = getattr(function, "__func__", function)
    if function is None or not inspect.isfunction(function):
        return None
    source = textwrap.dedent(inspect.getsource(function))
    return ast.parse(source).body[0]  # type: ignore[return-value]
