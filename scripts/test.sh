#!/usr/bin/env bash
# Install into a virtual environment and run the whole test suite: the README's second command, and what CI runs
# (.ci/run calls this script), so a developer and CI run the same thing. With CI set the environment is built
# fresh; otherwise an up-to-date .venv-ci is reused (scripts/venv.sh).
#
#   bash scripts/test.sh              every test
#   bash scripts/test.sh -k contract  extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-ci}
PYTHON=${PYTHON:-python3}
# Per test. The slowest tests start Ray clusters or several rank processes; none should come near this.
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-300}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"python 3.11 or newer is needed, {sys.executable} is {sys.version.split()[0]}")
PY

# CI (CI set, as CI services do) builds a fresh environment every time; a developer's run reuses an up-to-date
# one (scripts/venv.sh: same pyproject.toml and Python). torch first and pinned: `pip install -e .` alone would
# resolve torch>=2.11 to the newest CUDA build, gigabytes that the CPU tests do not need.
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
harness_venv "$VENV" '.[test]' pin ${CI:+fresh}

# The report's browser test drives a headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
    else
        echo "scripts/test.sh: chromium is missing and cannot be installed here (needs root and apt-get);" \
             "the browser test will skip" >&2
    fi
fi

# Every vLLM wheel download appends a line to the cache's downloads.log (harness.sizing.vllm_source.cache). The tests
# read releases from a cache of their own (tests/conftest.py: $HARNESS_TEST_CACHE_DIR, else moe-harness-tests beside
# the user's cache), which persists between runs on one machine: on a warm cache a run adds none.
USER_CACHE="${HARNESS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moe-harness}"
DOWNLOAD_LOG="${HARNESS_TEST_CACHE_DIR:-${USER_CACHE}-tests}/downloads.log"
logged_downloads() { if [ -f "$DOWNLOAD_LOG" ]; then wc -l < "$DOWNLOAD_LOG"; else echo 0; fi; }
downloads_before="$(logged_downloads)"

# Lint, format and types before the tests (pyproject.toml configures all three): any finding fails the run.
LINTED=(harness tests benchmarks scripts)
python -m ruff check "${LINTED[@]}"
python -m ruff format --check "${LINTED[@]}"
# mypy keeps its cache beside the tests' release cache, so a fresh clone on this machine checks only what changed
# (mypy takes a cached module only where its source's hash matches); a cold cache costs about 30 s of CPU here.
python -m mypy --cache-dir "${HARNESS_TEST_CACHE_DIR:-${USER_CACHE}-tests}/mypy"
echo "scripts/test.sh: ruff check, ruff format --check and mypy found nothing"

# The releases the tests read, fetched into the tests' cache before them: on a cold cache (a new machine, or entries
# extracted before the harness read a file it reads now) each is one download here, not one inside whichever test
# reaches it first. A warm cache fetches nothing.
python - "${HARNESS_TEST_CACHE_DIR:-${USER_CACHE}-tests}" <<'PY'
import sys
from pathlib import Path

from harness.sizing.vllm_source import locate

for version in ("0.8.5", "0.9.2", "0.19.0", "0.26.0", "0.29.0", "0.30.0", "0.33.0"):
    locate(version=version, cache_dir=Path(sys.argv[1]), with_ops=version in ("0.26.0", "0.30.0"),
           keep_wheel=version == "0.30.0")
PY

# Two workers (pytest-xdist, a module's tests on one worker: tests/conftest.py), then, in this process, the tests
# that need a process of one thread (a worker has more). WORKERS=0 runs everything in one process. Two on a 2-core
# machine: three were faster on a quiet one, but beside a CPU-bound process they starved the Ray tests' actors, and
# with those tests in a pass of their own the whole took longer than two workers do (CHANGELOG.md has the figures).
WORKERS=${WORKERS:-2}
set +e
if [ "$WORKERS" -gt 0 ]; then
    python -m pytest -q -p no:cacheprovider --timeout="$TEST_TIMEOUT_S" -n "$WORKERS" --dist loadscope \
        -m "not one_thread" "$@"
    rc=$?
    python -m pytest -q -p no:cacheprovider --timeout="$TEST_TIMEOUT_S" -m one_thread "$@"
    rc_one=$?
    # 5 (nothing collected) from one pass alone is not a failure: -k may select tests of the other pass only
    if [ "$rc" -eq 5 ] && [ "$rc_one" -ne 5 ]; then rc=$rc_one
    elif [ "$rc_one" -ne 0 ] && [ "$rc_one" -ne 5 ]; then rc=$rc_one; fi
else
    python -m pytest -q -p no:cacheprovider --timeout="$TEST_TIMEOUT_S" "$@"
    rc=$?
fi
set -e
downloads=$(( $(logged_downloads) - downloads_before ))
echo "scripts/test.sh: $downloads vLLM wheel download(s) during this run (counted in $DOWNLOAD_LOG)"
if [ "$downloads" -gt 0 ]; then
    tail -n "$downloads" "$DOWNLOAD_LOG" | sed 's/^/scripts\/test.sh:   /'
fi
if [ "$rc" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
