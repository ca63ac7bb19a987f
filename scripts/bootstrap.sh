#!/usr/bin/env bash
# Create .venv (once) and install npudoctor with its test extras into it, editable.
# Sourced by demo.sh and test.sh; safe to run again (pip skips what is installed).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NPUDOCTOR_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[test]"
# The live depth imports real sglang modules: their CPU dependency set, with the CPU torch pinned.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c "$repo/constraints-live.txt" -r "$repo/requirements-live.txt"
export PATH="$venv/bin:$PATH"
