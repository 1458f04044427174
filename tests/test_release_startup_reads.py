"""Three startup mechanisms read from each release's own files (harness.sizing.release_defaults): DeepGEMM started at
the model's build (deep_gemm_workspace_at_load), the load's max_split_size (load_max_split_size) and the Triton MXFP4
backend's Hopper padding (mxfp4_hopper_padding), per cached release; each answer flips when its construct is changed
in a copy of the release's files; the tables a plan without release files takes agree with the reads.

The trees are copies of the cached wheels' extracted files, edited at test time; nothing of vLLM is committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import release_copies
from harness.core.units import MIB
from harness.sizing import release_defaults as defaults
from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles
from harness.sizing.vllm_source.sources import default_cache_dir

pytestmark = pytest.mark.vllm_wheel

# release: (DeepGEMM started at the build, the load's max_split_size, (values' rows x bytes, scale-group multiple) on
# compute capability 9.0), as each release's files say
READ = {
    "0.8.5": (False, None, None),  # no vendored triton_kernels, no mxfp4_utils.py: the table answers
    "0.19.0": (False, None, ((64, 64), 1)),
    "0.26.0": (True, 20 * MIB, ((16, 32), 4)),
    "0.29.0": (True, 20 * MIB, ((16, 32), 4)),
    "0.30.0": (True, 20 * MIB, ((16, 32), 4)),
    "0.33.0": (True, 20 * MIB, ((16, 32), 4)),
}
QUANT_FILE = "vllm/model_executor/layers/quantization/input_quant_fp8.py"
DEEP_GEMM_FILE = "vllm/utils/deep_gemm.py"
VENDORED_FILE = "vllm/third_party/deep_gemm/__init__.py"
WORKER_FILE = "vllm/v1/worker/gpu_worker.py"
HOPPER_FILE = "vllm/third_party/triton_kernels/tensor_details/layout_details/hopper_value.py"
MXFP4_FILE = "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py"
READ_FILES = (QUANT_FILE, DEEP_GEMM_FILE, VENDORED_FILE, WORKER_FILE, HOPPER_FILE, MXFP4_FILE)


def release_files(version: str) -> ReleaseFiles:
    return ReleaseFiles(locate(version=version, cache_dir=default_cache_dir()))


@pytest.fixture(scope="module")
def release_026():
    return locate(version="0.26.0", cache_dir=default_cache_dir())


def planted(tmp_path: Path, release, file: str, old: str, new: str) -> ReleaseFiles:
    """The files these reads take copied from the release, `old` replaced by `new` in file (release_copies)."""
    return release_copies.planted(tmp_path, release.root, READ_FILES, file, old, new)


@pytest.mark.parametrize("version", sorted(READ))
def test_each_release_read_from_its_files(version):
    started, split, padding = READ[version]
    files = release_files(version)
    deep_gemm = defaults.deep_gemm_workspace_at_load(version, files)
    assert deep_gemm.value is started and deep_gemm.from_source, deep_gemm
    if started:
        assert deep_gemm.source.startswith("model_executor/layers/quantization/input_quant_fp8.py:"), deep_gemm
        assert "QuantFP8.__init__" in deep_gemm.source and "utils/deep_gemm.py:" in deep_gemm.source
        assert "if current_platform.is_arch_support_pdl()" in deep_gemm.source, deep_gemm
    load = defaults.load_max_split_size(version, files)
    assert load.value == split and load.source.startswith("v1/worker/gpu_worker.py:"), load
    assert "Worker.load_model" in load.source
    align, groups, source = defaults.mxfp4_hopper_padding(version, 9, files)
    if padding is None:
        assert source.startswith("table: ") and (align, groups) == ((64, 64), 1), source
    else:
        assert (align, groups) == padding and "table" not in source, source
        assert "hopper_value.py:" in source and "utils/mxfp4_utils.py:" in source, source
        assert defaults.mxfp4_hopper_padding(version, 10, files)[:2] == (padding[0], 1)  # 9.0 only


@pytest.mark.parametrize("version", sorted(READ))
def test_the_table_agrees_with_each_read(version):
    """A plan without release files (the table) gets what the release's files say."""
    files = release_files(version)
    assert (
        defaults.deep_gemm_workspace_at_load(version).value
        is defaults.deep_gemm_workspace_at_load(version, files).value
    )
    assert defaults.load_max_split_size(version).value == defaults.load_max_split_size(version, files).value
    for capability in (9, 10):
        table = defaults.mxfp4_hopper_padding(version, capability)
        assert table[2].startswith("table: swizzled values padded to"), table
        assert table[:2] == defaults.mxfp4_hopper_padding(version, capability, files)[:2]


def test_the_vendored_hopper_value_layout_is_one_file_from_0_26_0(release_026):
    """The 16 x 32 read in 0.26.0 holds in the later releases because they vendor the same file."""
    text = (release_026.root / HOPPER_FILE).read_bytes()
    for version in ("0.29.0", "0.30.0", "0.33.0"):
        assert (locate(version=version, cache_dir=default_cache_dir()).root / HOPPER_FILE).read_bytes() == text


# --- each construct changed in a copy of 0.26.0 ------------------------------------------------------------------


def test_an_unchanged_copy_reads_as_the_release(tmp_path, release_026):
    files = planted(tmp_path, release_026, WORKER_FILE, "max_split_size_mb=20),", "max_split_size_mb=20),")
    assert defaults.deep_gemm_workspace_at_load("0.26.0", files).value is True
    assert defaults.load_max_split_size("0.26.0", files).value == 20 * MIB
    assert defaults.mxfp4_hopper_padding("0.26.0", 9, files)[:2] == ((16, 32), 4)


@pytest.mark.parametrize(("file", "old", "new", "why"), [
    (QUANT_FILE, "is_deep_gemm_e8m0_used() if use_ue8m0 is None else use_ue8m0", "bool(use_ue8m0)",
     "QuantFP8.__init__ does not call is_deep_gemm_e8m0_used()"),
    (DEEP_GEMM_FILE, "        _apply_pdl(_dg, True)\n", "        pass\n", "_lazy_init calls no set_pdl"),
    (VENDORED_FILE, "    set_pdl,\n", "", "__init__.py has no set_pdl"),
])  # fmt: skip
def test_deep_gemm_chain_broken_in_a_copy(tmp_path, release_026, file, old, new, why):
    assert defaults.deep_gemm_workspace_at_load("0.26.0", release_files("0.26.0")).value is True
    read = defaults.deep_gemm_workspace_at_load("0.26.0", planted(tmp_path, release_026, file, old, new))
    assert read.value is False and why in read.source, read


def test_load_max_split_changed_in_a_copy(tmp_path, release_026):
    old = "self._scoped_allocator_max_split(max_split_size_mb=20),"
    read = defaults.load_max_split_size("0.26.0", planted(tmp_path / "64", release_026, WORKER_FILE, old,
                                                          old.replace("=20", "=64")))  # fmt: skip
    assert read.value == 64 * MIB and "max_split_size_mb=64" in read.source, read
    read = defaults.load_max_split_size("0.26.0", planted(tmp_path / "none", release_026, WORKER_FILE, old, ""))
    assert read.value is None and "sets no max_split_size" in read.source, read


def test_mxfp4_padding_changed_in_a_copy(tmp_path, release_026):
    tiles = planted(tmp_path / "tiles", release_026, HOPPER_FILE, "scott_trick = (2, 1)", "scott_trick = (4, 1)")
    assert defaults.mxfp4_hopper_padding("0.26.0", 9, tiles)[:2] == ((32, 32), 4)
    shape = "        init_shape = data.shape\n\n"  # 0.19.0's pre-pad, planted with 64 x 128
    prepad = planted(tmp_path / "prepad", release_026, HOPPER_FILE, shape,
                     shape[:-1] + "        SWIZZLE_ALIGN_M = 64\n        SWIZZLE_ALIGN_K = 128\n\n")  # fmt: skip
    assert defaults.mxfp4_hopper_padding("0.26.0", 9, prepad)[:2] == ((64, 128), 4)
    eight = planted(tmp_path / "eight", release_026, MXFP4_FILE, "pad_k = -K % 4", "pad_k = -K % 8")
    assert defaults.mxfp4_hopper_padding("0.26.0", 9, eight)[:2] == ((16, 32), 8)
    none = planted(tmp_path / "none", release_026, MXFP4_FILE, "pad_k = -K % 4", "pad_k = 0")
    align, groups, source = defaults.mxfp4_hopper_padding("0.26.0", 9, none)
    assert (align, groups) == ((16, 32), 1) and "pads no scale groups" in source, source


# --- a plan takes what the release's files say -------------------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data" / "real_startups"


@pytest.mark.parametrize(("version", "started"), [("0.19.0", False), ("0.30.0", True), ("0.33.0", True)])
def test_a_plan_reads_the_release_it_plans(version, started):
    """The real 0.26.0 startups' FP8 Llama and gpt-oss, planned for another release with its files: the DeepGEMM
    workspace, the load's split limit and the MXFP4 padding as that release's files say, and named in the settings."""
    from harness.verify.planning import plan_record
    from harness.verify.record import load_record

    def plan(name: str):
        return plan_record(load_record(DATA / f"{name}.yaml"), version=version, release=True,
                           cache_dir=default_cache_dir())  # fmt: skip

    fp8 = plan("llama-8b-4l-fp8tensor")
    settings = {s.name: s for s in fp8.settings}
    workspace = sum(line.bytes for line in fp8.lines if line.name == "DeepGEMM cuBLASLt workspace")
    assert workspace == (defaults.DEEP_GEMM_CUBLASLT_WORKSPACE if started else 0)
    assert settings["deep_gemm_at_load"].value is started and not settings["deep_gemm_at_load"].source.startswith(
        "table"
    )
    assert settings["load_max_split_size"].value == (20 * MIB if started else "none")
    assert settings["load_max_split_size"].source.startswith("v1/worker/gpu_worker.py:")
    padding = {s.name: s for s in plan("gpt-oss-4l").settings}["mxfp4_swizzle_padding"]
    assert padding.value == ("16 x 32, scale groups x 4" if started else "64 x 64, scale groups x 1"), padding
    assert "hopper_value.py:" in padding.source and "table" not in padding.source, padding
