#!/usr/bin/env bash
# The README's second command (and CI's): install npudoctor[test] into .venv and run the test suite
# against real sglang releases (fetched from PyPI into .cache/sglang on first use), on every core
# (pytest-xdist, --dist loadgroup: the live runs of one release go to one worker, whose zygote
# imports that sglang once). Each sweep over the releases runs at its newest state; `--full` runs
# every state. Extra arguments go to pytest: `./scripts/test.sh -m "not slow"` is the quick tier,
# `./scripts/test.sh --full` the whole suite.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
status=0
python -m pytest -q -n auto --dist loadgroup "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
