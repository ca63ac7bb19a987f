"""What pyproject.toml cannot say: the check and fix folders install inside npudoctor.

``checks/`` and ``fixes/`` sit at the repository's top level and install as ``npudoctor.checks``
and ``npudoctor.fixes``; every folder of ``checks/`` (one per check) is a subpackage of
``npudoctor.checks``, found here, so adding a check is adding a folder and nothing else.
``npudoctor.patching.bootstrap`` holds the ``sitecustomize.py`` of ``npudoctor run`` (put on PYTHONPATH,
never imported); ``npudoctor/data/server_args.json`` the ServerArgs history of every release;
``npudoctor/data/requirements-live.txt`` and ``constraints-live.txt`` what the live depth imports sglang
with (the repository's top-level files of those names link to them), shipped so that the install
command npudoctor prints names files that exist.
"""

from setuptools import find_packages, setup

setup(
    package_dir={
        "npudoctor": "npudoctor",
        "npudoctor.checks": "checks",
        "npudoctor.fixes": "fixes",
        "npudoctor.catalog": "catalog",
    },
    packages=[
        *find_packages(include=["npudoctor", "npudoctor.*"]),  # the engine's packages
        "npudoctor.patching.bootstrap",
        "npudoctor.fixes",
        "npudoctor.checks",
        "npudoctor.catalog",
        *(f"npudoctor.checks.{name}" for name in find_packages(where="checks")),
    ],
    # every release's ServerArgs fields and flags (scripts/server_args_history.py writes it); the live
    # depth's requirements and constraints (`npudoctor env` and the live depth print their paths)
    package_data={"npudoctor": ["data/*.json", "data/*.txt"], "npudoctor.catalog": ["*.yaml", "README.md"]},
)
