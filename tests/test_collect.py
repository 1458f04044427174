"""The collector: numbers in report.json recomputed from the synthetic inputs, exit codes, JUnit, robustness."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from report_records import make_scenario, policy_result, rank_record, read_json, workspace_delta_for, write_run

from harness.cli import main
from harness.report.collect import REPORT_FILES, collect
from harness.core.records import SCHEMA_VERSION, rank_record_path, write_record
from harness.core.contract import fixed_shapes, live_set_bytes


def four_rank_scenario(**sections):
    parallel = {"num_dispatchers": 8, "num_ranks": 4, "num_local_experts": 4, "max_tokens_per_rank": 32}
    return make_scenario(parallel=parallel, **sections)


def policy(report: dict, name: str) -> dict:
    return next(p for p in report["policies"] if p["policy"] == name)


def junit_cases(run_dir: Path) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.parse(run_dir / "junit.xml").getroot()
    return root, root.findall("./testsuite/testcase")


def test_all_pass_numbers_equal_the_inputs(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    result = collect(run_dir)

    assert result.exit_code == 0 and result.status == "OK"
    for name in REPORT_FILES:
        assert (run_dir / name).is_file(), name
    report = read_json(run_dir / "report.json")
    assert report == result.report
    args = scenario.sizing_args()
    fixed_total = fixed_shapes(args).total_bytes
    for name in ("legacy", "fixed"):
        deltas = [workspace_delta_for(scenario, name, rank) for rank in range(4)]
        summary = policy(report, name)
        assert summary["workspace_delta_bytes"] == {"min": min(deltas), "avg": sum(deltas) / 4, "max": max(deltas), "num_ranks": 4}
        assert summary["num_oom"] == 0 and summary["outcome"] == "fit" and summary["num_ranks"] == 4
        assert summary["lower_bound_bytes"] == live_set_bytes(args)
        assert summary["ratio_to_fixed"] == summary["contract_total_bytes"] / fixed_total
        # timings are aggregated with max over ranks, throughput with min (the synthetic values grow/shrink by rank)
        assert summary["experts_us"]["max"] == 200.0 + 2 * 3
        assert summary["experts_tflops"]["min"] == 900.0 - 3
        assert summary["dispatch_busbw_gbps"]["min"] == 250.0 - 3
        assert summary["max_rel_error"]["max"] == pytest.approx(0.01 + 0.003)
    # legacy multiplies M by D a second time: D times the fixed contract
    assert policy(report, "legacy")["ratio_to_fixed"] == 8.0
    assert report["checks"] == {"num_pass": 4 * 2 * 3, "num_fail": 0, "num_skip": 0, "num_error": 0}
    assert report["hardware"]["num_ranks_reported"] == 4 and report["hardware"]["num_ranks_expected"] == 4
    assert report["scenario"]["emulated"] is True and report["scenario"]["num_dispatchers"] == 8
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]


def test_markdown_header_table_and_footer(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, num_nodes=2)
    collect(run_dir)
    md = (run_dir / "report.md").read_text()
    for text in ("torch 2.13.0", "CUDA 12.8", "NCCL 2.27.3", "driver 580.95.05", "Ray 2.52.0", "vLLM source: release 0.30.0",
                 "NVIDIA H200", "on 2 node(s)", scenario.scenario_hash, "D=8 P=4 E=4 T=32 M=256 K=128 I=64",
                 "top_k=4", "is EMULATED on P=4", "same-baseline", "NVML"):
        assert text in md, text
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| policy |"))
    assert lines[header + 2].startswith("|  | MiB | MiB | ratio | MiB NVML")  # the units row
    assert "| over ranks |" in lines[header + 3] and "| max |" in lines[header + 3]  # the aggregation row
    assert lines[-1] == "**OK (exit 0): all 24 checks passed (0 skipped)**"


def test_failed_expectation_exits_1(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, overrides={2: {"legacy": {"status": "oom"}}})
    result = collect(run_dir)

    assert result.exit_code == 1
    report = result.report
    legacy = policy(report, "legacy")
    assert legacy["num_oom"] == 1 and legacy["outcome"] == "oom"
    assert legacy["workspace_delta_bytes"]["num_ranks"] == 3  # the OOMed rank measured nothing
    assert [(f["rank"], f["policy"], f["check"]) for f in report["check_failures"]] == [(2, "legacy", "expectation")]
    assert report["checks"]["num_fail"] == 1 and report["checks"]["num_skip"] == 2  # correctness + memory skipped
    assert (run_dir / "report.md").read_text().rstrip().endswith("**FAILED (exit 1): 1 check(s) failed**")
    assert main(["collect", str(run_dir)]) == 1


def test_expected_oom_passes(tmp_path: Path) -> None:
    scenario = four_rank_scenario(expect={"outcomes": {"legacy": "oom", "fixed": "fit"}})
    overrides = {rank: {"legacy": {"status": "oom"}} for rank in range(4)}
    result = collect(write_run(tmp_path / "run", scenario, overrides=overrides))
    assert result.exit_code == 0
    assert policy(result.report, "legacy")["num_oom"] == 4
    assert result.report["checks"]["num_skip"] == 4 * 2


def test_correctness_and_memory_out_of_tolerance_exit_1(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    contract = policy_result(scenario, "fixed", 0).contract
    too_big = int((contract.common_bytes + contract.ws2_bytes) * 1.05)  # the tolerance is 1 %
    overrides = {1: {"fixed": {"within_tolerance": False, "max_rel_error": 0.2}}, 3: {"fixed": {"workspace_delta_bytes": too_big}}}
    result = collect(write_run(tmp_path / "run", scenario, overrides=overrides))
    assert result.exit_code == 1
    failed = {(f["rank"], f["check"]) for f in result.report["check_failures"]}
    assert failed == {(1, "correctness"), (3, "memory")}
    assert policy(result.report, "fixed")["max_rel_error"]["max"] == 0.2
    message = next(f["message"] for f in result.report["check_failures"] if f["check"] == "memory")
    assert "+5%" in message and "tolerance 1%" in message


def test_rank_failure_exits_2_and_is_named(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario, failed_ranks={3: "died: exit code -9"})
    result = collect(run_dir)
    assert result.exit_code == 2
    problems = result.report["problems"]
    assert [(p["kind"], p["rank"]) for p in problems] == [("rank-failure", 3)]
    assert "died: exit code -9" in problems[0]["cause"]
    assert policy(result.report, "legacy")["num_ranks"] == 3  # the others are still reported
    md = (run_dir / "report.md").read_text()
    assert "ranks/rank-00003.failed.json" in md and "died: exit code -9" in md
    assert "FAILED (exit 2)" in md.splitlines()[-1]
    root, cases = junit_cases(run_dir)
    assert len(cases) == 3 * 2 * 3 + 1
    assert root.get("errors") == "1"


def test_corrupt_missing_and_newer_records(tmp_path: Path) -> None:
    scenario = make_scenario(parallel={"num_dispatchers": 5, "num_ranks": 5, "num_local_experts": 4, "max_tokens_per_rank": 32})
    run_dir = write_run(tmp_path / "run", scenario, skip_ranks=(4,))
    full = rank_record_path(run_dir, 1).read_text()
    rank_record_path(run_dir, 1).write_text(full[: full.index("\n", len(full) // 2)])  # a writer killed mid-file
    rank_record_path(run_dir, 2).write_text("\x00\x13garbage{")
    newer = json.loads(rank_record_path(run_dir, 3).read_text())
    newer["schema_version"] = SCHEMA_VERSION + 1
    rank_record_path(run_dir, 3).write_text(json.dumps(newer))

    result = collect(run_dir)
    assert result.exit_code == 2
    causes = {p["rank"]: (p["kind"], p["cause"]) for p in result.report["problems"]}
    assert causes[1][0] == "unreadable" and "truncated JSON" in causes[1][1]
    assert causes[2][0] == "unreadable" and "corrupt JSON" in causes[2][1]
    assert causes[3][0] == "unreadable" and f"schema version {SCHEMA_VERSION + 1} is newer" in causes[3][1]
    assert causes[4][0] == "missing-rank" and "ranks/rank-00004.json is missing" in causes[4][1]
    assert str(tmp_path) not in json.dumps(result.report["problems"])  # files are named relative to the run
    # rank 0 is still reported
    assert [r["rank"] for r in result.report["ranks"]] == [0]
    assert policy(result.report, "fixed")["workspace_delta_bytes"]["num_ranks"] == 1
    md = (run_dir / "report.md").read_text()
    for rank in (1, 2, 3, 4):
        assert f"ranks/rank-{rank:05d}.json" in md
    assert "is newer than this harness reads" in md and "truncated JSON" in md
    _, cases = junit_cases(run_dir)
    assert len(cases) == 1 * 2 * 3 + 4


def test_no_records_and_no_manifest(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "empty", scenario, skip_ranks=(0, 1, 2, 3))
    result = collect(run_dir)
    assert result.exit_code == 2
    kinds = sorted(p["kind"] for p in result.report["problems"])
    assert kinds == ["missing-rank"] * 4 + ["no-records"]
    assert "no readable rank records" in (run_dir / "report.md").read_text()

    run_dir = write_run(tmp_path / "nomanifest", scenario, manifest=False)
    result = collect(run_dir)
    assert result.exit_code == 2
    assert [p["kind"] for p in result.report["problems"]] == ["no-manifest"]
    assert policy(result.report, "fixed")["num_ranks"] == 4  # the records are still aggregated


def test_mismatched_scenario_hash_is_left_out(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    other = four_rank_scenario(policies=["legacy", "fixed", "lower-bound"])
    write_record(rank_record_path(run_dir, 2), rank_record(other, 2, run_id="20251130-052000-synthetic"))
    result = collect(run_dir)
    assert result.exit_code == 2
    (problem,) = result.report["problems"]
    assert problem["kind"] == "mismatch" and problem["rank"] == 2 and other.scenario_hash in problem["cause"]
    assert policy(result.report, "fixed")["num_ranks"] == 3


def test_ranks_stopped_by_another_ranks_oom(tmp_path: Path) -> None:
    scenario = four_rank_scenario(expect={"outcomes": {"legacy": "oom", "fixed": "fit"}})
    overrides = {rank: {"legacy": {"status": "oom" if rank == 1 else "stopped"}} for rank in range(4)}
    result = collect(write_run(tmp_path / "run", scenario, overrides=overrides))
    assert result.exit_code == 0, result.report["exit_reason"]  # stopping together is not an error
    legacy = policy(result.report, "legacy")
    assert (legacy["outcome"], legacy["num_oom"], legacy["num_stopped_by_oom"], legacy["num_error"]) == ("oom", 1, 3, 0)
    assert legacy["workspace_delta_bytes"] is None  # nothing ran to the end, so nothing is aggregated
    rank0 = result.report["ranks"][0]["policies"][0]
    assert rank0["stopped_by_oom_on_ranks"] == [1]
    assert {c["outcome"] for c in rank0["checks"].values()} == {"skip"}
    # expected fit instead: the OOMed rank fails its expectation, the stopped ones are skipped
    scenario = four_rank_scenario()
    result = collect(write_run(tmp_path / "fit", scenario, overrides=overrides))
    assert result.exit_code == 1
    assert [(f["rank"], f["check"]) for f in result.report["check_failures"]] == [(1, "expectation")]


def test_policy_error_exits_2(tmp_path: Path) -> None:
    result = collect(write_run(tmp_path / "run", four_rank_scenario(), overrides={0: {"fixed": {"status": "error"}}}))
    assert result.exit_code == 2
    assert policy(result.report, "fixed")["outcome"] == "error"
    assert any(p["kind"] == "policy-error" and "kernel not found" in p["cause"] for p in result.report["problems"])


def test_junit_counts_and_validity(tmp_path: Path) -> None:
    scenario = four_rank_scenario(policies=["legacy", "fixed", "lower-bound"])
    overrides = {0: {"legacy": {"status": "oom"}}, 2: {"fixed": {"within_tolerance": False}}}
    run_dir = write_run(tmp_path / "run", scenario, overrides=overrides, failed_ranks={3: "hung: no result within 60 s"})
    collect(run_dir)
    root, cases = junit_cases(run_dir)
    assert root.tag == "testsuites"
    assert len(cases) == 3 * 3 * 3 + 1
    failures = [c for c in cases if c.find("failure") is not None]
    errors = [c for c in cases if c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    # rank 0 legacy: expectation fails, correctness + memory skipped; rank 2 fixed: correctness fails;
    # lower-bound has no expectation on 3 ranks: 3 skipped; rank 3 hung: 1 error
    assert len(failures) == 2 and len(errors) == 1 and len(skipped) == 2 + 3
    assert {(c.get("classname"), c.get("name")) for c in failures} == {
        ("synthetic-smoke.rank-00000.legacy", "expectation"), ("synthetic-smoke.rank-00002.fixed", "correctness")}
    suite = root.find("testsuite")
    assert suite is not None
    for attr, expected in (("tests", len(cases)), ("failures", 2), ("errors", 1), ("skipped", 5)):
        assert suite.get(attr) == str(expected) == root.get(attr)


def test_collect_twice_is_byte_identical(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", four_rank_scenario(), overrides={1: {"legacy": {"status": "oom"}}},
                        failed_ranks={3: "died: exit code 1"})
    collect(run_dir)
    first = {name: (run_dir / name).read_bytes() for name in REPORT_FILES}
    collect(run_dir)
    assert {name: (run_dir / name).read_bytes() for name in REPORT_FILES} == first
    assert not list(run_dir.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_cpu_run_is_labelled_rss(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", four_rank_scenario(), device_kind="cpu")
    result = collect(run_dir)
    assert result.exit_code == 0
    md = (run_dir / "report.md").read_text()
    assert "MiB RSS" in md and "CPU memory (process RSS)" in md
    assert policy(result.report, "fixed")["allocator_allocated_peak_bytes"] is None
    assert "| n/a |" in md  # no allocator peak on CPU, and the table says so


def test_version_mismatch_is_warned(tmp_path: Path) -> None:
    scenario = four_rank_scenario()
    run_dir = write_run(tmp_path / "run", scenario)
    record = rank_record(scenario, 1, run_id="20251130-052000-synthetic")
    versions = record.versions.model_copy(update={"torch": "2.14.0"})
    write_record(rank_record_path(run_dir, 1), record.model_copy(update={"versions": versions}))
    result = collect(run_dir)
    assert result.report["version_mismatches"] == {"torch": ["2.13.0", "2.14.0"]}
    assert "WARNING: ranks disagree on torch: 2.13.0, 2.14.0" in (run_dir / "report.md").read_text()


def test_summary_table_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    run_dir = write_run(tmp_path / "run", four_rank_scenario())
    result = collect(run_dir)
    console = Console(file=io.StringIO(), width=220)
    console.print(result.summary_table())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "over ranks" in text and "OK (exit 0)" in text
    assert main(["collect", str(run_dir)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["collect", str(tmp_path / "nope")]) == 2


def test_many_ranks_are_aggregated_in_the_page(tmp_path: Path) -> None:
    scenario = make_scenario(parallel={"num_dispatchers": 80, "num_ranks": 80, "num_local_experts": 1, "max_tokens_per_rank": 8})
    run_dir = write_run(tmp_path / "run", scenario, num_nodes=10)
    result = collect(run_dir)
    assert result.exit_code == 0 and result.report["hardware"]["num_nodes"] == 10
    page = (run_dir / "report.html").read_text()
    assert "16 more ranks in report.json" in page  # per-rank rows stop at 64
    assert page.count("data:image/png;base64,") == 2


def _real_rank(info, scenario_data, run_dir):
    from harness.rank.lifecycle import rank_main
    from harness.scenario.schema import parse_scenario

    return rank_main(parse_scenario(scenario_data), info, Path(run_dir)).model_dump(mode="json")


def test_records_of_real_gloo_ranks(tmp_path: Path) -> None:
    """The collector on records that harness.rank.lifecycle really wrote: 2 CPU ranks, legacy over a budget, fixed fits."""
    from distributed_utils import parallel_launch

    from harness.core.records import RankRecord, RunManifest

    scenario = make_scenario(
        model={"hidden_size": 256, "intermediate_size": 128, "num_experts": 16, "top_k": 2},
        parallel={"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 4, "max_tokens_per_rank": 64},
        experts_backend="reference", device="cpu", iterations=2, warmup=0,
        memory={"budget_gb": 0.004},
        expect={"outcomes": {"legacy": "oom", "fixed": "fit"}, "memory_tolerance_pct": 2.0},
    )
    run_dir = tmp_path / "run"
    raw = parallel_launch(2, _real_rank, scenario.model_dump(mode="json"), str(run_dir))
    records = [RankRecord.model_validate(r) for r in raw]
    for record in records:
        write_record(rank_record_path(run_dir, record.rank), record)
    write_record(run_dir / "run.json", RunManifest(
        run_id=records[0].run_id, scenario_name=scenario.name or "", scenario_hash=scenario.scenario_hash,
        scenario=scenario.model_dump(mode="json"), scenario_path=None, num_ranks=2, launcher="local",
        command=["pytest"], started_at=records[0].started_at))

    result = collect(run_dir)
    assert result.exit_code == 0, result.report["exit_reason"]
    fixed = policy(result.report, "fixed")
    deltas = [r.policies[1].memory.workspace_delta_bytes for r in records]
    assert fixed["workspace_delta_bytes"] == {"min": min(deltas), "avg": sum(deltas) / 2, "max": max(deltas), "num_ranks": 2}
    assert fixed["max_rel_error"]["max"] == max(r.policies[1].correctness.max_rel_error for r in records)
    assert policy(result.report, "legacy")["outcome"] == "oom" and policy(result.report, "legacy")["num_oom"] == 2
    assert result.report["scenario"]["memory_label"] == "CPU memory (process RSS)"
    assert "MiB RSS" in (run_dir / "report.md").read_text()


def test_memory_check_accepts_allocator_segment_rounding_only_when_nvml_matches_it():
    from harness.report.collect import evaluate_checks
    from harness.core.records import ContractBytes, MemoryMeasurement, PolicyResult

    MiB = 2**20
    contract = ContractBytes(ws13_shape=[1], ws2_shape=[1], out_shape=[1], common_bytes=4 * MiB, ws2_bytes=4 * MiB,
                             total_bytes=8 * MiB, source="test")

    def result(delta: int, reserved: int | None) -> PolicyResult:
        memory = MemoryMeasurement(method="nvml", label="GPU", baseline_bytes=0, peak_bytes=delta, delta_bytes=delta,
                                   workspace_delta_bytes=delta, workspace_reserved_bytes=reserved)
        return PolicyResult(policy="fixed", status="ok", contract=contract, memory=memory)

    # Two 4 MiB buffers take two 20 MiB segments of the caching allocator; NVML shows the segments.
    ok = evaluate_checks(result(40 * MiB, 40 * MiB), expected_outcome=None, memory_tolerance_pct=1.0)["memory"]
    assert ok.outcome == "pass" and "allocator" in ok.message
    # NVML showing nothing while the allocator reserved segments is a real mismatch.
    bad = evaluate_checks(result(0, 40 * MiB), expected_outcome=None, memory_tolerance_pct=1.0)["memory"]
    assert bad.outcome == "fail"
    # Without the allocator figure (CPU), only the tolerance applies.
    cpu = evaluate_checks(result(40 * MiB, None), expected_outcome=None, memory_tolerance_pct=1.0)["memory"]
    assert cpu.outcome == "fail" and "+400%" in cpu.message
