"""Bootstrap of ``npudoctor run``: enable the run's runtime fixes in this interpreter.

``npudoctor run`` puts this directory first on ``PYTHONPATH``, so every Python process
the command starts, sglang's spawned scheduler processes included, imports this file at
start-up (the way ``opentelemetry-instrument`` and ``ddtrace-run`` work). It only arms
post-import hooks; the fixes are installed when sglang's modules are imported. It never
raises, and then hands over to the ``sitecustomize`` it shadows, if there is one.
"""

import os
import sys


def _enable_npudoctor_fixes():
    try:
        from npudoctor.activation import bootstrap
    except Exception as error:  # npudoctor not importable in this interpreter
        sys.stderr.write(f"npudoctor: runtime fixes not applied: {type(error).__name__}: {error}\n")
        return
    bootstrap()


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


_enable_npudoctor_fixes()
_run_shadowed_sitecustomize()
