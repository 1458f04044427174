"""Layout search benchmark: harness/bench/probe_search.py, which `harness bench --cpu-only` runs too; its
docstring gives the options.

    python benchmarks/bench_search.py [OPTIONS]
    python -m harness.bench.probe_search [OPTIONS]      (the same)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.bench.probe_search import main

if __name__ == "__main__":
    raise SystemExit(main())
