"""compare takes every number from the records: a collected report.json is verified first (its content digest and
its records' bytes), a hand-edited one is refused, and a changed byte shows as bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.collect import collect
from harness.report.compare import load_report
from harness.report.load import load_run
from harness.report.model import RunReport
from report_records import make_scenario, workspace_delta_for, write_run


def _run(tmp_path: Path, name: str, overrides=None) -> Path:
    run_dir = write_run(tmp_path / name, make_scenario(), overrides=overrides)
    collect(run_dir)
    return run_dir


def test_a_hand_edited_report_json_with_its_generation_kept_is_refused(tmp_path: Path, capsys) -> None:
    base, cur = _run(tmp_path, "base"), _run(tmp_path, "cur")
    path = cur / "report.json"
    data = json.loads(path.read_text())
    generation = data["generation"]
    fixed = next(p for p in data["policies"] if p["policy"] == "fixed")
    fixed["workspace_delta_bytes"]["max"] //= 2  # a better number, the stamp left as it was
    path.write_text(json.dumps(data, indent=1))
    assert json.loads(path.read_text())["generation"] == generation
    for current in (cur, path):  # the directory, or its report.json named as a file
        assert main(["compare", str(base), str(current)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "report.json was changed after collect" in err and f"re-run `harness collect {cur}`" in err
    # collecting again from the records restores the records' numbers, and the gate passes
    collect(cur)
    assert main(["compare", str(base), str(cur)]) == 0
    capsys.readouterr()


def test_a_verified_report_is_used_without_collecting_again(tmp_path: Path) -> None:
    from harness.report.load import input_hash

    run_dir = _run(tmp_path, "run")
    assert input_hash(run_dir) == load_run(run_dir).input_hash  # the bytes-only hash is load_run's
    assert load_report(run_dir).source == "report.json" and load_report(run_dir).digest == "verified"
    # a report.json without a digest (an older harness's): every number is taken from the records instead
    data = json.loads((run_dir / "report.json").read_text())
    data.pop("content_digest")
    data["policies"][0]["workspace_delta_bytes"]["max"] = 1
    (run_dir / "report.json").write_text(json.dumps(data))
    loaded = load_report(run_dir)
    assert loaded.source.startswith("records (collected in memory")
    assert isinstance(loaded.report, RunReport)
    delta = loaded.report.policies[0].workspace_delta_bytes
    assert delta is not None and delta.max != 1


def test_the_bytes_only_hash_is_load_runs_for_links_and_files_that_are_not_records(tmp_path: Path) -> None:
    """input_hash opens rank files without resolving each path; whatever is not a plain record (a link inside the
    run directory, one out of it, a FIFO) is digested as load_run digests it, so the two hashes stay one."""
    import os

    from harness.report.load import input_hash

    run_dir = _run(tmp_path, "run")
    plain = input_hash(run_dir)
    rank1 = run_dir / "ranks/rank-00001.json"
    (run_dir / "kept.json").write_bytes(rank1.read_bytes())
    rank1.unlink()
    rank1.symlink_to(run_dir / "kept.json")  # a link that stays inside: followed, the same bytes
    assert input_hash(run_dir) == load_run(run_dir).input_hash == plain
    (tmp_path / "outside.json").write_bytes((run_dir / "kept.json").read_bytes())
    rank1.unlink()
    rank1.symlink_to(tmp_path / "outside.json")  # a link out of the run directory: not read, named
    assert input_hash(run_dir) == load_run(run_dir).input_hash != plain
    rank1.unlink()
    os.mkfifo(rank1)  # a FIFO would block a reader: not opened for reading
    assert input_hash(run_dir) == load_run(run_dir).input_hash != plain


def test_a_record_changed_under_a_verified_report_is_refused(tmp_path: Path, capsys) -> None:
    base, cur = _run(tmp_path, "base"), _run(tmp_path, "cur")
    rank = cur / "ranks/rank-00001.json"
    rank.write_bytes(rank.read_bytes().replace(b'"num_checked_tokens": 32', b'"num_checked_tokens": 31', 1))
    assert main(["compare", str(base), str(cur)]) == 2
    assert "its records are now" in capsys.readouterr().err


def test_a_changed_byte_shows_as_bytes(tmp_path: Path, capsys) -> None:
    scenario = make_scenario()
    one_more = {
        r: {"fixed": {"workspace_delta_bytes": workspace_delta_for(scenario, "fixed", r) + 1}} for r in range(2)
    }
    base, cur = _run(tmp_path, "base"), _run(tmp_path, "cur", overrides=one_more)
    assert main(["compare", str(base), str(cur), "--threshold", "workspace_delta_max_bytes=0"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "workspace_delta_max_bytes" in line and "regression" in line)
    assert "+1 B" in line and "+0.0%" not in line


def test_bytes_that_round_alike_are_shown_exactly() -> None:
    from harness.report.compare import METRICS, compare_metric
    from harness.report.compare_metrics import Row
    from harness.report.compare_render import _fmt_change, _fmt_pair

    metric = METRICS["workspace_delta_max_bytes"]
    verdict, pct, diff, note = compare_metric(metric, 32 * 2**20, 32 * 2**20 + 1, 0.0)
    row = Row(
        cell=None,
        policy="fixed",
        metric=metric.name,
        baseline=32 * 2**20,
        current=32 * 2**20 + 1,
        change_pct=pct,
        change_abs=diff,
        threshold=0.0,
        threshold_kind="pct",
        verdict=verdict,
        note=note,
    )
    assert verdict == "regression"
    assert _fmt_pair(row) == ("33554432 B", "33554433 B") and _fmt_change(row) == "+1 B"


@pytest.mark.parametrize("edit", ["nan", "digest"])
def test_an_edited_report_file_outside_a_run_directory_is_refused(tmp_path: Path, capsys, edit: str) -> None:
    base = _run(tmp_path, "base")
    data = json.loads((base / "report.json").read_text())
    if edit == "nan":
        data["policies"][0]["max_rel_error"]["max"] = float("nan")
    else:
        data["content_digest"] = "sha256:" + "0" * 64
    (tmp_path / "copy.json").write_text(json.dumps(data))
    assert main(["compare", str(base), str(tmp_path / "copy.json")]) == 2
    assert "report.json was changed after collect" in capsys.readouterr().err
