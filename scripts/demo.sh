#!/usr/bin/env bash
# The README's first command: install (once), fetch two real sglang releases from PyPI (once), run
# `npudoctor check` on the bundled DeepSeek-V3 PD deployment against both (static and live depth),
# then show the runtime-fix plan for the buggy one and the check with the fix applied.
# Prints each command as `$ ...` and what it says; the installs' own output goes to .venv/bootstrap.log.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
deployment=examples/deepseek-v3-pd.yaml

tree() {  # the unpacked release, as a path relative to the repository (short enough for 80 columns)
  local fetched
  fetched="$(python scripts/fetch_sglang.py "$1")"
  realpath --relative-to="$repo" "$fetched"
}

show() {  # run a command as the user would type it; its exit code is the caller's to read
  echo
  echo "\$ $*"
  "$@"
}

for version in 0.5.12 0.5.23; do
  status=0
  show npudoctor check --sglang-path "$(tree "$version")" --config "$deployment" || status=$?
  case "$status" in
    0) echo "(exit 0: no findings for sglang $version)" ;;
    1) echo "(exit 1: findings for sglang $version)" ;;
    *) echo "(exit $status: npudoctor could not check sglang $version)" >&2; exit "$status" ;;
  esac
done
buggy="$(tree 0.5.12)"
show npudoctor fix --sglang-path "$buggy" --config "$deployment"
show npudoctor check --sglang-path "$buggy" --config "$deployment" --select NPD001 --with-fix NPD001
