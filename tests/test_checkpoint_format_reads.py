"""What a checkpoint format builds beyond its config, read from the release's own files
(harness.sizing.release_defaults): ModelOpt's excluded modules key and its quantized lm_head (modelopt_reads), and
GPTQ's quantized layers listed from the checkpoint's safetensors (gptq_layers_from_checkpoint). Each read flips when
its construct is changed in a copy of the release's files; the plan follows each read; the tables a plan without
release files takes agree with 0.26.0's reads. The real startups of these formats (tests/data/real_startups,
llama-8b-4l-gptq, llama-8b-4l-modelopt-fp8, llama-8b-4l-nvfp4, qwen3-moe-4l-gptq, qwen3-moe-4l-nvfp4) are checked
against vLLM's own figures in tests/test_real_startups.py.

The trees are copies of the cached wheel's extracted files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import release_copies
from harness.sizing import release_defaults as defaults
from harness.sizing.deployment import GIB
from harness.sizing.deployment_plan import plan_source
from harness.sizing.model_config import load_model
from harness.sizing.serve_args import parse_serve
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles
from harness.sizing.vllm_source.sources import default_cache_dir

pytestmark = pytest.mark.vllm_wheel

MODELOPT = defaults.MODELOPT_FILE
AUTO_GPTQ = defaults.GPTQ_FILES[0]
# Llama-3.1-8B's config.json facts (meta-llama/Llama-3.1-8B-Instruct), cut to four layers as the real startups are
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 128256,
         "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
         "model_type": "llama", "tie_word_embeddings": False, "hidden_act": "silu",
         "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}}  # fmt: skip
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
VOCAB_ROWS, HIDDEN = 128256, 4096


@pytest.fixture(scope="module")
def release_026():
    return locate(version="0.26.0", cache_dir=default_cache_dir())


def planted(tmp_path: Path, release, file: str, old: str, new: str) -> ReleaseFiles:
    """The release's checkpoint-format files copied, `old` replaced by `new` in file (release_copies)."""
    files = (MODELOPT, *defaults.GPTQ_FILES, *defaults.AWQ_FILES)
    return release_copies.planted(tmp_path, release.root, files, file, old, new)


def test_0_26_0_reads_and_the_tables_agree(release_026):
    key, lm_head = defaults.modelopt_reads(ReleaseFiles(release_026))
    assert (key.value, lm_head.value) == ("ignore", True)
    assert key.source.startswith("model_executor/layers/quantization/modelopt.py:") and "ignore" in key.source
    assert "ParallelLMHead" in lm_head.source
    listed = defaults.gptq_layers_from_checkpoint(ReleaseFiles(release_026))
    assert listed.value is True and listed.source.startswith("model_executor/layers/quantization/auto_gptq.py:")
    awq = defaults.awq_mixed_precision_kernel(ReleaseFiles(release_026))
    assert awq.value is True and awq.source.startswith("model_executor/layers/quantization/auto_awq.py:")
    assert defaults.awq_mixed_precision_kernel(None).value is True
    table_key, table_lm_head = defaults.modelopt_reads(None)
    assert (table_key.value, table_lm_head.value, defaults.gptq_layers_from_checkpoint(None).value) == \
        ("ignore", True, True)  # fmt: skip
    assert all(d.source.startswith("table:") for d in (table_key, table_lm_head))


def test_each_read_flips_with_its_construct(tmp_path, release_026):
    files = planted(tmp_path / "a", release_026, MODELOPT, 'exclude_modules = config.get("ignore", [])',
                    'exclude_modules = config.get("exclude_modules", [])')  # fmt: skip
    assert defaults.modelopt_reads(files)[0].value == "exclude_modules"
    # the branch that quantizes (the excluded modules' branch still names ParallelLMHead)
    files = planted(tmp_path / "b", release_026, MODELOPT,
                    "(LinearBase, ParallelLMHead)):\n            quant_method = self.LinearMethodCls",
                    "LinearBase):\n            quant_method = self.LinearMethodCls")  # fmt: skip
    assert defaults.modelopt_reads(files)[1].value is False
    files = planted(tmp_path / "c", release_026, AUTO_GPTQ, "metadata = get_safetensors_params_metadata(",
                    "metadata = read_nothing(")  # fmt: skip
    assert defaults.gptq_layers_from_checkpoint(files).value is False
    files = planted(tmp_path / "d", release_026, defaults.AWQ_FILES[0], "kernel_type = choose_mp_linear_kernel(",
                    "kernel_type = pick_a_kernel(")  # fmt: skip
    assert defaults.awq_mixed_precision_kernel(files).value is False


def _model_dir(tmp_path: Path, quant: dict, *, safetensors: bool) -> Path:
    directory = tmp_path / ("with-tensors" if safetensors else "config-only")
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": quant}))
    if safetensors:
        (directory / "model.safetensors").write_bytes(b"")  # its name is all the plan looks at
    return directory


def _plan(directory: Path, source=None, gpu: str = "H200-141GB"):
    _, spec, _ = parse_serve(["vllm", "serve", str(directory), "--max-model-len", "4096"])
    facts = load_model(str(directory))
    return plan_source(facts, spec, source, gpu=gpu, total_bytes=150_109_880_320, version="0.26.0")


def test_awq_on_hopper_keeps_machete_zero_points(tmp_path, release_026):
    """On compute capability 9.0 vLLM 0.26.0's AWQ linears run Machete (the real startup llama-8b-4l-awq: "Using
    MacheteLinearKernel for AutoAWQMarlinLinearMethod"), which keeps the zero points, scales pre-applied, as an
    (in / 128, out) bf16 tensor; on an A100 (8.0) Marlin keeps them packed and adds its workspace."""
    directory = _model_dir(tmp_path, AWQ, safetensors=True)
    hopper, ampere = _plan(directory, release_026), _plan(directory, release_026, gpu="A100-80GB")
    assert {s.name: s.value for s in hopper.settings}["awq_linear_kernel"] == "machete"
    assert "awq_linear_kernel" not in {s.name for s in ampere.settings}
    layer_groups = {"attention": (HIDDEN // 128) * (6144 + 4096),  # qkv (4096 -> 6144), o (4096 -> 4096)
                    "dense MLP": (HIDDEN // 128) * 28672 + (14336 // 128) * 4096}  # fmt: skip
    for name, groups in layer_groups.items():
        workspace = 2 * 132 * 4  # Marlin's per-linear workspace, one int32 per SM, two linears
        extra = 4 * (groups * 2 - groups // 2 - workspace)  # four layers: bf16 zero points for packed int4 ones
        assert hopper.line(name).bytes - ampere.line(name).bytes == extra, name


def test_gptq_from_a_config_only_directory_builds_its_linears_unquantized(tmp_path, release_026):
    """vLLM 0.26.0 lists GPTQ's quantized layers from the directory's safetensors: none there, every linear is
    bf16 (the real startup llama-8b-4l-gptq logs 3.63 GiB, as the unquantized llama-8b-4l)."""
    bare = _plan(_model_dir(tmp_path / "a", GPTQ, safetensors=False), release_026)
    full = _plan(_model_dir(tmp_path / "b", GPTQ, safetensors=True), release_026)
    plain = _plan(_model_dir(tmp_path / "c", {"quant_method": "fp8", "ignored_layers": ["model"]},
                             safetensors=False))  # fmt: skip
    linears = ("attention", "dense MLP")
    assert [bare.line(n).bytes for n in linears] == [plain.line(n).bytes for n in linears]
    assert all(full.line(n).bytes * 3 < bare.line(n).bytes for n in linears)
    setting = {s.name: s for s in bare.settings}["gptq_linears_quantized"]
    assert setting.value is False and "auto_gptq.py" in setting.source and "no *.safetensors" in setting.source
    assert "gptq_linears_quantized" not in {s.name for s in full.settings}
    # listed in the config: quantized whatever the directory holds
    listed = _plan(_model_dir(tmp_path / "d", {**GPTQ, "modules_in_block_to_quantize": [["self_attn.q_proj"]]},
                              safetensors=False), release_026)  # fmt: skip
    assert listed.line("attention").bytes == full.line("attention").bytes


@pytest.mark.parametrize(("quant", "lm_head_quantized"), [
    ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}, False),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}, True),  # not read flat
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}, False),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, True),
])  # fmt: skip
def test_modelopt_lm_head_follows_the_release(tmp_path, release_026, quant, lm_head_quantized):
    plan = _plan(_model_dir(tmp_path, quant, safetensors=False), release_026)
    bf16 = VOCAB_ROWS * HIDDEN * 2
    head = plan.line("embeddings + lm_head").bytes - bf16 - HIDDEN * 2  # less embed, norm
    if not lm_head_quantized:
        assert head == bf16
    elif quant.get("quant_algo") == "NVFP4":  # fp4 pairs, fp8 scales per 16, two f32 globals, Marlin's workspace
        assert VOCAB_ROWS * HIDDEN // 2 + VOCAB_ROWS * HIDDEN // 16 + 8 <= head < VOCAB_ROWS * HIDDEN // 2 * 1.2
    else:  # fp8, one f32 weight scale and one input scale
        assert head == VOCAB_ROWS * HIDDEN + 4 + 4
    assert {s.name: s.value for s in plan.settings}["modelopt_lm_head"] is True
    # no GEMM through cuBLAS when the lm_head is quantized too: the handle's 66 MiB never made
    # (results/h200/cublas-nontorch; the real startups llama-8b-4l-modelopt-fp8 and -nvfp4 log 0.16 GiB)
    non_torch = plan.line("non-torch memory")
    assert non_torch.bytes == int(0.25 * GIB) - (66 * 2**20 if lm_head_quantized else 0)
    assert ("less the cuBLAS handle" in non_torch.source) is lm_head_quantized


def test_the_modelopt_startups_weights_as_vllm_logged():
    """The real startups with ModelOpt FP8 and NVFP4 (their lm_head quantized by 0.26.0) within 0.05 GiB; before the
    release read they were 0.46-0.67 GiB over (the lm_head taken as bf16)."""
    from harness.verify.planning import plan_record
    from harness.verify.record import load_record

    data = Path(__file__).parent / "data" / "real_startups"
    for name in ("llama-8b-4l-modelopt-fp8", "llama-8b-4l-nvfp4", "llama-8b-4l-gptq"):
        record = load_record(data / f"{name}.yaml")
        plan = plan_record(record)
        assert abs(plan.group_bytes("weights") / GIB - record.figures.model_loading_gib) <= 0.05, name
