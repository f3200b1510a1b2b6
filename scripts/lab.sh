#!/usr/bin/env bash
# Set up the notebook environment and open JupyterLab on nbs/ (widgets included).
#
# usage: bash scripts/lab.sh [JUPYTER_LAB_ARGS...]   e.g. bash scripts/lab.sh --no-browser --port 8888
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for a in "$@"; do case "$a" in -h|--help) sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac; done
bash "$AR1_ROOT/scripts/setup.sh" dev
cd "$AR1_ROOT"
# in a container one often is root, and JupyterLab refuses root unless told it is meant
root_ok=()
[ "$(id -u)" = 0 ] && root_ok=(--allow-root)
exec "$AR1_VENV/bin/jupyter" lab --notebook-dir="$AR1_ROOT/nbs" ${root_ok[@]+"${root_ok[@]}"} "$@"
