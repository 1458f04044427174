import atexit
import fcntl
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
# One thread per rank process: tests run several gloo ranks on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# A suite started in the background of a script (`cmd &`) inherits SIGINT ignored, as POSIX has it, and so would
# every harness process it starts: the tests of Ctrl-C need SIGINT delivered. A Python handler, unlike an ignored
# disposition, is not inherited across exec, so the processes the tests start get the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- the tests' own release cache -------------------------------------------------------------------------------------
# The tests read vLLM releases from a cache of their own, never from the one a user's or another job's harness writes
# to: another process's downloads can then neither fail the download guard below nor slow a test down. It persists
# between runs ($HARNESS_TEST_CACHE_DIR, else a `moe-harness-tests` folder beside the user's cache), so a second run
# downloads nothing, and each session first takes in, as hard links, the finished entries the user's cache holds and
# it lacks. A second test session running at the same time gets a private copy of it for its lifetime.


def _user_cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "moe-harness"


def _finished_entries(cache: Path) -> list[Path]:
    """The entries (vllm/<version>/<kind>) whose extraction finished: a manifest, and no staging suffix; and the
    release wheels kept on request (vllm/<version>/wheel/*.whl, verified again on every use)."""
    found = []
    for manifest in sorted(cache.glob("vllm/*/*/manifest.json")):
        entry = manifest.parent
        if ".partial-" not in entry.name and ".replaced-" not in entry.name:
            found.append(entry)
    found += sorted({whl.parent for whl in cache.glob("vllm/*/wheel/vllm-*.whl")})
    return found


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


def _take_in(source: Path, target: Path) -> None:
    """Each finished entry of source that target lacks, placed with one rename (never a half-copied entry)."""
    if source.resolve() == target.resolve() or not source.is_dir():
        return
    for entry in _finished_entries(source):
        dest = target / entry.relative_to(source)
        if dest.exists():
            continue
        staging = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            shutil.copytree(entry, staging, copy_function=_link_or_copy)
            os.rename(staging, dest)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)


def _private_cache(shared: Path, user: Path, *, give_back: bool) -> Path:
    """A private cache for this process's tests, from the shared one and the user's. give_back: at exit, the entries
    it fetched go back into the shared cache (one rename each) and its download lines onto the shared log."""
    private = Path(tempfile.mkdtemp(prefix="moe-harness-tests-"))
    _take_in(shared, private)
    _take_in(user, private)

    def done() -> None:
        if give_back:
            _take_in(private, shared)
            fetched = private / "downloads.log"
            if fetched.is_file():
                with open(shared / "downloads.log", "a", encoding="utf-8") as log:
                    log.write(fetched.read_text(encoding="utf-8"))
        shutil.rmtree(private, ignore_errors=True)

    atexit.register(done)
    return private


def _tests_cache_dir() -> Path:
    user = _user_cache_dir()
    explicit = os.environ.get("HARNESS_TEST_CACHE_DIR")
    shared = Path(explicit).expanduser() if explicit else user.with_name(user.name + "-tests")
    shared.mkdir(parents=True, exist_ok=True)
    # A pytest-xdist worker belongs to the session of the process that started it, which holds the lock: each worker
    # reads a private cache of its own, so a download in one worker is never blamed on the test running in another.
    session_cache = os.environ.get("HARNESS_TESTS_SESSION_CACHE")
    if os.environ.get("PYTEST_XDIST_WORKER") and session_cache:
        return _private_cache(Path(session_cache), user, give_back=True)
    lock = open(shared / ".session.lock", "w")  # noqa: SIM115  held open for the session's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another test session holds it: a private cache for this one, from both
        lock.close()
        return _private_cache(shared, user, give_back=False)
    globals()["_SESSION_LOCK"] = lock
    _take_in(user, shared)
    return shared


TESTS_CACHE_DIR = _tests_cache_dir()
os.environ["HARNESS_CACHE_DIR"] = str(TESTS_CACHE_DIR)  # every harness the tests start, in process or not, reads it
os.environ.setdefault("HARNESS_TESTS_SESSION_CACHE", str(TESTS_CACHE_DIR))  # what this run's workers start from


import pytest  # noqa: E402


def _download_log() -> Path:
    from harness.sizing.vllm_source.cache import DOWNLOAD_LOG_NAME

    return TESTS_CACHE_DIR / DOWNLOAD_LOG_NAME


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
            f"{request.node.nodeid} downloaded vLLM wheel(s) into the tests' cache {log.parent} without the "
            "vllm_wheel mark: " + ", ".join(fetched),
            pytrace=False,
        )


# ==== The garbage collector between tests =============================================================================
# Each test starts with what the tests before it left collected, then what is alive frozen (gc.freeze): the session's
# and the module's objects (the collected tests, torch, the releases the harness parsed and keeps for the process,
# module fixtures) are left out of every later collection, and that collection walks only what was made since.
# Without it a worker's heap grows past 3 million objects (each release's syntax trees) and every full collection
# walked them all, 2.5 s of CPU each by the end of a run: some 70 s in the two workers of a suite run.
# And the young generation is collected every 50,000 allocations, not 700: a test that parses a release makes a
# million syntax-tree nodes, and at 700 the collections they set off, the full ones among them, walked that tree
# again and again (a quarter of the sizing tests' CPU time). The collection before each test still takes every cycle.
import gc  # noqa: E402

gc.set_threshold(50_000, 20, 20)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    gc.collect()
    gc.freeze()


# ==== One real smoke run shared by the tests that only read a run's outputs ==========================================
# (kept apart from the download guard above)
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
    from harness.scenario.schema import load_scenario
    from launch_helpers import harness_env

    out = tmp_path_factory.mktemp("shared") / ("a-long-directory-name-that-a-narrow-log-would-wrap-" * 2) / "smoke"
    args = ["--launcher", "local", "--out", str(out)]
    env = harness_env()
    env.pop("COLUMNS", None)
    launch = load_scenario(ROOT / "scenarios" / "smoke.yaml").launch
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=launch.placement_timeout_s + launch.rank_timeout_s + 60,
    )  # the run's own bounds
    return SmokeRun(
        out=out,
        command=["harness", "run", *args],
        returncode=done.returncode,
        stdout=done.stdout,
        stderr=done.stderr,
        wall_s=time.monotonic() - started,
    )


@pytest.fixture
def smoke_run_copy(smoke_run: SmokeRun, tmp_path: Path) -> Path:
    """A copy of the shared run's directory, at the same long name under tmp_path, for a test that writes into it."""
    assert smoke_run.returncode == 0, smoke_run.stdout[-3000:] + smoke_run.stderr[-3000:]
    copy = tmp_path / smoke_run.out.parent.name / smoke_run.out.name
    shutil.copytree(smoke_run.out, copy, symlinks=True)
    return copy


# ==== end of the shared smoke run ====================================================================================


# ==== pytest-xdist: a module per worker ===============================================================================
# Under pytest-xdist (scripts/test.sh: `-n 2 --dist loadscope`) each module's tests run on one worker, so its module
# fixtures (a sweep of a release, the hostile corpus, a Ray cluster) are built once; and the modules that start Ray
# clusters run one after another on one worker: two clusters at once would share this machine's cores. The grouping
# is the scheduler's (pytest_xdist_make_scheduler), by module path: xdist_group marks do not group under pytest 9,
# whose node ids no longer take pytest-xdist's group suffix. The modules that read the shared smoke run (smoke_run
# above, a session fixture: one per worker) are one scope too, so the run is made once, not once on each worker.
RAY_MODULES = ("tests/test_launch_ray.py", "tests/test_readme_ray.py")
SMOKE_RUN_MODULES = ("tests/test_baseline.py", "tests/test_console.py", "tests/test_launch_local.py")


def xdist_scope(nodeid: str) -> str:
    """The scope a test is scheduled with: its module, "ray" for the modules that start Ray clusters, or "smoke-run"
    for those that read the shared smoke run."""
    module = nodeid.split("::", 1)[0]
    if module in RAY_MODULES:
        return "ray"
    return "smoke-run" if module in SMOKE_RUN_MODULES else module


def module_scheduling():
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ModuleScheduling


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") not in ("loadscope", "loadgroup"):
        return None
    return module_scheduling()(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `ray` outside RAY_MODULES would run beside the others' clusters, and one reading the smoke run
    outside SMOKE_RUN_MODULES would make it again on another worker: both refused at collection."""
    stray = sorted({item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("ray") is not None}
                   - set(RAY_MODULES))  # fmt: skip
    if stray:
        raise pytest.UsageError(f"tests marked ray outside tests/conftest.py RAY_MODULES: {', '.join(stray)}")
    readers = {item.nodeid.split("::", 1)[0] for item in items
               if {"smoke_run", "smoke_run_copy"} & set(getattr(item, "fixturenames", ()))}  # fmt: skip
    stray = sorted(readers - set(SMOKE_RUN_MODULES))
    if stray:
        raise pytest.UsageError(
            f"tests reading smoke_run outside tests/conftest.py SMOKE_RUN_MODULES: {', '.join(stray)}"
        )
