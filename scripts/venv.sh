# Sourced by scripts/run-default.sh and scripts/test.sh: make a virtual environment, or reuse an up-to-date one,
# and activate it.
#
#   harness_venv VENV PIP_TARGET TORCH [fresh]
#       TORCH: auto  a GPU machine (nvidia-smi) sees its own torch (--system-site-packages); else torch==2.13.0
#              pin   torch==2.13.0 always
#   e.g. harness_venv .venv . auto ; harness_venv .venv-ci '.[test]' pin fresh
#
# VENV/.harness-stamp records what the environment was built from: the sha256 of pyproject.toml, the Python
# version and interpreter, the repository's path, the install target and the torch choice (CPU pin, or a GPU
# machine's own torch). When the stamp matches, the environment is used as it is, in about a second: the
# editable install follows source changes by itself, and only a change of pyproject.toml (dependencies, entry
# points) or of Python needs a reinstall. Anything else, or `fresh`, removes VENV and builds it anew (minutes);
# the stamp is written last, so an interrupted install is never taken for a good one. A build ends with one line
# saying how long it took and how many bytes pip fetched (its cache's growth: what it downloaded).
#
# Needs PYTHON (the interpreter to build from) and the repository root as the working directory.

harness_venv_stamp() {  # what the environment would be built from, one line per input
  local target="$1" torch_choice="$2"
  echo "pyproject.toml sha256: $("$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' pyproject.toml)"
  echo "python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  echo "repository: $PWD"
  echo "install: $target"
  echo "torch: $torch_choice"
}

harness_venv_torch_choice() {  # TORCH mode -> where torch comes from on this machine
  if [ "$1" = auto ] && command -v nvidia-smi >/dev/null 2>&1; then
    echo "the machine's own (GPU: --system-site-packages)"
  else
    echo "torch==2.13.0"
  fi
}

harness_pip_cache_bytes() {  # the bytes in pip's cache, where what pip downloads lands; 0 without one
  local dir
  dir="$("$PYTHON" -m pip cache dir 2>/dev/null)" && [ -d "$dir" ] || { echo 0; return 0; }
  du -sb "$dir" 2>/dev/null | cut -f1 || echo 0
}

harness_venv_summary() {  # VENV SECONDS CACHE_BYTES_BEFORE CACHE_BYTES_AFTER -> the install step's one line
  local grew=$(( $4 - $3 ))
  [ "$grew" -ge 0 ] || grew=0
  echo "$(basename "$0"): built $1 in $2 s; pip fetched $(( grew / 1048576 )) MiB ($grew bytes: its cache grew" \
       "from $3 to $4; a package already in pip's cache is not fetched again)" >&2
}

harness_venv_bytecode() {  # VENV -> Python keeps the bytecode it compiles, in VENV/pycache
  # A run starts many Python processes (the CLI, ranks, Ray workers; the test suite hundreds), each importing torch
  # and Ray. Where PYTHONDONTWRITEBYTECODE is set (some images set it), none of them keeps what it compiled, so
  # every process compiles those modules again: about 1.5 s of CPU per `import torch` on a 2-core machine, and the
  # suite on a fresh clone took a third longer. The bytecode goes to the environment's own folder
  # (PYTHONPYCACHEPREFIX), so nothing is written beside the sources.
  PYTHONPYCACHEPREFIX="$(cd "$1" && pwd)/pycache"
  export PYTHONPYCACHEPREFIX
  unset PYTHONDONTWRITEBYTECODE
}

harness_venv() {
  local venv="$1" target="$2" fresh="${4:-}" torch_choice stamp
  if [ -z "${PYTHON:-}" ]; then  # without it, pip would install into whatever python is first on PATH
    echo "scripts/venv.sh: PYTHON (the interpreter to build $venv from) is not set" >&2
    return 2
  fi
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  torch_choice="$(harness_venv_torch_choice "$3")"
  stamp="$(harness_venv_stamp "$target" "$torch_choice")"
  if [ -z "$fresh" ] && [ -f "$venv/.harness-stamp" ] && [ "$(cat "$venv/.harness-stamp")" = "$stamp" ] &&
     "$venv/bin/python" -c 'import harness' >/dev/null 2>&1; then
    echo "$(basename "$0"): reusing $venv (built from this pyproject.toml and Python; delete it to rebuild)" >&2
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    harness_venv_bytecode "$venv"
    return 0
  fi
  echo "$(basename "$0"): building $venv (a few minutes; later runs reuse it while pyproject.toml and Python stay the same)" >&2
  local started=$SECONDS cache_before
  cache_before="$(harness_pip_cache_bytes)"
  rm -rf "$venv"
  if [ "${torch_choice#the machine}" != "$torch_choice" ]; then
    # A GPU machine usually has a CUDA torch already; see it from the venv and keep it when it is new enough.
    "$PYTHON" -m venv --system-site-packages "$venv"
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
  else
    "$PYTHON" -m venv "$venv"
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    # Pinned first: otherwise torch>=2.11 resolves to the newest CUDA build, which a CPU machine cannot use.
    # No -q: pip's own progress (its bar on a terminal; "Collecting"/"Downloading ... (N MB)" lines in a log)
    # is what shows the minutes of the torch download are going somewhere.
    python -m pip install --progress-bar on --no-compile torch==2.13.0
  fi
  # --no-compile: Python compiles a module when it is first imported (and keeps it in __pycache__), so only the
  # modules a run imports are compiled, not every file of torch, Ray and matplotlib (a third of the install's time).
  python -m pip install --progress-bar on --no-compile -e "$target"
  harness_venv_bytecode "$venv"
  printf '%s\n' "$stamp" > "$venv/.harness-stamp"
  harness_venv_summary "$venv" "$(( SECONDS - started ))" "$cache_before" "$(harness_pip_cache_bytes)"
}
