"""Records are validated like scenarios, and nothing read from disk is unbounded: strict types, a supported schema
version, each policy once and only the scenario's, builtin contracts recomputed, run.json's scenario checked, and
num_ranks capped by the scenario's own limit."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from harness.core.records import RecordError, parse_record
from harness.report.collect import collect
from harness.report.load import load_run
from harness.scenario.limits import MAX_NUM_RANKS
from report_records import make_scenario, write_run


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _problems(run_dir: Path) -> list[str]:
    return [f"{p.kind}: {p.cause}" for p in collect(run_dir, write=False).report.problems]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["policies"][0]["contract"].update(total_bytes="262144"), "Input should be a valid integer"),
        (lambda d: d["policies"][0]["contract"].update(total_bytes=262144.0), "Input should be a valid integer"),
        (lambda d: d["policies"][0]["correctness"].update(num_wrong_slots=False), "Input should be a valid integer"),
        (lambda d: d.update(schema_version=0), "schema_version 0 is no version of these records; allowed: 1 to 2"),
        (lambda d: d.update(schema_version=-7), "schema_version -7 is no version"),
        (lambda d: d.update(schema_version=True), "no schema_version"),
        (lambda d: d["policies"].append(d["policies"][0]), "policy 'legacy' is listed twice; each policy once"),
        (lambda d: d.update(policies=d["policies"] * 40), "policies: 80 policies; allowed: at most 64"),
    ],
)
def test_a_record_is_read_strictly(tmp_path: Path, edit, says: str) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    record = run_dir / "ranks/rank-00000.json"
    _edit(record, edit)
    with pytest.raises(RecordError) as info:
        parse_record(record.read_bytes(), where="ranks/rank-00000.json")
    assert says in str(info.value) and "\n" not in str(info.value)
    assert any(p.startswith("corrupt: ranks/rank-00000.json") for p in _problems(run_dir))


def test_a_policy_outside_the_scenario_is_refused(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    _edit(run_dir / "ranks/rank-00001.json", lambda d: d["policies"][0].update(policy="mine"))
    assert any("policy 'mine' is not one of the scenario's (legacy, fixed)" in p for p in _problems(run_dir))
    assert collect(run_dir, write=False).exit_code == 2


def test_a_builtin_contract_is_recomputed_from_the_scenario(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    _edit(run_dir / "ranks/rank-00000.json", lambda d: d["policies"][1]["contract"].update(total_bytes=1))
    report = collect(run_dir, write=False).report
    assert report.exit_code == 2
    assert any(
        p.kind == "mismatch" and "policy fixed: contract" in p.cause and "the scenario's shapes give" in p.cause
        for p in report.problems
    )


def test_an_edited_scenario_in_run_json_is_refused(tmp_path: Path) -> None:
    """A wrong result (max_rel_error 0.5) passes a scenario whose expect.max_error was raised by hand: refused."""
    run_dir = write_run(tmp_path / "run", make_scenario(), overrides={0: {"fixed": {"max_rel_error": 0.5}}})
    assert collect(run_dir, write=False).exit_code == 1
    manifest = run_dir / "run.json"
    from harness.core.records import scenario_digest

    _edit(manifest, lambda d: d.update(scenario_sha256=scenario_digest(d["scenario"])))  # as the driver writes it
    assert collect(run_dir, write=False).exit_code == 1
    _edit(manifest, lambda d: d["scenario"]["expect"].update(max_error=1.0))
    report = collect(run_dir, write=False).report
    assert report.exit_code == 2
    assert any("run.json: its scenario is not the one the run was started with" in p.cause for p in report.problems)
    # without the digest (an older record), the ranks' own copy of the scenario still tells
    _edit(manifest, lambda d: d.pop("scenario_sha256"))
    report = collect(run_dir, write=False).report
    assert report.exit_code == 2
    assert any("run.json: its scenario differs from the one rank 0 ran" in p.cause for p in report.problems)


def test_num_ranks_in_run_json_is_capped_by_the_scenario_limit(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", make_scenario())
    _edit(run_dir / "run.json", lambda d: d.update(num_ranks=10**8))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = load_run(run_dir)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert any(
        p.kind == "invalid" and f"num_ranks 100000000; allowed: 1 to {MAX_NUM_RANKS}" in p.cause
        for p in loaded.problems
    )
    assert not any(p.kind == "missing-rank" for p in loaded.problems)
    assert grown_kib < 100 * 1024  # a 10^8 set of ints is gigabytes; nothing of that size was built
