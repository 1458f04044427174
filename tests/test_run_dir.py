"""`harness run`'s output directory: checked before anything runs, claimed atomically, created with the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_utils import REPO_DIR, harness_env, run_cli_inproc
from scenario_utils import TINY

from harness.launch import LaunchError
from harness.launch.rundir import CLAIM_FILE, check_out_dir, choose_run_dir, claim_run_dir, make_run_id
from harness.scenario.schema import parse_scenario
from harness.scenario.sections import is_safe_name

# Everything before the claim is torch-free input checking: a refusal takes one interpreter start (about 0.3 s
# idle, 2 s at a load of 12 on 2 cores), so 5 s (the bound for any refusal) leaves a margin.
REFUSAL_TIMEOUT_S = 5.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("prepare", "says"), [
    (lambda out: out.write_text("x"), "exists and is not a directory"),
    (lambda out: (out.mkdir(), (out / "notes.txt").write_text("x")), "is not empty (1 entries)"),
    (lambda out: (out.mkdir(), (out / "ranks").mkdir()), "already holds a run"),
    (lambda out: (out.mkdir(), (out / CLAIM_FILE).write_text("pid 7 on h since t, run r\n")),
     "is being written by another run (pid 7 on h since t, run r)"),
])
def test_unusable_out_is_refused_and_left_alone(tmp_path: Path, prepare, says: str) -> None:
    out = tmp_path / "out"
    prepare(out)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(LaunchError) as info:
        choose_run_dir(out, "20261130-000000-x")
    assert says in str(info.value) and str(out) in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_out_that_cannot_be_made_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(LaunchError) as info:
        check_out_dir(tmp_path / "a-file" / "out")
    assert "is not a directory" in str(info.value)
    with pytest.raises(LaunchError) as info:
        check_out_dir(tmp_path / ("n" * 300) / "out")  # a component past NAME_MAX
    assert "not a usable path" in str(info.value) or "cannot create" in str(info.value)


def test_an_empty_out_directory_is_taken(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    claim = claim_run_dir(choose_run_dir(out, "r"), "r")
    assert claim.path == out.resolve() and not claim.created
    assert (out / CLAIM_FILE).read_text().startswith(f"pid {os.getpid()} on ")
    claim.release()
    assert out.is_dir() and not any(out.iterdir()), "given empty, given back empty"


def test_default_run_dir_takes_the_next_free_name_and_gives_back_an_unused_one(tmp_path: Path) -> None:
    taken = tmp_path / "results" / "20261130-000000-x"
    taken.mkdir(parents=True)
    claim = claim_run_dir(taken, "20261130-000000-x", exact=False)
    assert claim.path.name == "20261130-000000-x-2" and claim.created
    claim.release()
    assert not claim.path.exists()


def test_a_released_run_dir_keeps_what_the_run_wrote(tmp_path: Path) -> None:
    claim = claim_run_dir(tmp_path / "run", "r")
    (claim.path / "run.json").write_text("{}\n")
    claim.release()
    assert sorted(p.name for p in claim.path.iterdir()) == ["run.json"], "the claim goes, the run's files stay"


def test_a_matrix_directory_takes_more_cells_of_the_same_matrix_only(tmp_path: Path) -> None:
    out = tmp_path / "matrix"
    out.mkdir()
    (out / "matrix.json").write_text('{"name": "kernels"}\n')
    (out / "cell-a").mkdir()
    assert choose_run_dir(out, "r", matrix_name="kernels") == out.resolve()
    claim_run_dir(out, "r", reuse=True).release()
    with pytest.raises(LaunchError) as info:
        choose_run_dir(out, "r", matrix_name="other")
    assert "holds matrix 'kernels', not 'other'" in str(info.value)
    with pytest.raises(LaunchError) as info:
        choose_run_dir(out, "r")  # a single scenario does not go into a matrix directory
    assert "is not empty" in str(info.value)


@pytest.mark.parametrize(("umask", "dir_mode", "file_mode"), [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_run_dir_and_claim_follow_the_umask(tmp_path: Path, umask: int, dir_mode: int, file_mode: int) -> None:
    old = os.umask(umask)
    try:
        claim = claim_run_dir(tmp_path / "deep" / "run", "r")
    finally:
        os.umask(old)
    assert _mode(claim.path) == dir_mode and _mode(claim.path.parent) == dir_mode
    assert _mode(claim.path / CLAIM_FILE) == file_mode


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", "x" * 5000, "a\0b", "  "])
def test_run_ids_are_one_safe_path_component(name: str) -> None:
    run_id = make_run_id(name)
    assert is_safe_name(run_id, 255), run_id


def test_a_file_name_that_is_no_safe_name_becomes_one(tmp_path: Path) -> None:
    scenario = parse_scenario({k: v for k, v in TINY.items() if k != "name"}, path=tmp_path / "my run (2).yaml")
    assert scenario.name == "my-run--2-"


@pytest.mark.slow
def test_two_runs_given_the_same_out_at_once(tmp_path: Path) -> None:
    """Started together, exactly one run takes --out; the other exits 2 naming it, and the first completes."""
    scenario_path = tmp_path / "tiny.yaml"
    scenario_path.write_text(yaml.safe_dump(TINY))
    scenario = parse_scenario(TINY)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "harness", "run", str(scenario_path), "--out", str(out)]
    runs = [subprocess.Popen(command, cwd=REPO_DIR, env=harness_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    # The loser is refused before torch is imported; the winner is bounded by the scenario's own timeouts.
    launch = scenario.launch
    deadline = time.monotonic() + REFUSAL_TIMEOUT_S + launch.placement_timeout_s + launch.rank_timeout_s + 60
    results = [(run, *run.communicate(timeout=max(1.0, deadline - time.monotonic()))) for run in runs]
    refused = [(run, err) for run, _, err in results if run.returncode == 2]
    # Exit 1 is a run that completed and found a check failed (CPU memory figures on a loaded machine): it ran.
    finished = [(run, out_text) for run, out_text, _ in results if run.returncode in (0, 1)]
    assert len(refused) == 1 and len(finished) == 1, [(r.returncode, e[-2000:]) for r, _, e in results]
    (_, message), (winner, _) = refused[0], finished[0]
    assert message.count("\n") == 1 and "being written by another run" in message, message
    assert f"pid {winner.pid} on " in message, message
    assert (out / "report.json").exists() and not (out / CLAIM_FILE).exists(), "the claim ends with the run"


def test_a_ray_job_without_out_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    # Inside `ray job submit` (its supervisor sets RAY_JOB_CONFIG_JSON_ENV_VAR in the driver) results/ would be in
    # Ray's temporary copy of the working directory, deleted with the job: the run must name --out instead.
    run = run_cli_inproc("run", "smoke", cwd=tmp_path, env={"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"})
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "give --out an absolute path" in lines[0] and "Traceback" not in run.stderr
    assert not any(tmp_path.iterdir()), "nothing written"
