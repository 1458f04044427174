"""run_harness: the real `harness` command as a subprocess of this interpreter, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent


def harness_env() -> dict[str, str]:
    """This checkout first on PYTHONPATH, so the tree under test runs whichever tree is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("COLUMNS", None)  # as in CI: harness.core.console prints tables whole without it
    return env


def run_harness(
    *args: str, cwd: Path = REPO_DIR, timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m harness ARGS`; stdout and stderr captured as text. env: variables set on top of harness_env()."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env={**harness_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
