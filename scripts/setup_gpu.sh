#!/usr/bin/env bash
# Set up the GPU environment (.venv-gpu) for the full-scale speedrun, idempotently: a second run with nothing
# changed takes a second. It is separate from .venv (the CPU environment) and never touches it.
#
#   bash scripts/setup_gpu.sh          pick the pinned stack from the NVIDIA driver: cu13 for R580+, cu12 otherwise
#   bash scripts/setup_gpu.sh cu12     force the CUDA 12 set (verl 0.9.1, vLLM 0.19.1, torch 2.10, faiss-gpu 1.15.1)
#   bash scripts/setup_gpu.sh cu13     force the CUDA 13 set (verl 0.9.1's own pins: vLLM 0.24, torch 2.11)
#
# The pins are scripts/gpu/requirements-<set>.txt (top level) and constraints-<set>.txt (the whole resolved set);
# scripts/gpu/resolve.py checks that they resolve. flash-attn is not installed: PyPI has only source releases, so it
# would need a CUDA compiler; vLLM brings its own attention kernels and the trainer runs with sdpa.
#
# Environment variables:
#   PYTHON        interpreter to build .venv-gpu from (default python3; must be 3.11 or 3.12, what the pins cover)
#   AR1_GPU_VENV  where the environment lives (default .venv-gpu in the repository)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pins=auto
for arg in "$@"; do
  case "$arg" in
    auto|cu12|cu13) pins=$arg ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ar1_usage_error "unknown argument '$arg' to scripts/setup_gpu.sh; choose the pin set 'cu12', 'cu13' or 'auto'" ;;
  esac
done

venv=${AR1_GPU_VENV:-$AR1_ROOT/.venv-gpu}
py=$venv/bin/python
t0=$(date +%s)

gpu_python_ok() {  # the pins were resolved for CPython 3.11 and 3.12 only
  local v
  v=$(ar1_python_version "$1") || exit $?
  case "$v" in
    3.11|3.12) ;;
    *) ar1_die "the GPU stack is pinned for Python 3.11 or 3.12, but '$1' is Python $v. Run again with PYTHON=/path/to/python3.12 (and remove $venv if it was made from the wrong one)." ;;
  esac
}

# 1. Which pin set: from the driver unless forced.
if [ "$pins" = auto ]; then
  pins=$(python3 "$AR1_ROOT/scripts/preflight.py" --pin-set) ||
    ar1_die "cannot choose the GPU stack from the driver (see above); pass 'cu12' or 'cu13' to force one"
fi
req=$AR1_ROOT/scripts/gpu/requirements-$pins.txt
con=$AR1_ROOT/scripts/gpu/constraints-$pins.txt
[ -f "$req" ] && [ -f "$con" ] || ar1_die "missing $req or $con"

# 2. The interpreter and the environment.
if [ -n "${PYTHON:-}" ] || [ ! -x "$py" ]; then
  base=${PYTHON:-python3}
  gpu_python_ok "$base"
fi
if [ ! -x "$py" ]; then
  ar1_say "creating $venv with $base ($(ar1_python_version "$base")) for the $pins stack"
  "$base" -m venv "$venv" 2>/dev/null ||
    ar1_die "'$base -m venv' failed. On Debian/Ubuntu install the venv module (apt-get install python3-venv) and run again."
else
  gpu_python_ok "$py"
fi
log=$venv/setup.log

# 3. Packages, skipped when the pins, pyproject.toml and the pin set are as at the last set-up.
key=$( { cat "$req" "$con" "$AR1_ROOT/pyproject.toml"; echo "$pins"; } | sha256sum | cut -c1-16)
stamp=$venv/.ar1-setup-gpu
games_ok() { [ "${AR1_GPU_GAMES:-no}" != yes ] || "$py" -c 'import alfworld, textworld' >/dev/null 2>&1; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && games_ok; then
  ar1_say "the $pins GPU stack in $venv is current (set-up skipped)"
  exit 0
fi
: >"$log"
pip_install() {
  if ! "$py" -m pip install --progress-bar off "$@" >>"$log" 2>&1; then
    tail -n 25 "$log" >&2
    ar1_die "pip install $* failed; the full log is $log"
  fi
}
ar1_say "upgrading pip"
pip_install -U pip
ar1_say "installing the $pins GPU stack (about 5.5 GB of wheels; several minutes); the log is $log"
pip_install --prefer-binary -r "$req" -c "$con"
# the package itself without its declared dependencies: they are in the requirements above, except faiss-cpu,
# which would shadow faiss-gpu (both provide the module `faiss`)
ar1_say "installing agent_r1_tutorial (editable, without faiss-cpu)"
pip_install --no-deps -e "$AR1_ROOT"
# ALFWorld runs (speedrun.sh --task alfworld) also need the text-game engine: TextWorld with its PDDL planner, ALFWorld
if [ "${AR1_GPU_GAMES:-no}" = yes ]; then
  ar1_say "installing TextWorld and ALFWorld (the alfworld task)"
  pip_install "textworld[pddl]>=1.6.1" "alfworld>=0.4.2" -c "$con"
fi
if ! "$py" -m pip check >>"$log" 2>&1; then
  if grep -v -i "faiss-cpu" <(tail -n 50 "$log" | grep -i "requires\|has requirement") | grep -q .; then
    tail -n 15 "$log" >&2
    ar1_die "pip check found conflicting requirements in $venv; see $log"
  fi
fi
"$py" -c "import verl, vllm, torch, faiss; print('verl', verl.__version__, '| vllm', vllm.__version__, '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| faiss GPUs', faiss.get_num_gpus())" ||
  ar1_die "the GPU stack was installed but does not import; see $log"
printf '%s\n' "$key" >"$stamp"
ar1_say "GPU environment ready: $venv ($pins, $(( $(date +%s) - t0 )) s)"
