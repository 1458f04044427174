"""The tests' own release cache (tests/conftest.py): the harness under test reads it, not the user's, and it takes in
only the user's finished entries, whole."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import TESTS_CACHE_DIR, _take_in
from harness.sizing.vllm_source.sources import default_cache_dir


def test_the_harness_under_test_reads_the_tests_cache():
    assert default_cache_dir() == TESTS_CACHE_DIR
    assert os.environ["HARNESS_CACHE_DIR"] == str(TESTS_CACHE_DIR)


def test_finished_entries_are_taken_in_whole_and_staging_is_left(tmp_path: Path):
    user, tests = tmp_path / "user", tmp_path / "tests"
    done = user / "vllm" / "0.30.0" / "release"
    (done / "vllm").mkdir(parents=True)
    (done / "vllm" / "a.py").write_text("x = 1\n")
    (done / "manifest.json").write_text("{}")
    staging = user / "vllm" / "0.31.0" / "release.partial-123"  # an extraction under way elsewhere
    (staging / "vllm").mkdir(parents=True)
    (staging / "manifest.json").write_text("{}")
    unfinished = user / "vllm" / "0.32.0" / "release"  # no manifest yet
    (unfinished / "vllm").mkdir(parents=True)
    _take_in(user, tests)
    taken = tests / "vllm" / "0.30.0" / "release"
    assert (taken / "vllm" / "a.py").read_text() == "x = 1\n"
    assert (taken / "vllm" / "a.py").stat().st_ino == (done / "vllm" / "a.py").stat().st_ino  # a link, no copy
    assert sorted(p.name for p in (tests / "vllm").iterdir()) == ["0.30.0"]
    (taken / "vllm" / "b.py").write_text("y = 2\n")  # an entry already there is left as it is
    _take_in(user, tests)
    assert (taken / "vllm" / "b.py").exists()


def test_a_kept_release_wheel_is_taken_in(tmp_path: Path):
    # A release's wheel kept on request (vllm/<version>/wheel/, placed with one rename and verified on every use) has
    # no manifest: without it a worker's private cache would download the release again.
    user, tests = tmp_path / "user", tmp_path / "tests"
    kept = user / "vllm" / "0.30.0" / "wheel"
    kept.mkdir(parents=True)
    name = "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    (kept / name).write_bytes(b"PK")
    (user / "vllm" / "0.31.0" / "wheel").mkdir(parents=True)  # nothing kept there
    _take_in(user, tests)
    assert (tests / "vllm" / "0.30.0" / "wheel" / name).read_bytes() == b"PK"
    assert sorted(p.name for p in (tests / "vllm").iterdir()) == ["0.30.0"]


def test_an_xdist_worker_reads_a_private_copy_and_gives_back_what_it_fetched(tmp_path: Path):
    """Under pytest-xdist a worker belongs to the session that started it: it reads a private copy of that session's
    cache (so a download in one worker is never blamed on another's test) and, at exit, its new entries and its
    download lines go back to the session's cache."""
    import subprocess
    import sys

    shared, user = tmp_path / "shared", tmp_path / "user"
    old = shared / "vllm" / "0.30.0" / "release"
    old.mkdir(parents=True)
    (old / "manifest.json").write_text("{}")
    worker = (
        "import sys, pathlib\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import conftest\n"
        "private = conftest.TESTS_CACHE_DIR\n"
        "print(private)\n"
        "assert (private / 'vllm/0.30.0/release/manifest.json').exists()\n"
        "new = private / 'vllm/0.33.0/release'\n"
        "new.mkdir(parents=True)\n"
        "(new / 'manifest.json').write_text('{}')\n"
        "(private / 'downloads.log').write_text('{\"version\": \"0.33.0\"}\\n')\n"
    )
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw1", "HARNESS_TESTS_SESSION_CACHE": str(shared),
           "HARNESS_CACHE_DIR": str(user)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", worker], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    private = Path(done.stdout.strip())
    assert private != shared and not private.exists()  # private, and removed at exit
    assert (shared / "vllm" / "0.33.0" / "release" / "manifest.json").exists()
    assert (shared / "downloads.log").read_text() == '{"version": "0.33.0"}\n'


def test_xdist_schedules_a_module_per_worker_and_the_ray_modules_together():
    """The scheduler tests/conftest.py gives pytest-xdist puts every test of a module in one scope (its module
    fixtures built once), both Ray modules in one (their clusters one after another) and the modules reading the
    shared smoke run in one (the run made once)."""
    from xdist.scheduler import LoadScopeScheduling

    import conftest

    scheduling = conftest.module_scheduling()
    assert issubclass(scheduling, LoadScopeScheduling)
    scope = scheduling._split_scope.__get__(object.__new__(scheduling))
    assert (
        scope("tests/test_hostile_inputs.py::test_hostile_input_is_refused[acc-x-plan]")
        == scope("tests/test_hostile_inputs.py::test_hostile_input_is_refused[tb-y-run]")
        == "tests/test_hostile_inputs.py"
    )
    assert scope("tests/test_launch_ray.py::test_a") == scope("tests/test_readme_ray.py::test_b") == "ray"
    assert (
        scope("tests/test_baseline.py::test_e")
        == scope("tests/test_console.py::test_f")
        == scope("tests/test_launch_local.py::test_g")
        == "smoke-run"
    )
    assert scope("tests/test_search.py::test_c") != scope("tests/test_models.py::test_d")
