#!/usr/bin/env bash
# The README's first command: install, fetch two real sglang releases from PyPI, and run
# `npudoctor check` on the bundled DeepSeek-V3 PD deployment against both.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
for version in 0.5.12 0.5.23; do
  tree="$(python scripts/fetch_sglang.py "$version")"
  echo "== npudoctor check --sglang-path $tree --config examples/deepseek-v3-pd.yaml"
  status=0
  npudoctor check --sglang-path "$tree" --config examples/deepseek-v3-pd.yaml || status=$?
  case "$status" in
    0) echo "exit 0: no findings for sglang $version" ;;
    1) echo "exit 1: findings for sglang $version (see above)" ;;
    *) echo "exit $status: npudoctor could not check sglang $version" >&2; exit "$status" ;;
  esac
done
