#!/usr/bin/env bash
# The main job: train a tool-using search agent end to end.
#
#   bash speedrun.sh                  on a machine without NVIDIA GPUs: the tiny CPU speedrun (GRPO)
#   bash speedrun.sh grpo             on a GPU box: the full HotpotQA pipeline on verl
#   bash speedrun.sh grpo --engine verl   anywhere: the tiny speedrun with verl's own trainer on this CPU
#   bash speedrun.sh --task textworld     without GPUs: a tiny agent for TextWorld's coin collector (chapter 11a)
#   bash speedrun.sh ALGO [--scale tiny|full] [--dry-run] [--seed N] [--out DIR]
#   bash speedrun.sh --help           every option
#
# ALGO is one of grpo, ppo, reinforce_pp, rloo, steppo. The first run sets up .venv (a minute or two);
# later runs skip the set-up. Results go to runs/ (report.md, logs, checkpoints): tiny runs to
# runs/tiny-<task>-<algo>-s<seed>/ and full runs to runs/full-<algo>-s<seed>/, both resumed when started again.
# The full run checks the machine first (scripts/preflight.py), then builds the pinned GPU stack in .venv-gpu
# (scripts/setup_gpu.sh); `--dry-run` does everything that needs no GPU. Full-scale options: --help.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/lib.sh"
export AR1_CALLER_DIR="${AR1_CALLER_DIR:-$PWD}"  # where --agent's relative paths and modules are found

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
needs_verl=$("$py" "$AR1_ROOT/scripts/speedrun.py" --print-needs-verl "$@") || exit $?
needs_games=$("$py" "$AR1_ROOT/scripts/speedrun.py" --print-needs-games "$@") || exit $?

dry=0
for a in "$@"; do
  case "$a" in --dry-run) dry=1 ;; esac
done

# The full run on a GPU box: preflight checks first (standard library only), then the pinned GPU environment
# (.venv-gpu, separate from .venv), then the pipeline inside it.
if [ "$scale" = full ] && [ "$dry" = 0 ]; then
  "$py" "$AR1_ROOT/scripts/speedrun.py" --preflight-only "$@" || exit 1
  AR1_GPU_GAMES=$needs_games bash "$AR1_ROOT/scripts/setup_gpu.sh"
  cd "$AR1_ROOT"
  exec "${AR1_GPU_VENV:-$AR1_ROOT/.venv-gpu}/bin/python" scripts/speedrun.py "$@"
fi

# The tiny run and the full dry run use the core environment. The dry run validates verl's configuration and
# `--engine verl` runs verl's trainer on this CPU, so both need verl's CPU build there (the [verl] extra; the dev
# profile already has it).
bash "$AR1_ROOT/scripts/setup.sh" core
if [ "$needs_verl" = yes ] && ! "$AR1_VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("verl") is None)'; then
  ar1_say "installing verl's CPU build (agent_r1_tutorial[verl]) into $AR1_VENV; the log is $AR1_VENV/setup.log"
  "$AR1_VENV/bin/python" -m pip install --progress-bar off -e "$AR1_ROOT[verl]" >>"$AR1_VENV/setup.log" 2>&1 ||
    { tail -n 20 "$AR1_VENV/setup.log" >&2; ar1_die "installing verl failed; see $AR1_VENV/setup.log"; }
fi
if [ "$needs_games" = yes ] && ! "$AR1_VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("alfworld") is None)'; then
  ar1_say "installing the text-game packages (agent_r1_tutorial[games]: TextWorld, ALFWorld) into $AR1_VENV"
  "$AR1_VENV/bin/python" -m pip install --progress-bar off -e "$AR1_ROOT[games]" >>"$AR1_VENV/setup.log" 2>&1 ||
    { tail -n 20 "$AR1_VENV/setup.log" >&2; ar1_die "installing the text-game packages failed; see $AR1_VENV/setup.log"; }
fi
cd "$AR1_ROOT"
exec "$AR1_VENV/bin/python" scripts/speedrun.py "$@"
