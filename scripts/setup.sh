#!/usr/bin/env bash
# Set up the project-local environment (.venv), idempotently: a second run with nothing changed takes a second.
#
#   bash scripts/setup.sh        core: the library and the CPU speedrun
#   bash scripts/setup.sh dev    core + notebooks (JupyterLab, widgets), docs (smalldocs, KaTeX, Chromium),
#                                tests, and the verl stack as far as it runs on a CPU
#
# Environment variables:
#   PYTHON               interpreter to build .venv from (default python3; 3.10 to 3.13)
#   AR1_VENV             where the environment lives (default .venv in the repository)
#   AR1_TORCH_SPEC       the torch to install first (default torch==2.13.0, the CPU build on our machines)
#   AR1_TORCH_INDEX_URL  an index for that torch, e.g. https://download.pytorch.org/whl/cpu on a Linux laptop,
#                        where plain PyPI would bring the CUDA build and several GB of CUDA libraries
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

profile=core
for arg in "$@"; do
  case "$arg" in
    core|dev) profile=$arg ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ar1_usage_error "unknown argument '$arg' to scripts/setup.sh; choose the profile 'core' or 'dev'" ;;
  esac
done

torch_spec=${AR1_TORCH_SPEC:-torch==2.13.0}
venv=$AR1_VENV
py=$venv/bin/python
log=$venv/setup.log
t0=$(date +%s)

# 1. The interpreter. An explicit PYTHON is always checked; an existing environment is checked too.
if [ -n "${PYTHON:-}" ] || [ ! -x "$py" ]; then
  base=$(ar1_base_python)
fi
if [ ! -x "$py" ]; then
  ar1_say "creating $venv with $base ($(ar1_python_version "$base"))"
  "$base" -m venv "$venv" 2>/dev/null ||
    ar1_die "'$base -m venv' failed. On Debian/Ubuntu install the venv module (apt-get install python3-venv) and run again."
else
  ar1_check_python "$py"
fi

# 2. Python packages, skipped when pyproject.toml, the profile and the torch spec are as at the last set-up.
extras=""
[ "$profile" = dev ] && extras="[dev,verl,games]"
key=$( { cat "$AR1_ROOT/pyproject.toml"; echo "$profile $torch_spec ${AR1_TORCH_INDEX_URL:-}"; } | sha256sum | cut -c1-16)
stamp=$venv/.ar1-setup-$profile
pip_install() {
  # quiet, with the full log kept: on failure show its end, which holds pip's reason
  # the environment's bin first on PATH: some source builds (fast-downward-textworld) run a bare `python`, which
  # under pyenv's shims started an interpreter without its standard library ("No module named 'glob'")
  if ! PATH="$venv/bin:$PATH" "$py" -m pip install --progress-bar off "$@" >>"$log" 2>&1; then
    tail -n 25 "$log" >&2
    ar1_die "pip install $* failed; the full log is $log"
  fi
}
dev_key=$( { cat "$AR1_ROOT/pyproject.toml"; echo "dev $torch_spec ${AR1_TORCH_INDEX_URL:-}"; } | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
  ar1_say "Python packages are current for profile '$profile' (set-up skipped)"
elif [ "$profile" = core ] && [ -f "$venv/.ar1-setup-dev" ] && [ "$(cat "$venv/.ar1-setup-dev")" = "$dev_key" ]; then
  ar1_say "Python packages are current (the dev profile includes core; set-up skipped)"
else
  : >"$log"
  ar1_say "upgrading pip"
  pip_install -U pip
  if ! "$py" -c 'import torch' >/dev/null 2>&1; then
    ar1_say "installing $torch_spec first (so that nothing pulls a CUDA build over it)"
    if [ -n "${AR1_TORCH_INDEX_URL:-}" ]; then pip_install "$torch_spec" --index-url "$AR1_TORCH_INDEX_URL"
    else pip_install "$torch_spec"; fi
  fi
  ar1_say "installing agent_r1_tutorial$extras (editable); the log is $log"
  pip_install -e "$AR1_ROOT$extras"
  # pip keeps going past some conflicts; say so rather than find out later
  # (textworld's wheel lists its platforms in one dotted Tag line, which `pip check` reads as an unsupported platform:
  # that line alone is not a conflict)
  if ! check=$("$py" -m pip check 2>&1); then
    printf '%s\n' "$check" >>"$log"
    if printf '%s\n' "$check" | grep -qv '^textworld [0-9.]* is not supported on this platform$'; then
      tail -n 10 "$log" >&2; ar1_die "pip check found conflicting requirements; see $log"
    fi
  fi
  printf '%s\n' "$key" >"$stamp"
fi

# 3. The dev profile's non-Python pieces: KaTeX for offline maths on the docs site, and a Chromium to test it in.
if [ "$profile" = dev ]; then
  katex_version=$("$py" -c 'from smalldocs.layout import KATEX; print(KATEX.split("katex@")[1].split("/")[0])')
  katex_dir=$venv/npm/node_modules/katex
  if [ ! -f "$katex_dir/dist/katex.min.js" ] || ! grep -q "\"version\": \"$katex_version\"" "$katex_dir/package.json"; then
    command -v npm >/dev/null 2>&1 || ar1_die "npm is needed once, to fetch KaTeX $katex_version for the docs site; install Node.js and npm (apt-get install npm)"
    ar1_say "fetching KaTeX $katex_version from the npm registry (bundled into the docs site: no CDN)"
    npm install --prefix "$venv/npm" --no-save --no-audit --no-fund --loglevel=error "katex@$katex_version" >>"$log" 2>&1 ||
      { tail -n 10 "$log" >&2; ar1_die "npm install katex@$katex_version failed; see $log"; }
  fi
  if ! "$py" "$AR1_ROOT/scripts/find_chromium.py" >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
      sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
      ar1_say "installing Chromium from Debian's packages (for the docs-site tests)"
      { $sudo apt-get install -y -q chromium || { $sudo apt-get update -q && $sudo apt-get install -y -q chromium; }; } >>"$log" 2>&1 ||
        { tail -n 10 "$log" >&2; ar1_die "apt-get install chromium failed; see $log"; }
    else
      ar1_say "no apt-get with root here: fetching Playwright's own Chromium instead"
      "$py" -m playwright install chromium >>"$log" 2>&1 ||
        ar1_die "could not install a Chromium for the docs-site tests: install one (Debian: apt-get install chromium) or set AR1_CHROMIUM=/path/to/chromium"
    fi
    "$py" "$AR1_ROOT/scripts/find_chromium.py" >/dev/null || ar1_die "Chromium was installed but cannot be found; set AR1_CHROMIUM=/path/to/chromium"
  fi
fi
ar1_say "environment ready: $venv (profile $profile, $(( $(date +%s) - t0 )) s)"
