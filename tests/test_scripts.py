"""scripts/venv.sh, which the README's two commands share: an up-to-date environment is reused, and what makes
one out of date (pyproject.toml, Python, the install target) is in its stamp.

Building an environment takes minutes (torch), so the rebuild itself is not run here; reuse is run for real on
a real virtual environment.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
VENV_SH = REPO_DIR / "scripts" / "venv.sh"


def _bash(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHON": sys.executable, **env}
    full_env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {shlex.quote(str(VENV_SH))}; {script}"],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stamp(cwd: Path, target: str = "'.[test]'") -> str:
    done = _bash(f'harness_venv_stamp {target} "$(harness_venv_torch_choice pin)"', cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_stamp_names_pyproject_python_repository_and_target(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text((REPO_DIR / "pyproject.toml").read_text())
    stamp = _stamp(tmp_path)
    assert f"python: {sys.version.split()[0]} {sys.executable}" in stamp
    assert f"repository: {tmp_path}" in stamp and "install: .[test]" in stamp and "torch: torch==2.13.0" in stamp
    (tmp_path / "pyproject.toml").write_text((REPO_DIR / "pyproject.toml").read_text() + "\n# a change\n")
    assert _stamp(tmp_path) != stamp  # a new pyproject.toml means a rebuild
    assert _stamp(tmp_path, target=".") != _stamp(tmp_path)


def test_an_up_to_date_environment_is_reused_as_it_is(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text((REPO_DIR / "pyproject.toml").read_text())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (venv / ".harness-stamp").write_text(_stamp(tmp_path))
    (venv / "kept").write_text("a rebuild would remove this")
    # `import harness` must work inside the environment (an editable install does that; PYTHONPATH here).
    done = _bash("harness_venv venv '.[test]' pin; command -v python", tmp_path, PYTHONPATH=str(REPO_DIR))
    assert done.returncode == 0, done.stderr
    assert "reusing venv" in done.stderr
    assert done.stdout.strip() == str(venv / "bin" / "python")  # activated
    assert (venv / "kept").exists()


def test_bench_output_is_ignored_and_committed_benches_are_kept():
    import pytest

    if not (REPO_DIR / ".git").exists():
        pytest.skip("not a git checkout")
    paths = {
        "results/bench/20261130-101010-bench-smoke/bench.json": True,  # what `harness bench` writes
        "results/20261130-101010-smoke/run.json": True,
        "results/bench/1xh200-pr55579-vllm-ops/bench.json": False,
        "results/bench/2xh200-pr55579-vllm-ops/bench.md": False,
        "results/bench/cpu-costs/bench.json": False,
        "results/h200/1xh200-pr55579-vllm-ops/report.md": False,
        "results/baselines/cpu/smoke/report.json": False,
    }
    for path, ignored in paths.items():
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_DIR, timeout=30, check=False)
        assert done.returncode == (0 if ignored else 1), path


DEVICE_SH = REPO_DIR / "scripts" / "gpu" / "device.sh"


def _device_steps() -> list[str]:
    """The steps device.sh accepts (its STEPS line)."""
    import re

    match = re.search(r'^STEPS="([^"]+)"$', DEVICE_SH.read_text(), flags=re.MULTILINE)
    assert match, 'device.sh names its steps in one STEPS="..." line'
    return match.group(1).split()


def test_every_gpu_script_is_a_documented_step_of_the_device_runner():
    steps = _device_steps()
    scripts = sorted(p.stem for p in (REPO_DIR / "scripts" / "gpu").glob("*.sh") if p != DEVICE_SH)
    assert scripts == sorted(steps), "every scripts/gpu/*.sh is a step of device.sh, and every step has its script"
    header = DEVICE_SH.read_text().split("set -uo pipefail")[0]
    for step in steps:
        assert f"#   {step} " in header, f"device.sh's header lists step {step} with what it runs"
        text = (REPO_DIR / "scripts" / "gpu" / f"{step}.sh").read_text()
        own = text.split("set -uo pipefail")[0]
        assert own.startswith(f"#!/usr/bin/env bash\n# Step {step}: "), step
        for label in ("# Runs:", "# Needs:", "# Writes:"):
            assert label in own, f"{step}.sh's header says {label[2:]}"
        done = subprocess.run(
            ["bash", "-n", str(REPO_DIR / "scripts" / "gpu" / f"{step}.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_the_device_runner_refuses_an_unknown_step_before_touching_anything(tmp_path: Path):
    import shutil

    checkout = tmp_path / "checkout"
    (checkout / "scripts" / "gpu").mkdir(parents=True)
    shutil.copy(DEVICE_SH, checkout / "scripts" / "gpu" / "device.sh")
    for args in (["diag"], []):
        done = subprocess.run(
            ["bash", str(checkout / "scripts" / "gpu" / "device.sh"), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.strip() == f"device.sh: step '{''.join(args)}' is not one of: {' '.join(_device_steps())}"
        assert not (checkout / ".gpu").exists()  # refused before any setup


def test_a_build_says_how_long_it_took_and_what_pip_fetched(tmp_path: Path):
    cache = tmp_path / "pip-cache"
    (cache / "http").mkdir(parents=True)
    (cache / "http" / "a").write_bytes(b"x" * 4096)
    done = _bash(
        'before="$(harness_pip_cache_bytes)"; head -c 3145728 /dev/zero > "$PIP_CACHE_DIR/http/b"; '
        'harness_venv_summary venv 75 "$before" "$(harness_pip_cache_bytes)"',
        tmp_path,
        PIP_CACHE_DIR=str(cache),
    )
    assert done.returncode == 0, done.stderr
    line = done.stderr.strip()
    assert "built venv in 75 s; pip fetched 3 MiB (3145728 bytes: its cache grew from " in line, line
    no_cache = _bash("harness_pip_cache_bytes", tmp_path, PIP_CACHE_DIR=str(tmp_path / "none"))
    assert no_cache.stdout.strip() == "0"
