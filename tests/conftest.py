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
        pytest.fail(
            f"{request.node.nodeid} downloaded vLLM wheel(s) into {log.parent} without the vllm_wheel mark: "
            + ", ".join(fetched),
            pytrace=False,
        )
