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
