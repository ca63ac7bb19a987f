"""Helpers the tests share, importable as ``support.<module>`` (``tests/`` is on ``sys.path``:
pytest's default ``prepend`` import mode puts the directory of ``tests/conftest.py`` there, in
every xdist worker too). Fixtures stay in ``tests/conftest.py``; ``fixprobe.py`` is a script the
``fixprobe`` helper runs in a fresh interpreter, not a module to import.

* ``repo``: the repository's root, its example deployments, ``scripts/fetch_sglang.py``;
* ``truths``: the verified truths of ``tests/data/known.yaml`` and how to read them;
* ``trees``: overlay copies of release trees, the edits tests make to them, synthetic states, a
  release installed by pip with torch beside it;
* ``patches``: unified diffs applied strictly (no offset, no fuzz) to an overlay copy of a release
  tree: the dry run's mutants of ``tests/data/dryrun/mutants/``;
* ``reports``: a ``check`` JSON report through the ``cli`` fixture, one check's result in it;
* ``filesystem``: directory states a test needs (one nothing can be written in, root included).

A helper only one check's tests use lives beside them (``tests/checks/<id>/<id>_support.py``).
"""
