"""The regression gate: exit codes 0 / 1 / 2, missing = regression, NaN, the runs' own spread, hardware, clear
errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import pytest

from harness.cli import main
from harness.core.records import SCHEMA_VERSION, rank_record_path, write_record
from harness.report.collect import collect
from harness.report.compare import (
    EXACT,
    METRICS,
    CompareError,
    compare_metric,
    compare_reports,
    load_report,
    parse_options,
    parse_thresholds,
)
from report_records import make_scenario, rank_record, write_run


def run(tmp_path: Path, name: str, overrides=None, device_kind: Literal["cuda", "cpu"] = "cuda", **sections) -> Path:
    run_dir = write_run(tmp_path / name, make_scenario(**sections), overrides=overrides, device_kind=device_kind)
    collect(run_dir)
    return run_dir


def compare_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def rows(data: dict, verdict: str) -> set[tuple[str, str]]:
    return {(r["policy"], r["metric"]) for r in data["rows"] if r["verdict"] == verdict}


def edit_report(run_dir: Path, dest: Path, edit) -> Path:
    """A copy of run_dir's report.json, edited as a careless script (or a hand) would; compared as a file."""
    data = json.loads((run_dir / "report.json").read_text())
    data.pop("content_digest")  # another writer's report: no digest, so the file is read as it is
    edit(data)
    dest.write_text(json.dumps(data))  # json.dumps writes NaN as NaN: not JSON, as such an edit would
    return dest


def test_identical_runs_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = run(tmp_path, "base"), run(tmp_path, "cur")
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 0 and data["status"] == "OK" and data["num_regressions"] == 0
    assert data["num_unchanged"] == 2 * (len(EXACT) + len(METRICS))
    assert main(["compare", str(base), str(cur)]) == 0
    assert "nothing changed beyond its threshold" in capsys.readouterr().out


def test_workspace_growth_is_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The scenario's own memory check allows 60 %: the runs pass their checks, and the growth is compare's to judge.
    wide = {"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 60.0}
    base = run(tmp_path, "base", expect=wide)
    contract_bytes = 2 * 4 * 128 * 128 * 2  # fixed at D=4: common + ws2, both (E, M, 128) bf16
    grown = {0: {"fixed": {"workspace_delta_bytes": int(contract_bytes * 1.5)}}}
    cur = run(tmp_path, "cur", overrides=grown, expect=wide)
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 1 and data["status"] == "FAILED"
    assert rows(data, "regression") == {("fixed", "workspace_delta_avg_bytes"), ("fixed", "workspace_delta_max_bytes")}
    row = next(r for r in data["rows"] if r["metric"] == "workspace_delta_max_bytes" and r["policy"] == "fixed")
    assert row["change_pct"] == pytest.approx((row["current"] - row["baseline"]) / row["baseline"] * 100)
    assert data["hints"] == []  # memory, not timing: no hint about --ignore time
    # the same change passes under a wider memory threshold (a group override)
    assert main(["compare", str(base), str(cur), "--threshold", "memory=60"]) == 0
    # ...and fails again when the one metric is tightened
    assert (
        main(
            ["compare", str(base), str(cur), "--threshold", "memory=60", "--threshold", "workspace_delta_max_bytes=10%"]
        )
        == 1
    )
    capsys.readouterr()


def test_fit_to_oom_is_a_regression_and_oom_to_fit_an_improvement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No expected outcomes: both runs pass their own checks, and the change of outcome is compare's to judge.
    free = {"outcomes": {}, "memory_tolerance_pct": 1.0}
    fits = run(tmp_path, "fits", expect=free)
    ooms = run(tmp_path, "ooms", overrides={1: {"legacy": {"status": "oom"}}}, expect=free)
    code, data = compare_json(capsys, str(fits), str(ooms))
    assert code == 1
    outcome = next(r for r in data["rows"] if r["policy"] == "legacy" and r["metric"] == "outcome")
    assert (outcome["baseline"], outcome["current"], outcome["verdict"]) == ("fit", "oom", "regression")
    code, data = compare_json(capsys, str(ooms), str(fits))
    assert code == 0
    outcome = next(r for r in data["rows"] if r["policy"] == "legacy" and r["metric"] == "outcome")
    assert outcome["verdict"] == "improvement"


def test_throughput_direction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    slower = run(tmp_path, "slower", overrides={1: {"fixed": {"experts_tflops": 500.0}}})
    quicker = {"fixed": {"experts_tflops": 2000.0, "experts_us": 50.0}}
    faster = run(tmp_path, "faster", overrides={0: quicker, 1: quicker})
    one_rank_faster = run(tmp_path, "one", overrides={1: quicker})
    code, data = compare_json(capsys, str(base), str(slower))
    assert code == 1
    assert rows(data, "regression") == {("fixed", "experts_tflops")}
    assert "--ignore time --ignore throughput" in data["hints"][0]
    assert main(["compare", str(base), str(slower)]) == 1
    assert "hint: timings and throughputs depend on the machine" in capsys.readouterr().out
    code, data = compare_json(capsys, str(base), str(faster))
    assert code == 0  # more TFLOP/s and less time are better
    assert rows(data, "improvement") == {("fixed", "experts_tflops"), ("fixed", "experts_us")}
    # one fast rank changes neither the max time nor the min throughput over ranks
    code, data = compare_json(capsys, str(base), str(one_rank_faster))
    assert code == 0 and data["num_improvements"] == 0


def test_timings_regress_only_beyond_the_runs_spread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """+25 % experts time is beyond the 10 % threshold. With samples spread over 40 % it is noise; with 4 % it is a
    regression; with no min/max in the records the threshold alone decides, and the row says so."""
    slow = {"experts_us": 250.0 + 2}
    for spread, expected, note in (
        (0.4, 0, "within the runs' spread (40%)"),
        (0.04, 1, ""),
        (None, 1, "no per-stage min/max in the records: threshold alone"),
    ):
        overrides_base = {r: {"fixed": {"timing_spread": spread}} for r in range(2)}
        overrides_cur = {r: {"fixed": {"timing_spread": spread, **slow}} for r in range(2)}
        base = run(tmp_path, f"base-{spread}", overrides=overrides_base)
        cur = run(tmp_path, f"cur-{spread}", overrides=overrides_cur)
        code, data = compare_json(capsys, str(base), str(cur))
        row = next(r for r in data["rows"] if r["policy"] == "fixed" and r["metric"] == "experts_us")
        assert code == expected, (spread, row)
        assert row["verdict"] == ("unchanged" if expected == 0 else "regression") and row["note"] == note


def test_compare_metric_rules() -> None:
    memory, error, tflops = METRICS["workspace_delta_avg_bytes"], METRICS["max_error"], METRICS["experts_tflops"]
    assert compare_metric(memory, 100, 102, 2.0)[0] == "unchanged"  # at the threshold: not beyond it
    assert compare_metric(memory, 100, 103, 2.0)[0] == "regression"
    assert compare_metric(memory, 100, 90, 2.0)[0] == "improvement"
    assert compare_metric(tflops, 100.0, 85.0, 10.0)[0] == "regression"
    assert compare_metric(tflops, 100.0, 85.0, 10.0, noise_pct=20.0)[0] == "unchanged"
    assert compare_metric(tflops, 100.0, 120.0, 10.0)[0] == "improvement"
    assert compare_metric(error, 0.001, 0.009, 0.01)[0] == "unchanged"  # +800 %, but absolutely small
    assert compare_metric(error, 0.01, 0.03, 0.01)[0] == "regression"
    verdict, pct, _, note = compare_metric(memory, 0, 4096, 2.0)
    assert verdict == "regression" and pct == float("inf") and note == "from zero"
    assert compare_metric(memory, None, 5, 2.0)[:1] == ("not compared",)
    assert compare_metric(memory, 5, None, 2.0) == ("regression", None, None, "missing in current")
    assert compare_metric(METRICS["contract_total_bytes"], 1000, 1001, 0.0)[0] == "regression"  # computed: exact


# ---------------------------------------------------------------------------------------------------------------
# Whatever the baseline has and the current run lacks


def test_a_policy_deleted_from_the_current_report_is_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = run(tmp_path, "base")
    cur = edit_report(
        run(tmp_path, "cur"),
        tmp_path / "edited.json",
        lambda d: d.update(policies=[p for p in d["policies"] if p["policy"] != "fixed"]),
    )
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 1
    (row,) = [r for r in data["rows"] if r["verdict"] == "regression"]
    assert (row["policy"], row["metric"], row["note"]) == ("fixed", "policy", "policy not in current")
    assert main(["compare", str(base), str(cur), "--ignore", "policy:fixed"]) == 0
    capsys.readouterr()


def test_a_missing_metric_and_fewer_ranks_are_regressions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")

    def drop(d: dict) -> None:
        fixed = next(p for p in d["policies"] if p["policy"] == "fixed")
        fixed["allocator_allocated_peak_bytes"] = None  # a metric that became missing
        fixed["num_ranks"] = 1  # a rank's results that vanished

    cur = edit_report(run(tmp_path, "cur"), tmp_path / "edited.json", drop)
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 1
    assert rows(data, "regression") == {("fixed", "allocator_peak_bytes"), ("fixed", "num_ranks")}
    assert {r["note"] for r in data["rows"] if r["verdict"] == "regression"} == {
        "missing in current",
        "ranks with a result: fewer than the baseline's",
    }
    code, data = compare_json(capsys, str(base), str(cur), "--ignore", "allocator_peak_bytes", "--ignore", "coverage")
    assert code == 0


def test_nan_in_the_current_report_is_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")

    def nan(d: dict) -> None:
        next(p for p in d["policies"] if p["policy"] == "legacy")["workspace_delta_bytes"]["avg"] = float("nan")

    cur = edit_report(run(tmp_path, "cur"), tmp_path / "nan.json", nan)
    assert "NaN" in cur.read_text()
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 1
    regressed = [r for r in data["rows"] if r["verdict"] == "regression"]
    assert {(r["policy"], r["metric"], r["note"]) for r in regressed} == {
        ("legacy", "workspace_delta_avg_bytes", "NaN or infinity in current"),
        ("legacy", "workspace_delta_max_bytes", "NaN or infinity in current"),
    }
    # the same NaN in the baseline leaves the metric uncompared, never an improvement
    code, data = compare_json(capsys, str(cur), str(base))
    assert code == 0 and data["num_improvements"] == 0
    assert ("legacy", "workspace_delta_avg_bytes") in rows(data, "not compared")
    # a literal too large for a float (JSON has no infinity, but 1e999 reads as one) is an infinity as well
    huge = tmp_path / "huge.json"
    huge.write_text(cur.read_text().replace("NaN", "1e999"))
    code, data = compare_json(capsys, str(base), str(huge))
    assert code == 1 and ("legacy", "workspace_delta_avg_bytes") in rows(data, "regression")


def test_problems_in_the_current_runs_records_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    for name, damage, says in (
        ("deleted", lambda p: p.unlink(), "missing-rank"),
        ("truncated", lambda p: p.write_text(p.read_text()[:200]), "truncated"),
        (
            "newer",
            lambda p: p.write_text(
                p.read_text().replace(
                    f'"schema_version": {SCHEMA_VERSION}', f'"schema_version": {SCHEMA_VERSION + 1}', 1
                )
            ),
            "newer-schema",
        ),
    ):
        cur = run(tmp_path, name)
        damage(rank_record_path(cur, 1))
        collect(cur)  # collected after the damage: the report itself carries the problem
        code, data = compare_json(capsys, str(base), str(cur))
        assert code == 2 and "the current run's records have 1 problem(s)" in data["exit_reason"], name
        assert says in data["exit_reason"], (name, data["exit_reason"])


def test_a_report_json_that_is_not_its_records_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    cur = run(tmp_path, "cur")
    shutil.copy(rank_record_path(cur, 1), tmp_path / "saved.json")
    rank_record_path(cur, 1).unlink()  # deleted after collect: report.json still looks complete
    assert main(["compare", str(base), str(cur)]) == 2
    assert "its records are now" in capsys.readouterr().err
    shutil.copy(tmp_path / "saved.json", rank_record_path(cur, 1))
    assert main(["compare", str(base), str(cur)]) == 0  # restored: the same generation again
    md = (cur / "report.md").read_text()
    (cur / "report.md").write_text(md.replace("# generation: ", "# generation: other-run@0000", 1))
    assert main(["compare", str(base), str(cur)]) == 2
    assert "a mixed set of outputs" in capsys.readouterr().err


def test_report_json_files_and_same_name_changed_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    # same scenario name, one more policy: the hash changes, the comparison goes on with a warning
    cur = run(
        tmp_path,
        "cur",
        policies=["legacy", "fixed", "lower-bound"],
        expect={"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
    )
    code, data = compare_json(capsys, str(base / "report.json"), str(cur / "report.json"))
    assert code == 0
    assert any("changed (hash" in w and "compared by name" in w for w in data["warnings"])
    assert any(r["policy"] == "lower-bound" and r["note"] == "policy not in baseline" for r in data["rows"])


# ---------------------------------------------------------------------------------------------------------------
# Hardware


def test_a_cpu_run_against_a_gpu_baseline_is_shown_not_gated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CPU RSS against GPU NVML and CPU timings against GPU ones say nothing about a regression."""
    gpu = run(tmp_path, "gpu")
    slow = {p: {"experts_us": 90_000.0, "experts_tflops": 0.03} for p in ("legacy", "fixed")}
    cpu = run(tmp_path, "cpu", overrides={0: slow, 1: slow}, device_kind="cpu")
    code, data = compare_json(capsys, str(gpu), str(cpu))
    assert code == 0
    note = data["hardware_note"]
    assert note.startswith("different hardware: baseline NVIDIA H200 (cuda), current x86_64 (cpu)")
    assert "measured memory (RSS vs NVML)" in note and "not gated" in note
    assert ("fixed", "experts_us") in rows(data, "not gated")
    assert ("fixed", "workspace_delta_avg_bytes") in rows(data, "not gated")
    assert ("fixed", "contract_total_bytes") in rows(data, "unchanged")  # computed bytes are still gated
    assert main(["compare", str(gpu), str(cpu)]) == 0
    out = capsys.readouterr().out
    assert sum(1 for line in out.splitlines() if line.startswith("different hardware:")) == 1
    assert main(["compare", str(gpu), str(cpu), "--gate-across-hardware"]) == 1
    capsys.readouterr()


def test_two_cpu_runs_show_timings_without_gating_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a shared CPU host another process can slow one policy's every sample threefold (measured on the
    development machine), which no spread of the run's own samples covers: CPU timings are shown, not gated."""
    base = run(tmp_path, "base", device_kind="cpu")
    slow = {"fixed": {"experts_us": 3 * 200.0, "experts_tflops": 300.0}}
    cur = run(tmp_path, "cur", overrides={0: slow, 1: slow}, device_kind="cpu")
    code, data = compare_json(capsys, str(base), str(cur))
    assert code == 0 and data["hardware_note"].startswith("CPU runs: timings and throughputs are wall-clock")
    assert {("fixed", "experts_us"), ("fixed", "experts_tflops")} <= rows(data, "not gated")
    row = next(r for r in data["rows"] if r["policy"] == "fixed" and r["metric"] == "experts_us")
    assert row["note"] == "CPU timing" and row["change_pct"] == pytest.approx((600 - 202) / 202 * 100)
    code, data = compare_json(capsys, str(base), str(cur), "--gate-cpu-timings")
    assert code == 1 and rows(data, "regression") == {("fixed", "experts_us"), ("fixed", "experts_tflops")}


def test_outcome_to_nothing_reads_n_a(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    cur = edit_report(
        run(tmp_path, "cur"),
        tmp_path / "edited.json",
        lambda d: next(p for p in d["policies"] if p["policy"] == "fixed").update(outcome=None),
    )
    assert main(["compare", str(base), str(cur)]) == 1
    out = capsys.readouterr().out
    assert "fit -> n/a" in out and "None" not in out


# ---------------------------------------------------------------------------------------------------------------
# Errors and options


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = run(tmp_path, "base")
    assert main(["compare", str(tmp_path / "missing"), str(base)]) == 2
    assert "no such file or directory" in capsys.readouterr().err

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(base), str(empty)]) == 2
    assert "neither report.json nor run.json" in capsys.readouterr().err

    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"report_schema_version": 2, "kind": "run", "polic')
    assert main(["compare", str(base), str(corrupt)]) == 2
    assert "corrupt JSON" in capsys.readouterr().err
    corrupt.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["compare", str(base), str(corrupt)]) == 2
    assert "not UTF-8" in capsys.readouterr().err

    assert main(["compare", str(base), str(base), "--threshold", "wall_time=5"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'wall_time'" in err and "workspace_delta_avg_bytes" in err and "throughput" in err
    assert main(["compare", str(base), str(base), "--threshold", "memory"]) == 2
    assert "expected METRIC=PCT" in capsys.readouterr().err
    assert main(["compare", str(base), str(base), "--threshold", "time=-1"]) == 2
    capsys.readouterr()

    other = write_run(tmp_path / "other", make_scenario(name="another-scenario"))
    code, data = compare_json(capsys, str(base), str(other))  # no report.json yet: collected in memory
    assert code == 2 and "different scenarios" in data["exit_reason"]
    assert not (other / "report.json").exists()


def test_parse_thresholds_and_options() -> None:
    thresholds = parse_thresholds(["time=25", "experts_us=5%", "max_error=0.05"])
    assert thresholds["dispatch_us"] == 25.0 and thresholds["combine_us"] == 25.0
    assert thresholds["experts_us"] == 5.0 and thresholds["max_error"] == 0.05
    assert thresholds["workspace_delta_avg_bytes"] == 2.0
    with pytest.raises(CompareError, match="compared exactly"):
        parse_thresholds(["outcome=1"])
    options = parse_options([], ["time", "policy:legacy", "cell:x", "outcome"])
    assert "dispatch_us" not in options.thresholds and {"policy:legacy", "cell:x", "outcome"} <= options.ignored
    with pytest.raises(CompareError, match="unknown metric or group"):
        parse_options([], ["policy:"])


def test_run_against_matrix_is_an_error(tmp_path: Path) -> None:
    from harness.report.matrix import collect_matrix
    from harness.scenario.matrix import load_matrix
    from harness.scenario.sections import REPO_DIR

    base = load_report(run(tmp_path, "base"))
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    result = collect_matrix(tmp_path / "matrix", matrix.cells(), matrix=matrix)
    with pytest.raises(CompareError, match="cannot compare a run report"):
        compare_reports(base, result.report)


def test_older_and_newer_report_schemas_are_errors(tmp_path: Path) -> None:
    path = run(tmp_path, "base") / "report.json"
    data = json.loads(path.read_text())
    for version, says in ((99, "newer than this harness reads"), (1, "older than this harness reads")):
        data["report_schema_version"] = version
        edited = tmp_path / f"v{version}.json"
        edited.write_text(json.dumps(data))
        with pytest.raises(CompareError, match=says):
            load_report(edited)


def test_matrices_compare_per_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.report.matrix import collect_matrix
    from harness.scenario.matrix import load_matrix
    from harness.scenario.sections import REPO_DIR

    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    for name, overrides, cells in (
        ("base", None, (first, second)),
        ("same", None, (first, second)),
        ("oom", {0: {"legacy": {"status": "oom"}}}, (first, second)),
        ("gone", None, (first,)),
    ):
        for cell in cells:
            write_run(tmp_path / name / cell.name, cell.scenario, overrides=overrides, device_kind="cpu")
        collect_matrix(tmp_path / name, matrix.cells(), matrix=matrix)
    base = str(tmp_path / "base")
    assert main(["compare", base, str(tmp_path / "same")]) == 0
    capsys.readouterr()
    code, data = compare_json(capsys, base, str(tmp_path / "oom"))
    assert code == 1
    assert {(r["cell"], r["policy"]) for r in data["rows"] if r["verdict"] == "regression"} == {
        (first.name, "legacy"),
        (second.name, "legacy"),
    }
    # a cell whose run vanished: its results are gone, which must not pass the gate
    code, data = compare_json(capsys, base, str(tmp_path / "gone"))
    assert code == 1
    gone = {(r["cell"], r["metric"], r["note"]) for r in data["rows"] if r["verdict"] == "regression"}
    assert gone == {(second.name, "outcome", "no result in current")}
    assert main(["compare", base, str(tmp_path / "gone"), "--ignore", f"cell:{second.name}"]) == 0
    capsys.readouterr()
    # a cell missing from the combined report altogether
    edited = edit_report(tmp_path / "same", tmp_path / "fewer.json", lambda d: d.update(cells=d["cells"][:1]))
    code, data = compare_json(capsys, base, str(edited))
    assert code == 1 and rows(data, "regression") == {("", "cell")}
    # records written for one rank replaced under a cell: the matrix report is stale against them
    write_record(
        rank_record_path(tmp_path / "same" / first.name, 1),
        rank_record(
            first.scenario,
            1,
            run_id="20251130-052000-synthetic",
            device_kind="cpu",
            overrides={"fixed": {"experts_us": 1.0}},
        ),
    )
    assert main(["compare", base, str(tmp_path / "same")]) == 2
    assert "its records are now" in capsys.readouterr().err
