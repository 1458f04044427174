"""The per-stage correctness check catches real divergences and names them; kernels are chosen and recorded.

The divergent backends are the reference experts with one stage changed the way real kernels go wrong (vLLM
0.26.0's silu_and_mul reads row r mod 2^32/2I, vLLM #42860; an expert fed another expert's weights). They run
through the real rank lifecycle on a real gloo group, so the check sees exactly what a run sees.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_utils import parallel_launch
from harness.core.records import KernelsRecord, PolicyResult
from harness.rank.experts.base import ExpertWeights, Workspace
from harness.rank.experts.reference import ReferenceExperts, Spans, silu_and_mul
from harness.report.collect import collect
from harness.scenario.schema import ScenarioError
from harness.scenario.sections import VllmSpec
from harness.sizing.vllm_source import VllmSourceError
from harness.sizing.vllm_source.kernels import file_sha256, release_of_library, resolve_kernels
from report_records import rank_record, write_run
from scenario_utils import tiny

WRAP_ROWS = 40  # the emulated 32-bit offset wraps here: row r reads row r mod 40 (expert 1, slot 8 with M = 32)


class WrappingActivation(ReferenceExperts):
    """silu_and_mul over the whole (E*M, 2I) view with the row offset computed modulo WRAP_ROWS rows, as vLLM
    0.26.0's kernel computes `blockIdx.x * 2 * d` in 32 bits (it wraps at 2^32 / 2I rows)."""

    def activation(self, ws: Workspace, spans: Spans) -> None:
        rows = torch.arange(ws.mm1_out.shape[0]) % WRAP_ROWS
        ws.act_out.copy_(silu_and_mul(ws.mm1_out.index_select(0, rows)))


class SwappedWeights(ReferenceExperts):
    """GEMM1 of local expert 2 multiplies by expert 3's weights (a wrong expert offset in a grouped GEMM)."""

    def gemm1(self, ws: Workspace, spans: Spans, expert_x: torch.Tensor, expert_x_scale: torch.Tensor,
              weights: ExpertWeights) -> None:
        swapped = weights.w1.clone(), weights.w1_scale.clone()
        swapped[0][2], swapped[1][2] = weights.w1[3], weights.w1_scale[3]
        super().gemm1(ws, spans, expert_x, expert_x_scale,
                      dataclasses.replace(weights, w1=swapped[0], w1_scale=swapped[1]))


BACKENDS = {"wrapping-activation": WrappingActivation, "swapped-weights": SwappedWeights,
            "reference": ReferenceExperts}
ONE_RANK = {"parallel.num_ranks": 1, "parallel.num_dispatchers": 4, "parallel.num_local_experts": 4,
            "parallel.max_tokens_per_rank": 8, "policies": ["fixed"]}


def _measure_with(info, scenario_data: dict, backend: str):
    from harness.rank.lifecycle import measure_policy, setup_rank
    from harness.scenario.schema import parse_scenario

    setup = setup_rank(parse_scenario(scenario_data), info, torch.device("cpu"), Path("/tmp"), 0)
    setup = dataclasses.replace(setup, backend=BACKENDS[backend]())
    result, counts = measure_policy(setup, "fixed", None)
    return result.model_dump(mode="json"), counts


def _run(backend: str) -> tuple[PolicyResult, list[int], int]:
    scenario = tiny(**ONE_RANK)
    ((result, counts),) = parallel_launch(1, _measure_with, scenario.model_dump(mode="json"), backend)
    return PolicyResult.model_validate(result), counts, scenario.parallel.max_tokens_per_rank * 4


@pytest.mark.slow
def test_activation_wrong_past_a_row_is_named_with_its_row_experts_and_share(tmp_path):
    result, counts, M = _run("wrapping-activation")
    c = result.correctness
    report, check = _correctness_verdict(tmp_path, result, release="0.26.0", expect={})  # not expected wrong
    assert c is not None and check.outcome == "fail", check
    assert report.ranks[0].policies[0].first_diverging_stage == "activation"
    stages = {s.stage: s for s in c.stages}
    # What the bug makes wrong: every valid row at or past WRAP_ROWS, and nothing before it.
    valid = [e * M + j for e, n in enumerate(counts) for j in range(n)]
    wrong = [r for r in valid if r >= WRAP_ROWS]
    assert wrong, f"the routing left no valid row past {WRAP_ROWS}: counts {counts}"
    act = stages["activation"]
    assert act.rows == "all" and act.num_rows_checked == len(valid)
    assert act.num_rows_wrong == len(wrong)
    assert act.first_wrong_row == wrong[0]
    assert (act.first_wrong_expert, act.first_wrong_slot) == (wrong[0] // M, wrong[0] % M)
    assert act.wrong_experts == sorted({r // M for r in wrong})
    assert act.fraction_wrong == pytest.approx(len(wrong) / len(valid))
    assert act.max_rel_error > 10 * act.tolerance
    # The stages before it agree, and the ones after it agree with the wrong activation they were given.
    for name in ("dispatch", "gemm1", "quant", "gemm2", "combine"):
        assert not stages[name].diverged, stages[name]
    assert c.max_rel_error > c.tolerance  # and the combined output is wrong end to end
    assert c.check_us is not None and c.check_us > 0


@pytest.mark.slow
def test_a_gemm_fed_the_wrong_weights_is_isolated_to_gemm1_and_its_expert(tmp_path):
    result, counts, M = _run("swapped-weights")
    c = result.correctness
    report, check = _correctness_verdict(tmp_path, result, release="0.26.0", expect={})
    assert c is not None and check.outcome == "fail", check
    assert report.ranks[0].policies[0].first_diverging_stage == "gemm1"
    stages = {s.stage: s for s in c.stages}
    g = stages["gemm1"]
    assert counts[2] > 0 and g.rows == "sampled"
    assert g.wrong_experts == [2]
    assert g.num_rows_wrong == min(counts[2], 16)  # every sampled row of expert 2, first and last included
    assert g.first_wrong_row == 2 * M and (g.first_wrong_expert, g.first_wrong_slot) == (2, 0)
    assert not stages["dispatch"].diverged
    for name in ("activation", "quant", "gemm2", "combine"):  # each judged on the actual output before it
        assert not stages[name].diverged, stages[name]


def _correctness_verdict(tmp_path: Path, result: PolicyResult, *, release: str, expect: dict) -> tuple[Any, Any]:
    """A one-rank run directory whose record holds `result`, as run with `release`'s kernels: its report and the
    correctness check collect judged."""
    scenario = tiny(**ONE_RANK, **{"expect.wrong_kernels": expect})
    run_dir = write_run(tmp_path / f"run-{len(list(tmp_path.iterdir()))}", scenario, device_kind="cpu")
    record = rank_record(scenario, 0, run_id="20251130-052000-synthetic", device_kind="cpu")
    kernels = KernelsRecord(backend="vllm-ops", description=f"vLLM {release} (test)", release=release,
                            release_from="given", library_sha256="0" * 64, library_bytes=1)
    synthetic = record.policies[0]  # its memory and timings: this test is about the correctness verdict
    record = record.model_copy(update={
        "policies": [synthetic.model_copy(update={"correctness": result.correctness})], "kernels": kernels})
    (run_dir / "ranks" / "rank-00000.json").write_text(record.model_dump_json())
    report = collect(run_dir, write=False).report
    return report, report.ranks[0].policies[0].checks.correctness


@pytest.mark.slow
def test_collect_passes_kernels_wrong_as_expected_and_fails_them_otherwise(tmp_path):
    wrong, counts, M = _run("wrapping-activation")
    first = wrong.correctness.stages[2].first_wrong_row  # activation
    expect = {"0.26.0": {"stage": "activation", "first_wrong_row": first, "reason": "vLLM #42860"}}

    report, check = _correctness_verdict(tmp_path, wrong, release="0.26.0", expect=expect)
    assert check.outcome == "pass", check
    assert "wrong as expected at activation from row" in check.message and "vLLM #42860" in check.message
    assert f"first wrong row {first} (expert {first // M}, slot {first % M})" in check.message
    assert report.ranks[0].kernels.release == "0.26.0"
    assert report.ranks[0].policies[0].first_diverging_stage == "activation"
    from harness.report.markdown import render_markdown

    act = wrong.correctness.stages[2]
    row = (f"| 0 | fixed | 0.26.0 | activation | {act.num_rows_wrong} of {act.num_rows_checked} "
           f"({act.fraction_wrong:.1%}) | {first} (expert {first // M}, slot {first % M}) |")
    from report_records import unpadded_md

    assert row in unpadded_md(render_markdown(report))

    # The same wrong output under a release not expected to be wrong fails, naming the stage.
    report, check = _correctness_verdict(tmp_path, wrong, release="0.30.0", expect=expect)
    assert check.outcome == "fail" and "first diverging stage activation" in check.message
    assert report.exit_code == 1

    # A wrong row other than the one stated is not "as expected".
    moved = {"0.26.0": dict(expect["0.26.0"], first_wrong_row=first + 1)}
    assert _correctness_verdict(tmp_path, wrong, release="0.26.0", expect=moved)[1].outcome == "fail"

    # Kernels expected wrong that came out right fail too: the expectation is what the scenario guards.
    right, _, _ = _run("reference")
    _, check = _correctness_verdict(tmp_path, right, release="0.26.0", expect=expect)
    assert check.outcome == "fail"
    assert "expected wrong at activation" in check.message and "every stage within tolerance" in check.message


# ---------------------------------------------------------------------------------------------------------------
# Choosing and recording the kernels (the ops libraries of real releases in the cache; see tests/test_vllm_source.py)


def _cached_library(version: str) -> Path:
    from harness.sizing.vllm_source import locate, ops_library

    return ops_library(locate(version=version, with_ops=True))


@pytest.mark.vllm_wheel
def test_a_release_by_number_names_its_library_hash_size_and_torch_pin():
    lib = resolve_kernels(VllmSpec(kernels="0.30.0"))
    path = _cached_library("0.30.0")
    assert lib.path == path and lib.release == "0.30.0" and lib.release_from == "release"
    assert lib.num_bytes == path.stat().st_size and lib.sha256 == file_sha256(path)
    assert lib.torch_requirement == "torch==2.13.0"
    assert lib.describe() == f"vLLM 0.30.0 _C_stable_libtorch.abi3.so (sha256 {lib.sha256[:12]}, {lib.num_bytes} B)"
    assert resolve_kernels(VllmSpec(version="0.30.0")) == lib  # vllm.version means the same


@pytest.mark.slow
@pytest.mark.vllm_wheel
def test_a_library_file_gets_its_release_from_the_cache_or_from_the_scenario(tmp_path):
    path = _cached_library("0.26.0")
    found = resolve_kernels(VllmSpec(ops_library=str(path)))
    assert (found.release, found.release_from, found.torch_requirement) == ("0.26.0", "cache", "torch==2.11.0")
    assert release_of_library(found.sha256, found.num_bytes) == ("0.26.0", "torch==2.11.0")

    # A copy outside the cache, on a machine whose cache does not know it: the release is what the user says.
    copy = tmp_path / "lib.so"
    copy.write_bytes(path.read_bytes()[:4096])
    stated = resolve_kernels(VllmSpec(kernels="0.26.0", ops_library=str(copy)), cache_dir=tmp_path / "empty")
    assert (stated.release, stated.release_from, stated.num_bytes) == ("0.26.0", "given", 4096)
    unknown = resolve_kernels(VllmSpec(ops_library=str(copy)), cache_dir=tmp_path / "empty")
    assert unknown.release is None and "release unknown" in unknown.describe()


@pytest.mark.vllm_wheel
def test_a_library_stated_to_be_another_release_than_the_cache_knows_is_refused():
    path = _cached_library("0.30.0")
    with pytest.raises(VllmSourceError, match=r"is vLLM 0\.30\.0's library .* not 0\.26\.0's as vllm\.kernels says"):
        resolve_kernels(VllmSpec(kernels="0.26.0", ops_library=str(path)))
    with pytest.raises(VllmSourceError, match=r"vllm\.ops_library /nonexistent/lib\.so: no such file"):
        resolve_kernels(VllmSpec(ops_library="/nonexistent/lib.so"))


@pytest.mark.parametrize("data, message", [
    ({"kernels": "latest"}, "vllm.kernels: vllm.kernels 'latest' is not a release (X.Y.Z) or 'installed'"),
    ({"kernels": "0.30.0", "version": "0.26.0"}, "give at most one of vllm.kernels, vllm.version"),
    ({"kernels": "installed", "ops_library": "/x.so"}, "got kernels, ops_library"),
])
def test_kernels_fields_are_validated_with_one_line(data, message):
    with pytest.raises(ScenarioError) as info:
        tiny(**{f"vllm.{k}": v for k, v in data.items()})
    assert message in str(info.value) and len(str(info.value).splitlines()) == 1


def test_expected_wrong_kernels_are_validated():
    with pytest.raises(ScenarioError, match=r"expect.wrong_kernels keys are vLLM releases like 0.26.0"):
        tiny(**{"expect.wrong_kernels": {"latest": {"stage": "activation"}}})
    with pytest.raises(ScenarioError, match=r"expect\.wrong_kernels\.0\.26\.0\.stage"):
        tiny(**{"expect.wrong_kernels": {"0.26.0": {"stage": "silu"}}})


def test_re_extracting_a_release_keeps_its_ops_library(tmp_path):
    """An entry written by older harness code re-extracts the wheel; the kernels extracted before stay."""
    import json

    from harness.sizing.vllm_source import locate
    from test_vllm_source import make_wheel

    wheel = make_wheel(tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl", {
        "vllm-0.9.9.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.9\n",
        "vllm/model_executor/layers/fused_moe/__init__.py": b"",
        "vllm/_C_stable_libtorch.abi3.so": b"\x7fELF not really",
    })
    cache = tmp_path / "cache"
    with_ops = locate(wheel=wheel, cache_dir=cache, with_ops=True)
    assert with_ops.ops_library is not None and with_ops.ops_library.read_bytes() == b"\x7fELF not really"
    manifest = with_ops.root / "manifest.json"
    older = {k: v for k, v in json.loads(manifest.read_text()).items() if k != "schema_version"}
    manifest.write_text(json.dumps(older))
    again = locate(wheel=wheel, cache_dir=cache)  # without with_ops: a reader of the sizing code only
    assert again.ops_library == with_ops.ops_library and again.ops_library.is_file()
    assert json.loads(manifest.read_text())["ops_extracted"] is True


# ---------------------------------------------------------------------------------------------------------------
# A kernels matrix run one release per call into one directory, and kernels that cannot be had, through the CLI


# The smoke scenario's shapes (their workspaces are large enough for RSS to resolve), one policy, one pass.
SMALL = {"parallel": {"num_dispatchers": 4, "num_ranks": 2, "num_local_experts": 8, "max_tokens_per_rank": 128},
         "model": {"hidden_size": 512, "intermediate_size": 256, "num_experts": 32, "top_k": 4},
         "policies": ["fixed"], "device": "cpu", "iterations": 1, "warmup": 0,
         "expect": {"outcomes": {"fixed": "fit"}, "memory_tolerance_pct": 2.0},
         "launch": {"rank_timeout_s": 120.0}}
# One `harness run` of one cell: the ranks' own bound, plus 60 s to start the interpreter and ranks and 60 s to
# collect, on a loaded 2-core machine.
RUN_BOUND_S = SMALL["launch"]["rank_timeout_s"] + 120


def _matrix_file(tmp_path: Path) -> Path:
    import yaml

    path = tmp_path / "kernels-cpu.yaml"
    path.write_text(yaml.safe_dump({"matrix": {"name": "kernels-cpu", "base": dict(SMALL, name="small"),
                                               "axes": {"vllm.kernels": ["0.26.0", "0.30.0"]}}}))
    return path


@pytest.mark.slow
@pytest.mark.vllm_wheel  # each cell's ranks load the release's ops library, from the shared cache
@pytest.mark.timeout(4 * RUN_BOUND_S)  # three runs and a collect
def test_a_kernels_matrix_runs_one_release_per_call_into_one_directory(tmp_path):
    from cli_utils import run_cli_inproc

    matrix, out = _matrix_file(tmp_path), tmp_path / "matrix"
    first = run_cli_inproc("run", str(matrix), "--kernels", "0.26.0", "--out", str(out))
    cells = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert cells == ["K512-I256_D4_T128_kernels-0.26.0"], first.stdout[-2000:] + first.stderr[-2000:]
    # The other release's cell is named as not run, in one line; the run is incomplete, so exit 2.
    assert first.returncode == 2
    report = json.loads((out / "report.json").read_text())
    (missing,) = [p for p in report["problems"] if p["kind"] == "missing-cell"]
    assert missing["cell"] == "K512-I256_D4_T128_kernels-0.30.0" and "\n" not in missing["cause"]

    kept = (out / cells[0] / "run.json").read_text()
    second = run_cli_inproc("run", str(matrix), "--kernels", "0.30.0", "--out", str(out))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert (out / cells[0] / "run.json").read_text() == kept  # the first call's cell, kept as it was
    again = run_cli_inproc("collect", str(out))
    assert again.returncode == 0, again.stdout[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in report["cells"]] == ["K512-I256_D4_T128_kernels-0.26.0", "K512-I256_D4_T128_kernels-0.30.0"]
    assert all(c["report"]["exit_code"] == 0 for c in report["cells"])

    wrong = run_cli_inproc("run", str(matrix), "--kernels", "0.29.0", "--out", str(tmp_path / "other"))
    assert wrong.returncode == 2
    assert "--kernels 0.29.0: the matrix's vllm.kernels axis has 0.26.0, 0.30.0" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(RUN_BOUND_S)
def test_a_kernels_file_that_is_not_there_is_refused_before_any_rank(tmp_path):
    import yaml
    from cli_utils import run_cli_inproc

    scenario = tmp_path / "small.yaml"
    scenario.write_text(yaml.safe_dump(dict(SMALL, name="small")))
    done = run_cli_inproc("run", str(scenario), "--kernels", "0.26.0", "--vllm-ops-library", "/nonexistent/lib.so",
                          "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "harness: error: --vllm-ops-library /nonexistent/lib.so: no such file or directory; allowed: vLLM's compiled "
        "ops library file (vllm/_C_stable_libtorch.abi3.so or vllm/_C.abi3.so)"]
    assert not (tmp_path / "run").exists()  # no run directory, no rank: the ranks' path is run_ranks' own test
    # The scenario file's own vllm.ops_library is checked as early.
    scenario.write_text(yaml.safe_dump(dict(SMALL, name="small", vllm={"ops_library": "/nonexistent/lib.so"})))
    done = run_cli_inproc("run", str(scenario), "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and not (tmp_path / "run").exists()
    assert "vllm.ops_library /nonexistent/lib.so: no such file or directory" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------------
# torch-cutlass's footprint: chunks cover every row once and stay under the stated bound whatever M is


@pytest.mark.parametrize("E, M", [(16, 8192), (8, 262144), (4, 524288), (3, 1040), (64, 16)])
def test_torch_cutlass_chunks_cover_every_row_once_within_the_scratch_bound(E, M):
    from harness.rank.experts import torch_cutlass as tc

    K, I = 7168, 2048  # DeepSeek-V3: at the default tokens whole-expert chunks made 20 GB of temporaries
    rows = tc.rows_per_chunk(M, K, I)
    covered = torch.zeros((E, M), dtype=torch.int32)
    for e0, e1, r0, r1 in tc.chunks(E, M, rows):
        assert (e1 - e0) * (r1 - r0) <= rows
        assert r0 % tc.ROW_ALIGN == 0  # row blocks start aligned
        covered[e0:e1, r0:r1] += 1
    assert bool((covered == 1).all())
    chunk_rows = max((e1 - e0) * (r1 - r0) for e0, e1, r0, r1 in tc.chunks(E, M, rows))
    assert chunk_rows * tc.scratch_bytes_per_row(K, I) <= tc.SCRATCH_BOUND_BYTES
    ws = type("W", (), {"num_local_experts": E, "max_slots_per_expert": M, "hidden_size": K, "intermediate_size": I})
    reported = tc.TorchCutlassExperts(torch.device("cpu")).scratch_bytes(ws)  # type: ignore[arg-type]
    assert reported == chunk_rows * tc.scratch_bytes_per_row(K, I) + 4 * E * M + tc.GEMM_LIBRARY_ALLOWANCE_BYTES
    assert reported < 2**30 + 4 * E * M  # not 20 GB: the bound holds at any M


def test_a_node_without_the_drivers_file_fetches_nothing_it_cannot_name(tmp_path):
    """A library given as a file has no release a node could fetch: the node's refusal names the path and the way
    out, in one line."""
    from dataclasses import replace

    from harness.sizing.vllm_source.kernels import KernelsLibrary, on_this_node
    from harness.sizing.vllm_source.sources import VllmSourceError

    here = tmp_path / "lib.so"
    here.write_bytes(b"\0" * 64)
    given = KernelsLibrary(path=here, release="0.30.0", release_from="given", sha256="ab" * 32, num_bytes=64,
                           torch_requirement=None, origin=f"file {here}")
    assert on_this_node(given) is given  # the driver's path exists here: used as it is
    with pytest.raises(VllmSourceError) as err:
        on_this_node(replace(given, path=tmp_path / "elsewhere" / "lib.so"))
    message = str(err.value)
    assert "\n" not in message and "is not on this node" in message and "vllm.kernels: X.Y.Z" in message


@pytest.mark.vllm_wheel
def test_a_node_without_the_drivers_file_fetches_the_same_release_and_checks_its_sha256(tmp_path):
    """On a node where the driver's path does not exist, the release is taken from this node's cache and accepted
    only with the driver's sha256 and size."""
    from dataclasses import replace

    from harness.scenario.sections import VllmSpec
    from harness.sizing.vllm_source.kernels import on_this_node, resolve_kernels
    from harness.sizing.vllm_source.sources import VllmSourceError

    drivers = resolve_kernels(VllmSpec(kernels="0.30.0"))
    remote = replace(drivers, path=tmp_path / "driver-cache" / drivers.path.name)
    local = on_this_node(remote)
    assert local.path == drivers.path and (local.sha256, local.num_bytes) == (drivers.sha256, drivers.num_bytes)
    with pytest.raises(VllmSourceError) as err:
        on_this_node(replace(remote, sha256="0" * 64))
    assert "the driver's has 000000000000" in str(err.value) and drivers.sha256[:12] in str(err.value)
