#!/usr/bin/env bash
# The main job: train a tool-using search agent end to end.
#
#   bash speedrun.sh                  on a machine without NVIDIA GPUs: the tiny CPU speedrun (GRPO)
#   bash speedrun.sh grpo             on a GPU box: the full HotpotQA pipeline on verl
#   bash speedrun.sh ALGO [--scale tiny|full] [--dry-run] [--seed N] [--out DIR]
#   bash speedrun.sh --help           every option
#
# ALGO is one of grpo, ppo, reinforce_pp, rloo, steppo. The first run sets up .venv (a minute or two);
# later runs skip the set-up. Results go to runs/<time>-<scale>-<algo>-s<seed>/ (report.md, logs, checkpoints).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/lib.sh"

# Reject bad input before any set-up, with the interpreter the environment is (or will be) made from.
if [ -x "$AR1_VENV/bin/python" ] && [ -z "${PYTHON:-}" ]; then
  py=$AR1_VENV/bin/python; ar1_check_python "$py"
else
  py=$(ar1_base_python)
fi
for a in "$@"; do
  case "$a" in -h|--help) exec "$py" "$AR1_ROOT/scripts/speedrun.py" --help ;; esac
done
scale=$("$py" "$AR1_ROOT/scripts/speedrun.py" --print-scale "$@") || exit $?

# The tiny run needs the core environment; the full run's GPU environment lands with the verl chapter,
# and until then its stages report themselves as not built from the core environment.
bash "$AR1_ROOT/scripts/setup.sh" core
cd "$AR1_ROOT"
exec "$AR1_VENV/bin/python" scripts/speedrun.py "$@"
