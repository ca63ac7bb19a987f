#!/usr/bin/env bash
# Create .venv (once) and install npudoctor with its test extras into it, editable.
# Sourced by demo.sh and test.sh; safe to run again (pip skips what is installed).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NPUDOCTOR_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"
# pip's own output (and the warnings a machine's pip configuration adds) goes to a log, shown
# only when an install fails: the README's commands print what the user needs to read.
log="$venv/bootstrap.log"
quietly() {
  if ! "$@" >>"$log" 2>&1; then
    echo "npudoctor: install failed: $*" >&2
    tail -n 40 "$log" >&2
    echo "npudoctor: the whole log: $log" >&2
    return 1
  fi
}
if [ ! -x "$venv/bin/python" ]; then
  echo "npudoctor: creating $venv (once)" >&2
  "$python" -m venv "$venv"
  : >"$log"
  quietly "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
fi
# What the installs depend on: the metadata, the dependency lists, this script, and the packages
# (each check folder is a package of the editable install). Unchanged since the last install: skip pip.
stamp="$venv/.npudoctor-bootstrap"
state="$(cd "$repo" && { cat pyproject.toml setup.py requirements-live.txt constraints-live.txt scripts/bootstrap.sh;
  find npudoctor checks fixes -name __init__.py | LC_ALL=C sort; } | sha256sum)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$state" ]; then
  echo "npudoctor: installing npudoctor and the live depth's CPU dependencies into $venv (log: $log)" >&2
  quietly "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[test]"
  # The live depth imports real sglang modules: their CPU dependency set, with the CPU torch pinned.
  quietly "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$repo/constraints-live.txt" -r "$repo/requirements-live.txt"
  echo "$state" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
