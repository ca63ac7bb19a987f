#!/usr/bin/env bash
# The README's first command: install, fetch two real sglang releases from PyPI, run
# `npudoctor check` on the bundled DeepSeek-V3 PD deployment against both (static and live
# depth), then show the runtime-fix plan for the buggy one and the check with the fix applied.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/bootstrap.sh"
cd "$repo"
deployment=examples/deepseek-v3-pd.yaml
for version in 0.5.12 0.5.23; do
  tree="$(python scripts/fetch_sglang.py "$version")"
  echo "== npudoctor check --sglang-path $tree --config $deployment"
  status=0
  npudoctor check --sglang-path "$tree" --config "$deployment" || status=$?
  case "$status" in
    0) echo "exit 0: no findings for sglang $version" ;;
    1) echo "exit 1: findings for sglang $version (see above)" ;;
    *) echo "exit $status: npudoctor could not check sglang $version" >&2; exit "$status" ;;
  esac
done
tree="$(python scripts/fetch_sglang.py 0.5.12)"
echo "== npudoctor fix --sglang-path $tree --config $deployment   (the plan; changes nothing)"
npudoctor fix --sglang-path "$tree" --config "$deployment"
echo "== npudoctor check --select NPD001 --with-fix NPD001 ...   (the live probe with the runtime fix applied)"
npudoctor check --sglang-path "$tree" --config "$deployment" --select NPD001 --with-fix NPD001
