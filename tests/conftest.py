import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
# One thread per rank process: tests run several gloo ranks on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402


def _download_log() -> Path:
    from harness.sizing.vllm_source.cache import DOWNLOAD_LOG_NAME
    from harness.sizing.vllm_source.sources import default_cache_dir

    return default_cache_dir() / DOWNLOAD_LOG_NAME


def _logged_downloads(log: Path) -> list[str]:
    try:
        return log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


@pytest.fixture(autouse=True)
def _wheel_downloads_need_the_vllm_wheel_mark(request: pytest.FixtureRequest):
    """A test that makes the harness download a vLLM wheel into the shared cache must carry the vllm_wheel mark
    (CI selects and counts those); one without it fails, naming the releases it fetched."""
    log = _download_log()
    before = len(_logged_downloads(log))
    yield
    if request.node.get_closest_marker("vllm_wheel") is not None:
        return
    fetched = _logged_downloads(log)[before:]
    if fetched:
        pytest.fail(f"{request.node.nodeid} downloaded vLLM wheel(s) into {log.parent} without the vllm_wheel mark: "
                    + ", ".join(fetched), pytrace=False)


# ==== One real smoke run shared by the tests that only read a run's outputs ==========================================
# (kept apart from the download guard above)
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class SmokeRun:
    """`harness run --launcher local --out OUT` with no scenario (so smoke on this CPU machine), as a user types it:
    a subprocess, stdout a pipe (a CI log), COLUMNS unset. OUT is a long path on purpose, so the tests of printed
    paths (test_console) read it too."""

    out: Path
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """The shared run. Read it; never write into it: a test that changes files copies it (smoke_run_copy)."""
    from launch_helpers import harness_env

    from harness.scenario.schema import load_scenario

    out = tmp_path_factory.mktemp("shared") / ("a-long-directory-name-that-a-narrow-log-would-wrap-" * 2) / "smoke"
    args = ["--launcher", "local", "--out", str(out)]
    env = harness_env()
    env.pop("COLUMNS", None)
    launch = load_scenario(ROOT / "scenarios" / "smoke.yaml").launch
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False,
                          timeout=launch.placement_timeout_s + launch.rank_timeout_s + 60)  # the run's own bounds
    return SmokeRun(out=out, command=["harness", "run", *args], returncode=done.returncode, stdout=done.stdout,
                    stderr=done.stderr, wall_s=time.monotonic() - started)


@pytest.fixture
def smoke_run_copy(smoke_run: SmokeRun, tmp_path: Path) -> Path:
    """A copy of the shared run's directory, at the same long name under tmp_path, for a test that writes into it."""
    assert smoke_run.returncode == 0, smoke_run.stdout[-3000:] + smoke_run.stderr[-3000:]
    copy = tmp_path / smoke_run.out.parent.name / smoke_run.out.name
    shutil.copytree(smoke_run.out, copy, symlinks=True)
    return copy
# ==== end of the shared smoke run ====================================================================================
