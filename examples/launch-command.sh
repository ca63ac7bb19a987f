#!/bin/sh
# The deployment given as the launch command itself, instead of a YAML file: put your exact
# `python -m sglang.launch_server ...` line (with its VAR=value prefix) after `npudoctor check --`.
# npudoctor reads the model's config.json from --model-path (a local directory, never a hub id),
# the server args from the flags and ASCEND_*/SGLANG_*/HCCL_* variables from the prefix and from
# your environment; flags it does not need (--host, --port, ...) are kept, never rejected.
#
# Here: a Qwen3-30B-A3B PD decode server with the FIA kernels (ASCEND_USE_FIA=1), the case of
# NPD002 (transfer item lengths) and, on the decode side, NPD001/NPD005 (retract offload).
# Extra npudoctor options go first, e.g.:
#   examples/launch-command.sh --sglang-path "$(python scripts/fetch_sglang.py 0.5.9)" --depth static
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec npudoctor check "$@" -- \
  ASCEND_USE_FIA=1 python -m sglang.launch_server \
    --model-path "$here/models/qwen3-30b-a3b" \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend ascend \
    --tp-size 4 \
    --host 0.0.0.0 --port 30000 --trust-remote-code --mem-fraction-static 0.8
