"""The serve lines operators run: every flag a release has (read from its source), every GPU of the table, and the
EP/DP terms per release. Each flag and GPU the deployment docs name has a test here; the published startup logs
(tests/test_startup_logs.py) check the figures."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from cli_utils import run_cli_inproc
from harness.scenario.deployment import DeploymentSpec
from harness.sizing import gpus, profile_run
from harness.sizing.deployment import (
    CUDAGRAPH_BYTES,
    NON_TORCH_MULTI_BYTES,
    NON_TORCH_SINGLE_BYTES,
    default_experts_backend,
    non_torch_bytes,
    plan_deployment,
    resolve,
    stage_layers,
)  # fmt: skip
from harness.sizing.deployment_plan import plan_source
from harness.sizing.model_config import load_model
from harness.sizing.release_flags import read_flags
from harness.sizing.serve_args import ServeArgsError, canonical_serve, read_serve

GIB = 2**30
H100 = gpus.lookup("H100-80GB")


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


def _dense(argv: str, gpu=H100, version: str = "0.30.0", estimate: bool | None = None):
    """A dense model's plan needs no release: its defaults come from the documented table."""
    parsed = read_serve(argv.split())
    facts = load_model(parsed.model, dtype=parsed.spec.dtype, quantization=parsed.spec.quantization)
    return plan_source(facts, parsed.spec, None, gpu=gpu, total_bytes=gpu.total_bytes,
                       version=version, cudagraph_estimate=estimate)  # fmt: skip


# --- GPUs -----------------------------------------------------------------------------------------------------------

NAMED = {  # the GPUs vLLM users deploy on: (name as typed, SMs, compute capability, interconnect)
    "A10": (72, (8, 6), "pcie"), "A10G": (80, (8, 6), "pcie"), "A30": (56, (8, 0), "pcie"),
    "A40": (84, (8, 6), "pcie"), "L4": (58, (8, 9), "pcie"), "L40": (142, (8, 9), "pcie"),
    "L40S": (142, (8, 9), "pcie"), "A100-40GB": (108, (8, 0), "nvlink"), "A100-PCIe-40GB": (108, (8, 0), "pcie"),
    "A100-80GB": (108, (8, 0), "nvlink"), "A100-PCIe-80GB": (108, (8, 0), "pcie"), "H100-SXM": (132, (9, 0), "nvlink"),
    "H100-PCIe": (114, (9, 0), "pcie"), "H100-NVL": (132, (9, 0), "nvlink"), "H800": (132, (9, 0), "nvlink"),
    "H20-96GB": (78, (9, 0), "nvlink"), "H20-141GB": (78, (9, 0), "nvlink"), "H200": (132, (9, 0), "nvlink"),
    "H200-NVL": (132, (9, 0), "nvlink"), "GH200": (132, (9, 0), "nvlink"), "B200": (148, (10, 0), "nvlink"),
    "B300": (148, (10, 3), "nvlink"), "GB200": (148, (10, 0), "nvlink"), "RTX-6000-Ada": (142, (8, 9), "pcie"),
    "RTX-PRO-6000": (188, (12, 0), "pcie"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(NAMED))
def test_every_named_gpu_has_a_sourced_row_and_plans(name):
    row = gpus.lookup(name)
    sms, capability, link = NAMED[name]
    assert (row.num_sms, row.capability, row.interconnect) == (sms, capability, link)
    assert row.source and ("github.com" in row.source or "nvidia.com" in row.source or "aws.amazon.com" in row.source)
    assert 10 * GIB < row.total_bytes < 300 * GIB
    plan = _dense("vllm serve qwen3-8b --max-model-len 4096", gpu=row)
    assert plan.total_bytes == row.total_bytes and plan.gpu == row.name
    assert plan.verdict.outcome in ("starts", "fails")
    # what torch reports is measured on some rows; the others say where their total comes from (an estimate of
    # a few hundred MiB, like the non-torch term's, not a memory left unsized)
    total_source = next(s.source for s in plan.settings if s.name == "gpu_total_bytes")
    assert ("torch's total is a few hundred MiB less" in total_source) == (not row.total_is_measured)
    assert not plan.approximate


def test_torch_totals_as_vllm_divides_them():
    assert gpus.lookup("H100-80GB").total_bytes == round(79.19 * GIB)
    assert gpus.lookup("H200-141GB").total_bytes == 150_109_880_320  # results/h200: device_total_bytes
    assert gpus.lookup("A100-80GB").total_bytes == round(79.14 * GIB)  # not 80.00: 1% of the KV cache
    assert gpus.lookup("B200").total_bytes == round(178.35 * GIB)


def test_names_are_read_loosely_and_unknown_ones_refused_with_the_closest():
    assert gpus.lookup("h100 sxm").name == gpus.lookup("H100_SXM").name == "H100-80GB"
    with pytest.raises(gpus.UnknownGpuError) as error:
        gpus.lookup("H100-SMX")
    message = str(error.value)
    assert "closest: H100-80GB" in message and "--gpu-memory-gib" in message and "\n" not in message


def test_cli_unknown_gpu_exit_2_and_any_gpu_by_its_memory():
    result = run_cli_inproc("plan", "--vllm-version", "0.30.0", "--gpu", "RTX-4090", "--", "vllm", "serve", "qwen3-8b")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "--gpu 'RTX-4090' is not a known GPU" in result.stderr and "--gpu-memory-gib" in result.stderr
    given = gpus.given(23.5, num_sms=128, capability="8.9")
    assert (given.total_bytes, given.num_sms, given.capability) == (round(23.5 * GIB), 128, (8, 9))
    with pytest.raises(gpus.UnknownGpuError, match="--gpu-capability"):
        gpus.given(23.5, capability="sm89")


def test_the_gpu_sets_the_sampler_cublas_and_non_torch_terms():
    facts = load_model("qwen3-8b")
    a10, h100 = gpus.lookup("A10"), gpus.lookup("H100-80GB")
    # the Triton top-k/top-p buffer: min(next_pow2(min(SMs, R)), SMs) rows of the vocab, f32
    low = profile_run.sampler_phase(facts, num_tokens=2048, max_num_seqs=256, tp=1, gpu=a10)
    high = profile_run.sampler_phase(facts, num_tokens=2048, max_num_seqs=256, tp=1, gpu=h100)
    assert high.bytes - low.bytes == (132 - 72) * facts.vocab_size * 4
    assert profile_run.cublas_workspace(a10)[0] == 8 * 2**20 + 128 * 2**10
    assert profile_run.cublas_workspace(gpus.lookup("B200"))[0] == profile_run.cublas_workspace(h100)[0] == 32 * 2**20
    assert profile_run.cublas_workspace(gpus.lookup("RTX-PRO-6000"))[0] == 32 * 2**20
    # custom all-reduce buffers only where the GPUs are on NVLink
    assert non_torch_bytes(2, h100)[0] == NON_TORCH_MULTI_BYTES
    assert non_torch_bytes(2, gpus.lookup("L40S"))[0] == NON_TORCH_SINGLE_BYTES
    assert non_torch_bytes(1, h100)[0] == NON_TORCH_SINGLE_BYTES
    # the DP ranks of a dense model are independent engines; an MoE model's exchange tokens every layer
    assert non_torch_bytes(1, h100, dp=4, moe=False)[0] == NON_TORCH_SINGLE_BYTES
    assert non_torch_bytes(1, h100, dp=4, moe=True)[0] == NON_TORCH_MULTI_BYTES


def test_the_fp8_experts_default_follows_the_compute_capability():
    fp8 = load_model("deepseek-v3")
    for name, family in (("H100-80GB", "cutlass"), ("B200", "cutlass"), ("A100-80GB", "triton"), ("L40S", "triton"),
                         ("RTX-PRO-6000", "triton")):  # fmt: skip
        assert default_experts_backend(fp8, gpus.lookup(name)).value == family, name
    assert default_experts_backend(load_model("qwen3-30b-a3b"), gpus.lookup("H100-80GB")).value == "triton"


# --- flags: the release's own ---------------------------------------------------------------------------------------

ARG_UTILS = """
from dataclasses import dataclass
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        g = parser.add_argument_group("cache")
        g.add_argument("--swap-space", **cache_kwargs["swap_space"])
        g.add_argument("--enforce-eager", **cache_kwargs["enforce_eager"])
        g.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
        g.add_argument("--tensor-parallel-size", "-tp", type=int)
        g.add_argument("--compilation-config", "-O", type=str)
        parser.add_argument("--disable-log-requests", action="store_true")
"""
CONFIG = """
from typing import Literal
CacheDType = Literal["auto", "fp8", "fp8_e5m2"]
class CacheConfig:
    swap_space: float = 4
    enforce_eager: bool = False
    cache_dtype: CacheDType = "auto"
"""


def test_flags_are_read_from_the_release_source(tmp_path):
    (tmp_path / "vllm" / "engine").mkdir(parents=True)
    (tmp_path / "vllm" / "config").mkdir()
    (tmp_path / "vllm" / "engine" / "arg_utils.py").write_text(ARG_UTILS)
    (tmp_path / "vllm" / "config" / "cache.py").write_text(CONFIG)
    flags = read_flags(tmp_path, "0.9.9")
    assert flags is not None
    assert flags.get("--enforce-eager").arity == flags.get("--no-enforce-eager").arity == "bool"
    assert flags.get("--kv-cache-dtype").choices == ("auto", "fp8", "fp8_e5m2")
    assert flags.get("-tp").dest == "tensor_parallel_size" and flags.optimization_flag == "--compilation-config"
    assert flags.get("--disable-log-requests").arity == "switch"
    # --swap-space is host memory: accepted and listed
    parsed = read_serve(
        ["qwen3-8b", "--swap-space", "16", "--disable-log-requests", "-tp", "2", "--no-enforce-eager"], flags
    )
    assert parsed.ignored == ["--swap-space", "--disable-log-requests"]
    assert (parsed.spec.tensor_parallel_size, parsed.spec.enforce_eager, parsed.spec.approximate) == (2, False, [])
    with pytest.raises(ServeArgsError) as error:
        read_serve(["qwen3-8b", "--kv-cache-dtype", "fp8_e4m3"], flags)
    assert str(error.value) == "vllm serve: --kv-cache-dtype fp8_e4m3: allowed in vLLM 0.9.9: auto, fp8, fp8_e5m2"
    with pytest.raises(ServeArgsError) as error:
        read_serve(["qwen3-8b", "--swap-spac", "4"], flags)
    assert str(error.value) == "vllm serve: flag --swap-spac is not one vLLM 0.9.9 has; closest: --swap-space"
    # -O is this release's --compilation-config (a level): 3, V1's default, changes nothing; 0 compiles nothing and
    # its graphs are not sized
    assert read_serve(["qwen3-8b", "-O3"], flags).spec.approximate == []
    assert read_serve(["qwen3-8b", "-O0"], flags).spec.approximate == [
        "--compilation-config without compilation: its CUDA graphs are not sized"
    ]


@pytest.mark.vllm_wheel
def test_a_real_release_flags(cache_dir):
    from harness.sizing.vllm_source import locate

    source = locate(version="0.29.0", cache_dir=cache_dir)
    flags = read_flags(source.root, source.version)
    assert flags is not None and len(flags.flags) > 250
    assert flags.optimization_flag == "--optimization-level"
    assert {"deepep_low_latency", "deepep_v2", "allgather_reducescatter"} <= set(flags.choices("--all2all-backend"))
    assert {"cutlass", "flashinfer_cutlass", "deep_gemm", "triton"} <= set(flags.choices("--moe-backend"))
    assert flags.get("--port").ref.startswith("entrypoints/")  # the frontend's: no GPU memory
    parsed = read_serve(["deepseek-v3", "-dp", "8", "-ep", "--all2all-backend", "deepep_v2", "--moe-backend",
                         "flashinfer_cutlass", "--port", "8000", "--api-key", "a", "b", "--served-model-name", "x",
                         "--uvicorn-log-level", "debug", "--speculative-config", "{}"], flags)  # fmt: skip
    assert parsed.spec.data_parallel_size == 8 and parsed.spec.enable_expert_parallel
    assert parsed.ignored == ["--port", "--api-key", "--served-model-name", "--uvicorn-log-level"]
    assert parsed.spec.approximate == ["--speculative-config is not sized (it may change GPU memory; "
                                       f"{flags.get('--speculative-config').ref})"]  # fmt: skip
    with pytest.raises(ServeArgsError, match=r"--swap-space is not one vLLM 0\.29\.0 has"):
        read_serve(["deepseek-v3", "--swap-space", "4"], flags)


@pytest.mark.vllm_wheel
def test_cli_an_approximate_plan_does_not_pass(cache_dir):
    args = ("plan", "--vllm-version", "0.29.0", "--gpu", "H100-80GB", "--cache-dir", str(cache_dir), "--json",
            "--fail-on-verdict", "--", "vllm", "serve", "qwen3-8b", "--max-model-len", "8192")  # fmt: skip
    result = run_cli_inproc(*args, "--port", "8000")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ignored_flags"] == ["--port"]
    result = run_cli_inproc(*args, "--cudagraph-capture-sizes", "1", "2", "4")
    assert result.returncode == 1, result.stderr
    (plan,) = json.loads(result.stdout)["deployments"]
    assert plan["verdict"]["outcome"] == "starts"
    assert "approximate: --cudagraph-capture-sizes" in plan["verdict"]["text"]


def test_pipeline_parallel_splits_layers_weights_and_kv():
    assert stage_layers(32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert stage_layers(61, 4) == [(0, 15), (15, 30), (30, 46), (46, 61)]  # the remainder before the last stage
    one = _dense("vllm serve llama-3.1-8b --max-model-len 8192 --gpu-memory-utilization 0.95", version="0.19.0")
    two = _dense("vllm serve llama-3.1-8b --max-model-len 8192 --gpu-memory-utilization 0.95 -pp 2", version="0.19.0")
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token  # 16 of 32 layers
    assert two.setting("pipeline_stage").startswith("1 of 2")  # the last stage: the sampler and the lm_head
    assert two.line("pipeline intermediate tensors").bytes == 2 * 8192 * 4096 * 2
    assert two.group_bytes("weights") < one.group_bytes("weights") * 0.55
    assert two.kv_tokens > 2 * one.kv_tokens


def test_kv_cache_memory_bytes_skips_the_profile():
    plan = _dense("vllm serve qwen3-8b --max-model-len 8192 --kv-cache-memory-bytes 10G")
    assert plan.kv_cache_bytes <= 10 * GIB < plan.kv_cache_bytes + 16 * plan.kv_bytes_per_token
    assert plan.verdict.outcome == "starts"
    too_big = _dense("vllm serve qwen3-8b --max-model-len 8192 --kv-cache-memory-bytes 90G")
    assert too_big.verdict.outcome == "oom" and too_big.verdict.component == "KV cache"


def test_cpu_offload_moves_weights_to_the_host():
    base = _dense("vllm serve qwen3-8b --max-model-len 8192")
    off = _dense("vllm serve qwen3-8b --max-model-len 8192 --cpu-offload-gb 4")
    assert base.group_bytes("weights") - off.group_bytes("weights") == 4 * GIB
    assert off.kv_tokens > base.kv_tokens


def test_max_model_len_auto_takes_what_the_cache_holds():
    plan = _dense("vllm serve qwen3-8b --max-model-len auto --gpu-memory-utilization 0.3")
    facts = load_model("qwen3-8b")
    assert plan.max_model_len == min(facts.max_position_embeddings, plan.kv_tokens)
    assert _dense("vllm serve qwen3-8b --max-model-len -1").max_model_len == facts.max_position_embeddings


@pytest.mark.parametrize(("flags", "graphs"), [
    ("", True), ("--enforce-eager", False), ("-O0", False), ("-O 3", True), ("--optimization-level=2", True),
    ("--compilation-config {\"cudagraph_mode\":\"NONE\"}", False), ("-cc.cudagraph_mode=NONE", False),
])  # fmt: skip
def test_cuda_graph_settings(flags, graphs):
    plan = _dense(f"vllm serve qwen3-8b --max-model-len 8192 {flags}")
    assert (plan.line("CUDA-graph estimate") is not None) == graphs
    assert not plan.approximate


@pytest.mark.parametrize("flags", ["--cudagraph-capture-sizes 1 2 4 8", "--max-cudagraph-capture-size 64",
                                   "--compilation-config {\"cudagraph_mode\":\"PIECEWISE\"}", "-O1",
                                   "--calculate-kv-scales", "--env VLLM_FUSED_MOE_CHUNK_SIZE=1024",
                                   "--num-gpu-blocks-override 1000"])  # fmt: skip
def test_memory_flags_not_sized_make_the_plan_approximate(flags):
    plan = _dense(f"vllm serve qwen3-8b --max-model-len 8192 {flags}")
    assert plan.approximate and "approximate:" in plan.verdict.text
    named = flags.split()[0] if not flags.startswith("--env") else flags.split()[1].split("=")[0]
    assert named.split("=")[0] in plan.verdict.text


def test_graphs_captured_after_the_kv_cache_where_the_release_does_not_estimate_them():
    before = _dense("vllm serve qwen3-8b --max-model-len 8192", version="0.19.0")  # VLLM_MEMORY_PROFILER_... off
    after = _dense("vllm serve qwen3-8b --max-model-len 8192", version="0.30.0")
    assert before.line("CUDA-graph estimate") is None and before.line("CUDA graphs").bytes == CUDAGRAPH_BYTES
    assert before.line("CUDA graphs").group == "after-kv"
    assert after.line("CUDA-graph estimate").group == "cuda-graphs" and after.line("CUDA graphs") is None
    env = read_serve(["qwen3-8b", "--env", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0"])
    assert env.env == {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"} and not env.spec.approximate


def test_flags_without_gpu_memory_and_routed_ones():
    parsed = read_serve(
        [
            "qwen3-8b",
            "--limit-mm-per-prompt",
            '{"image":0}',
            "--disable-hybrid-kv-cache-manager",
            "--dtype",
            "float16",
            "--quantization",
            "fp8",
            "--tokenizer",
            "x",
        ]
    )
    assert parsed.ignored == ["--tokenizer", "--disable-hybrid-kv-cache-manager"]
    assert (parsed.spec.dtype, parsed.spec.quantization) == ("float16", "fp8")
    assert parsed.spec.limit_mm_per_prompt == {"image": 0}  # routed: a multimodal model's tower (vision_tower_built)
    float16 = _dense("vllm serve qwen3-8b --max-model-len 8192 --dtype float16")
    assert not float16.approximate  # two bytes as bfloat16
    float32 = _dense("vllm serve qwen3-8b --max-model-len 8192 --dtype float32")
    assert not float32.approximate  # sized: 4 B weights and KV (harness.sizing.model_config load_model)
    assert float32.group_bytes("weights") > 1.9 * float16.group_bytes("weights")
    assert float32.kv_bytes_per_token == 2 * float16.kv_bytes_per_token


def test_the_openai_servers_module_and_image_forms_read_as_vllm_serve():
    """`python -m vllm.entrypoints.openai.api_server --model M FLAGS` (manifests and older logs) and `docker run ...
    vllm/vllm-openai ARGS` are `vllm serve M FLAGS`: the same flags, the model from --model or the first word;
    another module or image is refused in one line."""
    serve = read_serve(["vllm", "serve", "qwen3-8b", "--tensor-parallel-size", "2", "--max-model-len", "8192"])
    for entry in (["python", "-m"], ["python3", "-m"], ["/usr/bin/python3.12", "-m"]):
        module = read_serve([*entry, "vllm.entrypoints.openai.api_server", "--model", "qwen3-8b",
                             "--tensor-parallel-size", "2", "--max-model-len", "8192"])  # fmt: skip
        assert (module.model, module.spec) == (serve.model, serve.spec)
    with pytest.raises(ServeArgsError, match=r"python -m vllm\.entrypoints\.api_server is not read; allowed"):
        read_serve(["python", "-m", "vllm.entrypoints.api_server", "--model", "qwen3-8b"])
    # `docker run [OPTIONS] vllm/vllm-openai:TAG ARGS`: the image's arguments, its VLLM_ variables as --env
    docker = ["docker", "run", "--gpus", "all", "-v", "/m:/m", "-e", "HF_TOKEN=x", "--env=VLLM_MOE_DP_CHUNK_SIZE=512",
              "--ipc=host", "-p", "8000:8000"]  # fmt: skip
    for image, args in (("vllm/vllm-openai:v0.30.0", ["--model", "qwen3-8b"]), ("vllm/vllm-openai", ["qwen3-8b"])):
        run = read_serve([*docker, image, *args, "--tensor-parallel-size", "2", "--max-model-len", "8192"])
        assert run.model == "qwen3-8b" and run.env == {"VLLM_MOE_DP_CHUNK_SIZE": "512"}
        assert run.spec.model_copy(update={"moe_dp_chunk_size": None}) == serve.spec
    # the shell's environment before the command: the VLLM_ (and other upper-case) names as --env
    prefixed = read_serve(["CUDA_VISIBLE_DEVICES=0,1", "VLLM_MOE_DP_CHUNK_SIZE=512", "vllm", "serve", "qwen3-8b",
                           "--tensor-parallel-size", "2", "--max-model-len", "8192"])  # fmt: skip
    assert prefixed.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_MOE_DP_CHUNK_SIZE": "512"}
    assert prefixed.spec.moe_dp_chunk_size == 512 and prefixed.model == "qwen3-8b"
    assert read_serve(["env", "VLLM_MOE_DP_CHUNK_SIZE=512", "qwen3-8b"]).env == {"VLLM_MOE_DP_CHUNK_SIZE": "512"}
    with pytest.raises(ServeArgsError, match="an image that is not vLLM's OpenAI server"):
        read_serve(["docker", "run", "--gpus", "all", "nvcr.io/nvidia/tritonserver:24.08", "--model", "qwen3-8b"])


def test_a_config_file_of_flags_is_read_as_vllm_reads_it(tmp_path):
    """--config FILE (utils/argparse_utils.py load_config_file): `key: value` is `--key value`, true `--key`, false
    nothing, a mapping its JSON; placed after the model, so a flag on the line wins. A file not here makes the plan
    approximate; a file vLLM would refuse is refused."""
    config = tmp_path / "serve.yaml"
    config.write_text("tensor-parallel-size: 4\nmax_model_len: 8192\nenable-prefix-caching: false\n"
                      "compilation-config:\n  cudagraph_mode: NONE\n")  # fmt: skip
    read = read_serve(["vllm", "serve", "qwen3-8b", "--config", str(config)])
    assert (read.spec.tensor_parallel_size, read.spec.max_model_len) == (4, 8192) and not read.spec.approximate
    assert read_serve(["qwen3-8b", "--config", str(config), "-tp", "2"]).spec.tensor_parallel_size == 2
    plan = _dense(f"vllm serve qwen3-8b --config {config}")
    assert plan.line("CUDA-graph estimate") is None and plan.setting("tensor_parallel_size") == 4
    (tmp_path / "model.yml").write_text("model: qwen3-8b\nmax-num-seqs: 32\n")
    from_file = read_serve(["vllm", "serve", "--config", str(tmp_path / "model.yml")])
    assert from_file.model == "qwen3-8b" and from_file.spec.max_num_seqs == 32
    assert canonical_serve(["vllm", "serve", "--config", str(tmp_path / "model.yml")]) == \
        ["vllm", "serve", "qwen3-8b", "--config", str(tmp_path / "model.yml")]  # fmt: skip
    absent = read_serve(["qwen3-8b", "--config", "/gpu-host/serve.yaml"])
    assert absent.spec.approximate == ["--config /gpu-host/serve.yaml is not on this machine: the flags it holds "
                                       "are not read"]  # fmt: skip
    (tmp_path / "list.yaml").write_text("- tensor-parallel-size\n")
    laughs = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{x}: &{x} [{', '.join(['*' + y] * 10)}]\n" for y, x in zip("abcdefgh", "bcdefghi", strict=True)
    )
    (tmp_path / "laughs.yaml").write_text(laughs + "compilation-config: *i\n")  # 10^9 values once expanded
    for argv, message in (
        (["--config", "serve.json"], "--config serve.json: vLLM reads a .yaml or .yml file of flags"),
        (["--config", str(tmp_path / "list.yaml")], "holds list; allowed: a mapping of flag: value"),
        (["--config", str(config), "--config", str(config)], "--config is given more than once"),
        (["--config", str(tmp_path / "laughs.yaml")], "more than 100000 values once its aliases are expanded"),
    ):
        with pytest.raises(ServeArgsError) as error:
            read_serve(["qwen3-8b", *argv])
        assert message in str(error.value) and "\n" not in str(error.value)


def test_json_group_totals_add_up():
    plan = _dense("vllm serve qwen3-8b --max-model-len 8192")
    totals = plan.group_totals
    assert set(totals) >= {"weights", "profile-peak", "non-torch", "cuda-graphs", "kv-cache", "after-kv"}
    for group, total in totals.items():
        assert total == sum(line.bytes for line in plan.lines if line.group == group)
    assert sum(v for k, v in totals.items() if k not in ("kv-cache", "after-kv")) == plan.non_kv_bytes


# --- EP/DP per release ----------------------------------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_workspace_lifetime_and_dispatchers_per_release(cache_dir):
    from harness.sizing import release_defaults
    from harness.sizing.deployment_plan import layer_scenario
    from harness.sizing.layer import _tree, plan_layer_from
    from harness.sizing.vllm_source import locate
    from harness.sizing.vllm_source.layer_source import ReleaseFiles

    source = locate(version="0.29.0", cache_dir=cache_dir)
    files = ReleaseFiles(source, _tree(source))
    kept = release_defaults.workspace_persistent(files, "0.29.0")
    assert kept.value is True and kept.source.startswith("model_executor/layers/fused_moe/modular_kernel.py:")
    assert release_defaults.workspace_persistent(None, "0.10.1").value is False
    facts = load_model("qwen3-30b-a3b")
    spec = DeploymentSpec(
        model="qwen3-30b-a3b",
        tensor_parallel_size=2,
        data_parallel_size=2,
        enable_expert_parallel=True,
        max_model_len=8192,
        all2all_backend="deepep_low_latency",
    )
    r = resolve(facts, spec, files, "0.29.0", gpu_bytes=H100.total_bytes, gpu=H100)
    layer_plan = plan_layer_from(layer_scenario(facts, r), source)
    layer_workspace = layer_plan.component("workspace").bytes
    plan = plan_deployment(facts, r, layer_plan, version="0.29.0", gpu=H100, total_bytes=H100.total_bytes)
    # TP + EP through a batched all-to-all: every rank of the EP group dispatches (all2all_manager.world_size)
    assert r.num_dispatchers == 4 and layer_scenario(facts, r).parallel.num_dispatchers == 4
    assert plan.line("moe-workspace").bytes == layer_workspace and plan.line("moe-workspace").group == "held-once"
    # through the all-gather dispatch: the DP group's tokens, M = T x DP, half the EP group's
    gather = resolve(facts, spec.model_copy(update={"all2all_backend": "allgather_reducescatter"}), files, "0.29.0",
                     gpu_bytes=H100.total_bytes, gpu=H100)  # fmt: skip
    gather_layer = plan_layer_from(layer_scenario(facts, gather), source)
    gather_plan = plan_deployment(facts, gather, gather_layer, version="0.29.0", gpu=H100, total_bytes=H100.total_bytes)
    assert gather.num_dispatchers == 2
    assert gather_plan.line("moe-workspace").bytes == gather_layer.component("workspace").bytes // 2
    # a release that allocates the workspace per call: it is in the profile's peak, once, and not held
    per_call = plan_deployment(facts, dataclasses.replace(r, workspace_persistent=False), layer_plan,
                               version="0.10.1", gpu=H100, total_bytes=H100.total_bytes)  # fmt: skip
    assert per_call.line("moe-workspace") is None
    assert per_call.line("moe-workspace (per call)").bytes == layer_workspace
    kept_peak = plan.group_bytes("held-once") + plan.group_bytes("profile-peak")
    assert per_call.group_bytes("held-once") + per_call.group_bytes("profile-peak") <= kept_peak


@pytest.mark.vllm_wheel
def test_releases_before_the_all2all_flag_read_it_from_the_environment(cache_dir):
    """vLLM 0.9.2 has no --all2all-backend: envs.py's VLLM_ALL2ALL_BACKEND chooses (default "naive", an all-gather
    dispatch), so `--env VLLM_ALL2ALL_BACKEND=deepep_low_latency` is that release's spelling of the flag; it has no
    batched-DP token default either (8192 stays). Where the flag exists the variable is not sized."""
    from harness.sizing.vllm_source import locate
    from harness.sizing.vllm_source.layer_source import release_files

    facts = load_model("deepseek-r1")
    source = locate(version="0.9.2", cache_dir=cache_dir)
    flags = read_flags(source.root, source.version)
    assert flags is not None and flags.get("--all2all-backend") is None
    files = release_files(source)
    line = ["deepseek-r1", "-dp", "8", "--enable-expert-parallel"]
    default = resolve(facts, read_serve(line, flags).spec, files, "0.9.2", gpu_bytes=H100.total_bytes, gpu=H100)
    setting = next(x for x in default.settings if x.name == "all2all_backend")
    assert setting.value == "naive" and re.fullmatch(r"envs\.py:\d+ VLLM_ALL2ALL_BACKEND .*", setting.source)
    env = read_serve([*line, "--env", "VLLM_ALL2ALL_BACKEND=deepep_low_latency"], flags)
    assert env.spec.all2all_backend == "deepep_low_latency" and not env.spec.approximate
    r = resolve(facts, env.spec, files, "0.9.2", gpu_bytes=H100.total_bytes, gpu=H100)
    assert (r.all2all, r.max_num_batched_tokens) == ("deepep_low_latency", 8192)
    with pytest.raises(ServeArgsError, match="--env VLLM_ALL2ALL_BACKEND=pplxx: allowed: "):
        read_serve([*line, "--env", "VLLM_ALL2ALL_BACKEND=pplxx"], flags)
    newer = locate(version="0.29.0", cache_dir=cache_dir)
    later = read_serve([*line, "--env", "VLLM_ALL2ALL_BACKEND=deepep_low_latency"],
                       read_flags(newer.root, newer.version))  # fmt: skip
    assert later.spec.all2all_backend is None and later.spec.approximate == [
        "--env VLLM_ALL2ALL_BACKEND=deepep_low_latency is not sized"]  # fmt: skip


def test_an_all2all_backend_whose_buffers_are_not_sized_is_approximate():
    facts = load_model("deepseek-v3")
    for backend, approximate in (("deepep_low_latency", False), ("allgather_reducescatter", False),
                                 ("mori_low_latency", True), ("flashinfer_nvlink_one_sided", True)):  # fmt: skip
        spec = DeploymentSpec(model="deepseek-v3", data_parallel_size=8, enable_expert_parallel=True,
                              all2all_backend=backend)  # fmt: skip
        r = resolve(facts, spec, None, "0.30.0", gpu_bytes=H100.total_bytes, gpu=H100)
        assert any(backend in reason for reason in r.approximate) == approximate, backend


def test_a_scenario_plan_takes_any_gpu_of_the_table():
    result = run_cli_inproc("plan", "deepseek-v3-dp32-pr55579", "--gpu", "L40S")
    assert result.returncode == 0, result.stderr
    result = run_cli_inproc("plan", "deepseek-v3-dp32-pr55579", "--gpu", "L40X")
    assert result.returncode == 2 and "closest: L40, L40S" in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]


def test_the_plan_record_round_trips_with_its_version():
    from harness.sizing.deployment import DEPLOYMENT_PLAN_SCHEMA, DeploymentPlan

    plan = _dense("vllm serve /gpu-host/models/Qwen3-8B --max-model-len 8192 --cudagraph-capture-sizes 1 2")
    again = DeploymentPlan.model_validate_json(plan.model_dump_json())
    assert again == plan and again.schema_version == DEPLOYMENT_PLAN_SCHEMA == 4
    assert again.model_source.startswith("/gpu-host/models/Qwen3-8B is not on this machine; read as the preset")
    assert again.approximate == plan.approximate and again.group_totals == plan.group_totals


@pytest.mark.vllm_wheel
def test_the_moe_layers_tokens_per_dp_rank_per_release(cache_dir):
    """FusedMoEConfig.max_num_tokens, as each release's fused_moe/layer.py passes it: 0.19.0 the DP chunk
    (envs.VLLM_MOE_DP_CHUNK_SIZE, 256, or --env), 0.29.0 the scheduler's max_num_batched_tokens."""
    from harness.sizing import release_defaults
    from harness.sizing.layer import _tree
    from harness.sizing.vllm_source import locate
    from harness.sizing.vllm_source.layer_source import ReleaseFiles

    def files(version: str) -> ReleaseFiles:
        source = locate(version=version, cache_dir=cache_dir)
        return ReleaseFiles(source, _tree(source))

    old, new = files("0.19.0"), files("0.29.0")
    chunk = release_defaults.moe_max_num_tokens(old, max_num_batched_tokens=8192, dp=4)
    assert chunk.value == 256 and "VLLM_MOE_DP_CHUNK_SIZE" in chunk.source and "envs.py:" in chunk.source
    given = release_defaults.moe_max_num_tokens(old, max_num_batched_tokens=8192, dp=4, chunk_env=128)
    assert given.value == 128 and "--env VLLM_MOE_DP_CHUNK_SIZE=128" in given.source
    batched = release_defaults.moe_max_num_tokens(new, max_num_batched_tokens=8192, dp=4)
    assert batched.value == 8192 and "max_num_tokens=max_num_batched_tokens" in batched.source
    assert release_defaults.moe_max_num_tokens(old, max_num_batched_tokens=8192, dp=1).value == 8192
    parsed = read_serve(["qwen3-30b-a3b", "-dp", "4", "-ep", "--env", "VLLM_MOE_DP_CHUNK_SIZE=128"])
    assert parsed.spec.moe_dp_chunk_size == 128 and not parsed.spec.approximate


@pytest.mark.parametrize("argv,field,value", [
    ("--cudagraph-capture-sizes 1 2 4", "cudagraph_capture_sizes", [1, 2, 4]),
    ("--max-cudagraph-capture-size 64", "max_cudagraph_capture_size", 64),
    ("--compilation-config {\"cudagraph_mode\":\"full_decode_only\"}", "cudagraph_mode", "FULL_DECODE_ONLY"),
    ("--compilation-config {\"cudagraph_capture_sizes\":[8,16]}", "cudagraph_capture_sizes", [8, 16]),
])  # fmt: skip
def test_graph_settings_reach_the_spec(argv, field, value):
    parsed = read_serve(["qwen3-30b-a3b", *argv.split()])
    assert getattr(parsed.spec, field) == value and not parsed.spec.approximate


@pytest.mark.parametrize("argv,message", [
    ("--max-cudagraph-capture-size x", "--max-cudagraph-capture-size 'x' is not a positive integer"),
    ("--compilation-config {\"cudagraph_mode\":\"BOGUS\"}", "cudagraph_mode 'BOGUS' is not one of NONE, PIECEWISE"),
    ("--compilation-config {\"cudagraph_capture_sizes\":[]}", "cudagraph_capture_sizes is empty"),
])  # fmt: skip
def test_bad_graph_settings_name_the_field(argv, message):
    with pytest.raises(ServeArgsError, match=re.escape(message)):
        read_serve(["qwen3-30b-a3b", *argv.split()])


def test_a_plan_without_a_release_names_the_installed_one(tmp_path):
    """Without --vllm-version the plan is refused in one line; where a vLLM is installed (its package metadata, here
    a dist-info folder on the path) the line names its release as the flag to give."""
    from cli_utils import harness_env, run_harness

    argv = ("plan", "--gpu", "H200-141GB", "--", "vllm", "serve", "qwen3-8b")
    bare = run_harness(*argv)
    assert bare.returncode == 2 and bare.stderr.strip().count("\n") == 0
    assert "needs --vllm-version X.Y.Z, the release you run" in bare.stderr and "installed here" not in bare.stderr
    site = tmp_path / "site"
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.26.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    path = os.pathsep.join((harness_env()["PYTHONPATH"], str(site)))
    installed = run_harness(*argv, env={"PYTHONPATH": path})
    assert installed.returncode == 2 and installed.stderr.strip().count("\n") == 0
    assert "vLLM 0.26.0 is installed here: --vllm-version 0.26.0" in installed.stderr
