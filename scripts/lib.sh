# Shared shell helpers for speedrun.sh and scripts/*.sh. Source it; it defines functions only.
# Exit codes: 2 = bad usage (unknown option, algorithm, profile), 1 = the machine cannot run this (wrong Python, ...).

AR1_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AR1_VENV=${AR1_VENV:-$AR1_ROOT/.venv}
AR1_PY_MIN=10   # supported: Python 3.10 ... 3.13 (the range of pyproject.toml's requires-python)
AR1_PY_MAX=13

ar1_say() { printf '==> %s\n' "$*"; }
ar1_usage_error() { printf 'error: %s\n' "$*" >&2; exit 2; }
ar1_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# ar1_python_version PY: print "3.11" for the interpreter PY, or fail with a clear message.
ar1_python_version() {
  local py=$1 v
  command -v "$py" >/dev/null 2>&1 ||
    ar1_die "Python interpreter '$py' was not found. Install Python 3.$AR1_PY_MIN to 3.$AR1_PY_MAX, or point PYTHON at one (PYTHON=/path/to/python3.11)."
  v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
    ar1_die "'$py' did not run as a Python interpreter. Point PYTHON at a Python 3.$AR1_PY_MIN to 3.$AR1_PY_MAX interpreter."
  printf '%s\n' "$v"
}

# ar1_check_python PY: fail unless PY is a supported Python.
ar1_check_python() {
  local py=$1 v major minor
  v=$(ar1_python_version "$py") || exit $?
  major=${v%%.*}; minor=${v#*.}
  if [ "$major" != 3 ] || [ "$minor" -lt "$AR1_PY_MIN" ] || [ "$minor" -gt "$AR1_PY_MAX" ]; then
    ar1_die "agent_r1_tutorial needs Python 3.$AR1_PY_MIN to 3.$AR1_PY_MAX, but '$py' is Python $v. Install a supported Python and run again with PYTHON=/path/to/python3.11 (then remove .venv if it was made from the old one)."
  fi
}

# ar1_base_python: the interpreter to build the environment from ($PYTHON, else python3), checked.
ar1_base_python() {
  local py=${PYTHON:-python3}
  ar1_check_python "$py"
  printf '%s\n' "$py"
}
