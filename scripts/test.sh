#!/usr/bin/env bash
# The README's second command (and CI's): install npudoctor[test] into .venv and run the test suite
# against real sglang releases (fetched from PyPI into .cache/sglang on first use), on every core
# (pytest-xdist, --dist loadgroup: the live runs of one release go to one worker, whose zygote
# imports that sglang once). Each sweep over the releases runs at its newest state; `--full` runs
# every state. Extra arguments go to pytest: `./scripts/test.sh -m "not slow"` is the quick tier,
# `./scripts/test.sh --full` the whole suite.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The releases the suite reads (every one the catalog's ranges are derived over: 0.4.10 to the
# newest, post-releases included, ~45 wheels) are fetched several at once, while the venv is
# installed: one after another, inside the tests, they cost minutes on a clean clone. The script
# is stdlib only; it needs a pip to download with (else the venv's, once it is there). Whatever
# it cannot fetch the tests fetch themselves, and say why when they cannot either. A run given
# other arguments (a tier, a selection) fetches only what its tests ask for.
python="${PYTHON:-python3}"
fetched="$(mktemp)"
trap 'rm -f "$fetched"' EXIT
prefetch() { "$1" "$repo/scripts/fetch_sglang.py" --published-since 0.4.10 --jobs 6 >/dev/null 2>"$fetched"; }
ahead=no fetching=""
if [ "$#" -eq 0 ] || [ "$*" = "--full" ]; then
  ahead=yes
  if "$python" -m pip --version >/dev/null 2>&1; then
    prefetch "$python" &
    fetching=$!
  fi
fi
source "$repo/scripts/bootstrap.sh"
cd "$repo"
if [ "$ahead" = yes ] && [ -z "$fetching" ]; then
  prefetch python &
  fetching=$!
fi
if [ -n "$fetching" ] && ! wait "$fetching"; then
  echo "npudoctor: fetching the releases ahead failed (the tests fetch what they need):" >&2
  tail -n 5 "$fetched" >&2
fi
status=0
python -m pytest -q -n auto --dist loadgroup "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
