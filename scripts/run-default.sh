#!/usr/bin/env bash
# Install into a fresh virtual environment and run the embedded default scenario: the README's first command.
# Without GPUs that is the CPU smoke scenario; with GPUs, the vLLM PR #55579 case.
#
#   bash scripts/run-default.sh                 the default
#   bash scripts/run-default.sh --dry-run       extra arguments go to `harness run`
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"python 3.11 or newer is needed, {sys.executable} is {sys.version.split()[0]}")
PY

rm -rf "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if command -v nvidia-smi >/dev/null 2>&1; then
    # A GPU machine usually has a CUDA torch already; see it from the venv and keep it when it is new enough.
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
else
    "$PYTHON" -m venv "$VENV"
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
    # Pinned first: otherwise torch>=2.11 resolves to the newest CUDA build, which a CPU machine cannot use.
    python -m pip install -q torch==2.13.0
fi
python -m pip install -q -e .

exec python -m harness run "$@"
