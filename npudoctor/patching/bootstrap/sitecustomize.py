"""Bootstrap of ``npudoctor run``: enable the run's runtime fixes in this interpreter.

``npudoctor run`` puts this directory first on ``PYTHONPATH``, so every Python process
the command starts, sglang's spawned scheduler processes included, imports this file at
start-up (the way ``opentelemetry-instrument`` and ``ddtrace-run`` work). Most of those
processes never import sglang (pip, compilers, helper scripts), so at start-up this file
imports nothing, not even npudoctor: it only puts a finder on ``sys.meta_path`` that, at the
first lookup of sglang, hands over to ``npudoctor.patching.activation.bootstrap()``, which arms the
post-import hooks that install the fixes when sglang's modules are imported. It never
raises, and then hands over to the ``sitecustomize`` it shadows, if there is one.
"""

import os
import sys

TARGET_PACKAGE = "sglang"


class _ArmAtFirstImport:
    """A ``sys.meta_path`` finder that finds nothing: it takes itself off the path and arms
    the fixes the first time sglang (or a submodule) is looked up."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == TARGET_PACKAGE or fullname.startswith(TARGET_PACKAGE + "."):
            # a new list: the lookup in progress iterates the old one, so it skips no finder
            sys.meta_path = [finder for finder in sys.meta_path if finder is not self]
            _enable_npudoctor_fixes()
        return None


def _enable_npudoctor_fixes():
    try:
        from npudoctor.patching.activation import bootstrap
    except Exception as error:  # npudoctor not importable in this interpreter
        sys.stderr.write(f"npudoctor: runtime fixes not applied: {type(error).__name__}: {error}\n")
        return
    try:
        bootstrap()
    except Exception as error:  # never break the import that triggered us
        sys.stderr.write(f"npudoctor: runtime fixes not applied: {type(error).__name__}: {error}\n")


def _run_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        directory = os.path.abspath(entry or os.getcwd())
        candidate = os.path.join(directory, "sitecustomize.py")
        if directory == here or not os.path.isfile(candidate):
            continue
        import importlib.util  # only when there is one to run

        try:
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as error:
            sys.stderr.write(f"npudoctor: {candidate} raised {type(error).__name__}: {error}\n")
        return


if TARGET_PACKAGE in sys.modules:  # a .pth file imported it already
    _enable_npudoctor_fixes()
else:
    sys.meta_path.insert(0, _ArmAtFirstImport())
_run_shadowed_sitecustomize()
