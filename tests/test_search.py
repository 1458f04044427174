"""`harness plan --search`: the layouts a serve line leaves open, each planned as `harness plan` plans it, ranked.

The releases come from the harness's cache (downloaded on demand, as in tests/test_deployment.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.sizing import gpus
from harness.sizing.deployment import device_total
from harness.sizing.deployment_plan import plan_serve
from harness.sizing.search import SEARCH_SCHEMA, SearchReport, SearchRequest, gpu_counts_of, rank_key, search
from harness.sizing.serve_args import parse_serve

GPU = "H200-141GB"
TOTAL = device_total(GPU, 0)[0]
R1 = ("vllm", "serve", "deepseek-r1", "--max-model-len", "65536")


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


def _request(serve: tuple[str, ...], versions: tuple[str, ...], counts: tuple[int, ...], cache_dir: Path,
             **kwargs) -> SearchRequest:  # fmt: skip
    return SearchRequest(serve=serve, vllm_versions=versions, gpu=GPU, total_bytes=TOTAL, gpu_counts=counts,
                         cache_dir=cache_dir, **kwargs)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def each_search_once():
    """A search of the same request runs once in this module: the text output of R1's search is that of the request
    r1_search made, and --fail-on-verdict's exit is judged on the search the plain command made. A search is a
    function of its request alone (the releases' files, read from the cache); its report is read, never changed."""
    from harness.sizing import search as search_module

    real = search_module.search
    done: dict[SearchRequest, SearchReport] = {}

    def once(request: SearchRequest, progress=None) -> SearchReport:
        if progress is not None:  # a progress bar follows the search as it runs
            return real(request, progress)
        if request not in done:
            done[request] = real(request)
        return done[request]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_module, "search", once)
        patch.setattr(sys.modules[__name__], "search", once)
        yield


@pytest.fixture(scope="module")
def r1_search(cache_dir) -> SearchReport:
    # The request `harness plan --search --gpu H200-141GB --gpus 16` makes of R1 (the GPU as its row): the command's
    # text output below reads this search.
    request = _request(R1, ("0.29.0", "0.33.0"), (16,), cache_dir)
    return search(dataclasses.replace(request, gpu=gpus.lookup(GPU)))


@pytest.mark.vllm_wheel
def test_best_layout_replanned_on_its_own_serve_line_agrees_to_the_token(r1_search, cache_dir):
    best = next(c for c in r1_search.candidates if c.vllm_version == "0.33.0" and c.rank == 1)
    assert best.gpus == best.tensor_parallel_size * best.pipeline_parallel_size * best.data_parallel_size == 16
    done = run_cli_inproc("plan", "--vllm-version", "0.33.0", "--gpu", GPU, "--cache-dir", str(cache_dir), "--json",
                       "--", *best.serve)  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["deployments"][0]
    assert plan["verdict"]["outcome"] == "starts"
    assert plan["kv_tokens"] == best.per_gpu_kv_tokens
    assert plan["kv_cache_bytes"] == best.kv_cache_bytes
    assert plan["non_kv_bytes"] == best.non_kv_bytes
    assert best.deployment_kv_tokens == plan["kv_tokens"] * best.data_parallel_size
    # no layout of the search holds more KV across the deployment
    assert best.deployment_kv_tokens == max(c.deployment_kv_tokens for c in r1_search.candidates
                                            if c.vllm_version == "0.33.0")  # fmt: skip


@pytest.mark.vllm_wheel
def test_mla_prefers_dp_tp_replicates_the_latent(r1_search):
    """MLA's latent is whole on every GPU: at equal GPUs, TP 8 holds per GPU what DP 8 ranks would each hold."""
    ranked = [c for c in r1_search.candidates if c.vllm_version == "0.33.0" and c.rank is not None]
    no_pp = [c for c in ranked if c.pipeline_parallel_size == 1]
    best_tp = {tp: next(c for c in no_pp if c.tensor_parallel_size == tp) for tp in (1, 2, 4, 8)}
    for tp, c in best_tp.items():
        assert c.kv_bytes_per_token == 61 * 576 * 2  # not split by TP
        assert c.deployment_kv_tokens == c.per_gpu_kv_tokens * (16 // tp)
    # TP shards the weights, so a TP 8 GPU holds more tokens than a TP 1 GPU, but 8x fewer caches
    assert best_tp[8].per_gpu_kv_tokens > best_tp[1].per_gpu_kv_tokens
    assert best_tp[8].deployment_kv_tokens < best_tp[1].deployment_kv_tokens < ranked[0].deployment_kv_tokens + 1
    # PP splits the layers, and their KV, without replicating anything: PP 2 stores 31 of the 61 layers per GPU
    best_pp2 = next(c for c in ranked if (c.tensor_parallel_size, c.pipeline_parallel_size) == (1, 2))
    assert best_pp2.kv_bytes_per_token == 31 * 576 * 2
    assert best_pp2.deployment_kv_tokens == best_pp2.per_gpu_kv_tokens * 8
    assert ranked[0].tensor_parallel_size == 1
    why = next(r for r in r1_search.releases if r.vllm_version == "0.33.0").why
    assert why[0].startswith(f"best: {ranked[0].label} on 16 GPUs")
    assert any("MLA's latent is not split by TP: its 8 TP GPUs hold the same tokens" in line for line in why[1:])


@pytest.mark.vllm_wheel
def test_every_candidate_has_a_verdict_and_reasons_name_the_component(r1_search):
    old = [c for c in r1_search.candidates if c.vllm_version == "0.29.0"]
    assert {c.outcome for c in old} <= {"starts", "oom", "refused", "fails"}
    not_starting = [c for c in old if c.outcome != "starts"]
    assert not_starting and all(c.rank is None for c in not_starting)
    for c in not_starting:
        assert c.verdict.split(":")[0] in ("refused", "fails") or c.verdict.startswith("OOM at ")
    # 0.29.0's batched CUTLASS workspace counts D twice: the default-token deepep_low_latency layout with CUTLASS
    # forced is far larger there than on 0.33.0
    assert r1_search.changes and r1_search.changes[0].startswith("vllm 0.29.0 -> 0.33.0: best ")


@pytest.mark.vllm_wheel
def test_search_ranking_equals_planning_every_candidate_alone(cache_dir):
    """A small grid: the cached release reads give each candidate exactly what a fresh `harness plan` gives."""
    serve = (
        *R1,
        "--enable-expert-parallel",
        "--all2all-backend",
        "deepep_low_latency",
        "--moe-backend",
        "deep_gemm",
        "--max-num-batched-tokens",
        "512",
    )
    report = search(_request(serve, ("0.30.0",), (8, 16), cache_dir))
    assert 10 <= len(report.candidates) <= 100
    assert {c.all2all_backend for c in report.candidates} == {"deepep_low_latency"}
    assert {c.moe_backend for c in report.candidates} == {"deep_gemm"}
    alone = []
    for c in report.candidates:
        model, spec, _ = parse_serve(list(c.serve))
        [plan] = plan_serve(model, spec, ["0.30.0"], gpu=GPU, total_bytes=TOTAL, cache_dir=cache_dir)
        assert (plan.verdict.text, plan.kv_tokens, plan.non_kv_bytes) == (c.verdict, c.per_gpu_kv_tokens
                                                                         if c.outcome == "starts" else plan.kv_tokens,
                                                                         c.non_kv_bytes)  # fmt: skip
        if plan.verdict.outcome == "starts":
            alone.append(
                c.model_copy(
                    update={
                        "per_gpu_kv_tokens": plan.kv_tokens,
                        "deployment_kv_tokens": plan.kv_tokens * c.data_parallel_size,
                    }
                )
            )
    expected = [c.label + f"@{c.gpus}" for c in sorted(alone, key=rank_key("kv-tokens"))]
    ranked = sorted((c for c in report.candidates if c.rank is not None), key=lambda c: c.rank or 0)
    assert [c.label + f"@{c.gpus}" for c in ranked] == expected


@pytest.mark.vllm_wheel
def test_flags_on_the_line_are_constraints(cache_dir):
    serve = (
        *R1,
        "--tensor-parallel-size",
        "2",
        "--enable-expert-parallel",
        "--all2all-backend",
        "deepep_high_throughput",
        "--max-num-batched-tokens",
        "2048",
        "--kv-cache-dtype",
        "auto",
    )
    report = search(_request(serve, ("0.33.0",), (8, 16), cache_dir, allow=("kv-fp8",)))
    assert {(c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size) for c in report.candidates} == \
        {(2, 1, 4), (2, 2, 2), (2, 4, 1), (2, 1, 8), (2, 2, 4), (2, 4, 2)}  # fmt: skip
    assert all(c.gpus == c.tensor_parallel_size * c.pipeline_parallel_size * c.data_parallel_size
               for c in report.candidates)  # fmt: skip
    assert {c.all2all_backend for c in report.candidates} == {"deepep_high_throughput"}
    assert {c.max_num_batched_tokens for c in report.candidates} == {2048}
    assert {c.kv_cache_dtype for c in report.candidates} == {"auto"}
    assert {c.num_redundant_experts for c in report.candidates} == {0, 8, 16, 32}


@pytest.mark.vllm_wheel
def test_kv_fp8_only_when_allowed_and_doubles_tokens_per_byte(cache_dir):
    serve = (
        *R1,
        "--enable-expert-parallel",
        "--all2all-backend",
        "allgather_reducescatter",
        "--max-num-batched-tokens",
        "4096",
        "--eplb-config",
        '{"num_redundant_experts": 0}',
        "--enable-eplb",
    )
    plain = search(_request(serve, ("0.33.0",), (16,), cache_dir))
    assert {c.kv_cache_dtype for c in plain.candidates} == {"auto"}
    fp8 = search(_request(serve, ("0.33.0",), (16,), cache_dir, allow=("kv-fp8",)))
    by = {(c.label.removesuffix(" kv fp8"), c.kv_cache_dtype): c for c in fp8.candidates}
    for (label, dtype), c in by.items():
        if dtype == "fp8":
            auto = by[(label, "auto")]
            assert c.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
            assert c.non_kv_bytes == auto.non_kv_bytes
    assert fp8.candidates[0].kv_cache_dtype == "fp8" and fp8.input_hash != plain.input_hash


@pytest.mark.vllm_wheel
def test_min_gpus_objective(cache_dir):
    serve = (
        *R1,
        "--enable-expert-parallel",
        "--all2all-backend",
        "allgather_reducescatter",
        "--max-num-batched-tokens",
        "8192",
        "--tensor-parallel-size",
        "1",
    )
    report = search(_request(serve, ("0.33.0",), (8, 16, 32), cache_dir, objective="min-gpus", min_concurrency=150))
    ranked = sorted((c for c in report.candidates if c.rank is not None), key=lambda c: c.rank or 0)
    assert ranked and all(c.deployment_concurrency >= 150 for c in ranked)
    missed = [c for c in report.candidates if c.outcome == "starts" and c.rank is None]
    assert missed and all(c.meets_min_concurrency is False and c.deployment_concurrency < 150 for c in missed)
    assert ranked[0].gpus == min(c.gpus for c in ranked) and ranked[0].gpus > 8


@pytest.mark.vllm_wheel
def test_json_report_is_typed_and_versioned(cache_dir):
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--gpus", "8", "--vllm-version", "0.33.0", "--cache-dir",
                       str(cache_dir), "--json", "--", *R1, "--enable-expert-parallel")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress in a pipe
    report = SearchReport.model_validate(json.loads(done.stdout))
    assert report.schema_version == SEARCH_SCHEMA and report.kind == "layout-search"
    assert report.gpu == GPU and report.gpu_total_bytes == TOTAL and len(report.input_hash) == 64
    assert report.candidates and all(c.enable_expert_parallel for c in report.candidates)
    assert all(c.serve[:3] == ["vllm", "serve", "deepseek-r1"] for c in report.candidates)


@pytest.mark.vllm_wheel
def test_text_output_table_reasons_and_changes(cache_dir):
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--gpus", "16", "--vllm-version", "0.29.0",
                       "--vllm-version", "0.33.0", "--cache-dir", str(cache_dir), "--", *R1)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "deepseek-r1 on 16 x H200-141GB, vLLM 0.33.0" in out and "deployment KV tokens" in out
    assert "best on 0.33.0: vllm serve deepseek-r1 --max-model-len 65536 --tensor-parallel-size 1 " in out
    assert "not ranked on 0.29.0:" in out and "why: best: " in out
    assert "vllm 0.29.0 -> 0.33.0: best " in out


@pytest.mark.vllm_wheel
def test_a_docker_line_searches_its_images_release_and_writes_lines_a_shell_runs(cache_dir):
    """`docker run ... -e VLLM_X=V vllm/vllm-openai:vX.Y.Z ARGS` without --vllm-version: the tag's release is
    searched (said on stderr), and each candidate is written as a shell runs it, the variable before `vllm serve`."""
    line = ("docker", "run", "--gpus", "all", "-e", "VLLM_MOE_DP_CHUNK_SIZE=512", "vllm/vllm-openai:v0.33.0",
            "--model", "deepseek-r1", "--max-model-len", "65536")  # fmt: skip
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--gpus", "16", "--cache-dir", str(cache_dir), "--",
                          *line)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the release from the image's tag: vLLM 0.33.0" in done.stderr
    assert "best on 0.33.0: VLLM_MOE_DP_CHUNK_SIZE=512 vllm serve deepseek-r1 --max-model-len 65536 " in done.stdout
    plan = run_cli_inproc("plan", "--gpu", GPU, "--cache-dir", str(cache_dir), "--", *line, "-dp", "16",
                          "--enable-expert-parallel")  # fmt: skip
    assert plan.returncode == 0 and "vllm 0.33.0 on H200-141GB: " in plan.stdout, plan.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--gpus", "8,x"), "--gpus '8,x': 'x' is not a GPU count"),
    (("--gpus", "16", "--objective", "min-gpus"), "--objective min-gpus needs --min-concurrency"),
    (("--gpus", "16", "--min-concurrency", "-1"), "--min-concurrency -1.0: allowed: a number above 0"),
    (("--gpus", "0"), "'0' is not a GPU count"),
])  # fmt: skip
@pytest.mark.vllm_wheel
def test_bad_search_input_is_one_line_exit_2(args, message, cache_dir):
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--vllm-version", "0.33.0", "--cache-dir", str(cache_dir),
                       *args, "--", *R1)  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_search_without_a_serve_line_or_a_release_exit_2():
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--vllm-version", "0.33.0")
    assert done.returncode == 2 and "--search needs `-- vllm serve MODEL FLAGS`" in done.stderr
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--", *R1)
    assert done.returncode == 2 and "--search needs --vllm-version" in done.stderr


def test_gpu_counts_parse():
    assert gpu_counts_of("8, 16,32,16") == (8, 16, 32)


# --- the experts backend vLLM would choose --------------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_release_selection_picks_the_experts_backend(cache_dir):
    """oracle/fp8.py on Hopper for block FP8: Triton for TP, FlashInfer's CUTLASS for EP in the standard format (not
    sized: the table's family is planned, and the pick named), BatchedDeepGemm under deepep_low_latency."""
    from harness.sizing.deployment_plan import ReleaseReads
    from harness.sizing.moe_selection import cutlass_refusal, pick_fp8
    from harness.sizing.vllm_source.sources import locate

    files = ReleaseReads(locate(version="0.33.0", cache_dir=cache_dir)).files
    tp = pick_fp8(files, capability=90, ep_size=1, batched=False, block=True, all2all="allgather_reducescatter")
    assert (tp.backend, tp.experts_class, tp.family) == ("TRITON", "TritonExperts", "triton")
    assert tp.source.startswith("model_executor/layers/fused_moe/oracle/fp8.py:")
    ep = pick_fp8(files, capability=90, ep_size=16, batched=False, block=True, all2all="allgather_reducescatter")
    assert (ep.backend, ep.experts_class, ep.family) == ("FLASHINFER_CUTLASS", "FlashInferExperts", None)
    ll = pick_fp8(files, capability=90, ep_size=16, batched=True, block=True, all2all="deepep_low_latency")
    assert (ll.backend, ll.experts_class, ll.family) == ("BATCHED_DEEPGEMM", "BatchedDeepGemmExperts", "deep_gemm")
    assert "VLLM_CUTLASS (allow_vllm_cutlass=False" in ll.source
    assert "TRITON TritonExperts (Standard format)" in ll.source
    # Blackwell: FlashInfer's TRT-LLM kernels are on the device there
    blackwell = pick_fp8(files, capability=100, ep_size=1, batched=False, block=True, all2all="allgather_reducescatter")
    assert blackwell.backend != "TRITON"
    refusal = cutlass_refusal(files)
    assert refusal is not None and refusal.startswith("refused: vLLM CUTLASS FP8 MoE backend is disabled")


@pytest.mark.vllm_wheel
def test_plan_names_the_backend_it_assumed(cache_dir):
    serve = (
        "--",
        "vllm",
        "serve",
        "deepseek-r1",
        "--data-parallel-size",
        "16",
        "--enable-expert-parallel",
        "--all2all-backend",
        "deepep_low_latency",
        "--max-model-len",
        "65536",
    )
    done = run_cli_inproc("plan", "--vllm-version", "0.33.0", "--gpu", GPU, "--cache-dir", str(cache_dir), *serve)
    assert done.returncode == 0, done.stderr
    assert "experts backend: deep_gemm (model_executor/layers/fused_moe/oracle/fp8.py:" in done.stdout
    assert "vLLM picks BATCHED_DEEPGEMM (BatchedDeepGemmExperts)" in done.stdout
    forced = run_cli_inproc("plan", "--vllm-version", "0.33.0", "--gpu", GPU, "--cache-dir", str(cache_dir), "--json",
                         *serve, "--moe-backend", "deep_gemm")  # fmt: skip
    chosen = run_cli_inproc("plan", "--vllm-version", "0.33.0", "--gpu", GPU, "--cache-dir", str(cache_dir), "--json",
                         *serve)  # fmt: skip
    a, b = (json.loads(x.stdout)["deployments"][0] for x in (forced, chosen))
    assert a["kv_tokens"] == b["kv_tokens"] and a["non_kv_bytes"] == b["non_kv_bytes"]


@pytest.mark.vllm_wheel
def test_constraints_that_leave_no_layout_exit_2(cache_dir):
    done = run_cli_inproc("plan", "--search", "--gpu", GPU, "--gpus", "16", "--vllm-version", "0.33.0", "--cache-dir",
                       str(cache_dir), "--", *R1, "--tensor-parallel-size", "3")  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--gpus 16: no layout of these GPU counts fits --tensor-parallel-size" in done.stderr


@pytest.mark.vllm_wheel
def test_dense_gqa_model_tp_splits_the_kv_heads(cache_dir):
    """Llama-3.1-8B (8 KV heads of 128, 32 layers, bf16): TP splits the heads, so a TP 4 GPU stores a quarter of
    each token; no EP, no experts backend."""
    serve = ("vllm", "serve", "llama-3.1-8b", "--max-model-len", "8192", "--max-num-batched-tokens", "8192")
    report = search(
        SearchRequest(
            serve=serve,
            vllm_versions=("0.33.0",),
            gpu="H100-80GB",
            total_bytes=device_total("H100-80GB", 0)[0],
            gpu_counts=(4,),
            cache_dir=cache_dir,
        )
    )
    by_tp = {c.tensor_parallel_size: c for c in report.candidates if c.pipeline_parallel_size == 1}
    assert set(by_tp) == {1, 2, 4} and not any(c.enable_expert_parallel for c in report.candidates)
    for tp, c in by_tp.items():
        assert c.kv_bytes_per_token == 32 * 2 * (8 // tp) * 128 * 2
        assert c.deployment_kv_tokens == c.per_gpu_kv_tokens * (4 // tp)
    assert report.releases[0].notes == []


@pytest.mark.vllm_wheel
def test_fail_on_verdict_when_no_layout_starts(cache_dir):
    args = ("plan", "--search", "--gpu", GPU, "--gpus", "8", "--vllm-version", "0.33.0", "--cache-dir", str(cache_dir),
            "--json")  # fmt: skip
    serve = ("--", *R1, "--gpu-memory-utilization", "0.3", "--enable-expert-parallel")
    done = run_cli_inproc(*args, "--fail-on-verdict", *serve)
    assert done.returncode == 1, done.stderr
    report = SearchReport.model_validate(json.loads(done.stdout))
    assert report.releases[0].best is None and all(c.rank is None for c in report.candidates)
    assert {c.outcome for c in report.candidates} <= {"oom", "fails", "refused"}
    assert run_cli_inproc(*args, *serve).returncode == 0


@pytest.mark.vllm_wheel
def test_concurrency_objective_ranks_by_requests_served(cache_dir):
    serve = (
        *R1,
        "--enable-expert-parallel",
        "--all2all-backend",
        "allgather_reducescatter",
        "--max-num-batched-tokens",
        "2048",
    )
    report = search(_request(serve, ("0.33.0",), (8, 16), cache_dir, objective="concurrency"))
    ranked = sorted((c for c in report.candidates if c.rank is not None), key=lambda c: c.rank or 0)
    values = [c.deployment_concurrency for c in ranked]
    assert len(ranked) > 4 and values == sorted(values, reverse=True)
    for c in ranked:  # W = blocks / ceil(L / block) per GPU, x DP
        assert c.deployment_concurrency == pytest.approx(c.per_gpu_kv_tokens / 16 / (65536 / 16) * c.data_parallel_size)


@pytest.mark.vllm_wheel
def test_search_options_without_search_and_oversized_searches_exit_2(cache_dir):
    done = run_cli_inproc("plan", "--gpus", "16", "--vllm-version", "0.33.0", "--gpu", GPU, "--", *R1)
    assert done.returncode == 2 and "--gpus goes with --search" in done.stderr
    counts = ",".join(str(n) for n in range(8, 4097, 8))
    done = run_cli_inproc("plan", "--search", "--gpus", counts, "--search-backends", "--allow", "kv-fp8",
                       "--vllm-version", "0.33.0", "--gpu", GPU, "--cache-dir", str(cache_dir), "--", *R1)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "(512 counts)" in done.stderr and "allowed: at most 200000" in done.stderr


@pytest.mark.vllm_wheel
def test_block_fp8_qwen3_moe_on_0_26_0_runs_triton_without_ep(tmp_path, cache_dir):
    """vLLM 0.26.0 started a block-FP8 Qwen3 MoE on an H200 with the Triton experts, where the table said CUTLASS:
    the plan reads that pick from the release's oracle (which logs it as "Using TRITON Fp8 MoE backend ...")."""
    from harness.sizing.model_config import MODELS_DIR

    config = json.loads((MODELS_DIR / "qwen3-30b-a3b.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                     "activation_scheme": "dynamic", "fmt": "e4m3"}  # fmt: skip
    (tmp_path / "Qwen3-30B-A3B-FP8").mkdir()
    (tmp_path / "Qwen3-30B-A3B-FP8" / "config.json").write_text(json.dumps(config))
    model = str(tmp_path / "Qwen3-30B-A3B-FP8")
    done = run_cli_inproc("plan", "--vllm-version", "0.26.0", "--gpu", GPU, "--cache-dir", str(cache_dir), "--json",
                       "--", "vllm", "serve", model, "--max-model-len", "8192")  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = {s["name"]: s for s in json.loads(done.stdout)["deployments"][0]["settings"]}
    assert settings["moe_backend"]["value"] == "triton"
    assert settings["moe_backend"]["source"].startswith("model_executor/layers/fused_moe/oracle/fp8.py:")
    assert "vLLM picks TRITON (TritonExperts)" in settings["moe_backend"]["source"]


@pytest.mark.vllm_wheel
def test_selection_agrees_with_a_real_startup_on_an_h200(cache_dir):
    """tests/data/real_startups/qwen3-moe-4l-fp8block.yaml: vLLM 0.26.0 on one H200 logged "Using TRITON Fp8 MoE
    backend out of potential backends: [...]" for a block-FP8 Qwen3 MoE; the selection read from 0.26.0's oracle
    gives the same backend and the same list in the same order (VLLM_CUTLASS removed: allow_vllm_cutlass=False)."""
    from harness.sizing.deployment_plan import ReleaseReads
    from harness.sizing.moe_selection import pick_fp8
    from harness.sizing.vllm_source.sources import locate
    from harness.verify.planning import record_facts
    from harness.verify.record import load_record

    record = load_record(Path(__file__).resolve().parent / "data" / "real_startups" / "qwen3-moe-4l-fp8block.yaml")
    facts = record_facts(record)
    assert facts.quant_method == "fp8" and facts.weight_block_size == (128, 128) and record.gpu == GPU
    files = ReleaseReads(locate(version=record.vllm_version, cache_dir=cache_dir)).files
    pick = pick_fp8(files, capability=90, ep_size=1, batched=False, block=True, all2all="allgather_reducescatter")
    assert f"{pick.backend} Fp8" == record.backends.moe == "TRITON Fp8"
    assert list(pick.candidates) == list(record.backends.moe_candidates)
