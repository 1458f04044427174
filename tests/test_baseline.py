"""Fresh CPU runs of the smoke scenario through the real CLI: against the committed baseline, and against each other.

Two runs of smoke on this machine (the shared run of tests/conftest.py and `harness run smoke`) are the inputs of
every test here:
    - the fresh run against results/baselines/cpu-smoke: memory, error and outcome match (times depend on the
      machine, so `--ignore time --ignore throughput`); allocator bytes to the byte, errors within float32
      reordering (the baseline was made on another CPU);
    - the two runs against each other: allocator bytes and errors to the byte;
    - the two runs against each other with the plain `harness compare`: exit 0 (CPU timings are shown, not gated);
    - the same with one policy deleted from the current report, or one value set to NaN: exit 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_utils import run_cli_inproc

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "results" / "baselines" / "cpu-smoke"
# A smoke run takes ~12 s on an idle 2-core machine (imports, two spawned ranks, three policies); the scenario's
# own collective timeout bounds a stuck run well below this, and 4x leaves room for a machine loaded by others.
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def two_runs(smoke_run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shared smoke run (tests/conftest.py) and a second one: two runs of smoke on this machine."""
    assert smoke_run.returncode == 0, smoke_run.stdout[-2000:] + smoke_run.stderr[-2000:]
    out = tmp_path_factory.mktemp("smoke") / "second"
    run = run_cli_inproc("run", "smoke", "--out", str(out))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return smoke_run.out, out


def compare(baseline: Path, current: Path, *flags: str) -> tuple[int, dict]:
    cmp = run_cli_inproc("compare", str(baseline), str(current), "--json", *flags)
    assert cmp.returncode in (0, 1, 2), cmp.stderr
    return cmp.returncode, json.loads(cmp.stdout)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_fresh_cpu_smoke_run_matches_the_committed_baseline(two_runs: tuple[Path, Path]) -> None:
    _, fresh = two_runs
    code, result = compare(BASELINE, fresh, "--ignore", "time", "--ignore", "throughput")
    assert code == 0, json.dumps(result, indent=1)[-3000:]
    assert result["num_regressions"] == 0
    compared = {(r["policy"], r["metric"]) for r in result["rows"] if r["verdict"] == "unchanged"}
    for policy in ("legacy", "fixed", "lower-bound"):
        for metric in ("outcome", "num_ranks", "contract_total_bytes", "workspace_delta_avg_bytes", "max_error"):
            assert (policy, metric) in compared, (policy, metric)
    assert not any(r["metric"] in ("dispatch_us", "experts_tflops") for r in result["rows"])


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_back_to_back_smoke_runs_pass_the_default_gate(two_runs: tuple[Path, Path]) -> None:
    """The plain `harness compare` of two runs on this machine: exit 0. Their timings are shown, not gated: on a
    shared CPU host they move by tens of percent (and one policy's every sample threefold) from run to run."""
    first, second = two_runs
    code, result = compare(first, second)
    assert code == 0, json.dumps([r for r in result["rows"] if r["verdict"] == "regression"], indent=1)
    assert result["hardware_note"].startswith("CPU runs: timings and throughputs")
    timing = [r for r in result["rows"] if r["metric"] in ("dispatch_us", "experts_us", "combine_us")]
    assert len(timing) == 3 * 3 and {r["verdict"] for r in timing} == {"not gated"}
    gated = {(r["policy"], r["metric"]) for r in result["rows"] if r["verdict"] == "unchanged"}
    for policy in ("legacy", "fixed", "lower-bound"):
        for metric in ("outcome", "num_ranks", "contract_total_bytes", "workspace_delta_avg_bytes", "max_error"):
            assert (policy, metric) in gated, (policy, metric)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_a_deleted_policy_or_a_nan_fails_the_gate(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = two_runs
    report = json.loads((second / "report.json").read_text())
    report.pop("content_digest")  # another writer's report: no digest, so the file is read as it is
    deleted = dict(report, policies=[p for p in report["policies"] if p["policy"] != "fixed"])
    (tmp_path / "deleted.json").write_text(json.dumps(deleted))
    code, result = compare(first, tmp_path / "deleted.json")
    assert code == 1
    assert [(r["policy"], r["note"]) for r in result["rows"] if r["verdict"] == "regression"] == [
        ("fixed", "policy not in current")]

    nan = json.loads((second / "report.json").read_text())
    nan.pop("content_digest")
    nan["policies"][0]["max_rel_error"]["max"] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(nan))  # json.dumps writes a bare NaN
    code, result = compare(first, tmp_path / "nan.json")
    assert code == 1
    assert [(r["policy"], r["metric"], r["note"]) for r in result["rows"] if r["verdict"] == "regression"] == [
        ("legacy", "max_error", "NaN or infinity in current")]


def float32_reorder_bound(num_terms: int) -> float:
    """gamma_n = n*u / (1 - n*u), u = 2^-24: how far a float32 sum of n products may move, relative to the sum of
    their magnitudes, when another CPU sums them in another order (another SIMD width or GEMM blocking; Higham,
    Accuracy and Stability of Numerical Algorithms, Thm 3.1)."""
    u = 2.0 ** -24
    return num_terms * u / (1 - num_terms * u)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_back_to_back_runs_agree_to_the_byte_and_rss_to_the_page(two_runs: tuple[Path, Path]) -> None:
    """On one machine the same code gives the same allocator bytes, errors and outcomes, exactly (seeded routing
    and weights, the same float32 kernels). The RSS delta of a workspace is exact to the page: RSS counts 4096 B
    pages, and one page of the process's own heap can fall inside or outside the measured window from run to run
    (legacy 33579008 and 33583104 B, fixed 8392704 and 8396800 B were seen back to back)."""
    from harness.report.compare import load_report

    first, second = (load_report(run).report for run in two_runs)
    for mine in first.policies:  # type: ignore[union-attr]
        theirs = second.policy(mine.policy)  # type: ignore[union-attr]
        assert theirs is not None, mine.policy
        assert (mine.outcome, mine.num_oom, mine.contract_total_bytes, mine.lower_bound_bytes) == (
            theirs.outcome, theirs.num_oom, theirs.contract_total_bytes, theirs.lower_bound_bytes)
        for figure in ("allocator_allocated_peak_bytes", "max_rel_error", "max_abs_error"):
            got, want = getattr(mine, figure), getattr(theirs, figure)
            assert (got.min, got.max) == (want.min, want.max), (mine.policy, figure)
        _assert_within_a_page(mine, theirs)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_a_fresh_run_gives_the_baselines_bytes_and_its_errors_within_float32_reordering(
        two_runs: tuple[Path, Path]) -> None:
    """Against the committed baseline, made on another x86-64 CPU: allocator bytes, contracts and outcomes to the
    byte (they do not depend on the arithmetic), RSS to the page (as above), and the error figures within what
    float32 allows when the GEMMs sum in another order.

    The error figure is max |out - ref| / max |ref|, where out and ref both come from float32 GEMMs whose longest
    sum has n = max(K, I) products (smoke: K = 512). Each may move by gamma_n of max |ref| on another CPU, so the
    figure may move by 2 * gamma_n (6.1e-5 at n = 512); max_abs_error by 2 * gamma_n * max |ref|. Two CPUs gave
    0.019127551516 and 0.019127434083 (1.2e-7 apart). A real change of the data path moves the figure by far more:
    one FP8 step of an activation is 2^-4 relative."""
    from harness.report.compare import load_report

    fresh, committed = load_report(two_runs[0]).report, load_report(BASELINE).report
    assert fresh.kind == committed.kind == "run"
    scenario = json.loads((BASELINE / "run.json").read_text())["scenario"]
    n = max(scenario["model"]["hidden_size"], scenario["model"]["intermediate_size"])
    bound = 2 * float32_reorder_bound(n)
    for mine in fresh.policies:  # type: ignore[union-attr]
        theirs = committed.policy(mine.policy)  # type: ignore[union-attr]
        assert theirs is not None, mine.policy
        assert (mine.outcome, mine.num_oom, mine.contract_total_bytes, mine.lower_bound_bytes) == (
            theirs.outcome, theirs.num_oom, theirs.contract_total_bytes, theirs.lower_bound_bytes)
        got, want = mine.allocator_allocated_peak_bytes, theirs.allocator_allocated_peak_bytes
        assert (got.min, got.max) == (want.min, want.max), mine.policy
        rel_got, rel_want = mine.max_rel_error, theirs.max_rel_error
        assert abs(rel_got.max - rel_want.max) <= bound and abs(rel_got.min - rel_want.min) <= bound, (
            mine.policy, rel_got, rel_want, bound)
        abs_got, abs_want = mine.max_abs_error, theirs.max_abs_error
        ref_scale = abs_want.max / rel_want.max if rel_want.max > 0 else 0.0  # max |ref| of the worst rank
        assert abs(abs_got.max - abs_want.max) <= bound * ref_scale, (mine.policy, abs_got, abs_want)
        _assert_within_a_page(mine, theirs)


def _assert_within_a_page(mine, theirs) -> None:  # type: ignore[no-untyped-def]
    page = 4096
    got, want = mine.workspace_delta_bytes, theirs.workspace_delta_bytes
    assert abs(got.min - want.min) <= page and abs(got.max - want.max) <= page, (mine.policy, got, want)
    assert got.min % page == 0 and got.max % page == 0  # RSS moves in whole pages


def test_compare_flags_a_doubled_workspace_against_the_baseline(tmp_path: Path) -> None:
    """A run whose records show fixed's workspace twice as large (collected from those records, as compare trusts
    only numbers it can trace to them) is a regression against the committed baseline."""
    import shutil

    current = tmp_path / "current"
    shutil.copytree(BASELINE, current)
    for name in ("report.json", "report.md", "report.html", "junit.xml", "status.json"):
        (current / name).unlink(missing_ok=True)
    for path in sorted((current / "ranks").glob("rank-*.json")):
        record = json.loads(path.read_text())
        for policy in record["policies"]:
            if policy["policy"] == "fixed" and policy.get("memory"):
                policy["memory"]["workspace_delta_bytes"] *= 2
        path.write_text(json.dumps(record, indent=1))
    assert run_cli_inproc("collect", str(current)).returncode in (0, 1)
    cmp = run_cli_inproc("compare", str(BASELINE), str(current), "--ignore", "time", "--ignore", "throughput")
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    assert "workspace_delta_avg_bytes" in cmp.stdout and "regression" in cmp.stdout


def test_the_committed_baseline_is_one_generation() -> None:
    """Its report.json, report.md, junit.xml and report.html come from its records as they are committed."""
    cmp = run_cli_inproc("compare", str(BASELINE), str(BASELINE))
    assert cmp.returncode == 0, cmp.stdout[-2000:] + cmp.stderr


def test_ignore_names_an_unknown_group_clearly() -> None:
    cmp = run_cli_inproc("compare", str(BASELINE), str(BASELINE), "--ignore", "speed")
    assert cmp.returncode == 2
    assert "--ignore 'speed': unknown metric or group" in cmp.stderr and "groups: memory, error, time" in cmp.stderr
