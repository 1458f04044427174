"""The contract oracle of `harness vllm audit --sweep` on vLLM 0.33.0 (and 0.19.0's DeepGemmExperts): every experts
class that sizes a workspace, each with its own N, what apply() uses, named findings, and under-sizes planted in a
copy of the release's files.

The trees are copies of the cached 0.33.0 wheel's files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.evaluate import source_tree
from harness.sizing.vllm_source.sources import default_cache_dir
from harness.sizing.vllm_source.sweep import (
    BATCHED,
    CONSISTENT,
    NOT_DERIVED,
    OVER,
    REFUSED,
    STANDARD,
    UNDER,
    UNEVALUATED,
    UNSUPPORTED,
    SweepBudget,
    sweep,
)

pytestmark = pytest.mark.vllm_wheel

VERSION = "0.33.0"
EXPERTS = "vllm/model_executor/layers/fused_moe/experts"
MARLIN_FILE = f"{EXPERTS}/marlin_moe.py"
NAIVE_FILE = f"{EXPERTS}/fused_batched_moe.py"
CUTEDSL_FILE = f"{EXPERTS}/flashinfer_cutedsl_batched_moe.py"
HUMMING_FILE = f"{EXPERTS}/fused_humming_moe.py"
CUTLASS_FILE = f"{EXPERTS}/cutlass_moe.py"
TRTLLM_MXFP4_FILE = f"{EXPERTS}/trtllm_mxfp4_moe.py"


@pytest.fixture(scope="module")
def release():
    return locate(version=VERSION, cache_dir=default_cache_dir())


@pytest.fixture(scope="module")
def swept(release):
    # a release's tree is trusted: room for a loaded machine (the default budget is a hostile tree's bound)
    return sweep(source_tree(release), budget=SweepBudget(cpu_s=120))


def by_name(result) -> dict:
    return {c.name: c for c in result.classes}


def planted(tmp_path: Path, release, file: str, old: str, new: str) -> Path:
    """A copy of the release's files with `old` replaced by `new` in file (exactly once)."""
    root = tmp_path / "vllm-src"
    shutil.copytree(release.root / "vllm", root / "vllm")
    path = root / file
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {file} exactly once"
    path.write_text(text.replace(old, new))
    return root


def sweep_of(root: Path, *names: str):
    return by_name(sweep(source_tree(locate(src=root)), class_filter=lambda n: n in names))


def test_every_class_that_sizes_a_workspace_is_swept(release, swept):
    # Every class of 0.33.0 whose own body defines a concrete workspace_shapes, counted here from the files with ast.
    import ast

    defining = set()
    for path in (release.root / "vllm/model_executor/layers/fused_moe").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "workspace_shapes":
                        body = [
                            s for s in item.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                        ]
                        abstract = all(isinstance(s, (ast.Raise, ast.Pass)) for s in body)
                        if not abstract:
                            defining.add(node.name)
    names = {c.name for c in swept.classes}
    # 45 define a concrete one (FallbackExperts' raises NotImplementedError); BatchedHummingGroupedExperts inherits
    # HummingExpertsBase's and is swept in the batched format.
    assert len(defining) == 45 and defining <= names
    assert names - defining == {"BatchedHummingGroupedExperts"} and len(names) == 46
    formats = {c.name: c.format for c in swept.classes}
    assert sum(f == BATCHED for f in formats.values()) == 7
    assert formats["TritonExperts"] == STANDARD and formats["DeepGemmExperts"] == STANDARD
    assert formats["CutlassBatchedExpertsFp8"] == BATCHED
    # Standard-format points carry bytes, as batched ones do.
    triton = by_name(swept)["TritonExperts"]
    judged = [o for o in triton.outcomes.values() if o.status in (CONSISTENT, OVER)]
    assert len(judged) > 300 and all(o.total_bytes and o.shapes for o in judged)


def test_marlin_is_sized_with_n_equal_to_i(swept):
    """MarlinExpertsBase.moe_problem_size takes N from marlin_moe_intermediate_size (w2_packed.size(1) * 16 = I):
    the batched class's shapes equal the hand computation with N = I, not 2I."""
    marlin = by_name(swept)["BatchedMarlinExperts"]
    assert marlin.n_rule.startswith("N = I")
    point = next(p for p in marlin.outcomes if (p.D, p.E, p.T, p.K, p.I, p.activation, p.dispatchers, p.experts)
                 == (32, 16, 256, 7168, 2048, "silu", "set", "E·D") and p.quant == "fp8-per-token")  # fmt: skip
    outcome = marlin.outcomes[point]
    E, T, D, K, I = 16, 256, 32, 7168, 2048
    N = I
    assert outcome.N == N
    assert outcome.shapes == ((E * T * D, max(K, 2 * N)), (E * T * D, N), (E, T * D, K))
    assert outcome.total_bytes == 2 * (E * T * D * max(K, 2 * N) + E * T * D * N)
    # Sized with the harness's N = 2I it would be (E·T·D, max(K, 4I)) and (E·T·D, 2I): x1.33 more here.
    assert 2 * (E * T * D * max(K, 4 * I) + E * T * D * 2 * I) / outcome.total_bytes == pytest.approx(4 / 3)
    # What apply() uses is derived from its views (through batched_fused_marlin_moe and _fused_marlin_moe).
    assert marlin.live_set.startswith("derived from apply() views")
    assert outcome.status in (CONSISTENT, OVER)
    # The standard-format Marlin class uses the same convention.
    assert by_name(swept)["MarlinExperts"].n_rule.startswith("N = I")


def test_refused_points_are_not_judged(swept):
    classes = by_name(swept)
    for name in ("CutlassBatchedExpertsFp8", "CutlassExpertsFp8"):
        relu2 = [o for p, o in classes[name].outcomes.items() if p.activation.startswith("relu2")]
        assert relu2 and all(o.status in (UNSUPPORTED, REFUSED) for o in relu2), name
    for name in ("BatchedTritonExperts", "TritonExperts"):
        nvfp4 = [o for p, o in classes[name].outcomes.items() if p.quant == "nvfp4"]
        assert nvfp4 and all(o.status in (UNSUPPORTED, REFUSED) for o in nvfp4), name


def test_batched_deep_gemm_unused_workspace2_is_a_named_finding(release, tmp_path):
    junit = tmp_path / "sweep.xml"
    # The gate of the one class named (`--classes`): a pull request's class is swept, judged and reported alone.
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-version", VERSION, "--classes",
                               "BatchedDeepGemmExperts", "--json", "--junit", str(junit))  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["schema_version"] == 2
    assert data["selected"] == {"classes": ["BatchedDeepGemmExperts"], "of": 46}
    assert [c["name"] for c in data["classes"]] == ["BatchedDeepGemmExperts"]
    (finding,) = [f for f in data["findings"] if f["class"] == "BatchedDeepGemmExperts"]
    assert finding["kind"] == "unused-buffer" and finding["buffer"] == "workspace2"
    # The line of workspace_shapes that sizes it, read from the file here.
    source = (release.root / "vllm" / finding["file"]).read_text().splitlines()
    assert source[finding["line"] - 1].strip().startswith("workspace2 = (num_experts, max_num_tokens * num_dispatchers")
    # Its bytes at the reference deployments the deployment model sizes: (E, T·D, N/2) bf16 with N = 2I.
    assert finding["bytes_at"]["DeepSeek-V3 DP32 DeepEP LL (the case of vLLM PR 55579)"] == 16 * 256 * 32 * 2048 * 2
    assert finding["bytes_at"]["Kimi-K2 DP48 DeepEP LL"] == 8 * 256 * 48 * 2048 * 2
    assert "batched_deep_gemm_moe.py:" in finding["text"] and "DeepSeek-V3 DP32" in finding["text"]
    # Per point: the shapes, the bytes, what apply() uses, the verdict.
    fields = data["point_fields"]
    deep_gemm = next(c for c in data["classes"] if c["name"] == "BatchedDeepGemmExperts")
    rows = [dict(zip(fields, row, strict=False)) for row in deep_gemm["point_rows"]]
    assert len(rows) == deep_gemm["points"]
    where = ("D", "E", "T", "K", "activation", "quant", "experts", "dispatchers")
    pr = next(r for r in rows if tuple(r[k] for k in where) == (32, 16, 256, 7168, "silu", "fp8-block", "E·D", "set"))
    M = 256 * 32
    assert pr["ws13"] == [16, M, 7168] and pr["ws2"] == [16, M, 2048] and pr["out"] == [16, M, 7168]
    assert pr["total_bytes"] == 2 * (16 * M * 7168 + 16 * M * 2048)
    # apply() views workspace13 as (E, M, N) with N = 2I = 4096, and never workspace2.
    assert pr["uses_ws2_bytes"] == 0 and pr["uses_ws13_bytes"] == 2 * 16 * M * 4096 and pr["status"] == OVER
    suite = ET.parse(junit).getroot()
    cases = [c for c in suite.iter("testcase") if c.get("classname") == "BatchedDeepGemmExperts"]
    outs = "\n".join(c.findtext("system-out") or "" for c in cases)
    assert f"ws2=(16, {M}, 2048)" in outs and "uses_ws2_bytes=0" in outs
    assert any(c.get("name") == "finding: unused-buffer workspace2" for c in cases)
    # The table names it too, not only in a row.
    table = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-version", VERSION, "--classes",
                           "BatchedDeepGemmExperts")  # fmt: skip
    assert "FINDING: BatchedDeepGemmExperts allocates workspace2 and its apply() never views it" in table.stdout
    assert table.stdout.rstrip().endswith(
        "OK: none of 1 experts classes (1 batched, 0 standard), the 1 of 46 that --classes names double-counts or is "
        "under-sized"
    )
    # A name the release does not have: one line with the closest names, exit 2.
    wrong = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-version", VERSION, "--classes", "BatchedDeepGemExperts")
    assert wrong.returncode == 2 and wrong.stderr.strip().count("\n") == 0
    assert wrong.stderr.startswith(
        "harness: error: --classes BatchedDeepGemExperts: vllm 0.33.0 has no experts class of that name that sizes a "
        "workspace (46 do); closest: BatchedDeepGemmExperts"
    )


def test_not_derived_is_not_a_pass(swept):
    pending = [c for c in swept.classes if c.verdict == NOT_DERIVED]
    assert pending, "0.33.0 has classes whose apply() hands its workspaces to kernels the tracer does not know"
    for cls in pending:
        assert not cls.failed and cls.live_set.startswith("not derived")
        assert all(o.status in (NOT_DERIVED, UNSUPPORTED, REFUSED, UNEVALUATED) for o in cls.outcomes.values())
    from harness.sizing.vllm_source.sweep_report import footer

    line = footer(swept)
    assert line.startswith("OK: none of 46 experts classes (7 batched, 39 standard) double-counts or is under-sized")
    assert f"; not a pass: {len(pending)} not derived ({pending[0].name}" in line
    assert "unevaluated (BatchedHummingGroupedExperts" in line


# --- under-sizes planted in a copy of 0.33.0 ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "file", "old", "new"), [
    ("BatchedMarlinExperts", MARLIN_FILE, "workspace2 = (num_experts * max_num_tokens * num_dispatchers, N)",
     "workspace2 = (num_experts * max_num_tokens * num_dispatchers, N // 2)"),
    # NaiveBatchedExperts' apply() views workspace2 as (num, w1.size(1) // 2): its (M, N) is twice that, so a
    # halved one still holds the view (next test); a quartered one is x2 short.
    ("NaiveBatchedExperts", NAIVE_FILE, "workspace2 = (self.max_num_tokens * num_dp, N)",
     "workspace2 = (self.max_num_tokens * num_dp, N // 4)"),
    # FlashInfer CuteDSL hands workspace2, permuted, to its grouped GEMM as the gate-up output: m x N x E.
    ("FlashInferCuteDSLBatchedExperts", CUTEDSL_FILE, "workspace2 = (local_num_experts, M, N)",
     "workspace2 = (local_num_experts, M, N // 2)"),
])  # fmt: skip
def test_planted_halved_workspace2_is_caught(tmp_path, release, name, file, old, new):
    cls = sweep_of(planted(tmp_path, release, file, old, new), name)[name]
    assert cls.verdict == UNDER and cls.failed
    under = [o for o in cls.outcomes.values() if o.status == UNDER]
    assert under and all(o.detail == "apply() views workspace2 to x2 of its size" for o in under)


def test_naive_workspace2_is_twice_its_view(tmp_path, release):
    root = planted(
        tmp_path,
        release,
        NAIVE_FILE,
        "workspace2 = (self.max_num_tokens * num_dp, N)",
        "workspace2 = (self.max_num_tokens * num_dp, N // 2)",
    )
    naive = sweep_of(root, "NaiveBatchedExperts")["NaiveBatchedExperts"]
    traced = [o for p, o in naive.outcomes.items() if o.uses is not None and p.activation == "silu"]
    # At gated points the halved workspace2 is exactly the (M, N/2) apply() views: consistent, not under-sized.
    assert traced and all(o.uses[1] == 2 * o.shapes[1][0] * o.shapes[1][1] and o.status == CONSISTENT
                          for o in traced)  # fmt: skip


@pytest.mark.parametrize(("name", "file", "old", "new"), [
    ("BatchedMarlinExperts", MARLIN_FILE,
     "workspace13 = (num_experts * max_num_tokens * num_dispatchers, max(K, N * 2))",
     "workspace13 = (num_experts * max_num_tokens, max(K, N * 2))"),
    ("NaiveBatchedExperts", NAIVE_FILE, "workspace2 = (self.max_num_tokens * num_dp, N)",
     "workspace2 = (self.max_num_tokens, N)"),
    ("FlashInferCuteDSLBatchedExperts", CUTEDSL_FILE, "workspace2 = (local_num_experts, M, N)",
     "workspace2 = (local_num_experts, self.max_num_tokens, N)"),
])  # fmt: skip
def test_planted_num_dispatchers_drop_is_caught(tmp_path, release, name, file, old, new):
    # The mirror image of the double count: the workspace is D times too small while the output grows xD.
    cls = sweep_of(planted(tmp_path, release, file, old, new), name)[name]
    assert cls.verdict == UNDER and cls.failed
    under = [p for p, o in cls.outcomes.items() if o.status == UNDER]
    assert {p.D for p in under} == {2, 8, 32, 256}
    buffer = "ws13" if "workspace13" in old else "ws2"
    grown = [o for p, o in cls.outcomes.items() if o.status == UNDER and "does not grow with D" in o.detail]
    assert grown and all(o.detail == f"{buffer} does not grow with D while the output grows xD" for o in grown)
    # At D = 1 the drop changes nothing: those points are not under-sized.
    assert all(o.status != UNDER for p, o in cls.outcomes.items() if p.D == 1)


@pytest.mark.parametrize("plant", ["halved", "dispatchers dropped"])
def test_planted_humming_is_not_passed(tmp_path, release, plant):
    # BatchedHummingGroupedExperts sizes from the humming configs of a loaded layer (self.humming_configs): without
    # vLLM there are none, so its workspace is not evaluated at any point, planted or not, and nothing passes.
    old = "(workspace2_nbytes // elem_size,),"
    new = (
        "(workspace2_nbytes // elem_size // 2,),"
        if plant == "halved"
        else "(workspace2_nbytes // elem_size // self.num_dispatchers,),"
    )
    root = planted(tmp_path, release, HUMMING_FILE, old, new)
    cls = sweep_of(root, "BatchedHummingGroupedExperts")["BatchedHummingGroupedExperts"]
    assert cls.verdict == UNEVALUATED and not any(o.status == CONSISTENT for o in cls.outcomes.values())
    assert any("humming_configs" in o.detail or "humming" in o.detail for o in cls.outcomes.values())


def test_planted_under_size_fails_the_cli_gate(tmp_path, release):
    root = planted(
        tmp_path,
        release,
        MARLIN_FILE,
        "workspace2 = (num_experts * max_num_tokens * num_dispatchers, N)",
        "workspace2 = (num_experts * max_num_tokens * num_dispatchers, N // 2)",
    )
    # And in CutlassExpertsMxfp4, a standard-format class swept at the mxfp4 formats its _supports_quant_scheme
    # names: apply() views (M·topk, N/2) of its (M·topk, N) workspace2, so a quartered one is x2 short.
    cutlass = root / CUTLASS_FILE
    head, tail = cutlass.read_text().split("class CutlassExpertsMxfp4(", 1)
    assert "workspace2 = (M * topk, N)\n" in tail
    cutlass.write_text(
        head
        + "class CutlassExpertsMxfp4("
        + tail.replace("workspace2 = (M * topk, N)\n", "workspace2 = (M * topk, N // 4)\n", 1)
    )
    junit = tmp_path / "sweep.xml"
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(root), "--junit", str(junit),
                               "--classes", "BatchedMarlinExperts,CutlassExpertsMxfp4")  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    assert (
        "FAILED: 2 of 2 experts classes (1 batched, 1 standard), the 2 of 46 that --classes names: "
        "BatchedMarlinExperts (under-sized), CutlassExpertsMxfp4 (under-sized)" in completed.stdout
    )
    failures = [c for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert failures and {c.get("classname") for c in failures} == {"BatchedMarlinExperts", "CutlassExpertsMxfp4"}
    messages = {c.get("classname"): set() for c in failures}
    for case in failures:
        messages[case.get("classname")].add(case.find("failure").get("message"))
    assert all("apply() views workspace2 to x2 of its size" in m for m in messages["BatchedMarlinExperts"])
    # x2 at the gated activations; x4 at the non-gated ones, where apply() views all of (M·topk, N).
    mxfp4 = messages["CutlassExpertsMxfp4"]
    assert any("workspace2 to x2 of its size" in m for m in mxfp4) and any(
        "workspace2 to x4 of its" in m for m in mxfp4
    )
    assert all("workspace2 to x2 of its size" in m or "workspace2 to x4 of its size" in m for m in mxfp4)


def test_the_release_itself_has_no_under_size(swept):
    # Real classes whose workspace does not depend on M (a constant scratch) are not under-sized by the growth check:
    # it fires only where a buffer grows with T but not with D while the output grows xD.
    under = [(c.name, p) for c in swept.classes for p, o in c.outcomes.items() if o.status == UNDER]
    assert under == [] and swept.failed == [] and swept.limits == []


# --- classes swept at the formats and activations their own _supports_* methods take -------------------------------


def at(cls, **where):
    """The outcomes of the class's points that match `where` (Point fields), by point."""
    return {p: o for p, o in cls.outcomes.items() if all(getattr(p, k) == v for k, v in where.items())}


PR_POINT = dict(D=32, E=16, T=256, K=7168, I=2048, dispatchers="set", experts="E·D")


def test_classes_of_other_formats_match_hand_computations(swept):
    classes = by_name(swept)
    M, topk, K, I = 256 * 32, 8, 7168, 2048  # the standard format's M = T·D rows; TOP_K of the sweep
    # CutlassExpertsMxfp4 takes only mxfp4 weights (its _supports_quant_scheme): swept at the (weight, activation)
    # QuantKey pairs it names. cutlass_moe.py, CutlassExpertsMxfp4.workspace_shapes:
    #   workspace1 = (M * topk, max(2 * N, K)); workspace2 = (M * topk, N); output = (M, K), N = w1.size(1) = 2I.
    mxfp4 = at(classes["CutlassExpertsMxfp4"], quant="kMxfp4Static/kMxfp4Dynamic", activation="silu", **PR_POINT)
    ((_, outcome),) = mxfp4.items()
    N = 2 * I
    assert outcome.N == N
    assert outcome.shapes == ((M * topk, max(2 * N, K)), (M * topk, N), (M, K))
    assert outcome.total_bytes == 2 * (M * topk * max(2 * N, K) + M * topk * N)
    assert not any(p.quant in ("fp8-per-token", "bf16", "nvfp4") and o.status not in (UNSUPPORTED,)
                   for p, o in classes["CutlassExpertsMxfp4"].outcomes.items())  # fmt: skip
    # TrtLlmMxfp4ExpertsModular's output is (M, self.hidden_dim_unpadded), an attribute its __init__ assigns
    # (trtllm_mxfp4_moe.py: `self.hidden_dim_unpadded = (moe_config.hidden_dim_unpadded or moe_config.hidden_dim)`,
    # FusedMoEConfig setting an unset hidden_dim_unpadded to hidden_dim): derived, (M, K); workspaces (0,), (0,).
    trtllm = at(classes["TrtLlmMxfp4ExpertsModular"], quant="kMxfp4Static/none", activation="silu", **PR_POINT)
    ((_, outcome),) = trtllm.items()
    assert outcome.shapes == ((0,), (0,), (M, K)) and outcome.total_bytes == 2 * M * K
    assert classes["TrtLlmMxfp4ExpertsModular"].verdict == CONSISTENT
    # XPUExpertsMxFp4 reads self._expects_unquantized_inputs, which __init__ takes from the machine
    # (xpu_moe.py: `is_xe2_or_xe3 = torch.ops._xpu_C.is_xe2_arch() or ...`): swept at both values, labelled.
    # xpu_moe.py, XPUExpertsMxFp4.workspace_shapes: `logical_K = K if self.expects_unquantized_inputs else 2 * K`,
    # `return (0,), (0,), (M, logical_K)`. Where the prepare step quantizes (False), the K it is handed is that of
    # the mxfp4 input packed two values a byte, 7168 / 2: logical_K is the hidden size either way.
    xpu = at(classes["XPUExpertsMxFp4"], quant="kMxfp4Static/kMxfp4Dynamic", activation="silu", **PR_POINT)
    shapes = {p.variant: o.shapes for p, o in xpu.items()}
    assert shapes == {"_expects_unquantized_inputs=True": ((0,), (0,), (M, K)),
                      "_expects_unquantized_inputs=False": ((0,), (0,), (M, K))}  # fmt: skip


def test_swept_coverage_of_0_33_0(swept):
    # Every class is swept at some point it takes, but those whose workspace_shapes needs vLLM itself or a runtime
    # object (each named with its reason); none of the newly taken formats is under-sized in the release.
    unevaluated = {c.name: c for c in swept.classes if c.verdict == UNEVALUATED}
    # Each remaining class stops at a value of a kernel library vLLM wraps, not at vLLM's own code: the humming
    # library's configs (vllm.utils.humming re-exports it), the b12x library's execution plan (b12x.py, after its
    # `del N, ...`), DeepGEMM's contiguous-layout alignment where no __init__ asserts it (DeepGemmFP4Experts), and
    # DeepGEMM's per-call alignment, which deep_gemm_utils.compute_aligned_M_and_alignment asks for in a `try`
    # (DeepGemmExperts, past the alignment its __init__ asserts).
    reasons = {
        "BatchedHummingGroupedExperts": "imports vllm.utils.humming at call time",
        "HummingExpertsBase": "imports vllm.utils.humming at call time",
        "B12xExperts": "uses the name 'get_b12x_fused_moe'",
        "DeepGemmExperts": "uses Try, which is outside the evaluated subset (deep_gemm_utils.py line",
        "DeepGemmFP4Experts": "uses the name 'get_mk_alignment_for_contiguous_layout'",
    }
    assert set(unevaluated) == set(reasons)
    for name, cls in unevaluated.items():
        assert not any(o.status == CONSISTENT for o in cls.outcomes.values())
        details = {o.detail for o in cls.outcomes.values() if o.status == UNEVALUATED}
        assert all(d.startswith("workspace_shapes ") for d in details) and any(reasons[name] in d for d in details)
    verdicts = [c.verdict for c in swept.classes]
    assert len(verdicts) == 46 and (verdicts.count(CONSISTENT), verdicts.count(OVER)) == (23, 10)
    assert (verdicts.count(NOT_DERIVED), verdicts.count(UNEVALUATED)) == (8, 5)
    # TritonOrCutlassExperts' self.is_sm100 (`current_platform.has_device_capability(100)`) is swept at both values.
    toc = by_name(swept)["TritonOrCutlassExperts"]
    assert {p.variant for p in toc.outcomes} == {"is_sm100=True", "is_sm100=False"}
    # TritonOrDeepGemmExperts' `if is_deep_gemm_e8m0_used()` (a function of no argument, imported from vLLM) is
    # swept at both values; the alignment it and DeepGemmExperts read is the one DeepGemmExperts' __init__ asserts.
    tod = by_name(swept)["TritonOrDeepGemmExperts"]
    assert {p.variant.split(",")[0] for p in tod.outcomes} == {"is_deep_gemm_e8m0_used()=True",
                                                                "is_deep_gemm_e8m0_used()=False"}  # fmt: skip
    assert tod.verdict == OVER
    assert swept.failed == [] and swept.limits == []


def _line_of(path: Path, text: str, after: str = "") -> int:
    """The 1-based line of the only line of path that holds text (after the first line that holds `after`)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    found = [i + 1 for i, line in enumerate(lines) if i >= start and text in line]
    assert found, f"{text!r} is not in {path}"
    return found[0]


ALIGNMENT = "get_mk_alignment_for_contiguous_layout"
DEEP_GEMM_ASSERT = f"assert quant_config.block_shape == {ALIGNMENT}()"


def test_deep_gemm_alignment_is_the_block_shape_its_init_asserts(release, swept):
    # deep_gemm_moe.py, DeepGemmExperts.__init__: `assert quant_config.block_shape ==
    # get_mk_alignment_for_contiguous_layout()` outside MXFP8's [1, 32] blocks, so the alignment of a DeepGemmExperts
    # vLLM builds is its quant config's block_shape: [128, 128] at fp8-block (kFp8Dynamic128Sym).
    line = _line_of(release.root / EXPERTS / "deep_gemm_moe.py", DEEP_GEMM_ASSERT)
    part = f"{ALIGNMENT}()=quant_config.block_shape (asserted at deep_gemm_moe.py:{line})"
    classes = by_name(swept)
    deep_gemm, tod = classes["DeepGemmExperts"], classes["TritonOrDeepGemmExperts"]
    assert {p.variant for p in deep_gemm.outcomes} == {part}
    assert {p.variant for p in tod.outcomes} == {f"is_deep_gemm_e8m0_used()={v},{part}" for v in (True, False)}
    # The sweep's MXFP8 format carries no block_shape: the assert compares None with the alignment, a sequence the
    # release indexes (`get_mk_alignment_for_contiguous_layout()[0]`), so vLLM refuses to build the class.
    mxfp8 = {p: o for p, o in deep_gemm.outcomes.items() if p.quant == "kMxfp8Static/kMxfp8Dynamic"
             and p.activation == "silu"}  # fmt: skip
    assert len(mxfp8) == 20 and {o.status for o in mxfp8.values()} == {REFUSED}
    (detail,) = {o.detail for o in mxfp8.values()}
    assert f"`{DEEP_GEMM_ASSERT}` (deep_gemm_moe.py:{line}) fails" in detail
    assert "quant_config.block_shape is None" in detail
    # At fp8-block, past the alignment, workspace_shapes calls compute_aligned_M_and_alignment, whose `try` asks
    # DeepGEMM for a per-call alignment (get_theoretical_mk_alignment_for_contiguous_layout, imported at call time).
    try_line = _line_of(release.root / "vllm/model_executor/layers/fused_moe/deep_gemm_utils.py", "try:",
                        after="def compute_aligned_M_and_alignment(")  # fmt: skip
    block = {o.detail for p, o in deep_gemm.outcomes.items() if p.quant == "fp8-block" and o.status == UNEVALUATED}
    assert block == {f"workspace_shapes uses Try, which is outside the evaluated subset (deep_gemm_utils.py line "
                     f"{try_line})"}  # fmt: skip
    # TritonOrDeepGemmExperts (triton_deep_gemm_moe.py) sizes for DeepGemmExperts when `is_deep_gemm_e8m0_used() or
    # _valid_deep_gemm_shape(M, N, K)`, which is `align <= M and N % align == 0 and K % align == 0` with align =
    # get_mk_alignment_for_contiguous_layout()[0] = 128 here; else for TritonExperts (triton_moe.py:
    # (M, topk, max(N/2, K)), (M, topk, max(N, K)), (M, K)).
    align, topk, K, I = 128, 8, 7168, 2048
    N = 2 * I
    for D in (1, 2, 8, 32, 256):
        M = D  # T = 1
        found = at(tod, quant="fp8-block", activation="silu", D=D, E=16, T=1, K=K, I=I, experts="E·D")
        shapes = {p.variant.split(",")[0]: o for p, o in found.items() if p.dispatchers == "set"}
        assert shapes["is_deep_gemm_e8m0_used()=True"].status == UNEVALUATED  # DeepGemmExperts, at the try
        fallback = shapes["is_deep_gemm_e8m0_used()=False"]
        if align <= M and N % align == 0 and K % align == 0:
            assert fallback.status == UNEVALUATED and fallback.shapes is None
        else:
            assert fallback.shapes == ((M, topk, max(N // 2, K)), (M, topk, max(N, K)), (M, K))


def test_delegating_and_flagged_classes_match_hand_computations(swept):
    classes = by_name(swept)
    M, topk, K, I = 256 * 32, 8, 7168, 2048
    N = 2 * I
    # TritonOrCutlassExperts (triton_cutlass_moe.py) is a FallbackExperts whose __init__ builds
    # `experts=CutlassExpertsFp8(moe_config, quant_config)` and `fallback_experts=TritonExperts(...)`; its
    # workspace_shapes hands off to the fallback when `self.is_sm100 and M <= 8`, else to the experts.
    # cutlass_moe.py, CutlassExpertsFp8.workspace_shapes: (M * topk, max(N, K)), (M * topk, max(I, K)), (M, K).
    toc = classes["TritonOrCutlassExperts"]
    assert toc.verdict != UNEVALUATED
    big = at(toc, quant="fp8-per-tensor", activation="silu", **PR_POINT)
    assert {p.variant for p in big} == {"is_sm100=True", "is_sm100=False"}
    for outcome in big.values():
        assert outcome.shapes == ((M * topk, max(N, K)), (M * topk, max(I, K)), (M, K))
        assert outcome.total_bytes == 2 * (M * topk * max(N, K) + M * topk * max(I, K))
    # At M = 1 on SM100 the fallback: triton_moe.py, TritonExperts.workspace_shapes:
    # (M, topk, max(I, K)), (M, topk, max(N, K)), (M, K).
    small = at(toc, quant="fp8-per-token", activation="silu", D=1, E=16, T=1, K=K, I=I, experts="E·D")
    shapes = {p.variant: o.shapes for p, o in small.items() if p.dispatchers == "set"}
    assert shapes == {"is_sm100=True": ((1, topk, max(I, K)), (1, topk, max(N, K)), (1, K)),
                      "is_sm100=False": ((topk, max(N, K)), (topk, max(I, K)), (1, K))}  # fmt: skip
    # AiterExperts (rocm_aiter_moe.py) reads self.moe_config.use_mori_kernels, a property of FusedMoEConfig that
    # is true when the all-to-all backend is MoRI: swept at both values. Its workspaces are (0,), (0,) and its
    # output (M, K * 2 if use_mori_kernels and quant_config.use_mxfp4_w4a4 else K): (M, K) at every swept format.
    aiter = classes["AiterExperts"]
    assert aiter.verdict == CONSISTENT
    assert {p.variant for p in aiter.outcomes} == {"moe_config.use_mori_kernels=True",
                                                   "moe_config.use_mori_kernels=False"}  # fmt: skip
    fp8 = at(aiter, quant="fp8-per-tensor", activation="silu", **PR_POINT)
    assert len(fp8) == 2
    assert all(o.shapes == ((0,), (0,), (M, K)) and o.total_bytes == 2 * M * K for o in fp8.values())


def test_packed_k_classes_match_hand_computations(swept):
    classes = by_name(swept)
    M, K = 256 * 32, 7168
    # The modular kernel hands workspace_shapes `K = a1.size(-1)` of moe_problem_size on the prepared input a1q;
    # at nvfp4 the prepare step quantizes it two values a byte unless `expects_unquantized_inputs` (which both
    # classes take from `self.per_token_activation`, an __init__ argument defaulting to False), so K = 7168 / 2.
    # trtllm_nvfp4_moe.py: `assert self.hidden_dim == (K if self.expects_unquantized_inputs else K * 2)`,
    # `output = (M, self.hidden_dim)`, workspaces (0,), (0,); flashinfer_cutedsl_moe.py the same.
    for name in ("TrtLlmNvFp4ExpertsModular", "FlashInferCuteDSLExperts"):
        cls = classes[name]
        assert cls.verdict == CONSISTENT, (name, cls.verdict)
        nvfp4 = at(cls, quant="nvfp4", activation="silu", **PR_POINT)
        ((_, outcome),) = nvfp4.items()
        assert outcome.shapes == ((0,), (0,), (M, K)) and outcome.total_bytes == 2 * M * K
        assert not any(o.status == UNEVALUATED for o in cls.outcomes.values())


def test_planted_output_under_size_in_a_packed_k_class_fails_the_gate(tmp_path, release):
    root = planted(tmp_path, release, f"{EXPERTS}/trtllm_nvfp4_moe.py", "output = (M, self.hidden_dim)",
                   "output = (M, self.hidden_dim // 2)")  # fmt: skip
    cls = sweep_of(root, "TrtLlmNvFp4ExpertsModular")["TrtLlmNvFp4ExpertsModular"]
    assert cls.verdict == UNDER and cls.failed
    under = {o.detail for o in cls.outcomes.values() if o.status == UNDER}
    assert under == {"out holds x0.5 of the standard format's (M, K)"}
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(root), "--classes",
                               "TrtLlmNvFp4ExpertsModular")  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    assert "TrtLlmNvFp4ExpertsModular (under-sized)" in completed.stdout


def test_a_config_property_that_is_not_a_truth_value_is_not_swept_as_a_flag(tmp_path, release):
    # FusedMoEConfig.use_mori_kernels returning the backend's name (a str) is no flag of two values: AiterExperts
    # stays unevaluated at the attribute its stand-in config does not carry, and nothing of it passes.
    old = "    def use_mori_kernels(self):\n        return self.moe_parallel_config.use_mori_kernels"
    root = planted(tmp_path, release, "vllm/model_executor/layers/fused_moe/config.py", old,
                   old.replace("parallel_config.use_mori_kernels", "parallel_config.all2all_backend"))  # fmt: skip
    cls = sweep_of(root, "AiterExperts")["AiterExperts"]
    assert cls.verdict == UNEVALUATED and not any(o.status == CONSISTENT for o in cls.outcomes.values())
    assert {p.variant for p in cls.outcomes} == {""}
    details = {o.detail for o in cls.outcomes.values() if o.status == UNEVALUATED}
    assert details == {"workspace_shapes reads self.moe_config.use_mori_kernels, which the stand-in does not carry "
                       "(rocm_aiter_moe.py line 557)"}  # fmt: skip


def test_planted_under_size_in_a_delegating_class_fails_the_gate(tmp_path, release):
    # TritonOrCutlassExperts hands half the top-k to the CUTLASS experts it builds: the buffers apply() views as
    # (M * topk, ...) are x2 short, caught through the delegate, and the gate exits 1.
    old = """            return self.experts.workspace_shapes(
                M,
                N,
                K,
                topk,"""
    root = planted(tmp_path, release, f"{EXPERTS}/triton_cutlass_moe.py", old, old.replace("topk,", "topk // 2,"))
    cls = sweep_of(root, "TritonOrCutlassExperts")["TritonOrCutlassExperts"]
    assert cls.verdict == UNDER and cls.failed
    completed = run_cli_inproc("vllm", "audit", "--sweep", "--vllm-src", str(root), "--classes",
                               "TritonOrCutlassExperts")  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    assert "TritonOrCutlassExperts (under-sized)" in completed.stdout


def test_planted_underivable_attribute_is_not_derived(tmp_path, release):
    # An attribute __init__ computes with a helper the parsed files do not define: workspace_shapes' output cannot be
    # sized, the class says which assignment and why, and nothing of it passes.
    old = "self.hidden_dim_unpadded = (\n            moe_config.hidden_dim_unpadded or moe_config.hidden_dim\n        )"
    root = planted(tmp_path, release, TRTLLM_MXFP4_FILE, old, "self.hidden_dim_unpadded = unknown_pad(moe_config)")
    cls = sweep_of(root, "TrtLlmMxfp4ExpertsModular")["TrtLlmMxfp4ExpertsModular"]
    assert cls.verdict == UNEVALUATED and not cls.failed
    assert not any(o.status in (CONSISTENT, NOT_DERIVED, OVER) for o in cls.outcomes.values())
    details = {o.detail for o in cls.outcomes.values() if o.status == UNEVALUATED}
    assert details == {
        "workspace_shapes reads self.hidden_dim_unpadded, which the stand-in self does not carry (trtllm_mxfp4_moe.py "
        "line 334); not derived: self.hidden_dim_unpadded = unknown_pad(moe_config): uses the name 'unknown_pad', "
        "which is only defined when vLLM is imported (trtllm_mxfp4_moe.py line 55)"
    }


# vLLM 0.19.0's DeepGemmExperts sizes its workspaces from its block_shape and its apply() from DeepGEMM's alignment,
# with no `try` in deep_gemm_utils.compute_aligned_M: there the asserted alignment lets apply()'s views be derived.
OLD_DEEP_GEMM = "vllm/model_executor/layers/fused_moe/deep_gemm_moe.py"


@pytest.fixture(scope="module")
def release_0_19():
    return locate(version="0.19.0", cache_dir=default_cache_dir())


def test_deep_gemm_experts_of_0_19_0_match_hand_computations(release_0_19):
    line = _line_of(release_0_19.root / OLD_DEEP_GEMM, DEEP_GEMM_ASSERT)
    deep_gemm = by_name(sweep(source_tree(release_0_19), class_filter=lambda n: n == "DeepGemmExperts"))[
        "DeepGemmExperts"
    ]
    assert {p.variant for p in deep_gemm.outcomes} == {
        f"{ALIGNMENT}()=quant_config.block_shape (asserted at deep_gemm_moe.py:{line})"
    }
    # deep_gemm_moe.py, DeepGemmExperts.workspace_shapes: block_m = self.block_shape[0], M_sum = compute_aligned_M(M,
    # topk, local_num_experts, block_m, ...), (M_sum, max(N/2, K)), (M_sum, max(N, K)), (M, K); deep_gemm_utils.py,
    # compute_aligned_M: round_up(M * num_topk + local_num_experts * (alignment - 1), alignment).
    M, topk, E, K, I, block_m = 256 * 32, 8, 16, 7168, 2048, 128
    N = 2 * I
    M_sum = -(-(M * topk + E * (block_m - 1)) // block_m) * block_m
    ((_, outcome),) = at(deep_gemm, quant="fp8-block", activation="silu", **PR_POINT).items()
    assert outcome.shapes == ((M_sum, max(N // 2, K)), (M_sum, max(N, K)), (M, K))
    # apply(): M_sum from compute_aligned_M(..., alignment=get_mk_alignment_for_contiguous_layout()[0]) = 128, then
    # fp8 views of workspace13 (M_sum, K) and (M_sum, N/2), bf16 views of workspace2 (M_sum, N) and (M_sum, K).
    uses13, uses2 = M_sum * max(K, N // 2), 2 * M_sum * max(N, K)
    assert outcome.uses == (uses13, uses2)
    allocated = 2 * (max(M_sum * max(N // 2, K), M * K) + M_sum * max(N, K))
    assert outcome.status == OVER and outcome.total_bytes == allocated
    assert outcome.ratio == allocated / (max(uses13, 2 * M * K) + uses2)
    assert deep_gemm.verdict == OVER and not deep_gemm.by_status(UNEVALUATED)


def test_under_size_planted_in_deep_gemm_experts_is_caught(tmp_path, release_0_19):
    # Half the rows of workspace2: apply()'s (M_sum, N) and (M_sum, K) views, with M_sum at the asserted alignment,
    # need twice what it holds at K = 7168 (max(N, K) = K).
    root = planted(tmp_path, release_0_19, OLD_DEEP_GEMM, "workspace2 = (M_sum, max(N, K))",
                   "workspace2 = (M_sum // 2, max(N, K))")  # fmt: skip
    deep_gemm = sweep_of(root, "DeepGemmExperts")["DeepGemmExperts"]
    assert deep_gemm.failed and deep_gemm.verdict == UNDER
    ((_, outcome),) = at(deep_gemm, quant="fp8-block", activation="silu", **PR_POINT).items()
    assert outcome.status == UNDER and outcome.detail == "apply() views workspace2 to x2 of its size"
