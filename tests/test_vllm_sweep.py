"""`harness vllm audit --sweep` on real vLLM releases, and on source trees with a regression planted in them.

The trees are copies of the cached 0.30.0 wheel's files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from packaging.version import Version

from cli_utils import run_cli_inproc
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.evaluate import source_tree as _source_tree
from harness.sizing.vllm_source.sources import default_cache_dir
from harness.sizing.vllm_source.sweep import (
    CONSISTENT,
    DOUBLE,
    GRID_D,
    OVER,
    REFUSED,
    UNDER,
    UNSUPPORTED,
    SweepBudget,
    boxes,
    sweep,
)
from harness.sizing.vllm_source.sweep_report import sweep_json, write_junit

CUTLASS = "CutlassBatchedExpertsFp8"
TRITON = "BatchedTritonExperts"
CUTLASS_FILE = "vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py"
BATCHED_FILE = "vllm/model_executor/layers/fused_moe/experts/fused_batched_moe.py"

# A release's own tree is trusted: its whole sweep gets room for a loaded or shared machine, where the default budget
# (a hostile tree's bound, about 1.3x what 0.33.0 takes on an idle core) can run out and stop the sweep at a limit.
TRUSTED = SweepBudget(cpu_s=120)


@pytest.fixture(scope="module")
def sweeps() -> dict:
    found = {}
    for version in ("0.29.0", "0.30.0"):
        found[version] = sweep(_source_tree(locate(version=version, cache_dir=default_cache_dir())), budget=TRUSTED)
    return found


def by_name(result) -> dict:
    return {c.name: c for c in result.classes}


def judged(cls, status=None):
    """The points the class takes (not refused or unsupported), or those of one status."""
    return [p for p, o in cls.outcomes.items() if (o.status == status if status else o.status not in
                                                   (REFUSED, UNSUPPORTED))]  # fmt: skip


@pytest.mark.vllm_wheel
def test_0_29_0_double_counts_at_every_point_with_d_at_least_2(sweeps):
    cutlass = by_name(sweeps["0.29.0"])[CUTLASS]
    assert cutlass.verdict == DOUBLE and cutlass.failed
    taken = judged(cutlass)
    assert {p.D for p in taken} == set(GRID_D)
    for point in taken:
        outcome = cutlass.outcomes[point]
        if point.D >= 2:
            assert outcome.status == DOUBLE, (point, outcome)
            assert "M·D" in outcome.detail
        else:
            assert outcome.status == CONSISTENT, (point, outcome)
    # Every layout axis of the full product is covered by the double count.
    doubled = judged(cutlass, DOUBLE)
    assert {p.E for p in doubled} == {1, 8, 16, 64} and {p.T for p in doubled} == {1, 256, 8192}
    assert {p.experts for p in doubled} == {"E·D", "EPLB"}
    assert len({p.activation for p in doubled}) >= 7  # every gated activation the class takes
    # The legacy total is the harness's legacy formula at the PR point (x32 the fixed one at D = 32).
    pr = next(p for p in doubled if (p.D, p.E, p.T, p.K, p.activation) == (32, 16, 256, 7168, "silu"))
    assert cutlass.outcomes[pr].total_bytes == 112 * 2**30
    assert [c.name for c in sweeps["0.29.0"].failed] == [CUTLASS]


@pytest.mark.vllm_wheel
def test_0_30_0_is_consistent_everywhere(sweeps):
    cutlass = by_name(sweeps["0.30.0"])[CUTLASS]
    assert cutlass.verdict == CONSISTENT and not cutlass.failed
    taken = judged(cutlass)
    assert len(taken) > 300
    assert all(cutlass.outcomes[p].status == CONSISTENT for p in taken)
    # The live set was derived from apply()'s views, and the workspace is exactly that at every traced point.
    assert cutlass.live_set.startswith("derived from apply() views")
    pr = next(p for p in taken if (p.D, p.E, p.T, p.K, p.activation) == (32, 16, 256, 7168, "silu"))
    assert cutlass.outcomes[pr].total_bytes == int(3.5 * 2**30)
    assert "sized to apply()'s views" in cutlass.outcomes[pr].detail
    # Non-gated activations: the class says it does not take them.
    assert all(o.status == UNSUPPORTED for p, o in cutlass.outcomes.items() if p.activation.endswith("_no_mul"))
    assert sweeps["0.30.0"].failed == []


@pytest.mark.vllm_wheel
def test_batched_deep_gemm_over_allocates_its_unused_ws2(sweeps):
    # BatchedDeepGemmExperts sizes ws2 (E, M, N/2) but its apply() never views workspace2.
    deep_gemm = by_name(sweeps["0.30.0"])["BatchedDeepGemmExperts"]
    assert deep_gemm.verdict == OVER and not deep_gemm.failed
    ratios = {p.K: o.ratio for p, o in deep_gemm.outcomes.items() if o.status == OVER}
    # K < N: ws13 = (E, M, N) beside ws2 (E, M, N/2): x1.5; K = 7168 > N: (K + N/2) / K.
    assert ratios[512] == pytest.approx(1.5) and ratios[7168] == pytest.approx((7168 + 2048) / 7168)


def planted_tree(tmp_path: Path, file: str, old: str, new: str) -> Path:
    """A copy of the cached 0.30.0 files with `old` replaced by `new` in file (exactly once)."""
    source = locate(version="0.30.0", cache_dir=default_cache_dir())
    root = tmp_path / "vllm-src"
    shutil.copytree(source.root / "vllm", root / "vllm")
    path = root / file
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {file} exactly once"
    path.write_text(text.replace(old, new))
    return root


@pytest.mark.vllm_wheel
def test_planted_num_dp_regression_fails_with_class_and_points(tmp_path):
    # Put the double count back: the token dim of ws13 becomes M * num_dispatchers again.
    root = planted_tree(
        tmp_path,
        CUTLASS_FILE,
        "workspace1 = (experts_per_worker, M, max(N, K))",
        "workspace1 = (experts_per_worker, M * self.num_dispatchers, max(N, K))",
    )
    junit = tmp_path / "sweep.xml"
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(root), "--junit", str(junit),
                               "--classes", CUTLASS)  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    assert re.search(
        rf"FAILED: 1 of 1 experts classes \(1 batched, 0 standard\), the 1 of \d+ that --classes names: {CUTLASS} "
        r"\(double-count\)",
        completed.stdout,
    ), completed.stdout[-2000:]
    assert "double-counts at" in completed.stdout and "D=2..256" in completed.stdout
    suite = ET.parse(junit).getroot()
    failures = [case for case in suite.iter("testcase") if case.find("failure") is not None]
    assert failures and all(CUTLASS in case.get("classname") for case in failures)
    assert all(case.get("name").startswith("double-count: D=2..256") for case in failures)
    assert suite.get("failures") == str(len(failures))


@pytest.mark.vllm_wheel
def test_planted_non_gated_sized_as_gated_is_under_sized(tmp_path):
    # BatchedTritonExperts' workspace_shapes halves N for every activation, the *_no_mul ones too.
    old = """        max_num_tokens = self.max_num_tokens
        activation_out_dim = self.adjust_N_for_activation(N, activation)
        workspace13 = (num_experts, max_num_tokens * num_dp, max(K, N))"""
    root = planted_tree(tmp_path, BATCHED_FILE, old, old.replace("self.adjust_N_for_activation(N, activation)",
                                                                 "N // 2"))  # fmt: skip
    result = sweep(_source_tree(locate(src=root)), budget=TRUSTED)
    triton = by_name(result)[TRITON]
    assert triton.verdict == UNDER and [c.name for c in result.failed] == [TRITON]
    under = judged(triton, UNDER)
    assert under and all(p.activation.endswith("_no_mul") for p in under)
    assert {p.D for p in under} == {1, 32}  # the sub-grid apply() is traced on
    assert all(triton.outcomes[p].detail == "apply() views workspace2 to x2 of its size" for p in under)
    # Gated activations are untouched: consistent wherever the class takes them.
    gated = [o.status for p, o in triton.outcomes.items() if not p.activation.endswith("_no_mul")]
    assert set(gated) <= {CONSISTENT, REFUSED, UNSUPPORTED} and gated.count(CONSISTENT) > 300
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(root), "--classes", TRITON)
    assert completed.returncode == 1
    assert f"{TRITON} (under-sized)" in completed.stdout


def test_boxes_cover_each_point_once():
    from harness.sizing.vllm_source.sweep import Point

    points = [Point(d, "set", "E·D", "bf16", "silu", k, 2048, e, 1) for d in (1, 2, 8) for k in (512, 3072)
              for e in (1, 8)]  # fmt: skip
    points.remove(Point(1, "set", "E·D", "bf16", "silu", 512, 2048, 1, 1))
    found = boxes(points)
    covered = [p for p in points for box in found if all(getattr(p, a) in box[a] for a in box)]
    assert sorted(covered) == sorted(points)  # a cover, each point in one box
    assert len(found) <= 3


def test_sweep_input_errors(tmp_path):
    completed = run_cli_inproc("vllm", "audit", "--junit", str(tmp_path / "x.xml"))
    assert completed.returncode == 2 and completed.stderr.strip().count("\n") == 0
    assert "--junit goes with --sweep" in completed.stderr
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(tmp_path / "missing"))
    assert completed.returncode == 2 and "no such directory" in completed.stderr
    assert completed.stderr.strip().count("\n") == 0


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("version", ["0.21.0", "0.15.0"])
def test_releases_without_a_manylinux_2_28_wheel_are_found(tmp_path, version):
    # 0.21.0 ships only manylinux_2_24, 0.15.0 only manylinux_2_31: the index's sha256 is had for both (a dry run
    # reads the wheel's metadata, it does not download the wheel).
    from harness.sizing.vllm_source.registry import published_sha256

    assert re.fullmatch(r"[0-9a-f]{64}", published_sha256(version, tmp_path / "scratch"))


@pytest.mark.vllm_wheel
def test_a_release_the_index_does_not_have_says_so(tmp_path):
    from harness.sizing.vllm_source.cache import CacheError
    from harness.sizing.vllm_source.registry import published_sha256

    with pytest.raises(
        CacheError,
        match=r"^could not download vLLM release 0\.1\.9999: the package index has no vllm==0\.1\.9999 \(pip: ",
    ):
        published_sha256("0.1.9999", tmp_path / "scratch")


@pytest.mark.vllm_wheel
def test_sweep_json_and_junit_of_0_30_0(sweeps, tmp_path):
    # The whole release's JSON and JUnit, rendered from the module's sweep of 0.30.0 as the command renders its own.
    junit = tmp_path / "sweep.xml"
    write_junit(sweeps["0.30.0"], junit)
    data = json.loads(json.dumps(sweep_json(sweeps["0.30.0"])))
    assert data["vllm_version"] == "0.30.0" and data["failed"] == []
    cutlass = next(c for c in data["classes"] if c["name"] == CUTLASS)
    assert cutlass["verdict"] == CONSISTENT and cutlass["summary"].startswith("consistent everywhere")
    assert sum(g["points"] for g in cutlass["groups"]) == cutlass["points"]
    suite = ET.parse(junit).getroot()
    # One testcase per point group, per finding (0.30.0: BatchedDeepGemmExperts' unused workspace2) and per limit.
    assert [f["class"] for f in data["findings"]] == ["BatchedDeepGemmExperts"] and data["limits"] == []
    assert suite.get("failures") == "0"
    assert int(suite.get("tests")) == sum(len(c["groups"]) for c in data["classes"]) + len(data["findings"])
    # The command, on two of its classes: the same entries as the whole release's, the finding's bytes at the
    # reference deployments besides.
    named = (CUTLASS, "BatchedDeepGemmExperts")
    cli_junit = tmp_path / "cli.xml"
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-version", "0.30.0", "--json", "--junit",
                               str(cli_junit), "--classes", ",".join(named),
                               "--budget-s", str(TRUSTED.cpu_s))  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    cli = json.loads(completed.stdout)
    assert cli["classes"] == [c for c in data["classes"] if c["name"] in named]
    assert cli["selected"] == {"classes": sorted(named), "of": len(data["classes"])} and cli["limits"] == []
    (finding,) = cli["findings"]
    assert finding["class"] == "BatchedDeepGemmExperts" and finding["bytes_at"]
    assert {k: v for k, v in finding.items() if k not in ("bytes_at", "text")} == {
        k: v for k, v in data["findings"][0].items() if k not in ("bytes_at", "text")
    }
    cli_suite = ET.parse(cli_junit).getroot()
    assert cli_suite.get("failures") == "0"
    assert int(cli_suite.get("tests")) == sum(len(c["groups"]) for c in cli["classes"]) + 1


def test_sweep_flag_combinations_are_one_line_errors(tmp_path):
    for args, message in (
        (("--sweep", "--scenario", "smoke"), "--scenario does not go with --sweep"),
        (("--sweep", "--releases", "0.29.0", "--junit", str(tmp_path / "x.xml")), "--junit goes with --sweep of one"),
        (("--sweep", "--out", str(tmp_path)), "--releases and --out go with --layer or --sweep --releases"),
        (("--classes", "CutlassBatchedExpertsFp8"), "--classes goes with --sweep of one source"),
        (("--sweep", "--releases", "0.29.0", "--classes", "X"), "--classes goes with --sweep of one source"),
        (("--sweep", "--classes", "a-b,"), "--classes a-b,: comma-separated experts class names are allowed"),
    ):
        completed = run_cli_inproc("vllm", "audit", *args)
        assert completed.returncode == 2, args
        assert message in completed.stderr and completed.stderr.strip().count("\n") == 0, completed.stderr


def test_the_committed_sweep_table():
    """results/audit/sweep-audit.{json,md}: every release from the first with the batched CUTLASS path, and the
    verdicts the sweep gives on the pinned ones."""
    root = Path(__file__).resolve().parent.parent / "results" / "audit"
    data = json.loads((root / "sweep-audit.json").read_text())
    versions = [r["vllm_version"] for r in data["releases"]]
    assert versions[0] == "0.9.2" and versions[-1] == "0.33.0" and len(versions) >= 40 and not data["not_swept"]
    verdicts = {r["vllm_version"]: {c["name"]: c["verdict"] for c in r["classes"]} for r in data["releases"]}
    assert verdicts["0.9.2"]["CutlassExpertsFp8"] == DOUBLE
    split = [v for v in versions if Version("0.10.1") <= Version(v) <= Version("0.29.0")]
    assert len(split) >= 30 and all(verdicts[v][CUTLASS] == DOUBLE for v in split)
    assert all(verdicts[v][CUTLASS] == CONSISTENT for v in ("0.30.0", "0.31.0", "0.32.0", "0.33.0"))
    table = (root / "sweep-audit.md").read_text()
    assert f"| {CUTLASS} | 0.30.0-0.33.0 | experts/cutlass_moe.py | consistent everywhere it takes |" in table
