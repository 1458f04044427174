"""One gate, one verdict: `harness status DIR` verifies what `harness compare` verifies (one function,
compare_load.verify_directory), so on every tampered run or matrix built here the two agree: both exit 2 with one
line. A report.json rewritten after collect with its content digest recomputed cannot pass a run whose records
failed, because the verdict is re-derived from the records beside it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from report_records import make_scenario, write_run

from harness.cli import main
from harness.report.collect import collect
from harness.report.matrix import collect_matrix
from harness.report.model import content_digest
from harness.scenario.matrix import load_matrix
from harness.scenario.sections import REPO_DIR

FAILING = {0: {"fixed": {"num_wrong_slots": 1}}}  # rank 0's fixed policy routed a slot wrongly: exit 1


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _put(path: Path, data: dict, *, digest: bool = False) -> None:
    if digest:
        data.pop("content_digest", None)
        data["content_digest"] = content_digest(data)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _as_passing(run: Path) -> None:
    """report.json and status.json of a failing run rewritten as a pass, each consistent, the digest recomputed."""
    data = _json(run / "report.json")
    data.update(status="OK", exit_code=0, exit_reason="all checks passed", check_failures=[])
    data["checks"] = {**data["checks"], "num_fail": 0}
    _put(run / "report.json", data, digest=True)
    _put(run / "status.json", {**_json(run / "status.json"), "status": "OK", "exit_code": 0,
                               "exit_reason": data["exit_reason"]})


def _better_numbers(run: Path) -> None:
    data = _json(run / "report.json")
    for policy in data["policies"]:
        if policy["workspace_delta_bytes"] is not None:
            policy["workspace_delta_bytes"]["max"] //= 2
    _put(run / "report.json", data, digest=True)


def _edit_record(run: Path) -> None:
    rank = run / "ranks/rank-00001.json"
    rank.write_bytes(rank.read_bytes().replace(b'"num_checked_tokens": 32', b'"num_checked_tokens": 31', 1))


TAMPERS: dict[str, tuple[Callable[[Path], None], bool]] = {  # name: (the tamper, applied to the failing run)
    "status exit 1 edited to 0": (lambda r: _put(r / "status.json", {**_json(r / "status.json"), "exit_code": 0}),
                                  True),
    "status exit 1 edited to 0, status OK": (
        lambda r: _put(r / "status.json", {**_json(r / "status.json"), "exit_code": 0, "status": "OK"}), True),
    "status exit_code false": (lambda r: _put(r / "status.json", {**_json(r / "status.json"), "exit_code": False}),
                               False),
    "status exit_code true": (lambda r: _put(r / "status.json", {**_json(r / "status.json"), "exit_code": True}),
                              True),
    "status OK with exit 1": (lambda r: _put(r / "status.json", {**_json(r / "status.json"), "status": "OK"}), True),
    "report.json deleted": (lambda r: (r / "report.json").unlink(), False),
    "a record edited after collect": (_edit_record, False),
    "a record deleted after collect": (lambda r: (r / "ranks/rank-00001.json").unlink(), False),
    "run.json deleted after collect": (lambda r: (r / "run.json").unlink(), False),
    "report and status rewritten as a pass, digest recomputed": (_as_passing, True),
    "report numbers rewritten, digest recomputed": (_better_numbers, False),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_status_and_compare_refuse_every_tampered_run_alike(tmp_path: Path, capsys, name: str) -> None:
    tamper, failing = TAMPERS[name]
    base = write_run(tmp_path / "base", make_scenario())
    cur = write_run(tmp_path / "cur", make_scenario(), overrides=FAILING if failing else None)
    collect(base), collect(cur)
    capsys.readouterr()
    tamper(cur)
    codes = []
    for argv in (["status", str(cur)], ["compare", str(base), str(cur)]):
        codes.append(main(argv))
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and captured.err.startswith("harness: error: "), captured.err
        assert "Traceback" not in captured.err
    assert codes == [2, 2]


@pytest.mark.parametrize("overrides,code", [(None, 0), (FAILING, 1)])
def test_status_and_compare_agree_on_untampered_runs(tmp_path: Path, capsys, overrides, code: int) -> None:
    base = write_run(tmp_path / "base", make_scenario())
    cur = write_run(tmp_path / "cur", make_scenario(), overrides=overrides)
    collect(base), collect(cur)
    assert main(["status", str(cur)]) == code
    assert main(["compare", str(base), str(cur)]) == code
    capsys.readouterr()


def test_a_rewritten_report_without_its_records_is_trusted_as_far_as_its_digest(tmp_path: Path, capsys) -> None:
    """docs/reports.md: without records beside it, report.json is checked against its digest and siblings only; a
    recomputed digest then passes, which is why a gate keeps the records with the report."""
    base = write_run(tmp_path / "base", make_scenario())
    cur = write_run(tmp_path / "cur", make_scenario(), overrides=FAILING)
    collect(base), collect(cur)
    _as_passing(cur)
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("report.json", "status.json"):
        (alone / name).write_bytes((cur / name).read_bytes())
    assert main(["status", str(alone)]) == main(["compare", str(base), str(alone)]) == 0
    assert main(["status", str(cur)]) == main(["compare", str(base), str(cur)]) == 2  # the records say otherwise
    capsys.readouterr()


def _matrix(tmp_path: Path, name: str, overrides=None) -> Path:
    matrix = load_matrix(REPO_DIR / "scenarios/matrix/cpu-ci.yaml")
    for cell in matrix.cells():
        write_run(tmp_path / name / cell.name, cell.scenario, overrides=overrides, device_kind="cpu")
    collect_matrix(tmp_path / name, matrix.cells(), matrix=matrix)
    return tmp_path / name


def _matrix_as_passing(out: Path) -> None:
    data = _json(out / "report.json")
    for cell in data["cells"]:
        cell["report"].update(status="OK", exit_code=0, exit_reason="all checks passed", check_failures=[])
    data.update(status="OK", exit_code=0, exit_reason="all cells passed", check_failures=[])
    _put(out / "report.json", data, digest=True)
    _put(out / "status.json", {**_json(out / "status.json"), "status": "OK", "exit_code": 0,
                               "exit_reason": data["exit_reason"]})


MATRIX_TAMPERS: dict[str, Callable[[Path], None]] = {
    "matrix report and status rewritten as a pass, digest recomputed": _matrix_as_passing,
    "matrix status exit edited to 0": lambda m: _put(m / "status.json", {**_json(m / "status.json"), "exit_code": 0}),
    "matrix report.json deleted": lambda m: (m / "report.json").unlink(),
    "a cell's record deleted": lambda m: next(m.glob("*/ranks/rank-00001.json")).unlink(),
}


@pytest.mark.parametrize("name", list(MATRIX_TAMPERS))
def test_status_and_compare_refuse_every_tampered_matrix_alike(tmp_path: Path, capsys, name: str) -> None:
    base, cur = _matrix(tmp_path, "base"), _matrix(tmp_path, "cur", overrides=FAILING)
    capsys.readouterr()
    MATRIX_TAMPERS[name](cur)
    assert main(["status", str(cur)]) == 2
    assert main(["compare", str(base), str(cur)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err


def test_compare_prints_one_line_per_problem_and_the_traceback_stays_in_the_record(tmp_path: Path, capsys) -> None:
    base = write_run(tmp_path / "base", make_scenario())
    cur = write_run(tmp_path / "cur", make_scenario(), failed_ranks={0: "error: RuntimeError: boom",
                                                                      1: "died: exit code 1\n\x1b[2Jhidden"})
    traceback = 'Traceback (most recent call last):\n  File "lifecycle.py", line 1, in rank_main\nRuntimeError: boom'
    failed = cur / "ranks/rank-00000.failed.json"
    failed.write_text(json.dumps({**_json(failed), "detail": traceback}))
    collect(base), collect(cur)
    capsys.readouterr()
    assert main(["compare", str(base), str(cur)]) == 2
    lines = capsys.readouterr().err.splitlines()
    problems = _json(cur / "report.json")["problems"]
    assert lines[0] == f"harness: error: the current run's records have {len(problems)} problem(s):"
    assert len(lines) == 1 + len(problems) and all(line.startswith("  ") for line in lines[1:])
    assert "  rank-failure: rank 0 on node-0: error: RuntimeError: boom (its traceback: " \
           "ranks/rank-00000.failed.json)" in "\n".join(lines)
    assert "Traceback" not in "\n".join(lines) and "\x1b" not in "\n".join(lines)
    assert _json(failed)["detail"] == traceback  # kept in the record, which the line names
