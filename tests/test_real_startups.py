"""The deployment model against real vLLM 0.26.0 startups on one H200 (tests/data/real_startups/*.yaml: dummy
weights, a config directory holding only config.json, what vLLM printed; results/h200/real-startups says how).

Targets (docs/deployment-memory.md keeps the error per case):
- the KV tokens within 1% on every startup, at most 0.3% mean;
- each line the log prints within 0.05 GiB: weights ("Model loading took"), the profile's torch peak and non-torch
  increase, the CUDA-graph estimate (0 where vLLM made none).
Where the model misses, the case is a strict expected failure naming the mechanism; the target is not moved.
MoE cases read their layer's workspace from the 0.26.0 release, so they are marked vllm_wheel.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

from harness.core.units import MIB
from harness.sizing import cudagraph_memory, profile_run, release_defaults
from harness.sizing.deployment import GIB, graph_experts_call
from harness.sizing.kv_cache import kv_shape
from harness.sizing.release_defaults import v2_runner_without_estimate
from harness.verify.compare import taken_outcome
from harness.verify.logparse import parse_log
from harness.verify.planning import plan_record, record_facts, record_spec
from harness.verify.record import load_record

DATA = Path(__file__).resolve().parent / "data" / "real_startups"
CASES = {p.stem: load_record(p) for p in sorted(DATA.glob("*.yaml"))}

# What the plan does not size yet of a flag (none: --dtype float32 and --quantization fp8 are sized).
FLAG_GAPS: dict[str, str] = {}
# Lines the model misses on a startup the plan can make, and why.
LINE_GAPS: dict[tuple[str, str], str] = {}


# The lines each flag gap moves (none: --dtype and --quantization are sized by the model facts).
FLAG_LINES: dict[str, tuple[str, ...]] = {}


def _marks(name: str, reason: str | None = None, line: str | None = None) -> list:
    marks = [pytest.mark.vllm_wheel] if record_facts(CASES[name]).is_moe else []
    if line is None or line in FLAG_LINES.get(name, ()):
        reason = reason or FLAG_GAPS.get(name)
    if reason:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return marks


def _cache_dir() -> Path:
    import os

    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return _cache_dir()


@functools.cache
def _plan(name: str, cache_dir: Path):
    """One plan per record for the whole module: the tests read it, none changes it."""
    return plan_record(CASES[name], cache_dir=cache_dir)


def test_the_startups_cover_the_model_surface():
    assert len(CASES) >= 55
    archs = {record_facts(c).architecture for c in CASES.values()}
    assert {"Qwen3MoeForCausalLM", "MixtralForCausalLM", "DeepseekV2ForCausalLM", "LlamaForCausalLM",
            "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Gemma2ForCausalLM", "GraniteForCausalLM",
            "Phi3ForCausalLM", "MistralForCausalLM", "Glm4MoeForCausalLM", "Qwen3NextForCausalLM",
            "Llama4ForConditionalGeneration", "GptOssForCausalLM", "MiniMaxM2ForCausalLM", "PhiForCausalLM",
            "Gemma3ForConditionalGeneration", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"} <= archs  # fmt: skip
    kinds = {k for c in CASES.values() for k in record_facts(c).layer_kinds}
    assert {"full", "sliding", "chunked", "linear"} <= kinds
    modes = {(c.llm_kwargs or {}).get("compilation_config", {}).get("cudagraph_mode") for c in CASES.values()}
    assert {"PIECEWISE", "FULL_DECODE_ONLY", "NONE"} <= modes
    assert any(c.llm_kwargs and c.llm_kwargs.get("kv_cache_dtype") == "fp8" for c in CASES.values())
    assert any(c.llm_kwargs and c.llm_kwargs.get("enforce_eager") for c in CASES.values())
    assert any(record_facts(c).weight_block_size for c in CASES.values())
    for name, case in CASES.items():
        assert case.schema_version == 2 and case.vllm_version == "0.26.0" and case.machine is not None, name
        assert case.machine.gpu_name == "NVIDIA H200" and case.machine.torch.startswith("2.11.0"), name
        assert case.entry == "llm" and case.llm_kwargs is not None and case.config is not None, name
        assert case.figures.kv_cache_tokens and case.figures.model_loading_gib, name


@pytest.mark.parametrize("name", list(CASES))
def test_the_record_is_what_its_key_lines_say(name):
    """The figures are what the parser reads from the log lines kept with them (nothing typed by hand)."""
    case = CASES[name]
    parsed = parse_log("\n".join(case.key_lines))
    assert parsed.figures == case.figures
    assert parsed.backends == case.backends
    assert parsed.model_runner == case.model_runner


@pytest.mark.parametrize("name", list(CASES))
def test_model_runner_and_its_graph_estimate_per_architecture(name):
    """0.26.0 picks the V2 runner for dense models and DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES; V2 prints no
    CUDA-graph estimate; V1 prints one unless eager or cudagraph_mode NONE."""
    case = CASES[name]
    facts = record_facts(case)
    v2 = v2_runner_without_estimate(facts.architecture, facts.is_moe, case.vllm_version) is not None
    assert case.model_runner == ("v2" if v2 else "v1")
    kwargs = case.llm_kwargs or {}
    no_graphs = (
        bool(kwargs.get("enforce_eager")) or kwargs.get("compilation_config", {}).get("cudagraph_mode") == "NONE"
    )
    assert (case.figures.cuda_graph_estimate_gib is not None) == (not v2 and not no_graphs)


def _uniform_kv(name: str) -> bool:
    """Every layer full attention: one KV cache group, so the tokens are the memory over the bytes per token. With
    sliding-window or linear-attention layers vLLM's hybrid KV cache manager shares blocks between groups, and the
    plan's own KV test below judges the tokens."""
    return set(record_facts(CASES[name]).layer_kinds) <= {"full"}


@pytest.mark.parametrize("name", [n for n in CASES if n not in FLAG_GAPS and _uniform_kv(n)])
def test_kv_bytes_per_token_exact(name):
    """The logged tokens are what the logged KV memory (to 0.01 GiB) holds at the model's bytes per token."""
    case = CASES[name]
    _, spec = record_spec(case)
    shape = kv_shape(record_facts(case), spec.tensor_parallel_size, spec.kv_cache_dtype)
    block = spec.block_size or 16
    page = block * shape.bytes_per_token
    gib = case.figures.available_kv_cache_gib
    low, high = (gib - 0.005) * GIB // page * block, (gib + 0.005) * GIB // page * block
    assert low <= case.figures.kv_cache_tokens <= high, (shape.bytes_per_token, low, high)


def _taken(name: str, cache_dir: Path):
    """The plan's outcome the startup took (compare.taken_outcome: None for the plan's own)."""
    return taken_outcome(_plan(name, cache_dir), CASES[name].figures.torch_peak_increase_gib)


def _kv_error(name: str, cache_dir: Path) -> float:
    logged = CASES[name].figures.kv_cache_tokens
    taken = _taken(name, cache_dir)
    return ((taken or _plan(name, cache_dir)).kv_tokens - logged) / logged


# Startups whose KV tokens the plan misses by more than 1%, and why.
KV_GAPS: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n, KV_GAPS.get(n)), id=n) for n in CASES])
def test_kv_tokens_within_one_percent(name, cache_dir):
    error = _kv_error(name, cache_dir)
    assert abs(error) < 0.01, f"{name}: {error:+.2%}"


@pytest.mark.vllm_wheel
def test_kv_tokens_mean_error(cache_dir):
    errors = [abs(_kv_error(n, cache_dir)) for n in CASES if n not in FLAG_GAPS]
    assert sum(errors) / len(errors) <= 0.003, f"mean {sum(errors) / len(errors):.3%}"


LINES = ("weights", "torch peak", "non-torch", "CUDA graphs")


def _line(plan, name: str) -> float:
    groups = {"weights": ("weights",), "torch peak": ("held-once", "profile-peak"), "non-torch": ("non-torch",),
              "CUDA graphs": ("cuda-graphs",)}[name]  # fmt: skip
    return sum(plan.group_bytes(g) for g in groups) / GIB


def _logged(case, name: str) -> float:
    f = case.figures
    return {"weights": f.model_loading_gib, "torch peak": f.torch_peak_increase_gib,
            "non-torch": f.non_torch_increase_gib, "CUDA graphs": f.cuda_graph_estimate_gib or 0.0}[name]  # fmt: skip


@pytest.mark.parametrize("name,line", [pytest.param(n, x, marks=_marks(n, LINE_GAPS.get((n, x)), x),
                                                    id=f"{n}-{x}")
                                       for n in CASES for x in LINES])  # fmt: skip
def test_each_logged_line_within_0_05_gib(name, line, cache_dir):
    predicted, logged = _line(_plan(name, cache_dir), line), _logged(CASES[name], line)
    taken = _taken(name, cache_dir)
    if line == "torch peak" and taken is not None:
        predicted += taken.torch_peak_extra_bytes / GIB
    assert abs(predicted - logged) <= 0.05, f"{name} {line}: {predicted:.3f} GiB predicted, {logged} GiB logged"


# --- the V1 runner's CUDA-graph estimate (harness/sizing/cudagraph_memory.py) -----------------------------------------

PROFILING = re.compile(r"Profiling CUDA graph memory: (.*)$")
MODE_COUNT = re.compile(r"(PIECEWISE|FULL)=(\d+) \(largest=(\d+)\)")
PER_MODE = re.compile(r"Estimated (PIECEWISE|FULL) CUDA graph memory: ([\d.]+) MiB first-capture \+ \((\d+)-1\) "
                      r"\S ([\d.]+) MiB per-graph")  # fmt: skip
TOTAL = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB total")


@functools.cache
def _graph_plan(name: str):
    """The estimate's modes, as the plan makes them: with the monolithic experts kernel's own tensors where the plan
    runs one (its "moe kernel buffers (per call)" line)."""
    case = CASES[name]
    _, spec = record_spec(case)
    assert spec.max_num_seqs is not None and spec.max_num_batched_tokens is not None
    facts, tp = record_facts(case), spec.tensor_parallel_size
    plan = _plan(name, _cache_dir())
    monolithic = facts.is_moe and plan.line("moe kernel buffers (per call)") is not None
    mla_rows = (
        profile_run.mla_workspace_rows(
            max_model_len=int(str(plan.setting("max_model_len"))),
            max_num_seqs=spec.max_num_seqs,
            block_size=int(str(plan.setting("block_size"))),
        )
        if facts.is_mla
        else 0
    )
    return cudagraph_memory.estimate(facts, tp=tp, max_num_seqs=spec.max_num_seqs,
                                     max_num_batched_tokens=spec.max_num_batched_tokens, mode=spec.cudagraph_mode,
                                     max_capture=spec.max_cudagraph_capture_size, sizes=spec.cudagraph_capture_sizes,
                                     gpu=case.gpu, kv_cache_dtype=spec.kv_cache_dtype or "auto",
                                     experts_call=graph_experts_call(facts, tp) if monolithic else None,
                                     mla_rows=mla_rows)  # fmt: skip


GRAPHED = [n for n, c in CASES.items() if any(PROFILING.search(line) for line in c.key_lines)]
# The startups whose records keep vLLM's per-mode DEBUG lines (profile_cudagraph_memory), with their INFO lines.
GRAPH_LINES = {n: [x for x in c.key_lines if PROFILING.search(x) or PER_MODE.search(x) or TOTAL.search(x)]
               for n, c in CASES.items() if any(PER_MODE.search(x) for x in c.key_lines)}  # fmt: skip


@pytest.mark.parametrize("name", GRAPHED)
def test_graph_modes_and_counts_are_what_the_log_says(name):
    """The modes captured, in order, with the number of graphs and the largest size of each, as vLLM printed them
    ("Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)")."""
    (text,) = [m.group(1) for line in CASES[name].key_lines if (m := PROFILING.search(line))]
    logged = [(mode, int(n), int(largest)) for mode, n, largest in MODE_COUNT.findall(text)]
    planned = [(m.mode, m.graphs, m.largest) for m in _graph_plan(name).modes]
    assert planned == logged and logged


# Startups whose "Profiling CUDA graph memory" line the driver did not keep (its per-mode and total lines are kept).
PROFILING_LINE_CUT = {
    "gpt-oss-20b": "the per-layer DEBUG lines ahead of it filled the driver's line budget",
    **{
        name: "the captures' DEBUG lines (83 graphs a mode) filled the driver's line budget before its figures' "
        "pattern kept this line; the per-mode lines are kept"
        for name in ("gpt-oss-4l-seqs1024", "qwen3-moe-4l-seqs1024-capture1024")
    },
}


def test_every_v1_startup_with_graphs_has_its_estimate_lines():
    v1 = {n for n, c in CASES.items() if c.model_runner == "v1" and c.figures.cuda_graph_estimate_gib is not None}
    assert set(GRAPHED) | set(PROFILING_LINE_CUT) == v1 and len(v1) >= 14
    assert set(GRAPH_LINES) <= v1 and len(GRAPH_LINES) >= 10


# Startups whose per-mode figures the estimate misses (the combination and the counts hold on all), and why.
GRAPH_GAPS = {
    "qwen3-next-4l-len16k-seqs64-mbt4096": "PIECEWISE's second capture (120 tokens) logs the release's 1 MiB floor "
    "where the plan opens a 2 MiB driver page for the graph objects at the profile's ninth graph (as qwen3-next-4l "
    "logs at 496 tokens); here both PIECEWISE samples run the shared expert on the aux stream (at most 256 tokens), "
    "which the driver-page measurement did not cover: not read. The first captures and the total are within their "
    "bounds",
    "dsv32-4l-capture1024": "FULL's first capture at 1024 tokens logs 256 MiB against 0: one FlashAttention 3 split "
    "over 992 sequences, so no accumulators, as planned (28 splits would have been 7 GiB), but the FULL graph's own "
    "tensors in the pool (270 MiB made: FlashAttention's varlen output and MLA's output buffer, 128 MiB each, and a "
    "14 MiB block: results/h200/startup-gaps) are not modelled; PIECEWISE's 332 MiB is planned at 330 and the total "
    "as logged",
    **{
        name: f"PIECEWISE's first capture at 512 tokens logs {logged} MiB against 75 planned (the total, 0.26 GiB, as "
        "planned): the Marlin MoE GEMM op (moe_wna16_marlin_gemm) allocates two 26 MiB segments inside its compiled "
        "code, in the warm-up and again in the graph pool (qwen3-moe-4l-awq's allocator history, results/h200/"
        "startup-gaps); the op's C++ is not in the release's Python, so their size is not read"
        for name, logged in (
            ("qwen3-moe-4l-awq", 110),
            ("qwen3-moe-4l-gptq", 108),
            ("qwen3-moe-4l-w4a16", 108),
            ("qwen3-moe-4l-w4a16-mbt32k", 108),
        )
    },
}


def _graph_marks(name: str) -> list:
    return [pytest.mark.xfail(strict=True, reason=GRAPH_GAPS[name])] if name in GRAPH_GAPS else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_graph_marks(n), id=n) for n in sorted(GRAPH_LINES)])
def test_the_total_combines_the_modes_as_the_release_does(name):
    """The logged total is max(first captures) + sum((n - 1) x per graph) of the logged per-mode lines (to the
    log's 0.01 GiB), the per-mode counts are the plan's, and the plan's first capture of each mode is within
    0.03 GiB of the logged one."""
    lines = GRAPH_LINES[name]
    modes = [(mode, float(first), int(n), float(per)) for line in lines
             for mode, first, n, per in PER_MODE.findall(line)]  # fmt: skip
    (total,) = [float(m.group(1)) for line in lines if (m := TOTAL.search(line))]
    assert total == CASES[name].figures.cuda_graph_estimate_gib
    combined = cudagraph_memory.combine([(n, round(first * MIB), round(per * MIB)) for _, first, n, per in modes])
    assert abs(combined / GIB - total) <= 0.005, (combined / GIB, total)
    plan = _graph_plan(name)
    assert [(m.mode, m.graphs) for m in plan.modes] == [(mode, n) for mode, _, n, _ in modes]
    for m, (_, first, _, per) in zip(plan.modes, modes, strict=True):
        assert abs(m.first_capture / MIB - first) <= 0.03 * 1024, (m.mode, m.first_capture / MIB, first)
        assert m.per_graph == round(per * MIB), (m.mode, m.per_graph / MIB, per)


def test_flashmla_sparse_decode_accumulators_by_hand():
    """FLASHMLA_SPARSE's fp8 decode allocates (b + num_sm_parts) x (s_q, h_q, 512 + 1) float32 of split-KV buffers in
    each call (FlashMLA sparse_decode.h): DeepSeek-V3.2's 128 heads decode one token a request (b = the tokens,
    s_q = 1) in 132 / 1 / (128 / 64) = 66 SM parts on an H200; at 16 heads a rank (TP 8) the builder runs the tokens
    as one batch (b = 1, s_q = the tokens) padded to 64 heads, one SM part past 132 tokens; none with a 16-bit cache
    (FlashAttention's accumulators instead) or on 8.x; on 10.x num_sms / s_q parts."""
    facts = record_facts(CASES["dsv32-4l-kvfp8"])
    got, how = cudagraph_memory.flashmla_sparse_accumulators(facts, 256, 1, capability=9, num_sms=132,
                                                             kv_cache_dtype="fp8")  # fmt: skip
    assert got == (256 + 66) * 1 * 128 * 513 * 4 and "66 SM parts" in how
    assert (
        cudagraph_memory.flashmla_sparse_accumulators(facts, 256, 8, capability=9, num_sms=132, kv_cache_dtype="fp8")[0]
        == (1 + 1) * 256 * 64 * 513 * 4
    )
    assert (
        cudagraph_memory.flashmla_sparse_accumulators(facts, 64, 8, capability=9, num_sms=132, kv_cache_dtype="fp8")[0]
        == (1 + 2) * 64 * 64 * 513 * 4
    )
    assert (
        cudagraph_memory.flashmla_sparse_accumulators(facts, 256, 1, capability=10, num_sms=148, kv_cache_dtype="fp8")[
            0
        ]
        == (256 + 148) * 128 * 513 * 4
    )
    assert cudagraph_memory.flashmla_sparse_accumulators(facts, 256, 1, capability=9, num_sms=132)[0] == 0
    assert (
        cudagraph_memory.flashmla_sparse_accumulators(facts, 256, 1, capability=8, num_sms=108, kv_cache_dtype="fp8")[0]
        == 0
    )
    dense = record_facts(CASES["dsv3-4l"])
    assert (
        cudagraph_memory.flashmla_sparse_accumulators(dense, 256, 1, capability=9, num_sms=132, kv_cache_dtype="fp8")[0]
        == 0
    )


@pytest.mark.vllm_wheel
def test_the_fp8_sparse_decode_first_full_capture_against_its_log():
    """DeepSeek-V3.2 with an fp8 KV cache logs its FULL first capture at 256 tokens as 136 MiB, segment by segment
    (results/h200/startup-gaps, sixth batch): FlashMLA's split-KV buffers (80.5 MiB of o_accum in an 82 MiB segment),
    its output (256, 128, 512) bf16 in a new 32 MiB one (MLA's own output buffer took a freed 36 MiB block) and the
    block-FP8 shared experts' 20 + 2 MiB on the aux stream."""
    modes = {m.mode: m for m in _graph_plan("dsv32-4l-kvfp8").modes}
    (logged,) = [float(first) for line in GRAPH_LINES["dsv32-4l-kvfp8"]
                 for mode, first, _, _ in PER_MODE.findall(line) if mode == "FULL"]  # fmt: skip
    assert logged == 136.0 == 82 + 32 + 22
    assert abs(modes["FULL"].first_capture / MIB - logged) < 0.5
    assert "FlashMLA sparse decode" in modes["FULL"].detail


def test_first_capture_by_hand_for_a_small_config():
    """Qwen3-30B-A3B cut to 4 layers (hidden 2048, 32 heads of 128, 4 KV heads, 128 experts top-8, no shared
    experts), 64 sequences, captures up to 64 tokens, on an H200 (compute capability 9.0)."""
    facts = record_facts(CASES["qwen3-moe-4l"])
    got = cudagraph_memory.estimate(facts, tp=1, max_num_seqs=64, max_num_batched_tokens=4096, max_capture=64,
                                    gpu="H200")  # fmt: skip
    piecewise, full = got.modes
    assert (piecewise.mode, piecewise.graphs, full.mode, full.graphs) == ("PIECEWISE", 11, "FULL", 11)
    cublas = 4096 * 8 * 1024  # the capture stream's cuBLAS workspace on compute capability 9.x
    # the compiled attention block with q/k norms: the layer's input and the residual (N, K), qkv (N, (32 + 2 x 4)
    # x 128), the q norm's, the rotary's and the attention's q-sized outputs and one k-sized, over 4 (N, K) and
    # the attention projections (N, (2 x 32 + 2 x 4) x 128) and the router's f32 logits
    block = 2 * 64 * 2048 * 2 + 64 * (32 + 2 * 4 + 3 * 32 + 4) * 128 * 2
    assert block > 4 * 64 * 2048 * 2 + 64 * (2 * 32 + 2 * 4) * 128 * 2
    # graph exec: the first capture's 5 piece graphs open no page (the 64 KiB objects' run opens its next at the
    # 9th graph, the 48 KiB objects' at the 36th; 5 x 15 nodes x 1840 B fit in the node blocks' open page)
    assert piecewise.first_capture == cublas + 2 * block == 39190528  # 37.4 MiB; 38 logged
    accum = 32 * 32 * 64 * (128 + 1) * 4  # 32 splits x 32 heads x 64 tokens x (out 128 + lse 1) f32
    # the forward's transients reuse the PIECEWISE pools; the FULL graph's 4 x 18 nodes fit in the open page
    assert full.first_capture == accum == 33816576
    # the second capture's graphs 6-10 hold the 9th: one page; the FULL ones none, the release's 1 MiB floor
    assert (piecewise.per_graph, full.per_graph) == (2 << 20, 1 << 20)
    assert got.total == 39190528 + 10 * (2 << 20) + 10 * (1 << 20) == 70647808


def test_the_triton_mxfp4_kernels_own_tensors_in_the_first_capture():
    """gpt-oss's monolithic Triton MXFP4 kernel allocates its intermediate (M x topk, I), the layer's output (M, K)
    and the scatter's scratchpad (M x topk, K) itself, outside vLLM's workspace: the first PIECEWISE capture at 1024
    tokens keeps them in the graph pool, the two (4096, 2880) bf16 ones in 24 MiB segments each (the allocator's
    history: results/h200/startup-gaps). A later, smaller capture reuses them."""
    facts = record_facts(CASES["gpt-oss-4l"])
    kwargs = dict(tp=1, max_num_seqs=256, max_num_batched_tokens=8192, gpu="H200-141GB")
    bare = cudagraph_memory.estimate(facts, **kwargs)
    full = cudagraph_memory.estimate(facts, experts_call=graph_experts_call(facts, 1), **kwargs)
    assert graph_experts_call(facts, 1)(1024) == [4096 * 2880 * 2, 1024 * 2880 * 2, 4096 * 2880 * 2]
    assert cudagraph_memory.pool_segments(graph_experts_call(facts, 1)(1024)) == 48 * MIB + 1024 * 2880 * 2
    (p0, f0), (p1, f1) = bare.modes, full.modes
    assert (p1.mode, p1.largest, f1.mode, f1.largest) == ("PIECEWISE", 1024, "FULL", 256)
    assert p1.first_capture - p0.first_capture == 48 * MIB + 1024 * 2880 * 2
    assert "the experts kernel's own tensors at 1024 tokens" in p1.detail
    assert (f1.first_capture, p1.per_graph, f1.per_graph) == (f0.first_capture, p0.per_graph, f0.per_graph)


def test_a_piecewise_warm_up_keeps_an_mla_stand_in_where_the_first_cublas_gemm_follows_the_attention():
    """The PIECEWISE warm-up runs without attention metadata, so each MLA layer makes its profile stand-in
    (rows, heads, qk_nope + v) and frees it; with every linear before the attention block FP8, the capture stream's
    cuBLAS workspace (32 MiB on compute capability 9.0) is cut from a freed stand-in block and keeps that whole
    segment through the capture, in place of its own. DeepSeek-V3.2's indexer multiplies in bf16 first, and a FULL
    warm-up has attention metadata: neither keeps one. The three startups logged their first PIECEWISE capture with
    the segment in it: what is left beyond it is at most the plan's graph pool term (mla_pool), where the logged
    figure is nine to twenty-eight times that term."""
    kwargs = dict(tp=1, max_num_seqs=256, max_num_batched_tokens=8192, gpu="H200-141GB")
    cublas = 4096 * 8 * 1024
    for name, heads, rows in (("dsv3-4l", 128, 32768), ("dsv3-4l-len8k", 128, 65536), ("kimi-k2-4l", 64, 32768)):
        facts = record_facts(CASES[name])
        spec = record_spec(CASES[name])[1]
        plan = _plan(name, _cache_dir())
        assert (
            profile_run.mla_workspace_rows(
                max_model_len=spec.max_model_len or 0, max_num_seqs=256, block_size=int(str(plan.setting("block_size")))
            )
            == rows
        )
        segment = rows * heads * (128 + 128) * 2  # qk_nope_head_dim 128, v_head_dim 128, bf16: a whole 2 MiB multiple
        bare = cudagraph_memory.estimate(facts, **kwargs)
        held = cudagraph_memory.estimate(facts, mla_rows=rows, **kwargs)
        (p0, f0), (p1, f1) = bare.modes, held.modes
        # without the held segment, _dummy_run's logits gather, (256 requests, 7168) bf16, takes a 20 MiB one
        gather = cudagraph_memory.logits_gather_segment(facts, 512, 256, held=0)[0]
        assert gather == 20 * MIB and cudagraph_memory.logits_gather_segment(facts, 512, 256, held=segment)[0] == 0
        assert p1.first_capture - p0.first_capture == segment - cublas - gather
        assert f1 == f0 and p1.per_graph == p0.per_graph
        assert f"its {segment} B segment kept by the capture stream's cuBLAS workspace" in p1.detail
        (logged,) = [float(first) for line in GRAPH_LINES[name] for mode, first, _, _ in PER_MODE.findall(line)
                     if mode == "PIECEWISE"]  # fmt: skip
        pool = p1.first_capture - segment
        assert 0 <= logged * MIB - segment <= pool < logged * MIB / 5, (name, logged, segment / MIB, pool / MIB)
    sparse = record_facts(CASES["dsv32-4l"])
    assert cudagraph_memory.estimate(sparse, mla_rows=65536, **kwargs) == cudagraph_memory.estimate(sparse, **kwargs)
    dense = record_facts(CASES["dsv3-4l"])
    assert cudagraph_memory.first_cublas_after_attention(dense)[0]
    unquantized = dataclasses.replace(dense, quant=None)
    assert not cudagraph_memory.first_cublas_after_attention(unquantized)[0]
    decode_only = dict(kwargs, mode="FULL_DECODE_ONLY")
    assert cudagraph_memory.estimate(dense, mla_rows=32768, **decode_only) == cudagraph_memory.estimate(
        dense, **decode_only
    )
    logged = {"gpt-oss-4l": 178, "gpt-oss-4l-seqs1024": 178, "gpt-oss-20b": 180, "gpt-oss-4l-len16k-seqs128": 158}
    for name, first in logged.items():
        assert f"Estimated PIECEWISE CUDA graph memory: {first}.00 MiB first-capture" in " ".join(GRAPH_LINES[name])
        assert abs(_graph_plan(name).modes[0].first_capture / MIB - first) <= 30, name


def test_the_mla_graph_pool_by_hand_against_the_allocators_segments():
    """MLA's graph pool from the segments the allocator made in three first PIECEWISE captures (results/h200/
    startup-gaps): DeepSeek-V3.2 at 1024 tokens made 72 + 48 x 3 + 16 + 14 x 2 + 20 + 2 + 2 = 284 MiB in the graph
    pool and its logits gather (1024 requests of 7168 bf16) a 14 MiB segment of its own; at 512 tokens the tensors
    under 10 MiB share 20 MiB segments: DeepSeek-V3 made 132 MiB with one (two hidden-sized and its smaller
    tensors), DeepSeek-V3.2 152 with two (and its indexer's query) and a third for the gather of 256 requests; V3's
    gather took room in its held MLA stand-in segment."""
    dsv32, dsv3 = record_facts(CASES["dsv32-4l"]), record_facts(CASES["dsv3-4l"])
    gate_up, query, index_q, hidden = 2 * 18432 * 2, 128 * 192 * 2, 64 * 128 * 2, 7168 * 2  # bytes a token
    at_1024 = 1024 * (gate_up + 3 * query + index_q + 2 * hidden) + 20 * MIB + 2 * 2 * MIB
    assert at_1024 == 284 * MIB
    assert cudagraph_memory.mla_pool(dsv32, 1024, 1)[0] == at_1024
    assert cudagraph_memory.logits_gather_segment(dsv32, 1024, 1024, held=0)[0] == 1024 * hidden == 14 * MIB
    assert 20 * MIB < 512 * (index_q + 2 * hidden) <= 2 * 20 * MIB  # 22 MiB under 10 MiB each: two segments
    assert 512 * 2 * hidden <= 20 * MIB  # 14 MiB: one
    assert cudagraph_memory.mla_pool(dsv32, 512, 1)[0] == 512 * (gate_up + 3 * query) + 2 * 20 * MIB + 4 * MIB
    assert cudagraph_memory.mla_pool(dsv3, 512, 1)[0] == 512 * (gate_up + 3 * query) + 20 * MIB + 4 * MIB == 132 * MIB
    assert cudagraph_memory.mla_pool(dsv32, 512, 1)[0] + 20 * MIB == 172 * MIB
    assert cudagraph_memory.logits_gather_segment(dsv32, 512, 256, held=0)[0] == 20 * MIB


def test_the_graph_exec_measurement_follows_the_release():
    """From 0.26.0 the driver's graph-exec memory is the pages measured under that release's stack (the 48-layer
    Qwen3-30B-A3B: 6 MiB a PIECEWISE graph and 2 a FULL one, as logged); before, the per-layer 6 MiB per 32 layers
    of the published 0.19.0 H100 logs (a 32-layer model: 6 MiB in either mode, as the Llama-3.1-8B log prints)."""
    assert release_defaults.graph_exec_pages("0.26.0").value is True
    assert release_defaults.graph_exec_pages("0.19.0").value is False
    facts = record_facts(CASES["qwen3-30b-a3b"])
    base = dict(tp=1, max_num_seqs=256, max_num_batched_tokens=8192, gpu="H200")
    measured = cudagraph_memory.estimate(facts, **base)
    assert [m.per_graph for m in measured.modes] == [6 * MIB, 2 * MIB]
    layers32 = dataclasses.replace(facts, num_hidden_layers=32)
    scaled = cudagraph_memory.estimate(layers32, exec_pages=False, **base)
    assert [m.per_graph for m in scaled.modes] == [6 * MIB, 6 * MIB]


def test_graph_settings_and_eager_change_the_estimate():
    facts = record_facts(CASES["qwen3-moe-4l"])
    base = dict(tp=1, max_num_seqs=256, max_num_batched_tokens=8192, gpu="H200")
    assert cudagraph_memory.estimate(facts, mode="NONE", **base).total == 0
    assert [m.mode for m in cudagraph_memory.estimate(facts, mode="FULL_DECODE_ONLY", **base).modes] == ["FULL"]
    assert [m.graphs for m in cudagraph_memory.estimate(facts, mode="FULL", **base).modes] == [51]
    given = cudagraph_memory.capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192, sizes=[8, 1, 4, 8, 9000])
    assert given == [1, 4, 8]
    assert cudagraph_memory.capture_sizes(max_num_seqs=4, max_num_batched_tokens=6)[-1] == 6
    chunked = record_facts(CASES["llama4-scout-4l-text"])
    assert cudagraph_memory.resolve_mode(chunked, None)[0] == "PIECEWISE"


def test_full_graph_attention_accumulators_per_backend():
    """FlashAttention's split-KV accumulators under full graphs: GQA at head_dim, FLASH_ATTN_MLA at the latent
    kv_lora_rank (DeepSeek-V2-Lite: 16 heads, 512), none where another backend runs (FlashMLA for an fp8 KV cache,
    FlashInfer on Blackwell, TRITON_ATTN in float32)."""
    mla = record_facts(CASES["dsv2-lite-4l"])
    assert (mla.num_attention_heads, mla.kv_lora_rank) == (16, 512)
    assert cudagraph_memory.split_accumulators(mla, 256, 1, 32) == 32 * 16 * 256 * 513 * 4
    assert cudagraph_memory.split_accumulators(mla, 256, 2, 32) == 32 * 8 * 256 * 513 * 4
    assert cudagraph_memory.split_accumulators(mla, 256, 1, 32, kv_cache_dtype="fp8") == 0
    gqa = record_facts(CASES["qwen3-moe-4l"])
    assert cudagraph_memory.split_accumulators(gqa, 256, 1, 32, capability=10) == 0
    assert cudagraph_memory.split_accumulators(record_facts(CASES["llama-8b-4l-fp32"]), 256, 1, 32) == 0
    # FULL of mixed batches needs AttentionCGSupport.ALWAYS: gated delta net and MLA fall back to FULL_AND_PIECEWISE
    assert cudagraph_memory.resolve_mode(record_facts(CASES["qwen3-next-4l"]), "FULL")[0] == "FULL_AND_PIECEWISE"
    assert cudagraph_memory.resolve_mode(mla, "FULL")[0] == "FULL_AND_PIECEWISE"
    assert cudagraph_memory.resolve_mode(gqa, "FULL")[0] == "FULL"


def test_flash_attention_3_picks_the_sparse_mla_splits():
    """FLASH_ATTN_MLA_SPARSE leaves num_splits to FlashAttention 3. Its heuristic, by hand: the fewest splits within
    85% of the best wave efficiency, the example of its own comment (48 blocks on 108 SMs: 2 splits, 0.89; 9 would
    fill every wave). DeepSeek-V3.2 (128 heads, rope 64, latent 512, index_topk 2048) on the H200 (132 SMs): the
    heads packed into 2 m blocks of 64, 2048 / 64 = 32 n blocks, so efficiency 2 s / 132 up to s = 32 and the first
    within 85% of 64 / 132 is 28 (56 / 132); the H200's FULL capture at 256 tokens kept 28 x (128, 256, 512) f32."""
    assert cudagraph_memory.fa3_splits_heuristic(48, 108, 16, 1, 0, False) == 2
    assert cudagraph_memory.fa3_splits_heuristic(2, 132, 4, 2, 0, False) == 1  # 4 n blocks or fewer: no split
    # enough m blocks to fill the SMs: one split, unless a KV head overflows 50 MiB of L2 and the queries go twice
    assert cudagraph_memory.fa3_splits_heuristic(120, 132, 64, 264, 60 << 20, False) == 2
    assert cudagraph_memory.fa3_splits_heuristic(120, 132, 64, 264, 60 << 20, True) == 1
    dsv32 = record_facts(CASES["dsv32-4l"])
    assert (dsv32.num_attention_heads, dsv32.qk_rope_head_dim, dsv32.kv_lora_rank, dsv32.index_topk) == \
        (128, 64, 512, 2048)  # fmt: skip
    assert cudagraph_memory.fa3_sparse_mla_splits(dsv32, 256, 1, 132) == 28
    assert cudagraph_memory.fa3_sparse_mla_splits(dsv32, 256, 2, 132) == 28  # 64 heads: 1 m block, 32 / 132 best
    assert cudagraph_memory.fa3_sparse_mla_splits(dsv32, 993, 1, 132) == 1  # varlen over 992 sequences: no split
    assert cudagraph_memory.fa3_mla_tile(64, 384) is None  # a value width whose tile is not read: the config's 32
    got = cudagraph_memory.estimate(dsv32, tp=1, max_num_seqs=256, max_num_batched_tokens=8192, gpu="H200")
    full = got.modes[1]
    assert (full.mode, full.largest) == ("FULL", 256)
    accum = 28 * 128 * 256 * (512 + 1) * 4  # out_accum and softmax_lse_accum, f32
    assert f"split-KV accumulators {accum} B (28 splits, FlashAttention 3's heuristic, sparse MLA)" in full.detail


@pytest.mark.vllm_wheel
def test_each_pipeline_stage_estimates_its_own_layers(cache_dir):
    """With pipeline parallelism each worker captures graphs of its stage's layers (the pieces and the per-graph
    driver memory follow them): the plan's line is the estimate for the stage it returns."""
    from harness.sizing.deployment import stage_facts
    from harness.sizing.deployment_plan import plan_source
    from harness.sizing.vllm_source import locate

    case = CASES["qwen3-moe-4l"]
    facts = record_facts(case)
    _, spec = record_spec(case)
    staged = spec.model_copy(update={"pipeline_parallel_size": 2})
    plan = plan_source(facts, staged, locate(version="0.26.0", cache_dir=cache_dir), gpu=case.gpu,
                       total_bytes=round(case.figures.gpu_total_gib * GIB), version="0.26.0")  # fmt: skip
    assert spec.max_num_seqs is not None and spec.max_num_batched_tokens is not None
    two = cudagraph_memory.estimate(stage_facts(facts, 0, 2), tp=1, max_num_seqs=spec.max_num_seqs,
                                    max_num_batched_tokens=spec.max_num_batched_tokens, gpu=case.gpu)  # fmt: skip
    whole = _graph_plan("qwen3-moe-4l")
    assert plan.group_bytes("cuda-graphs") == two.total < whole.total
    assert [m.per_graph for m in two.modes] == [1 << 20, 1 << 20]  # 3 pieces stay within the open page


# Qwen3-Next's hybrid KV cache on 0.26.0, by hand from the release's code for the record's config.
def test_qwen3_next_pages_blocks_and_tokens_by_hand():
    """0.26.0: the attention page of one token is FullAttentionSpec's 2 x KV heads x head_dim x 2 B; the gated delta
    net's state is conv (conv_kernel - 1, 2 x k_heads x k_dim + v_heads x v_dim) + temporal (v_heads, v_dim, k_dim)
    in bf16 (mamba_utils.py gated_delta_net_state_shape, _mamba_state_dtype: mamba_ssm_cache_dtype auto); prefix
    caching is off for a hybrid model (engine/arg_utils.py), so mamba_cache_mode is "none" and the attention block
    is 16 x cdiv(state, 16 x page of a token) (platforms/interface.py _align_hybrid_block_size), the mamba page
    padded to it. 3 linear layers and 1 full: groups of 1 layer (_get_kv_cache_groups_uniform_page_size), 4
    groups. A request holds cdiv(4096, block) full-attention blocks and one block per linear group
    (MambaSpec.max_memory_usage_bytes); the printed tokens are int(num_blocks / that x max_model_len)."""
    case = CASES["qwen3-next-4l"]
    c = case.config
    token_page = 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    conv = (c["linear_conv_kernel_dim"] - 1) * (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                                                + c["linear_num_value_heads"] * c["linear_value_head_dim"])  # fmt: skip
    temporal = c["linear_num_value_heads"] * c["linear_value_head_dim"] * c["linear_key_head_dim"]
    state = (conv + temporal) * 2
    assert (token_page, state) == (2048, 1097728)
    block = 16 * -(-state // (16 * token_page))
    page = block * token_page
    assert (block, page) == (544, 1114112)
    per_request = -(-case.figures.max_model_len // block) + 3
    assert per_request == 11
    # the logged concurrency (to 0.01) names one block count, and that count's pool is the logged KV memory
    blocks = [n for n in range(100_000, 120_000) if round(n / per_request, 2) == case.figures.max_concurrency]
    assert blocks == [106489]
    assert round(blocks[0] * page / GIB, 2) == case.figures.available_kv_cache_gib
    assert int(blocks[0] / per_request * case.figures.max_model_len) == case.figures.kv_cache_tokens

    # the plan's KV model gives the same from that memory, and 0.19.0's count (num_blocks // groups x block)
    from harness.sizing.kv_cache import kv_cache, tokens_from_concurrency

    assert tokens_from_concurrency(case.vllm_version) and not tokens_from_concurrency("0.19.0")
    shape = kv_shape(record_facts(case), 1)
    assert (shape.per_layer_bytes_per_token, shape.state_bytes) == (token_page, state)
    cache = kv_cache(shape, blocks[0] * page + page - 1, 16, case.figures.max_model_len, concurrency_tokens=True)
    assert (cache.block_size, cache.page_bytes, cache.groups, cache.group_size) == (block, page, 4, 1)
    assert (cache.num_blocks, cache.blocks_per_request) == (blocks[0], per_request)
    assert cache.tokens == case.figures.kv_cache_tokens
    assert round(cache.concurrency, 2) == case.figures.max_concurrency
    old = kv_cache(shape, blocks[0] * page, 16, case.figures.max_model_len, concurrency_tokens=False)
    assert old.tokens == blocks[0] // 4 * block


def test_printed_tokens_of_a_uniform_model_are_blocks_times_block_size_on_both_releases():
    """For full attention alone int(num_blocks / cdiv(L, block) x L) is num_blocks x block where block divides L,
    and the floor of it where it does not (0.26.0)."""
    from harness.sizing.kv_cache import kv_cache

    shape = kv_shape(record_facts(CASES["llama-8b-4l"]), 1)
    page = 16 * shape.bytes_per_token
    for version in ("0.19.0", "0.26.0"):
        assert kv_cache(shape, 1000 * page, 16, 4096, concurrency_tokens=version == "0.26.0").tokens == 16000
    assert kv_cache(shape, 1000 * page, 16, 4100, concurrency_tokens=False).tokens == 16000
    assert kv_cache(shape, 1000 * page, 16, 4100, concurrency_tokens=True).tokens == int(1000 / 257 * 4100) == 15953


# Llama-4 Scout with and without --limit-mm-per-prompt image=0 (the record's startup).
def _scout_plan(drop_limit: bool, cache_dir: Path, version: str | None = None):
    from harness.verify.logparse import llm_kwargs_to_serve

    case = CASES["llama4-scout-4l-text"]
    kwargs = dict(case.llm_kwargs or {})
    if drop_limit:
        kwargs.pop("limit_mm_per_prompt")
    return plan_record(case.model_copy(update={"serve": llm_kwargs_to_serve(case.model, kwargs)}),
                       cache_dir=cache_dir, version=version)  # fmt: skip


@pytest.mark.vllm_wheel
def test_llama4_scout_limit_mm_zero_drops_the_vision_tower(cache_dir):
    from harness.sizing.deployment_weights import vision_tensors

    case = CASES["llama4-scout-4l-text"]
    assert "--limit-mm-per-prompt" in case.serve
    text_only, with_tower = _scout_plan(False, cache_dir), _scout_plan(True, cache_dir)
    assert text_only.line("vision tower") is None
    tower = with_tower.line("vision tower")
    assert tower is not None and tower.bytes == sum(vision_tensors(record_facts(case), 1)[0])
    rounding = with_tower.line("allocator rounding").bytes - text_only.line("allocator rounding").bytes
    assert with_tower.group_bytes("weights") - text_only.group_bytes("weights") == tower.bytes + rounding > 1.7 * GIB
    assert abs(text_only.group_bytes("weights") / GIB - case.figures.model_loading_gib) <= 0.05
    assert text_only.setting("vision_tower") is False and with_tower.setting("vision_tower") is True
    assert text_only.kv_tokens > with_tower.kv_tokens


def test_the_tower_is_dropped_only_where_every_image_limit_is_zero():
    from harness.scenario.deployment import DeploymentSpec
    from harness.sizing.deployment import vision_tower_built
    from harness.sizing.serve_args import ServeArgsError, parse_serve

    def spec(*flags: str) -> DeploymentSpec:
        return parse_serve(["vllm", "serve", "m", *flags])[1]

    assert spec("--limit-mm-per-prompt", '{"image":0}').limit_mm_per_prompt == {"image": 0}
    assert spec("--limit-mm-per-prompt", '{"image":{"count":2},"video":0}').limit_mm_per_prompt == \
        {"image": 2, "video": 0}  # fmt: skip
    assert spec("--limit-mm-per-prompt", '{"image":{"width":8}}').limit_mm_per_prompt == {"image": 999}
    assert vision_tower_built(spec("--limit-mm-per-prompt", '{"image":0}'), "0.26.0")[0] is False
    assert vision_tower_built(spec("--limit-mm-per-prompt", '{"video":0}'), "0.26.0")[0] is True
    assert vision_tower_built(spec("--limit-mm-per-prompt", '{"image":1}'), "0.26.0")[0] is True
    assert vision_tower_built(spec("--language-model-only"), "0.26.0")[0] is False
    assert vision_tower_built(spec(), "0.26.0")[0] is True
    assert vision_tower_built(spec("--limit-mm-per-prompt", '{"image":0}'), "0.19.0")[0] is False
    assert vision_tower_built(spec("--limit-mm-per-prompt", '{"image":0}'), "0.8.5")[0] is True
    assert spec("--limit-mm-per-prompt.image=0").limit_mm_per_prompt == {"image": 0}
    for bad, says in (("image=x", "is not JSON"), ('{"image":-1}', "counts >= 0"), ("[0]", "a JSON object"),
                      ('{"image":true}', "counts >= 0")):  # fmt: skip
        with pytest.raises(ServeArgsError, match=says) as error:
            spec("--limit-mm-per-prompt", bad)
        assert "--limit-mm-per-prompt" in str(error.value)


def test_gemma3_drops_its_siglip_tower_the_same_way():
    """Gemma 3 builds SigLIP and its projector in _mark_tower_model(vllm_config, "image") too (gemma3_mm.py)."""
    from harness.sizing.deployment_plan import plan_source
    from harness.sizing.model_config import load_model
    from harness.sizing.serve_args import parse_serve

    def plan(*flags: str, version: str = "0.26.0"):
        model, spec, ignored = parse_serve(["vllm", "serve", "gemma-3-4b-it", "--max-model-len", "8192", *flags])
        assert not ignored
        return plan_source(load_model(model), spec, None, gpu="H200-141GB", total_bytes=round(139.8 * GIB),
                           version=version)  # fmt: skip

    full, text = plan(), plan("--limit-mm-per-prompt", '{"image":0}')
    tower = full.line("vision tower")
    assert tower is not None and text.line("vision tower") is None
    rounding = full.line("allocator rounding").bytes - text.line("allocator rounding").bytes
    assert full.group_bytes("weights") - text.group_bytes("weights") == tower.bytes + rounding
    assert plan("--language-model-only").group_bytes("weights") == text.group_bytes("weights")
    older = plan("--limit-mm-per-prompt", '{"image":0}', version="0.8.5")
    assert older.line("vision tower") is not None and older.setting("vision_tower") is True


def test_a_window_request_counts_the_in_flight_tokens_on_0_26_0():
    """0.26.0's SlidingWindowSpec / ChunkedLocalAttentionSpec hold window - 1 (chunk) + max_in_flight_tokens of a
    request: max_concurrent_batches (async scheduling on: 2 on the V1 runner, PP + 1 on V2) x the batched tokens;
    0.19.0 counted the batched tokens once."""
    from harness.sizing.kv_cache import in_flight_tokens, kv_cache

    assert in_flight_tokens("0.19.0", 8192, pp=1, v2_runner=False) == 8192
    assert in_flight_tokens("0.26.0", 8192, pp=1, v2_runner=False) == 16384
    assert in_flight_tokens("0.26.0", 8192, pp=1, v2_runner=True) == 16384
    assert in_flight_tokens("0.26.0", 8192, pp=4, v2_runner=False) == 4 * 8192
    assert in_flight_tokens("0.26.0", 8192, pp=4, v2_runner=True) == 5 * 8192
    shape = kv_shape(record_facts(CASES["gemma2-9b-4l"]), 1)  # 2 sliding (4096) + 2 full layers
    window = shape.sliding_window
    old, new = (kv_cache(shape, 40 * GIB, 16, 32768, t) for t in (8192, 16384))
    assert old.blocks_per_request == 32768 // 16 + -(-(window - 1 + 8192) // 16) + 1
    assert new.blocks_per_request == 32768 // 16 + -(-(window - 1 + 16384) // 16) + 1
    # and the record's startup (L 4096) is capped by max_model_len either way
    short = [kv_cache(shape, 40 * GIB, 16, 4096, t).blocks_per_request for t in (8192, 16384)]
    assert short[0] == short[1] == 2 * 256 + 1


def test_mla_profile_point_by_hand_for_deepseek_v32():
    """DeepSeek-V3.2 cut to 4 layers at max_model_len 4096, 256 sequences, 8192 batched tokens on an H200: the sparse
    backends run 64-token pages, so MLA's chunked-prefill workspace is min(max(8 x 4096, 4 x 256 x 64), 65536) =
    65536 rows; the profile's stand-in (65536, 128, 128 + 128) bf16 is 4 GiB, beside q (N, 128 x 192), kv_c_normed
    (N, 512), k_pe (N, 64), the output (N, 128 x 128) and the residual (N, 7168); with the kept MoE workspace
    (TritonExperts at M = 8192) and the cuBLAS workspace that is the 6.52 GiB vLLM logged."""
    from harness.sizing.kv_cache import default_block_size
    from harness.sizing.profile_run import mla_attention_point, mla_workspace_rows

    facts = record_facts(CASES["dsv32-4l"])
    assert default_block_size(facts, 9)[0] == 64
    rows = mla_workspace_rows(max_model_len=4096, max_num_seqs=256, block_size=64)
    assert rows == 65536
    point = mla_attention_point(facts, num_tokens=8192, tp=1, rows=rows, eager=False)
    dummy = 65536 * 128 * 256 * 2
    inputs = 8192 * (128 * 192 + 512 + 64 + 128 * 128 + 7168) * 2
    assert point.bytes == dummy + inputs == 5_092_933_632
    peak = 1_879_048_192 + 32 * MIB + point.bytes
    assert round(peak / GIB, 2) == CASES["dsv32-4l"].figures.torch_peak_increase_gib == 6.52


@pytest.mark.vllm_wheel
def test_mla_profile_point_is_the_plans_peak(cache_dir):
    """The plan's torch peak of the 4-layer DeepSeek-V3.2 is the MoE workspace, the cuBLAS workspace and the MLA
    attention point computed by hand in the test above."""
    peak = 1_879_048_192 + 32 * MIB + 5_092_933_632
    assert round(_line(_plan("dsv32-4l", cache_dir), "torch peak") * GIB) == peak


def test_mla_block_size_follows_the_backend_vllm_picks():
    """The block the MLA workspace (and the KV cache) is sized with: FLASH_ATTN_MLA's 16 on Hopper with a 16-bit
    cache, FlashMLA's 64 with fp8, FlashInfer MLA's 32 on Blackwell, Triton MLA's 16 elsewhere; the DeepSeek-V2-Lite
    startups show it: the fp8 cache's FlashMLA doubles the profile's stand-in (32768 to 65536 rows, +0.25 GiB
    logged)."""
    from harness.sizing.kv_cache import default_block_size
    from harness.sizing.profile_run import mla_workspace_rows

    facts = record_facts(CASES["dsv2-lite-4l"])
    assert [default_block_size(facts, cap, kv)[0] for cap, kv in ((9, "auto"), (9, "fp8"), (10, "auto"), (8, "auto"))] \
        == [16, 64, 32, 16]  # fmt: skip
    assert default_block_size(record_facts(CASES["llama-8b-4l"]), 9)[0] == 16
    bf16 = mla_workspace_rows(max_model_len=4096, max_num_seqs=256, block_size=16)
    fp8 = mla_workspace_rows(max_model_len=4096, max_num_seqs=256, block_size=64)
    assert (bf16, fp8) == (32768, 65536)
    stand_in = (fp8 - bf16) * 16 * 256 * 2
    peaks = [CASES[n].figures.torch_peak_increase_gib for n in ("dsv2-lite-4l-kvfp8", "dsv2-lite-4l")]
    logged = peaks[0] - peaks[1]
    assert abs(stand_in / GIB - logged) < 0.01


@pytest.mark.vllm_wheel
def test_sparse_attention_buffers_counted_with_the_weights(cache_dir):
    """What DeepSeek-V3.2 builds beside its weights, in vLLM's 'Model loading took': the top-k buffer (8192, 2048)
    int32, a second rope cache (the indexer's neox-style one), and with an fp8 cache FlashMLA sparse's workspace,
    q_concat (8192, 128, 576) bf16 + (5 x 4096, 576) bf16: the 1.14 GiB the fp8 startup logs over the bf16 one."""
    names = {line.name: line.bytes for line in _plan("dsv32-4l-kvfp8", cache_dir).lines if line.group == "weights"}
    assert names["sparse indexer top-k buffer"] == 8192 * 2048 * 4
    assert names["FlashMLA sparse workspace"] == 8192 * 128 * 576 * 2 + 5 * 4096 * 576 * 2
    bf16 = {line.name for line in _plan("dsv32-4l", cache_dir).lines if line.group == "weights"}
    assert "FlashMLA sparse workspace" not in bf16 and "sparse indexer top-k buffer" in bf16
    logged = CASES["dsv32-4l-kvfp8"].figures.model_loading_gib - CASES["dsv32-4l"].figures.model_loading_gib
    assert abs(names["FlashMLA sparse workspace"] / GIB - logged) < 0.01


@pytest.mark.vllm_wheel
def test_mxfp4_loaded_scales_per_release(cache_dir):
    """0.19.0's Triton MXFP4 branch deletes the loaded weights and keeps their block scales beside the swizzled copy;
    0.26.0's deletes the scales too, so the four-layer gpt-oss's experts are (E, 2I, K/32) + (E, K, I/32) bytes a
    layer lighter: 4.006 GiB planned where vLLM 0.26.0 logged 4.00."""
    from harness.sizing import release_defaults
    from harness.sizing.layer import _tree
    from harness.sizing.vllm_source import locate
    from harness.sizing.vllm_source.layer_source import ReleaseFiles

    def kept(version: str):
        source = locate(version=version, cache_dir=cache_dir)
        return release_defaults.mxfp4_keeps_loaded_scales(ReleaseFiles(source, _tree(source)))

    old, new = kept("0.19.0"), kept("0.26.0")
    assert (old.value, new.value) == (True, False)
    assert new.source.startswith("model_executor/layers/fused_moe/oracle/mxfp4.py:")
    assert "del layer.w13_weight_scale" in new.source
    import dataclasses

    from harness.sizing.quant_formats import linear_tensors

    q = record_facts(CASES["gpt-oss-4l"]).quant
    assert q.loaded_scales_kept  # the config's own facts; the plan drops them for 0.26.0
    freed = dataclasses.replace(q, loaded_scales_kept=False)
    w13, w2 = (5760, 2880), (2880, 2880)  # (2I, K), (K, I) of 32 experts, e8m0 scales per 32 of the input
    kept_bytes = sum(linear_tensors(q, *w13, 2, stacked=32)) + sum(linear_tensors(q, *w2, 2, stacked=32))
    freed_bytes = sum(linear_tensors(freed, *w13, 2, stacked=32)) + sum(linear_tensors(freed, *w2, 2, stacked=32))
    assert kept_bytes - freed_bytes == 32 * (5760 * 90 + 2880 * 90) == 24_883_200
    assert abs(_line(_plan("gpt-oss-4l", cache_dir), "weights") - CASES["gpt-oss-4l"].figures.model_loading_gib) < 0.01


@pytest.mark.vllm_wheel
def test_combo_kernel_benchmark_per_release(cache_dir):
    """vLLM turns on Inductor's combo-kernel benchmark in CompilationConfig.__post_init__ (config/compilation.py),
    read per release; with it the first compile benchmarks the fused rotary kernel on a copy of the rope cache:
    Llama-4 Scout's (10485760, 128) bf16 cache makes its cold profile peak, 2.76 GiB, as vLLM 0.26.0 logged."""
    from harness.sizing import release_defaults
    from harness.sizing.layer import _tree
    from harness.sizing.vllm_source import locate
    from harness.sizing.vllm_source.layer_source import ReleaseFiles

    for version in ("0.19.0", "0.26.0"):
        source = locate(version=version, cache_dir=cache_dir)
        read = release_defaults.benchmarks_combo_kernels(ReleaseFiles(source, _tree(source)), version)
        assert read.value is True and read.source.startswith("config/compilation.py:"), read
    plan = _plan("llama4-scout-4l-text", cache_dir)
    line = next(line for line in plan.lines if line.name == "activations")
    assert "rotary combo kernel's benchmark" in line.source and line.source.startswith("peak in the first compile")
    assert abs(_line(plan, "torch peak") - CASES["llama4-scout-4l-text"].figures.torch_peak_increase_gib) < 0.01


def test_deep_gemm_workspace_in_the_fp8_loads(cache_dir):
    """0.26.0 resolves DeepGEMM when an FP8 model is built (QuantFP8 -> utils/deep_gemm.py _lazy_init -> set_pdl),
    and DeepGEMM's DeviceRuntime keeps a 32 MiB cuBLASLt workspace: the one block beside the parameters that a
    load's allocator snapshot showed (results/h200/load-snapshot). The FP8 Llama and the bf16 Llama with an fp8 cache
    log what the bf16 Llama logs less the linears' bytes saved plus it; the bf16 Llama and gpt-oss (MXFP4) have none."""
    from harness.sizing import release_defaults

    def workspace(name: str) -> int:
        return sum(x.bytes for x in _plan(name, cache_dir).lines if x.name == "DeepGEMM cuBLASLt workspace")

    for name in ("llama-8b-4l-fp8tensor", "llama-8b-4l-ctfp8", "llama-8b-4l-kvfp8", "qwen3-8b-4l-fp8block"):
        assert workspace(name) == release_defaults.DEEP_GEMM_CUBLASLT_WORKSPACE == 32 * MIB, name
    assert workspace("llama-8b-4l") == workspace("qwen3-8b-4l") == 0
    assert workspace("gpt-oss-4l") == 0
    assert release_defaults.deep_gemm_workspace_at_load("0.19.0").value is False
    assert release_defaults.deep_gemm_workspace_at_load("0.26.0").value is True
    # the fp8 cache alone moves the bf16 Llama's load by the workspace (3.63 -> 3.66 GiB logged)
    logged = CASES["llama-8b-4l-kvfp8"].figures.model_loading_gib - CASES["llama-8b-4l"].figures.model_loading_gib
    planned = _line(_plan("llama-8b-4l-kvfp8", cache_dir), "weights") - _line(
        _plan("llama-8b-4l", cache_dir), "weights"
    )
    assert abs(planned - 32 * MIB / GIB) < 1e-9 and abs(planned - logged) <= 0.01


def test_weights_of_20_mib_hold_their_segment_under_the_load_max_split():
    """0.26.0's Worker.load_model runs under max_split_size_mb=20, and the caching allocator does not split a request
    of at least max_split_size: gpt-oss's qkv_proj, 29,491,200 B asked, held 31,457,280 (its whole 2 MiB-rounded
    segment) in the load's snapshot, where PyTorch's default would split it; requests under 20 MiB are unchanged."""
    from harness.sizing import release_defaults
    from harness.sizing.deployment_weights import allocator_block_bytes

    split = release_defaults.load_max_split_size("0.26.0").value
    assert split == 20 * MIB and release_defaults.load_max_split_size("0.19.0").value is None
    assert allocator_block_bytes(29_491_200) == 29_491_200
    assert allocator_block_bytes(29_491_200, split) == 31_457_280
    assert allocator_block_bytes(23_592_960, split) == 25_165_824  # o_proj, as held
    assert allocator_block_bytes(16 * MIB + 512 * 1024, split) == 16 * MIB + 512 * 1024  # under 20 MiB: split


@pytest.mark.vllm_wheel
def test_mxfp4_hopper_padding_per_release(cache_dir):
    """0.26.0's vendored triton_kernels pads the swizzled MXFP4 values to 16 rows x 32 bytes (0.19.0's to 64 x 64)
    and its _swizzle_mxfp4 pads the 90 scale groups to 92 on compute capability 9.0: gpt-oss's experts as the load's
    snapshot held them, (32, 5760, 1440) and (32, 2880, 1440) bytes of values and 32 x 5888 x 92 + 32 x 3072 x 92
    of scales a layer; gpt-oss-20b's weights within 0.01 GiB of its log (0.06 over with the 64 x 64 padding)."""
    import dataclasses

    from harness.sizing import release_defaults
    from harness.sizing.quant_formats import linear_tensors

    assert release_defaults.mxfp4_hopper_padding("0.19.0", 9)[:2] == ((64, 64), 1)
    assert release_defaults.mxfp4_hopper_padding("0.26.0", 9)[:2] == ((16, 32), 4)
    assert release_defaults.mxfp4_hopper_padding("0.26.0", 10)[:2] == ((16, 32), 1)
    q = dataclasses.replace(record_facts(CASES["gpt-oss-4l"]).quant, loaded_scales_kept=False, swizzle_align=(16, 32),
                            scale_groups_multiple=4)  # fmt: skip
    assert linear_tensors(q, 5760, 2880, 2, stacked=32) == [32 * 5760 * 1440, 32 * 5888 * 92]
    assert linear_tensors(q, 2880, 2880, 2, stacked=32) == [32 * 2880 * 1440, 32 * 3072 * 92]
    assert (
        abs(_line(_plan("gpt-oss-20b", cache_dir), "weights") - CASES["gpt-oss-20b"].figures.model_loading_gib) < 0.01
    )


@pytest.mark.vllm_wheel
def test_fp8_experts_call_tensors_in_the_moe_peak(cache_dir):
    """At Mixtral's online-FP8 profile peak (the allocator's history, results/h200/load-snapshot) the first MoE
    layer's experts call holds, beside its kept workspace, its output (8192, 4096) bf16, the quantized input a1q
    (8192, 4096) fp8 and the quantized intermediate a2q (8192 x 2, 14336) fp8: 1.91 GiB, as logged; the bf16
    checkpoint's call holds only the output, under the attention point."""
    from harness.sizing import profile_run

    facts = record_facts(CASES["mixtral-2l-online-fp8"])
    fp8, _ = profile_run.moe_call_tensors(facts, num_tokens=8192, intermediate=14336, act_quant=facts.quant.scheme)
    bf16, _ = profile_run.moe_call_tensors(facts, num_tokens=8192, intermediate=14336, act_quant=None)
    assert bf16 == 8192 * 4096 * 2
    assert fp8 - bf16 == 8192 * 4096 + 8192 * 2 * 14336 + 8
    plan = _plan("mixtral-2l-online-fp8", cache_dir)
    assert abs(_line(plan, "torch peak") - CASES["mixtral-2l-online-fp8"].figures.torch_peak_increase_gib) < 0.01


def test_fp8_cache_quantizes_the_query_inside_the_compiled_attention_block(cache_dir):
    """With an fp8 KV cache the attention layer quantizes the query before the backend, fused by torch.compile into
    the rotary: GLM-4.5's compiled attention block (the bf16 cache's peak, 2.24 GiB logged) keeps that (8192, 96 x
    128) output as fp8, 96 MiB less, and its fp8-cache startup logs 2.14. Eager, QuantFP8 runs its own kernel."""
    from harness.sizing import profile_run

    facts = record_facts(CASES["glm45-4l-kvfp8-seqs128"])
    bf16 = profile_run.forward_phase(facts, num_tokens=8192, tp=1)
    fp8 = profile_run.forward_phase(facts, num_tokens=8192, tp=1, query_fp8=True)
    assert bf16.bytes == 2 * 8192 * 5120 * 2 + 8192 * (4 * 96 + 3 * 8) * 128 * 2
    assert "compiled attention block" in bf16.detail
    # 96 MiB less puts the block under the dense layer's MLP estimate, which is then the forward's point
    assert bf16.bytes - 8192 * 96 * 128 < fp8.bytes == 4 * 8192 * 5120 * 2 + 3 * 8192 * 12288 * 2 < bf16.bytes
    qwen = record_facts(CASES["qwen3-moe-4l-kvfp8"])  # no dense layer: the block stays the point, 32 MiB less
    q16, q8 = (profile_run.forward_phase(qwen, num_tokens=8192, tp=1, query_fp8=q) for q in (False, True))
    assert q16.bytes - q8.bytes == 8192 * 32 * 128 and "the rotary's q as fp8" in q8.detail
    assert profile_run.query_quant_fused("fp8", compiled=True)
    assert profile_run.query_quant_fused("fp8_e4m3", compiled=True)
    assert not profile_run.query_quant_fused("fp8_e5m2", compiled=True)
    assert not profile_run.query_quant_fused("fp8", compiled=False)
    assert not profile_run.query_quant_fused("auto", compiled=True)
    logged = {n: CASES[n].figures.torch_peak_increase_gib for n in ("glm45-4l", "glm45-4l-kvfp8-seqs128")}
    assert logged == {"glm45-4l": 2.24, "glm45-4l-kvfp8-seqs128": 2.14}
    for name, peak in logged.items():
        assert abs(_line(_plan(name, cache_dir), "torch peak") - peak) <= 0.03, name
