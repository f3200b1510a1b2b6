#!/usr/bin/env bash
# Build the docs site offline from the notebooks into _docs/ (and README.md from nbs/index.ipynb).
#
# usage: bash scripts/docs.sh [--serve [PORT]] [--out DIR]
#   --serve [PORT]  after building, serve the site on http://127.0.0.1:PORT (default 8000)
#   --out DIR       build into DIR instead of _docs
# Where Quarto is installed, `nbdev-docs` builds the same project with Quarto instead.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for a in "$@"; do case "$a" in -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac; done
bash "$AR1_ROOT/scripts/setup.sh" dev
cd "$AR1_ROOT"
exec "$AR1_VENV/bin/python" scripts/build_docs.py --readme "$@"
