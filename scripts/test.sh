#!/usr/bin/env bash
# The tests: set up (if needed), then one pytest run that checks
#   - the library is exactly what nbdev-export makes of the notebooks, and nbdev-clean changes nothing;
#   - every notebook in nbs/ executes top to bottom (#| slow and #| gpu cells skipped unless flagged);
#   - the unit and property tests in tests/;
#   - the docs site builds offline and renders in headless Chromium (screenshots in _build/artifacts/).
# pytest's summary line is the last line printed.
#
# usage: bash scripts/test.sh [--flags "slow gpu"] [--slow] [--gpu] [--no-setup] [-- PYTEST_ARGS...]
#   --flags F     space-separated nbdev test flags to run as well (slow, gpu)
#   --slow/--gpu  shorthands for --flags slow / --flags gpu (combinable)
#   --no-setup    skip the set-up step (the environment must exist)
#   -- ARGS       passed to pytest, e.g. -- -k docs -x
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

flags=""
setup=1
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --flags) [ $# -ge 2 ] || ar1_usage_error "--flags needs a value, e.g. --flags \"slow gpu\""
             flags="$flags $2"; shift 2 ;;
    --flags=*) flags="$flags ${1#--flags=}"; shift ;;
    --slow) flags="$flags slow"; shift ;;
    --gpu) flags="$flags gpu"; shift ;;
    --no-setup) setup=0; shift ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) ar1_usage_error "unknown option '$1' to scripts/test.sh; options: --flags \"slow gpu\", --slow, --gpu, --no-setup, -- PYTEST_ARGS (see --help)" ;;
  esac
done
for f in $flags; do
  case "$f" in slow|gpu|notest) ;; *) ar1_usage_error "unknown test flag '$f'; the flags are: slow, gpu, notest" ;; esac
done

if [ "$setup" = 1 ]; then bash "$AR1_ROOT/scripts/setup.sh" dev
else [ -x "$AR1_VENV/bin/python" ] || ar1_die "--no-setup was given but there is no environment at $AR1_VENV"; fi

cd "$AR1_ROOT"
export AR1_FLAGS="${flags# }"
export PATH="$AR1_VENV/bin:$PATH"
ar1_say "running the tests${AR1_FLAGS:+ with flags: $AR1_FLAGS}"
exec "$AR1_VENV/bin/python" -m pytest ${pytest_args[@]+"${pytest_args[@]}"}
