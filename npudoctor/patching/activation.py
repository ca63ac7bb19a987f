"""Install the enabled fixes in a running interpreter, and take them out again.

This module runs inside sglang's processes (through the sglang plugin entry point or
the ``npudoctor run`` bootstrap), so it imports nothing heavy at import time and never
breaks its host: every failure is written once to stderr and the process goes on
unpatched. ``NPUDOCTOR_DISABLE_FIXES=1`` turns every fix off.

A *plan* is ``{fix id: shape}`` as ``npudoctor.service.planning.decide`` accepted it (``npudoctor.patching.planfile``). ``enable(plan)``
registers a post-import hook (wrapt) on each fix's modules; when the last of them is
imported, the shape of the imported code is compared with the planned one and, only if
they are equal, each site the fix installs in that code (``Fix.installs``) is wrapped with
``wrapt.wrap_object``: a function wrapper that calls the replacement, with the replacement's
signature as its visible one (wrapt's adapter), so ``inspect.signature`` of the patched
method says what now binds rather than what the original accepted (a fix that widens a
signature is judged by that). A replacement marked ``calls_original`` gets the original,
bound to the instance, as its first argument. ``revert()`` removes exactly those wrappers
with ``wrapt.unwrap_object``, which restores the original attribute where it was defined,
or deletes one the fix added.

The ``npudoctor run`` bootstrap (``npudoctor/patching/bootstrap/sitecustomize.py``) runs at every
interpreter start, most of which never import sglang (pip, compilers, helper scripts): it
only puts a finder on ``sys.meta_path`` that calls ``bootstrap()`` at the first lookup of
sglang, so importing this module and wrapt (which imports asyncio) and reading the plan cost
nothing anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping

KILL_SWITCH = "NPUDOCTOR_DISABLE_FIXES"
RUN_PLAN = "NPUDOCTOR_RUN_PLAN"  # set by `npudoctor run`: path of the plan its bootstrap applies

_lock = threading.RLock()
# fix id -> the wrappers it installed, as (owner, attribute, wrapt handle)
_installed: dict[str, list[tuple[object, str, object]]] = {}
_outcomes: dict[str, str] = {}  # fix id -> "applied" or why not
_said: set[str] = set()


def disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (this process's environment) turns every fix off."""
    environ = os.environ if environ is None else environ
    return environ.get(KILL_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def say_once(message: str) -> None:
    """One line on stderr per distinct message and process; never raises."""
    message = " ".join(str(message).split())  # one line, whatever an exception's text holds
    if message in _said:
        return
    _said.add(message)
    with contextlib.suppress(Exception):  # a closed stderr must not break the host either
        sys.stderr.write(f"npudoctor: {message}\n")


def enable(plan: dict[str, dict[str, str]]) -> None:
    """Arm every fix of ``plan``: it is applied as soon as its sglang modules are imported."""
    if disabled():
        say_once(f"{KILL_SWITCH} is set: no runtime fix is applied")
        return
    try:
        import wrapt
    except Exception as error:
        say_once(f"runtime fixes not applied: wrapt does not import ({error})")
        return
    for fix_id, shape in plan.items():
        # the sites are "module:Qual.name": the modules come from the plan, no fix module is
        # imported before sglang is
        modules = tuple(dict.fromkeys(site.partition(":")[0] for site in shape))
        for module in modules:
            wrapt.register_post_import_hook(_hook(fix_id, shape, modules), module)


def outcomes() -> dict[str, str]:
    """What became of each fix enabled in this process so far."""
    return dict(_outcomes)


def revert(fix_ids: list[str] | None = None) -> list[str]:
    """Remove the wrappers of ``fix_ids`` (all by default); returns the ids reverted."""
    import wrapt

    done = []
    with _lock:
        for fix_id in list(fix_ids or _installed):
            wrappers = _installed.pop(fix_id, None)
            if wrappers is None:
                continue
            for owner, name, handle in reversed(wrappers):
                wrapt.unwrap_object(owner, name, handle, missing_ok=True)
            _outcomes[fix_id] = "reverted"
            done.append(fix_id)
    return done


def sglang_plugin() -> None:
    """Entry point of the ``sglang.srt.plugins`` group: enable what ``npudoctor fix --apply`` recorded."""
    try:
        from npudoctor.patching.planfile import installed_plan

        enable(installed_plan())
    except Exception as error:
        say_once(f"runtime fixes not applied: {type(error).__name__}: {error}")


def bootstrap() -> None:
    """Called by the ``sitecustomize`` of ``npudoctor run`` at the first lookup of sglang, before
    any of its modules is imported: enable the run's plan."""
    path = os.environ.get(RUN_PLAN)
    if not path:
        return
    if disabled():
        say_once(f"{KILL_SWITCH} is set: no runtime fix is applied")
        return
    from npudoctor.patching.planfile import (
        read_file,  # here, as in sglang_plugin: importing this module reads no plan
    )

    try:
        enable(read_file(path))
    except Exception as error:
        say_once(f"runtime fixes not applied: cannot read {path}: {type(error).__name__}: {error}")


def _hook(fix_id: str, shape: dict[str, str], modules: tuple[str, ...]):
    def on_import(_module) -> None:
        if all(name in sys.modules for name in modules):
            try:
                _apply(fix_id, shape)
            except Exception as error:  # never break the import that triggered us
                _outcomes[fix_id] = f"failed: {type(error).__name__}: {error}"
                say_once(f"{fix_id} not applied: {type(error).__name__}: {error}")

    return on_import


def _apply(fix_id: str, shape: dict[str, str]) -> None:
    """Wrap every replaced site of ``fix_id`` if the imported code still has ``shape``."""
    import wrapt

    from npudoctor.patching.fixbase import Site, fix_by_id

    with _lock:
        if fix_id in _installed:
            return  # idempotent: already in place in this process
        fix = fix_by_id(fix_id)
        current = fix.shape_of_modules()
        if current != shape:
            changed = sorted(site for site in shape if current.get(site) != shape[site])
            _outcomes[fix_id] = (
                f"refused: the imported code changed since the fix was planned ({', '.join(changed)})"
            )
            say_once(f"{fix_id} not applied: {_outcomes[fix_id]}")
            return
        installed: list[tuple[object, str, object]] = []
        wanted = fix.installs_in_modules()
        try:
            for site_text, replacement in fix.implementations().items():
                if site_text not in wanted:
                    continue  # already right in this code
                site = Site.parse(site_text)
                owner_path, _, name = site.qualname.rpartition(".")
                owner = sys.modules[site.module]
                for part in owner_path.split(".") if owner_path else ():
                    owner = getattr(owner, part)
                handle = wrapt.wrap_object(owner, name, _wrapper_of, (replacement,))
                installed.append((owner, name, handle))
        except Exception:
            for owner, name, handle in reversed(installed):
                wrapt.unwrap_object(owner, name, handle, missing_ok=True)
            raise
        _installed[fix_id] = installed
        _outcomes[fix_id] = "applied"


def _wrapper_of(original, replacement):
    """The wrapt function wrapper installed in place of ``original``: it calls ``replacement``,
    and shows the replacement's signature to introspection."""
    import wrapt

    return wrapt.decorator(_replacing(replacement), adapter=_visible(replacement))(original)


def _replacing(replacement):
    """A wrapt wrapper that calls the fixed implementation instead of the wrapped one."""
    takes_original = getattr(replacement, "calls_original", False)

    def wrapper(wrapped, instance, args, kwargs):
        if instance is None:  # called through the class: Cls.method(obj, ...)
            if takes_original and args:
                import functools

                return replacement(functools.partial(wrapped, args[0]), *args, **kwargs)
            return replacement(*args, **kwargs)
        if takes_original:
            return replacement(wrapped, instance, *args, **kwargs)
        return replacement(instance, *args, **kwargs)

    return wrapper


def _visible(replacement):
    """What callers see of ``replacement``: itself, or, for one that ``calls_original``, its
    signature without that first parameter."""
    if not getattr(replacement, "calls_original", False):
        return replacement
    import inspect  # here, not at import: the `npudoctor run` bootstrap imports this module everywhere

    signature = inspect.signature(replacement)

    def adapter(*args, **kwargs):  # never called: only its signature is read
        raise NotImplementedError

    adapter.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    adapter.__name__, adapter.__qualname__ = replacement.__name__, replacement.__qualname__
    return adapter
