"""Regression matrices: expansion, "N of M valid", clear errors, and the combined report past a failed cell."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from report_records import write_run

from harness.cli import main
from harness.report.write import REPORT_FILES
from harness.report.matrix import collect_matrix
from harness.report.model import MatrixReport, RunReport, RunSummary
from harness.report.write import file_sha256
from harness.scenario.matrix import MatrixError, is_matrix_file, load_matrix
from harness.scenario.schema import ScenarioError, parse_scenario
from harness.scenario.sections import REPO_DIR
from harness.core.contract import fixed_shapes, legacy_shapes

BASE = {
    "model": {"hidden_size": 128, "intermediate_size": 64, "num_experts": 16, "top_k": 4},
    "parallel": {"num_ranks": 2, "num_dispatchers": 2, "max_tokens_per_rank": 32},
    "policies": ["legacy", "fixed"],
    "expect": {"outcomes": {"legacy": "fit", "fixed": "fit"}, "memory_tolerance_pct": 1.0},
}


def write_matrix(tmp_path: Path, body: dict, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"matrix": body}, sort_keys=False))
    return path


def test_repository_matrices_expand() -> None:
    nightly = load_matrix(REPO_DIR / "scenarios/matrix/nightly-releases.yaml")
    assert nightly.expansion().summary() == "3 of 4 valid"
    assert [c.name for c in nightly.cells()] == ["deepseek-v3_D16_T256", "deepseek-v3_D32_T256", "deepseek-v3_D64_T256"]
    (skipped,) = nightly.skipped()
    assert skipped.name == "deepseek-v3_D8_T256" and "cannot hold model.num_experts (256)" in skipped.reason
    for cell in nightly.cells():
        s = cell.scenario
        assert s.policies == ["vllm==0.29.0", "vllm==0.30.0"] and s.emulated and s.parallel.num_ranks == 1
        assert s.num_local_experts == 16 and s.parallel.max_tokens_per_rank == 256
        expected_legacy = "oom" if s.parallel.num_dispatchers == 64 else "fit"
        assert s.expect.outcomes == {"vllm==0.29.0": expected_legacy, "vllm==0.30.0": "fit"}

    ci = load_matrix("matrix/cpu-ci")  # bare names resolve under scenarios/, like scenarios do
    assert ci.expansion().summary() == "2 of 2 valid"
    assert [(c.scenario.parallel.num_dispatchers, c.scenario.num_local_experts) for c in ci.cells()] == [(2, 16), (4, 8)]
    assert all(c.scenario.device == "cpu" and c.scenario.parallel.num_ranks == 2 for c in ci.cells())


def test_is_matrix_file(tmp_path: Path) -> None:
    assert is_matrix_file(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    assert not is_matrix_file(REPO_DIR / "scenarios/smoke.yaml")
    assert not is_matrix_file(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("matrix: [unclosed")
    assert not is_matrix_file(broken)


def test_invalid_combinations_are_skipped_with_reasons(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, {"name": "dp", "base": BASE, "axes": {"parallel.num_dispatchers": [1, 2, 3, 4]}})
    matrix = load_matrix(path)
    assert matrix.expansion().num_combinations == 4 and matrix.expansion().summary() == "2 of 4 valid"
    reasons = {s.name: s.reason for s in matrix.skipped()}
    assert reasons == {
        "K128-I64_D1_T32": "parallel.num_dispatchers (1) is smaller than parallel.num_ranks (2): D >= P",
        "K128-I64_D3_T32": reasons["K128-I64_D3_T32"],
    }
    assert "must be a multiple of parallel.num_ranks (2)" in reasons["K128-I64_D3_T32"]
    assert [c.scenario.name for c in matrix.cells()] == ["dp.K128-I64_D2_T32", "dp.K128-I64_D4_T32"]


def test_cell_names_are_filesystem_safe_and_unique(tmp_path: Path) -> None:
    body = {"base": BASE, "axes": {
        "model.preset": ["qwen3-30b-a3b", "qwen3-235b-a22b"],
        "parallel.num_dispatchers": [2],
        "policies": [["legacy", "fixed"], ["vllm==0.29.0", "vllm==0.30.0"]],
        "expect.outcomes": [{}],
    }}
    matrix = load_matrix(write_matrix(tmp_path, body))
    names = [c.name for c in matrix.cells()]
    assert len(names) == 4 and len(set(names)) == 4
    assert "qwen3-30b-a3b_D2_T32_vllm-0.29.0+vllm-0.30.0" in names
    assert all(re.fullmatch(r"[A-Za-z0-9._+-]+", n) for n in names)
    # the preset fills the shapes the base left out, explicit fields win
    assert {c.scenario.model.hidden_size for c in matrix.cells()} == {128}


def test_overrides_and_base_file(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios/base.yaml").write_text(yaml.safe_dump(BASE))
    body = {"base_file": "scenarios/base.yaml", "axes": {"parallel.num_dispatchers": [2, 4]},
            "overrides": [{"when": {"parallel.num_dispatchers": 4}, "set": {"expect.outcomes.legacy": "oom"}}]}
    matrix = load_matrix(write_matrix(tmp_path, body))
    outcomes = [c.scenario.expect.outcomes for c in matrix.cells()]
    assert outcomes == [{"legacy": "fit", "fixed": "fit"}, {"legacy": "oom", "fixed": "fit"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"base": BASE, "axes": {"parallel.num_dispatcher": [2]}},
         "matrix.axes: unknown scenario field 'parallel.num_dispatcher': parallel has max_tokens_per_rank, num_dispatchers"),
        ({"base": BASE, "axes": {"seed.value": [1]}}, "'seed' is a value, not a section"),
        ({"base": BASE, "axes": {"seed": []}}, "matrix.axes.seed: give at least one value"),
        ({"base": BASE, "base_file": "x.yaml", "axes": {"seed": [1]}}, "give exactly one of matrix.base"),
        ({"base_file": "missing.yaml", "axes": {"seed": [1]}}, "matrix.base_file: 'missing.yaml' does not exist"),
        ({"base": BASE, "axes": {"seed": [1]}, "colour": "red"}, "unknown key 'matrix.colour'; allowed here: axes, base"),
        ({"base": BASE}, "missing field 'matrix.axes'"),
        ({"base": BASE, "axes": {"parallel.num_dispatchers": [3, 5]}}, "none of the 2 combinations is a valid scenario"),
        ({"base": BASE, "axes": {"seed": [1]}, "overrides": [{"when": {}, "set": {"parallel.nope": 1}}]},
         "matrix.overrides.0.set: unknown scenario field 'parallel.nope'"),
    ],
)
def test_matrix_errors_name_file_and_field(tmp_path: Path, body: dict, message: str) -> None:
    path = write_matrix(tmp_path, body)
    with pytest.raises(ScenarioError) as info:
        load_matrix(path)
    assert isinstance(info.value, MatrixError)
    assert str(path) in str(info.value) and message in str(info.value)


def test_collect_matrix_goes_on_past_a_failed_cell(tmp_path: Path) -> None:
    body = {"name": "ci", "base": BASE, "axes": {"parallel.num_dispatchers": [1, 2, 4, 8]}}
    matrix = load_matrix(write_matrix(tmp_path, body))
    cells = matrix.cells()
    assert [c.name for c in cells] == ["K128-I64_D2_T32", "K128-I64_D4_T32", "K128-I64_D8_T32"]
    matrix_dir = tmp_path / "results"
    ok_cell, failed_cell, never_ran = cells
    write_run(matrix_dir / ok_cell.name, ok_cell.scenario)
    write_run(matrix_dir / failed_cell.name, failed_cell.scenario, failed_ranks={1: "died: exit code -9"})

    result = collect_matrix(matrix_dir, cells, matrix=matrix)
    report = result.report
    assert isinstance(report, MatrixReport)
    assert result.exit_code == 2 and report.status == "FAILED"
    for name in REPORT_FILES:
        assert (matrix_dir / name).is_file()
    assert (matrix_dir / ok_cell.name / "report.json").is_file()  # each cell keeps its own report
    assert [c.report.exit_code for c in report.cells] == [0, 2, 2]
    assert (report.num_valid, report.num_combinations) == (3, 4)
    assert [s.name for s in report.skipped] == ["K128-I64_D1_T32"]
    assert {(p.cell, p.kind) for p in report.problems} == {
        (failed_cell.name, "rank-failure"), (never_ran.name, "missing-cell")}
    # the healthy cell's numbers are all there; the cell that never ran still has its planned contracts
    ok = report.cells[0]
    legacy = ok.report.policy("legacy")
    assert legacy is not None and legacy.contract_total_bytes == legacy_shapes(ok_cell.scenario.sizing_args()).total_bytes
    assert report.cells[2].planned_contracts["fixed"] == fixed_shapes(never_ran.scenario.sizing_args()).total_bytes
    assert report.cells[2].report.scenario.num_dispatchers == 8

    md = (matrix_dir / "report.md").read_text()
    assert "3 of 4 combinations valid" in md and "missing-cell" in md and "died: exit code -9" in md
    assert "Skipped combinations (1 of 4)" in md and md.rstrip().splitlines()[-1].startswith("**FAILED (exit 2)")
    assert f"# generation: {report.generation}" in md
    page = (matrix_dir / "report.html").read_text()
    assert 'id="plot-workspace-vs-d"><img' in page
    root = ET.parse(matrix_dir / "junit.xml").getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == [c.name for c in cells]
    # 2 ranks x 2 policies x 4 checks in the first cell; 1 rank's in the second plus its failure; the third: 1 error
    assert int(root.get("tests")) == 16 + 8 + 1 + 1 and int(root.get("errors")) == 2

    # `harness collect MATRIX_DIR` re-collects from matrix.json and writes the same bytes
    before = {name: (matrix_dir / name).read_bytes() for name in REPORT_FILES}
    assert json.loads((matrix_dir / "matrix.json").read_text())["num_combinations"] == 4
    assert main(["collect", str(matrix_dir)]) == 2
    assert {name: (matrix_dir / name).read_bytes() for name in REPORT_FILES} == before


def test_collect_matrix_all_pass(tmp_path: Path) -> None:
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    for cell in matrix.cells():
        write_run(tmp_path / cell.name, cell.scenario, device_kind="cpu")
    result = collect_matrix(tmp_path, matrix.cells(), matrix=matrix)
    assert result.exit_code == 0, result.report.exit_reason
    assert result.report.exit_reason == "all 2 cells passed (32 checks, 0 skipped)"
    from report_records import read_md

    assert "| cell | model | D | E | T | policy | outcome |" in read_md(tmp_path / "report.md")


def test_collect_matrix_reuses_the_reports_the_cells_were_collected_into(tmp_path: Path) -> None:
    """harness run collects each cell as it finishes; the combined report takes those reports and reads no record
    again, and the cells' own reports are not written a second time."""
    from harness.report.collect import collect

    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    for cell in (first, second):
        write_run(tmp_path / cell.name, cell.scenario, device_kind="cpu")
    ran = collect(tmp_path / first.name)  # what run_scenario collected and wrote for the first cell
    assert isinstance(ran.report, RunReport)
    written = {name: (tmp_path / first.name / name).read_bytes() for name in REPORT_FILES}
    for record in (tmp_path / first.name / "ranks").iterdir():
        record.unlink()  # reading the records again would now find none: the cell would be an error

    result = collect_matrix(tmp_path, matrix.cells(), matrix=matrix, collected={first.name: ran})
    report = result.report
    assert isinstance(report, MatrixReport) and result.exit_code == 0, report.exit_reason
    # the report the cell was collected into, less its ranks (they stay in the cell's own report.json) and that
    # file's digest; the file itself is named by the sha256 of its bytes
    assert report.cells[0].report == ran.report.summary().model_copy(update={"content_digest": None})
    assert type(report.cells[0].report) is RunSummary and report.cells[0].report.hardware.num_ranks_reported == 2
    assert report.cells[0].report_sha256 == file_sha256(written["report.json"])
    assert {name: (tmp_path / first.name / name).read_bytes() for name in REPORT_FILES} == written
    # the cell no call collected is collected here, and its reports written since it had none
    assert report.cells[1].report.checks.num_pass == 16 and (tmp_path / second.name / "report.json").is_file()
    assert report.cells[1].report_sha256 == file_sha256((tmp_path / second.name / "report.json").read_bytes())
    # the matrix's report.json embeds no rank entry, and names matrix.json by its bytes
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["report_schema_version"] == 3 and all("ranks" not in c["report"] for c in data["cells"])
    assert data["manifest_sha256"] == file_sha256((tmp_path / "matrix.json").read_bytes())
    # the combined junit.xml still has every rank x policy x check of both cells (from the cells' whole reports)
    assert int(ET.parse(tmp_path / "junit.xml").getroot().get("tests")) == 2 * 16


def test_a_kept_cell_is_rewritten_only_when_its_reports_are_stale(tmp_path: Path) -> None:
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    first, second = matrix.cells()
    for cell in (first, second):
        write_run(tmp_path / cell.name, cell.scenario, device_kind="cpu")
    collect_matrix(tmp_path, matrix.cells(), matrix=matrix)
    kept_md = tmp_path / first.name / "report.md"
    kept_md.write_text(kept_md.read_text() + "kept as written\n")  # same generation: a later call leaves it
    write_run(tmp_path / second.name, second.scenario, device_kind="cpu", run_id="20251130-060000-again")
    stale = json.loads((tmp_path / second.name / "report.json").read_text())["generation"]

    report = collect_matrix(tmp_path, matrix.cells(), matrix=matrix).report
    assert kept_md.read_text().endswith("kept as written\n")
    assert stale != report.cells[1].report.generation  # the records changed: that cell's reports are rewritten
    assert json.loads((tmp_path / second.name / "report.json").read_text())["generation"] == \
        report.cells[1].report.generation
    assert f"# generation: {report.cells[1].report.generation}" in (tmp_path / second.name / "report.md").read_text()


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/abs", "..", "a/b", "", "x" * 300, "nul\x00"])
def test_an_unsafe_cell_name_in_matrix_json_is_refused(tmp_path: Path, name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """matrix.json is read back from the run directory: a cell name must stay one directory below it."""
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    matrix_dir = tmp_path / "deep" / "matrix"
    for cell in matrix.cells():
        write_run(matrix_dir / cell.name, cell.scenario, device_kind="cpu")
    collect_matrix(matrix_dir, matrix.cells(), matrix=matrix)
    data = json.loads((matrix_dir / "matrix.json").read_text())
    data["cells"][1]["name"] = name
    (matrix_dir / "matrix.json").write_text(json.dumps(data))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["collect", str(matrix_dir)]) == 2
    err = capsys.readouterr().err
    assert "is not a safe directory name" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written anywhere


def test_a_corrupt_matrix_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "matrix.json").write_bytes(b"\xff\xfe" + b"[" * 100_000)
    assert main(["collect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read the matrix manifest" in err and len(err.strip().splitlines()) == 1


def test_a_stored_scenario_of_an_older_harness_reads_its_default_redundant_experts_as_unset():
    """Older harnesses wrote `layer.num_redundant_experts: 0` as their default ("derive them") into run.json and
    matrix.json; such a record still loads, hashing as it did, while the same 0 in a scenario file is a declared 0
    that contradicts E x D."""
    from harness.scenario.schema import parse_stored_scenario

    data = {"model": {"preset": "deepseek-v3"},
            "parallel": {"num_dispatchers": 32, "num_ranks": 1, "num_local_experts": 16, "max_tokens_per_rank": 256},
            "layer": {"all2all": "deepep-low-latency", "moe_backend": "deep_gemm", "num_redundant_experts": 0}}
    with pytest.raises(ScenarioError, match=r"num_local_experts \(16\) x num_dispatchers \(32\) = 512"):
        parse_scenario(data, path="declared.yaml")
    stored = parse_stored_scenario(data, path="run.json scenario")
    assert stored.layer.num_redundant_experts is None
    assert json.loads(stored.canonical_json())["layer"]["num_redundant_experts"] == 0  # hashes as it was written
    assert parse_stored_scenario(dict(data, parallel=dict(data["parallel"], num_local_experts=8)),
                                 path="x").layer.num_redundant_experts == 0  # a consistent 0 stays declared


def test_the_committed_h200_matrix_baseline_compares_with_itself():
    from cli_utils import run_cli_inproc

    baseline = REPO_DIR / "results" / "baselines" / "h200" / "1xh200-matrix-nightly-releases"
    result = run_cli_inproc("compare", str(baseline), str(baseline))
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
