#!/usr/bin/env bash
# The README's first command: install (once), fetch two real sglang releases from PyPI (once), run
# `npudoctor check` on the bundled DeepSeek-V3 PD deployment against both (static and live depth),
# then show the runtime-fix plan for the buggy one and the check with the fix applied.
# Prints each command as `$ ...` and what it says; the installs' own output goes to .venv/bootstrap.log.
#
# The demo checks copies of the releases of its own ($NPUDOCTOR_DEMO_DIR, else .cache/demo), made
# afresh on each run: the hints it prints (`npudoctor fix --apply --sglang-path ...`) write there,
# never into the release cache that the tests and `npudoctor advise` share (.cache/sglang), where a
# recorded fix would be applied in every later live run of that release.
# Sourced (`source scripts/demo.sh`), it defines its functions and runs nothing: the tests use them.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deployment=examples/deepseek-v3-pd.yaml

tree() {  # the demo's copy of a release, relative to the repository where it can be (80 columns)
  local fetched copy
  fetched="$(python "$repo/scripts/fetch_sglang.py" "$1")"
  copy="${NPUDOCTOR_DEMO_DIR:-$repo/.cache/demo}/$1"
  rm -rf "$copy"
  mkdir -p "$copy"
  cp -Rp "$fetched/sglang" "$fetched"/sglang-*.dist-info "$copy/"  # -p: the same fingerprint each run
  realpath --relative-base="$repo" "$copy"
}

show() {  # run a command as the user would type it; its exit code is the caller's to read
  echo
  echo "\$ $*"
  "$@"
}

main() {
  source "$repo/scripts/bootstrap.sh"
  cd "$repo"
  local version copy status buggy
  for version in 0.5.12 0.5.23; do
    copy="$(tree "$version")"
    [ "$version" != 0.5.12 ] || buggy="$copy"
    status=0
    show npudoctor check --sglang-path "$copy" --config "$deployment" || status=$?
    case "$status" in
      0) echo "(exit 0: no findings for sglang $version)" ;;
      1) echo "(exit 1: findings for sglang $version)" ;;
      *) echo "(exit $status: npudoctor could not check sglang $version)" >&2; exit "$status" ;;
    esac
  done
  show npudoctor fix --sglang-path "$buggy" --config "$deployment"
  show npudoctor check --sglang-path "$buggy" --config "$deployment" --select NPD001 --with-fix NPD001
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main
fi
