"""The collector: numbers in report.json recomputed from the synthetic inputs, verdicts judged from the numbers (never
from a record's own flags), hostile run directories contained, one generation across the four outputs."""

from __future__ import annotations

import io
import json
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Literal

import pytest

from harness.cli import main
from harness.core.contract import fixed_shapes, live_set_bytes
from harness.core.records import SCHEMA_VERSION, RecordError, parse_record, rank_record_path, read_record, write_record
from harness.report.checks import BASELINE_ROUNDING_BYTES, Judging, evaluate_checks
from harness.report.collect import collect
from harness.report.model import Check, PolicySummary, RunReport
from harness.report.write import REPORT_FILES, output_generations
from report_records import make_scenario, policy_result, rank_record, read_md, workspace_delta_for, write_run

MiB = 2**20


def four_rank_scenario(**sections):
    parallel = {"num_dispatchers": 8, "num_ranks": 4, "num_local_experts": 4, "max_tokens_per_rank": 32}
    return make_scenario(parallel=parallel, **sections)


def run_report(result) -> RunReport:
    assert isinstance(result.report, RunReport)
    return result.report


def policy(report: RunReport, name: str) -> PolicySummary:
    summary = report.policy(name)
    assert summary is not None, name
    return summary


def junit_cases(run_dir: Path) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.parse(run_dir / "junit.xml").getroot()
    return root, root.findall("./testsuite/testcase")


def strict_json(path: Path) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path} holds {constant}: not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def kinds(report: RunReport) -> list[tuple[str, int | None]]:
    return [(p.kind, p.rank) for p in report.problems]


# ---------------------------------------------------------------------------------------------------------------
# Numbers and verdicts


def test_all_pass_numbers_equal_the_inputs(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    result = collect(run_dir)
    report = run_report(result)

    assert result.exit_code == 0 and result.status == "OK"
    for name in REPORT_FILES:
        assert (run_dir / name).is_file(), name
    assert strict_json(run_dir / "report.json") == report.model_dump(mode="json")
    args = scenario.sizing_args()
    fixed_total = fixed_shapes(args).total_bytes
    for name in ("legacy", "fixed"):
        deltas = [workspace_delta_for(scenario, name, rank) for rank in range(4)]
        summary = policy(report, name)
        assert summary.workspace_delta_bytes is not None
        assert summary.workspace_delta_bytes.model_dump() == {
            "min": min(deltas),
            "avg": sum(deltas) / 4,
            "max": max(deltas),
            "num_ranks": 4,
        }
        assert (summary.num_oom, summary.outcome, summary.num_ranks, summary.expectation) == (0, "fit", 4, "pass")
        assert summary.lower_bound_bytes == live_set_bytes(args)
        assert summary.contract_total_bytes is not None
        assert summary.ratio_to_fixed == summary.contract_total_bytes / fixed_total
        # timings are aggregated with max over ranks, throughput with min (the synthetic values grow/shrink by rank)
        assert summary.experts_us and summary.experts_us.max == 200.0 + 2 * 3
        assert summary.experts_tflops and summary.experts_tflops.min == 900.0 - 3
        assert summary.dispatch_busbw_gbps and summary.dispatch_busbw_gbps.min == 250.0 - 3
        assert summary.max_rel_error and summary.max_rel_error.max == pytest.approx(0.01 + 0.003)
        assert summary.timing_spread and summary.timing_spread.experts == pytest.approx(0.04)
        # the baselines: 1e9 + rank on every policy of a rank
        assert summary.baseline_bytes and (summary.baseline_bytes.min, summary.baseline_bytes.max) == (10**9, 10**9 + 3)
    # legacy multiplies M by D a second time: D times the fixed contract
    assert policy(report, "legacy").ratio_to_fixed == 8.0
    assert report.checks.model_dump() == {"num_pass": 4 * 2 * 4, "num_fail": 0, "num_skip": 0, "num_error": 0}
    assert report.hardware.num_ranks_reported == 4 and report.hardware.num_ranks_expected == 4
    assert report.scenario.emulated is True and report.scenario.num_dispatchers == 8
    assert [r.rank for r in report.ranks] == [0, 1, 2, 3]
    assert report.run_id == "20251130-052000-synthetic" and report.scenario_hash == scenario.scenario_hash


def test_markdown_header_table_and_footer(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, num_nodes=2)
    report = run_report(collect(run_dir))
    md = read_md(run_dir / "report.md")
    for text in (
        "torch 2.13.0",
        "CUDA 12.8",
        "NCCL 2.27.3",
        "driver 580.95.05",
        "Ray 2.52.0",
        "vLLM source: release 0.30.0",
        "NVIDIA H200",
        "on 2 node(s)",
        scenario.scenario_hash,
        "D=8 P=4 E=4 T=32 M=256 K=128 I=64",
        "top_k=4",
        "is EMULATED on P=4",
        "each GPU's memory",
        "same-baseline",
        "NVML",
        f"# generation: {report.generation}",
    ):
        assert text in md, text
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| policy |"))
    headers = [h.strip() for h in lines[header].strip("|").split("|")]
    assert len(headers) == len(set(headers)), headers  # unique: no two "experts", no three "ws delta"
    assert "ws delta min" in headers and "experts time" in headers and "experts rate" in headers
    assert lines[header + 2].startswith("|  | vs expected | MiB | MiB | ratio | MiB NVML")  # the units row
    assert "| over ranks |" in lines[header + 3] and "| max |" in lines[header + 3]  # the aggregation row
    assert "| legacy | fit (expected fit): pass |" in md
    assert "### Memory baselines per rank" in md and "allowed 2.0 MiB" in md
    assert lines[-1] == "**OK (exit 0): all 32 checks passed (0 skipped)**"


def test_failed_expectation_exits_1(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, overrides={2: {"legacy": {"status": "oom"}}})
    result = collect(run_dir)
    report = run_report(result)

    assert result.exit_code == 1
    legacy = policy(report, "legacy")
    assert (legacy.num_oom, legacy.outcome, legacy.expectation) == (1, "oom", "fail")
    assert (
        legacy.workspace_delta_bytes and legacy.workspace_delta_bytes.num_ranks == 3
    )  # the OOMed rank measured nothing
    assert [(f.rank, f.policy, f.check) for f in report.check_failures] == [(2, "legacy", "expectation")]
    assert report.checks.num_fail == 1 and report.checks.num_skip == 2  # correctness + memory skipped
    md = read_md(run_dir / "report.md")
    assert "| legacy | oom (expected fit): FAIL |" in md
    assert md.rstrip().endswith("**FAILED (exit 1): 1 check(s) failed**")
    assert main(["collect", str(run_dir)]) == 1


def test_expected_oom_passes_and_says_so(tmp_path: Path) -> None:
    scenario = four_rank_scenario(expect={"outcomes": {"legacy": "oom", "fixed": "fit"}})
    overrides = {rank: {"legacy": {"status": "oom"}} for rank in range(4)}
    run_dir = write_run(tmp_path / "run", scenario, overrides=overrides)
    result = collect(run_dir)
    assert result.exit_code == 0
    assert policy(run_report(result), "legacy").num_oom == 4
    assert run_report(result).checks.num_skip == 4 * 2
    assert "| legacy | oom (expected oom): pass |" in read_md(run_dir / "report.md")


def _as_version_1(run_dir: Path, flags: dict[tuple[int, str], bool]) -> None:
    """Rewrite a run's records as version 1 ones, carrying the verdicts a rank made then: within_tolerance and
    first_diverging_stage on each correctness, expectation_met on each policy; `flags` sets (rank, policy)'s."""
    run_json = run_dir / "run.json"
    run_json.write_text(run_json.read_text().replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 1', 1))
    for path in sorted((run_dir / "ranks").glob("rank-*.json")):
        data = json.loads(path.read_text())
        data["schema_version"] = 1
        for p in data["policies"]:
            claim = flags.get((data["rank"], p["policy"]), True)
            p["expectation_met"] = claim
            if p.get("correctness") is not None:
                p["correctness"].update(within_tolerance=claim, first_diverging_stage=None)
        path.write_text(json.dumps(data))


def test_a_version_1_record_loads_without_the_verdicts_it_carried(tmp_path: Path) -> None:
    """Version 1 records carried the rank's own verdicts; they load, the verdicts dropped. A current record
    holding one is corrupt, named by its field."""
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    current = read_record(rank_record_path(run_dir, 0))
    _as_version_1(run_dir, {})
    old = json.loads(rank_record_path(run_dir, 0).read_text())
    assert old["policies"][0]["correctness"]["within_tolerance"] is True and old["policies"][0]["expectation_met"]
    loaded = read_record(rank_record_path(run_dir, 0))
    assert loaded.model_dump(exclude={"schema_version"}) == current.model_dump(exclude={"schema_version"})
    assert loaded.schema_version == 1
    old["schema_version"] = SCHEMA_VERSION
    with pytest.raises(
        RecordError, match=r"^rank\.json: corrupt: policies\.0\.correctness\.within_tolerance: Extra inputs"
    ):
        parse_record(json.dumps(old).encode(), where="rank.json")


def test_verdicts_come_from_the_numbers_not_the_records_flags(tmp_path: Path) -> None:
    """Version 1 records carried the rank's verdicts: one that claims within_tolerance with max_rel_error 50 and
    1000 wrong slots is a failed check; one that claims failure with good numbers passes."""
    scenario = four_rank_scenario()
    contract = policy_result(scenario, "fixed", 0).contract
    too_big = int((contract.common_bytes + contract.ws2_bytes) * 1.05)  # the tolerance is 1 %
    overrides: dict[int, dict[str, dict[str, Any]]] = {
        1: {"fixed": {"max_rel_error": 50.0, "num_wrong_slots": 1000}},
        2: {"legacy": {"max_rel_error": 0.07}},  # just over expect.max_error 0.06
        3: {"fixed": {"workspace_delta_bytes": too_big}},
    }
    run_dir = write_run(tmp_path / "run", scenario, overrides=overrides)
    _as_version_1(run_dir, {(0, "fixed"): False})  # good numbers, a pessimistic flag; every other flag claims success
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 1
    assert {(f.rank, f.policy, f.check) for f in report.check_failures} == {
        (1, "fixed", "correctness"),
        (2, "legacy", "correctness"),
        (3, "fixed", "memory"),
    }
    message = next(f.message for f in report.check_failures if f.rank == 1)
    assert "max rel error 50 (tolerance 0.06, expect.max_error)" in message and "1000 wrong slots" in message
    assert policy(report, "fixed").max_rel_error.max == 50.0  # type: ignore[union-attr]
    memory = next(f.message for f in report.check_failures if f.check == "memory")
    assert "+5%" in memory and "tolerance 1%" in memory


def test_unequal_baselines_fail_the_baseline_check(tmp_path: Path) -> None:
    """Legacy runs first; 572 MB of one-time setup inside its window lifts fixed's baseline."""
    scenario = four_rank_scenario()
    rounding = BASELINE_ROUNDING_BYTES["nvml"]
    overrides = {
        0: {"legacy": {"baseline_bytes": 6_526_271_488}, "fixed": {"baseline_bytes": 7_098_793_984}},
        1: {"legacy": {"baseline_bytes": 10**9}, "fixed": {"baseline_bytes": 10**9 + rounding}},
    }
    run_dir = write_run(tmp_path / "run", scenario, overrides=overrides)
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 1
    assert [(f.rank, f.policy, f.check) for f in report.check_failures] == [(0, "fixed", "baseline")]
    message = report.check_failures[0].message
    assert "+572522496 B" in message and "legacy's 6526271488 B" in message and "2097152 B of nvml rounding" in message
    assert report.ranks[1].policy("fixed").checks.baseline.outcome == "pass"  # type: ignore[union-attr]
    md = read_md(run_dir / "report.md")
    assert "| 0 | 6223.9 | 6769.9 | 546.0 | fail |" in md  # MiB per policy, the spread, the verdict


# ---------------------------------------------------------------------------------------------------------------
# Problems


def test_rank_failure_exits_2_and_is_named(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, failed_ranks={3: "died: exit code -9"})
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 2
    assert kinds(report) == [("rank-failure", 3)]
    assert "died: exit code -9; lost legacy, fixed" in report.problems[0].cause
    assert policy(report, "legacy").num_ranks == 3  # the others are still reported
    md = read_md(run_dir / "report.md")
    assert "ranks/rank-00003.failed.json" in md and "died: exit code -9" in md
    assert "FAILED (exit 2)" in md.splitlines()[-1]
    root, cases = junit_cases(run_dir)
    assert len(cases) == 3 * 2 * 4 + 1
    assert root.get("errors") == "1"


def test_a_rank_that_died_after_its_first_policy_keeps_it(tmp_path: Path) -> None:
    """Ranks write their record after every policy: a rank that died later keeps what it finished."""
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, failed_ranks={1: "died: exit code -9"})
    partial = rank_record(scenario, 1, run_id="20251130-052000-synthetic")
    write_record(rank_record_path(run_dir, 1), partial.model_copy(update={"policies": partial.policies[:1]}))
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 2
    assert kinds(report) == [("rank-failure", 1)]
    assert "finished legacy; lost fixed" in report.problems[0].cause
    rank1 = report.ranks[1]
    assert [p.policy for p in rank1.policies] == ["legacy"] and rank1.lost_policies == ["fixed"]
    assert rank1.failure is not None and "died" in rank1.failure
    assert policy(report, "legacy").num_ranks == 4 and policy(report, "fixed").num_ranks == 3


def test_unreadable_missing_newer_and_binary_records(tmp_path: Path) -> None:
    scenario = make_scenario(
        parallel={"num_dispatchers": 6, "num_ranks": 6, "num_local_experts": 4, "max_tokens_per_rank": 32}
    )
    run_dir = write_run(tmp_path / "run", scenario, skip_ranks=(4,))
    full = rank_record_path(run_dir, 1).read_text()
    rank_record_path(run_dir, 1).write_text(full[: full.index("\n", len(full) // 2)])  # a writer killed mid-file
    rank_record_path(run_dir, 2).write_text("\x00\x13garbage{")
    newer = json.loads(rank_record_path(run_dir, 3).read_text())
    newer["schema_version"] = SCHEMA_VERSION + 1
    rank_record_path(run_dir, 3).write_text(json.dumps(newer))
    rank_record_path(run_dir, 5).write_bytes(os.urandom(4096) + b"\xff\xfe")  # not even UTF-8

    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 2
    causes = {p.rank: (p.kind, p.cause) for p in report.problems}
    assert causes[1][0] == "truncated" and "truncated JSON" in causes[1][1]
    assert causes[2][0] == "corrupt" and "corrupt JSON" in causes[2][1]
    assert causes[3][0] == "newer-schema" and f"schema version {SCHEMA_VERSION + 1} is newer" in causes[3][1]
    assert causes[4][0] == "missing-rank" and "ranks/rank-00004.json is missing" in causes[4][1]
    assert causes[5] == ("corrupt", causes[5][1]) and "not UTF-8" in causes[5][1]
    assert all("\n" not in p.cause for p in report.problems)  # one line each
    assert str(tmp_path) not in json.dumps([p.cause for p in report.problems])  # named relative to the run
    assert [r.rank for r in report.ranks] == [0]  # rank 0 is still reported
    md = read_md(run_dir / "report.md")
    for rank in (1, 2, 3, 4, 5):
        assert f"ranks/rank-{rank:05d}.json" in md
    _, cases = junit_cases(run_dir)
    assert len(cases) == 1 * 2 * 4 + 5
    assert main(["collect", str(run_dir)]) == 2  # no traceback for any of them


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_rel_error", float("nan"), "max_rel_error is nan: a record holds finite numbers only"),
        ("experts_us", float("inf"), "experts_us is inf"),
        ("workspace_reserved_bytes", -4096, "workspace_reserved_bytes is -4096: sizes, counts and times are >= 0"),
        ("common_bytes", -1, "contract.common_bytes is -1"),
    ],
)
def test_nan_infinity_and_negative_sizes_are_invalid(tmp_path: Path, field: str, value: float, says: str) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    path = rank_record_path(run_dir, 2)
    data = json.loads(path.read_text())
    fixed = data["policies"][1]
    section = {
        "max_rel_error": "correctness",
        "experts_us": "timings",
        "workspace_reserved_bytes": "memory",
        "common_bytes": "contract",
    }[field]
    fixed[section][field] = value
    path.write_text(json.dumps(data))  # Python's json writes NaN and Infinity, as a careless writer would
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 2
    (problem,) = report.problems
    assert (problem.kind, problem.rank, problem.path) == ("invalid", 2, "ranks/rank-00002.json")
    assert says in problem.cause and problem.cause.startswith("ranks/rank-00002.json: policies.1.")
    strict_json(run_dir / "report.json")  # the report stays strict JSON
    assert policy(report, "fixed").num_ranks == 3


def test_only_canonical_rank_files_are_read(tmp_path: Path) -> None:
    """rank-1.json beside rank-00001.json must not replace it; anything else in ranks/ is named."""
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    impostor = rank_record(scenario, 1, run_id="20251130-052000-synthetic", overrides={"fixed": {"max_rel_error": 9.0}})
    write_record(run_dir / "ranks" / "rank-1.json", impostor)
    write_record(run_dir / "ranks" / "rank-000001.json", impostor)
    (run_dir / "ranks" / ".rank-00002.json.abc123.tmp").write_text("{")
    (run_dir / "ranks" / "notes.txt").write_text("hello")
    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 2
    problems = {p.path: (p.kind, p.cause) for p in report.problems}
    assert set(problems) == {
        "ranks/rank-1.json",
        "ranks/rank-000001.json",
        "ranks/.rank-00002.json.abc123.tmp",
        "ranks/notes.txt",
    }
    assert {k for k, _ in problems.values()} == {"unexpected-file"}
    assert "left by a writer that was stopped" in problems["ranks/.rank-00002.json.abc123.tmp"][1]
    assert policy(report, "fixed").max_rel_error.max < 0.1  # type: ignore[union-attr]  # the canonical record counted


def test_links_out_of_the_run_and_special_files_are_not_read(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    outside = write_run(tmp_path / "elsewhere", scenario)
    run_dir = write_run(tmp_path / "run", scenario, skip_ranks=(1, 2))
    os.symlink(rank_record_path(outside, 1), rank_record_path(run_dir, 1))
    os.mkfifo(rank_record_path(run_dir, 2))  # reading it would block forever
    (run_dir / "inside.json").write_text(rank_record_path(outside, 3).read_text())
    rank_record_path(run_dir, 3).unlink()
    os.symlink(run_dir / "inside.json", rank_record_path(run_dir, 3))  # a link inside the run is fine

    result = collect(run_dir)
    report = run_report(result)
    problems = {p.rank: (p.kind, p.cause) for p in report.problems}
    assert problems[1][0] == "outside" and "outside the run directory: not read" in problems[1][1]
    assert problems[2] == ("outside", "ranks/rank-00002.json: not a regular file: not read")
    assert 3 not in problems and [r.rank for r in report.ranks] == [0, 3]


def test_no_records_and_no_manifest(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "empty", scenario, skip_ranks=(0, 1, 2, 3))
    result = collect(run_dir)
    assert result.exit_code == 2
    assert sorted(k for k, _ in kinds(run_report(result))) == ["missing-rank"] * 4 + ["no-records"]
    assert "no readable rank records" in read_md(run_dir / "report.md")

    run_dir = write_run(tmp_path / "nomanifest", scenario, manifest=False)
    result = collect(run_dir)
    assert result.exit_code == 2
    assert [k for k, _ in kinds(run_report(result))] == ["no-manifest"]
    assert policy(run_report(result), "fixed").num_ranks == 4  # the records are still aggregated


def test_mismatched_scenario_hash_is_left_out(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    other = four_rank_scenario(policies=["legacy", "fixed", "lower-bound"])
    write_record(rank_record_path(run_dir, 2), rank_record(other, 2, run_id="20251130-052000-synthetic"))
    report = run_report(collect(run_dir))
    assert report.exit_code == 2
    (problem,) = report.problems
    assert problem.kind == "mismatch" and problem.rank == 2 and other.scenario_hash in problem.cause
    assert policy(report, "fixed").num_ranks == 3


def test_ranks_stopped_by_another_ranks_oom(tmp_path: Path) -> None:
    scenario = four_rank_scenario(expect={"outcomes": {"legacy": "oom", "fixed": "fit"}})
    overrides = {rank: {"legacy": {"status": "oom" if rank == 1 else "stopped"}} for rank in range(4)}
    result = collect(write_run(tmp_path / "run", scenario, overrides=overrides))
    report = run_report(result)
    assert result.exit_code == 0, report.exit_reason  # stopping together is not an error
    legacy = policy(report, "legacy")
    assert (legacy.outcome, legacy.num_oom, legacy.num_stopped, legacy.num_error) == ("oom", 1, 3, 0)
    assert legacy.workspace_delta_bytes is None  # nothing ran to the end, so nothing is aggregated
    rank0 = report.ranks[0].policies[0]
    assert rank0.stopped_by_ranks == [1]
    assert {c.outcome for name, c in rank0.checks.items() if name != "baseline"} == {"skip"}
    # expected fit instead: the OOMed rank fails its expectation, the stopped ones are skipped
    result = collect(write_run(tmp_path / "fit", four_rank_scenario(), overrides=overrides))
    assert result.exit_code == 1
    assert [(f.rank, f.check) for f in run_report(result).check_failures] == [(1, "expectation")]


def test_one_ranks_error_stops_the_others_without_counting_them(tmp_path: Path) -> None:
    """A DispatchError on rank 1 ends the policy on every rank at once (failed_ranks [1]): one policy-error problem,
    the other ranks' checks skipped, the policy's outcome an error."""
    overrides = {
        rank: {"fixed": {"status": "error" if rank == 1 else "stopped", "failed_ranks": [1]}} for rank in range(4)
    }
    result = collect(write_run(tmp_path / "run", four_rank_scenario(), overrides=overrides))
    report = run_report(result)
    assert result.exit_code == 2
    assert kinds(report) == [("policy-error", 1)]
    fixed = policy(report, "fixed")
    assert (fixed.outcome, fixed.num_error, fixed.num_stopped, fixed.expectation) == ("error", 1, 3, "error")
    stopped = report.ranks[0].policy("fixed")
    assert stopped is not None and stopped.stopped_by_ranks == [1]
    assert (
        stopped.checks.expectation.outcome == "skip"
        and "rank(s) [1] ran out of memory or raised" in stopped.checks.expectation.message
    )


def test_a_record_so_far_without_a_final_one_is_named(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    partial = rank_record(scenario, 2, run_id="20251130-052000-synthetic", complete=False)
    write_record(rank_record_path(run_dir, 2), partial.model_copy(update={"policies": partial.policies[:1]}))
    report = run_report(collect(run_dir))
    assert report.exit_code == 2
    (problem,) = report.problems
    assert (problem.kind, problem.rank) == ("incomplete", 2)
    assert "written after 1 finished policy(ies), the final record never came" in problem.cause
    assert report.ranks[2].lost_policies == ["fixed"] and report.ranks[2].complete is False


def test_the_header_says_how_the_ranks_warmed_up(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    collect(run_dir)
    assert "# warm-up pass: full on every rank" in read_md(run_dir / "report.md")
    for rank in (1, 3):
        old = rank_record(
            scenario,
            rank,
            run_id="20251130-052000-synthetic",
            warmup=None,
            overrides={"fixed": {"baseline_bytes": 2 * 10**9}},
        )
        write_record(rank_record_path(run_dir, rank), old)
    report = run_report(collect(run_dir))
    assert "# warm-up pass: full on rank(s) 0, 2; none on rank(s) 1, 3" in read_md(run_dir / "report.md")
    assert {(f.rank, f.check) for f in report.check_failures} == {(1, "baseline"), (3, "baseline")}
    assert all("no warm-up pass recorded" in f.message for f in report.check_failures)


def test_policy_error_exits_2(tmp_path: Path) -> None:
    result = collect(write_run(tmp_path / "run", four_rank_scenario(), overrides={0: {"fixed": {"status": "error"}}}))
    report = run_report(result)
    assert result.exit_code == 2
    assert policy(report, "fixed").outcome == "error"
    assert any(p.kind == "policy-error" and "kernel not found" in p.cause for p in report.problems)


def test_junit_counts_and_validity(tmp_path: Path) -> None:
    scenario = four_rank_scenario(policies=["legacy", "fixed", "lower-bound"])
    overrides: dict[int, dict[str, dict[str, Any]]] = {
        0: {"legacy": {"status": "oom"}},
        2: {"fixed": {"max_rel_error": 0.5}},
    }
    run_dir = write_run(
        tmp_path / "run", scenario, overrides=overrides, failed_ranks={3: "hung: no result within 60 s"}
    )
    report = run_report(collect(run_dir))
    root, cases = junit_cases(run_dir)
    assert root.tag == "testsuites"
    assert len(cases) == 3 * 3 * 4 + 1
    failures = [c for c in cases if c.find("failure") is not None]
    errors = [c for c in cases if c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    # rank 0 legacy: expectation fails, correctness + memory skipped; rank 2 fixed: correctness fails;
    # lower-bound has no expectation on 3 ranks: 3 skipped; rank 3 hung: 1 error
    assert len(failures) == 2 and len(errors) == 1 and len(skipped) == 2 + 3
    assert {(c.get("classname"), c.get("name")) for c in failures} == {
        ("synthetic-smoke.rank-00000.legacy", "expectation"),
        ("synthetic-smoke.rank-00002.fixed", "correctness"),
    }
    suite = root.find("testsuite")
    assert suite is not None
    for attr, expected in (("tests", len(cases)), ("failures", 2), ("errors", 1), ("skipped", 5)):
        assert suite.get(attr) == str(expected) == root.get(attr)
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["generation"] == report.generation


# ---------------------------------------------------------------------------------------------------------------
# Outputs: generations, atomic writes, modes


def test_collect_twice_is_byte_identical_and_one_generation(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path / "run",
        four_rank_scenario(),
        overrides={1: {"legacy": {"status": "oom"}}},
        failed_ranks={3: "died: exit code 1"},
    )
    first_result = collect(run_dir)
    first = {name: (run_dir / name).read_bytes() for name in REPORT_FILES}
    again = collect(run_dir)
    assert {name: (run_dir / name).read_bytes() for name in REPORT_FILES} == first
    assert again.notes == ()
    assert not list(run_dir.glob(".*.tmp"))  # atomic writes leave no temporary files
    generation = first_result.report.generation
    assert generation.startswith("20251130-052000-synthetic@") and len(generation.split("@")[1]) == 16
    assert output_generations(run_dir) == {name: generation for name in REPORT_FILES}


def test_a_mixed_set_of_outputs_is_detected_and_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A collect killed between writes, or records changed since: outputs of two generations. Re-collect
    names each stale output, rewrites it, and removes a temporary file a killed writer left."""
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    old = collect(run_dir).report.generation
    old_md = (run_dir / "report.md").read_text()
    write_record(
        rank_record_path(run_dir, 2),
        rank_record(scenario, 2, run_id="20251130-052000-synthetic", overrides={"fixed": {"experts_us": 999.0}}),
    )
    new = collect(run_dir, write=False).report.generation
    assert new != old  # the content hash sees the changed record
    (run_dir / "report.md").write_text(old_md)  # as if the last collect died after report.json
    (run_dir / ".report.html.x1y2z3.tmp").write_text("<html")
    result = collect(run_dir)
    assert result.report.generation != old
    assert any(n.startswith("report.md was of generation " + old) for n in result.notes)
    assert set(output_generations(run_dir).values()) == {result.report.generation}
    assert not list(run_dir.glob(".*.tmp"))
    assert main(["collect", str(run_dir)]) == 0
    assert "stale output" not in capsys.readouterr().out  # consistent now


def test_an_output_that_cannot_be_written_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run", four_rank_scenario())
    (run_dir / "report.md").mkdir()  # something in the way of an output
    result = collect(run_dir)
    assert result.exit_code == 2 and result.write_error is not None
    assert "cannot write the reports into" in result.write_error and "report.md" in result.write_error
    assert not list(run_dir.glob(".*.tmp"))  # the failed write left no temporary file
    assert main(["collect", str(run_dir)]) == 2
    out = capsys.readouterr().out
    assert "ERROR (exit 2): cannot write the reports" in out and "Traceback" not in out


def test_outputs_follow_the_umask(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", four_rank_scenario())
    old = os.umask(0o022)
    try:
        collect(run_dir)
        for name in REPORT_FILES:
            assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644, name
        os.umask(0o027)
        collect(run_dir)
        assert stat.S_IMODE((run_dir / "report.json").stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert stat.S_IMODE(rank_record_path(run_dir, 0).stat().st_mode) == 0o644  # records are written the same way


def test_cpu_run_is_labelled_rss_and_cpu_memory(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", four_rank_scenario(), device_kind="cpu")
    result = collect(run_dir)
    assert result.exit_code == 0
    md = read_md(run_dir / "report.md")
    assert "MiB RSS" in md and "CPU memory (process RSS)" in md and "each rank's CPU memory" in md
    assert "GPU" not in md.split("```")[1]  # the header says CPU memory, never "each GPU's memory"
    assert policy(run_report(result), "fixed").allocator_allocated_peak_bytes is None
    assert "| n/a |" in md  # no allocator peak on CPU, and the table says so
    assert run_report(result).scenario.baseline_rounding_bytes == BASELINE_ROUNDING_BYTES["rss"]


def test_bus_bandwidth_is_na_with_one_physical_rank(tmp_path: Path) -> None:
    scenario = make_scenario(
        parallel={"num_dispatchers": 4, "num_ranks": 1, "num_local_experts": 4, "max_tokens_per_rank": 32}
    )
    run_dir = write_run(tmp_path / "run", scenario)
    report = run_report(collect(run_dir))
    fixed = policy(report, "fixed")
    assert fixed.dispatch_busbw_gbps is None and fixed.combine_busbw_gbps is None
    assert fixed.experts_tflops is not None
    row = next(line for line in read_md(run_dir / "report.md").splitlines() if line.startswith("| fixed |"))
    assert row.rstrip().endswith("| n/a | n/a |") and "| 0 |" not in row.split("|", 12)[-1]


def test_version_mismatch_is_warned(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    record = rank_record(scenario, 1, run_id="20251130-052000-synthetic")
    versions = record.versions.model_copy(update={"torch": "2.14.0"})
    write_record(rank_record_path(run_dir, 1), record.model_copy(update={"versions": versions}))
    report = run_report(collect(run_dir))
    assert report.version_mismatches == {"torch": ["2.13.0", "2.14.0"]}
    assert "WARNING: ranks disagree on torch: 2.13.0, 2.14.0" in read_md(run_dir / "report.md")


def test_summary_table_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    run_dir = write_run(tmp_path / "run", four_rank_scenario())
    result = collect(run_dir)
    console = Console(file=io.StringIO(), width=260)
    console.print(result.summary_table())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "over ranks" in text and "OK (exit 0)" in text and "fit (expected fit): pass" in text
    assert main(["collect", str(run_dir)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["collect", str(tmp_path / "nope")]) == 2


def test_many_ranks_are_aggregated_in_the_page(tmp_path: Path) -> None:
    scenario = make_scenario(
        parallel={"num_dispatchers": 80, "num_ranks": 80, "num_local_experts": 1, "max_tokens_per_rank": 8}
    )
    run_dir = write_run(tmp_path / "run", scenario, num_nodes=10)
    result = collect(run_dir)
    assert result.exit_code == 0 and run_report(result).hardware.num_nodes == 10
    page = (run_dir / "report.html").read_text()
    assert "16 more ranks in report.json" in page  # per-rank rows stop at 64
    assert page.count("data:image/png;base64,") == 2


def test_memory_check_accepts_allocator_segment_rounding_only_when_nvml_matches_it():
    from harness.core.records import ContractBytes, MemoryMeasurement, PolicyResult

    contract = ContractBytes(
        ws13_shape=[1],
        ws2_shape=[1],
        out_shape=[1],
        common_bytes=4 * MiB,
        ws2_bytes=4 * MiB,
        total_bytes=8 * MiB,
        source="test",
    )
    judging = Judging(expected={}, memory_tolerance_pct=1.0, max_error=0.06, max_error_source="test")
    baseline = Check(outcome="skip", message="")

    def memory_check(delta: int, reserved: int | None) -> Check:
        memory = MemoryMeasurement(
            method="nvml",
            label="GPU",
            baseline_bytes=0,
            peak_bytes=delta,
            delta_bytes=delta,
            workspace_delta_bytes=delta,
            workspace_reserved_bytes=reserved,
        )
        result = PolicyResult(policy="fixed", status="ok", contract=contract, memory=memory)
        return evaluate_checks(result, expected_outcome=None, judging=judging, baseline=baseline).memory

    # Two 4 MiB buffers take two 20 MiB segments of the caching allocator; NVML shows the segments.
    ok = memory_check(40 * MiB, 40 * MiB)
    assert ok.outcome == "pass" and "allocator" in ok.message
    # NVML showing nothing while the allocator reserved segments is a real mismatch.
    assert memory_check(0, 40 * MiB).outcome == "fail"
    # Without the allocator figure (CPU), only the tolerance applies.
    cpu = memory_check(40 * MiB, None)
    assert cpu.outcome == "fail" and "+400%" in cpu.message


def test_memory_check_on_rss_allows_half_a_mib_of_other_threads():
    """An RSS reading of an 8 MiB workspace 0.21 MiB over (+2.6%, seen on one rank of the Ray-launched CPU smoke)
    passes a 2% tolerance on RSS, which allows at least RSS_READ_SLACK_BYTES; the same reading on NVML fails, and
    an RSS reading 1 MiB off, or of nothing, fails."""
    from harness.core.records import ContractBytes, MemoryMeasurement, PolicyResult
    from harness.core.rounding import RSS_READ_SLACK_BYTES

    contract = ContractBytes(ws13_shape=[1], ws2_shape=[1], out_shape=[1], common_bytes=4 * MiB, ws2_bytes=4 * MiB,
                             total_bytes=8 * MiB, source="test")  # fmt: skip
    judging = Judging(expected={}, memory_tolerance_pct=2.0, max_error=0.06, max_error_source="test")

    def memory_check(delta: int, method: Literal["nvml", "rss"]) -> Check:
        memory = MemoryMeasurement(method=method, label="x", baseline_bytes=0, peak_bytes=delta, delta_bytes=delta,
                                   workspace_delta_bytes=delta, workspace_reserved_bytes=None)  # fmt: skip
        result = PolicyResult(policy="fixed", status="ok", contract=contract, memory=memory)
        baseline = Check(outcome="skip", message="")
        return evaluate_checks(result, expected_outcome=None, judging=judging, baseline=baseline).memory

    assert RSS_READ_SLACK_BYTES == 512 * 1024
    seen = 8622080  # 8.22 MiB
    rss = memory_check(seen, "rss")
    assert rss.outcome == "pass" and "+2.78%" in rss.message and "at least 524288 B on RSS" in rss.message
    assert memory_check(seen, "nvml").outcome == "fail"
    assert memory_check(8 * MiB + MiB, "rss").outcome == "fail"
    assert memory_check(0, "rss").outcome == "fail"
    # At 8 MiB, 2% is 0.16 MiB: the slack is the bound, to the byte.
    assert memory_check(8 * MiB + RSS_READ_SLACK_BYTES, "rss").outcome == "pass"
    assert memory_check(8 * MiB + RSS_READ_SLACK_BYTES + 4096, "rss").outcome == "fail"


def _real_rank(info, scenario_data, run_dir):
    from harness.rank.lifecycle import rank_main
    from harness.scenario.schema import parse_scenario

    return rank_main(parse_scenario(scenario_data), info, Path(run_dir)).model_dump(mode="json")


def test_records_of_real_gloo_ranks(tmp_path: Path) -> None:
    """The collector on records that harness.rank.lifecycle really wrote: 2 CPU ranks, legacy over a budget, fixed
    fits."""
    from distributed_utils import parallel_launch
    from harness.core.records import RankRecord, RunManifest

    scenario = make_scenario(
        model={"hidden_size": 256, "intermediate_size": 128, "num_experts": 16, "top_k": 2},
        parallel={"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 4, "max_tokens_per_rank": 64},
        experts_backend="reference",
        device="cpu",
        iterations=2,
        warmup=0,
        memory={"budget_gb": 0.004, "comm_buffer": "none"},  # no 2.1 MB DeepEP buffer inside the 4 MB budget
        expect={"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 2.0},
    )
    run_dir = tmp_path / "run"
    raw = parallel_launch(2, _real_rank, scenario.model_dump(mode="json"), str(run_dir))
    records = [RankRecord.model_validate(r) for r in raw]
    for record in records:
        write_record(rank_record_path(run_dir, record.rank), record)
    write_record(
        run_dir / "run.json",
        RunManifest(
            run_id=records[0].run_id,
            scenario_name=scenario.name or "",
            scenario_hash=scenario.scenario_hash,
            scenario=scenario.model_dump(mode="json"),
            scenario_path=None,
            num_ranks=2,
            launcher="local",
            command=["pytest"],
            started_at=records[0].started_at,
        ),
    )

    result = collect(run_dir)
    report = run_report(result)
    assert result.exit_code == 0, report.exit_reason
    fixed = policy(report, "fixed")
    deltas = [r.policies[1].memory.workspace_delta_bytes for r in records]  # type: ignore[union-attr]
    assert fixed.workspace_delta_bytes.model_dump() == {  # type: ignore[union-attr]
        "min": min(deltas),
        "avg": sum(deltas) / 2,
        "max": max(deltas),
        "num_ranks": 2,
    }
    assert fixed.max_rel_error.max == max(r.policies[1].correctness.max_rel_error for r in records)  # type: ignore[union-attr]
    legacy = policy(report, "legacy")
    assert legacy.outcome == "oom" and legacy.num_oom == 2
    assert report.scenario.memory_label == "CPU memory (process RSS)"
    assert "MiB RSS" in read_md(run_dir / "report.md")


def test_streamed_collect_equals_the_report_of_the_loaded_run(tmp_path: Path) -> None:
    """collect folds each record as it is read and drops it (build.RunFold through load_run's sink); the report is
    the one build_report makes from every record held at once, for each kind of run the folding treats apart."""
    from harness.report.build import build_report, collect_report
    from harness.report.load import load_run

    scenario = four_rank_scenario()
    stopped = {rank: {"legacy": {"status": "oom" if rank == 3 else "stopped"}} for rank in range(4)}
    runs = {
        # rank 0's legacy was stopped by rank 3's OOM, from a record without failed_ranks: judged once all are read
        "stopped-by-a-later-oom": write_run(tmp_path / "a", scenario, overrides=stopped),
        "a-failed-rank": write_run(tmp_path / "b", scenario, failed_ranks={1: "died: exit code -9"}),
        "no-manifest": write_run(tmp_path / "c", scenario, manifest=False),
        "mixed": write_run(
            tmp_path / "d",
            scenario,
            overrides={2: {"fixed": {"max_rel_error": 0.5}}},
            failed_ranks={3: "hung"},
            num_nodes=2,
        ),
    }
    unreadable = write_run(tmp_path / "e", scenario)
    manifest = json.loads((unreadable / "run.json").read_text())
    manifest["scenario"]["parallel"]["num_dispatchers"] = -1  # run.json's scenario no longer parses
    (unreadable / "run.json").write_text(json.dumps(manifest))
    runs["unparsable-scenario"] = unreadable
    for name, run_dir in runs.items():
        streamed = collect_report(run_dir)
        assert streamed == build_report(load_run(run_dir)), name
        assert streamed.ranks and [r.rank for r in streamed.ranks] == sorted(r.rank for r in streamed.ranks), name
    report = collect_report(runs["stopped-by-a-later-oom"])
    assert report.ranks[0].policy("legacy").stopped_by_ranks == [3]  # type: ignore[union-attr]
    assert collect_report(runs["unparsable-scenario"]).scenario_problem is not None
