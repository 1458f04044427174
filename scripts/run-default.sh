#!/usr/bin/env bash
# Install into a virtual environment (.venv, reused while pyproject.toml and Python stay the same) and run the
# embedded default scenario: the README's first command. Without GPUs that is the CPU smoke scenario; with GPUs,
# the vLLM PR #55579 case.
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

# shellcheck source=scripts/venv.sh
source scripts/venv.sh
harness_venv "$VENV" . auto  # reused while pyproject.toml and Python stay the same (scripts/venv.sh)

exec python -m harness run "$@"
