"""harness.sizing.vllm_source: locating vLLM sources and auditing their batched workspace_shapes without importing vLLM.

Tests marked vllm_wheel fetch real vLLM wheels with pip into a cache shared across runs ($HARNESS_CACHE_DIR, else
~/.cache/moe-harness); the others build small synthetic trees and need nothing from the network.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import pytest

import harness.sizing.vllm_source.cache as cache_module
import harness.sizing.vllm_source.registry as registry_module
import harness.sizing.vllm_source.sources as sources_module
from harness.core.contract import SizingArgs, fixed_shapes, legacy_shapes
from harness.core.errors import HarnessError
from harness.sizing.vllm_source import (
    CONSISTENT,
    DOUBLE_COUNT,
    UNEVALUATED,
    AuditRequest,
    AuditResult,
    VllmSource,
    VllmSourceError,
    audit,
    default_cache_dir,
    locate,
    ops_library,
    release_shapes,
    run_audit,
)

FUSED_MOE = "vllm/model_executor/layers/fused_moe"
LEGACY_DS_V3_BYTES = 120259084288  # 112 GiB: CutlassBatchedExpertsFp8 up to 0.29.0, DS-V3 DP32 E16 T256
FIXED_DS_V3_BYTES = 3758096384  # 3.5 GiB: from 0.30.0


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """One cache for the whole session and across runs, so each release is downloaded once."""
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


@pytest.fixture(scope="session")
def ds_v3_args() -> SizingArgs:
    """DeepSeek-V3 at DP32 with 16 local experts and 256 tokens per rank: the case of vLLM PR #55579."""
    return SizingArgs(
        max_tokens_per_rank=256,
        num_dispatchers=32,
        num_local_experts=16,
        num_global_experts=512,
        hidden_size=7168,
        intermediate_size=2048,
        top_k=8,
    )


@pytest.fixture(scope="session")
def release_audits(cache_dir: Path, ds_v3_args: SizingArgs) -> dict[str, AuditResult]:
    versions = ("0.29.0", "0.30.0")
    return {version: audit(locate(version=version, cache_dir=cache_dir), ds_v3_args) for version in versions}


def by_name(result: AuditResult) -> dict[str, object]:
    return {c.name: c for c in result.classes}


def expected_other_classes(args: SizingArgs) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(ws13, ws2, out) of the other batched classes, written from reading releases 0.29.0 and 0.30.0.

    They size from their own max_num_tokens (T) times num_dispatchers (D), which is M.
    """
    E, T, D, N, K = args.num_local_experts, args.max_tokens_per_rank, args.num_dispatchers, args.N, args.K
    rows = T * D
    return {
        "BatchedTritonExperts": ((E, rows, max(K, N)), (E, rows, N // 2), (E, rows, K)),
        "BatchedDeepGemmExperts": ((E, rows, max(K, N)), (E, rows, N // 2), (E, rows, K)),
        "NaiveBatchedExperts": ((E, rows, K), (rows, N), (E, rows, K)),
        # Marlin's own moe_problem_size gives N = I (marlin_moe_intermediate_size: w2_packed.size(1) * 16).
        "BatchedMarlinExperts": (
            (E * rows, max(K, 2 * args.intermediate_size)),
            (E * rows, args.intermediate_size),
            (E, rows, K),
        ),
        # Uses the M argument; K is not doubled because the stand-in does not use NVFP4 dispatch.
        "FlashInferCuteDSLBatchedExperts": ((E, args.M, K), (E, args.M, N), (E, args.M, K)),
    }


def bytes_of(ws13, ws2, out, dtype_bytes: int = 2) -> int:
    return (max(math.prod(ws13), math.prod(out)) + math.prod(ws2)) * dtype_bytes


# --- real releases -----------------------------------------------------------------------------------------------


@pytest.mark.vllm_wheel
def test_release_0_29_0_double_counts(release_audits, ds_v3_args):
    cutlass = by_name(release_audits["0.29.0"])["CutlassBatchedExpertsFp8"]
    assert cutlass.verdict == DOUBLE_COUNT, cutlass.reason
    assert cutlass.file == "model_executor/layers/fused_moe/experts/cutlass_moe.py"
    assert cutlass.shapes.ws13 == (16, 8192 * 32, 7168)
    assert cutlass.total_bytes == LEGACY_DS_V3_BYTES == legacy_shapes(ds_v3_args).total_bytes
    assert cutlass.shapes.policy == "vllm==0.29.0"
    assert "CutlassBatchedExpertsFp8" in cutlass.shapes.source and "cutlass_moe.py" in cutlass.shapes.source
    assert "M·D" in cutlass.reason
    assert [c.name for c in release_audits["0.29.0"].double_counts] == ["CutlassBatchedExpertsFp8"]


@pytest.mark.vllm_wheel
def test_release_0_30_0_is_fixed(release_audits, ds_v3_args):
    cutlass = by_name(release_audits["0.30.0"])["CutlassBatchedExpertsFp8"]
    assert cutlass.verdict == CONSISTENT, cutlass.reason
    assert cutlass.shapes.ws13 == (16, 8192, 7168)
    assert cutlass.total_bytes == FIXED_DS_V3_BYTES == fixed_shapes(ds_v3_args).total_bytes
    assert release_audits["0.30.0"].double_counts == []


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("version", ["0.29.0", "0.30.0"])
def test_other_batched_classes_are_consistent(release_audits, ds_v3_args, version):
    classes = by_name(release_audits[version])
    expected = expected_other_classes(ds_v3_args)
    for name, (ws13, ws2, out) in expected.items():
        audited = classes[name]
        assert audited.verdict == CONSISTENT, f"{name}: {audited.reason}"
        assert (audited.shapes.ws13, audited.shapes.ws2, audited.shapes.out) == (ws13, ws2, out), name
        assert audited.total_bytes == bytes_of(ws13, ws2, out), name
    # Every batched class is found, and the one that needs the humming library at call time says so.
    assert set(classes) == {*expected, "CutlassBatchedExpertsFp8", "BatchedHummingGroupedExperts"}
    humming = classes["BatchedHummingGroupedExperts"]
    assert humming.verdict == UNEVALUATED and humming.shapes is None and "humming" in humming.reason


@pytest.mark.vllm_wheel
def test_release_shapes(cache_dir, ds_v3_args):
    legacy = release_shapes("0.29.0", ds_v3_args, cache_dir=cache_dir)
    fixed = release_shapes("0.30.0", ds_v3_args, cache_dir=cache_dir)
    assert legacy.total_bytes == legacy_shapes(ds_v3_args).total_bytes
    assert fixed.total_bytes == fixed_shapes(ds_v3_args).total_bytes
    assert (fixed.ws13, fixed.ws2, fixed.out) == (
        fixed_shapes(ds_v3_args).ws13,
        fixed_shapes(ds_v3_args).ws2,
        fixed_shapes(ds_v3_args).out,
    )
    assert fixed.policy == "vllm==0.30.0" and "CutlassBatchedExpertsFp8" in fixed.source


@pytest.mark.vllm_wheel
def test_release_source_metadata(cache_dir):
    source = locate(version="0.29.0", cache_dir=cache_dir)
    assert source.kind == "release" and source.version == "0.29.0"
    assert source.torch_requirement == "torch==2.13.0"
    assert source.root == cache_dir / "vllm" / "0.29.0" / "release"
    assert (source.root / FUSED_MOE / "experts" / "cutlass_moe.py").is_file()
    # Only the fused-MoE sources were kept; the wheel itself was deleted.
    assert not list((cache_dir / "vllm" / "0.29.0").glob("wheel/*.whl"))
    # Of the engine, only the parser the serve-line flags are read from (harness.sizing.release_flags).
    assert sorted(p.name for p in (source.root / "vllm" / "engine").iterdir()) == ["arg_utils.py"]
    # Of the worker, only Worker.load_model's file (harness.sizing.release_defaults.load_max_split_size).
    assert sorted(p.name for p in (source.root / "vllm" / "v1" / "worker").iterdir()) == ["gpu_worker.py"]
    assert not (source.root / "vllm" / "attention").exists()


@pytest.mark.vllm_wheel
def test_second_locate_reuses_the_cache(cache_dir, monkeypatch):
    first = locate(version="0.30.0", cache_dir=cache_dir)
    manifest = first.root / "manifest.json"
    mtime_before = manifest.stat().st_mtime_ns

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the release is cached")

    monkeypatch.setattr(registry_module.subprocess, "run", no_pip)
    second = locate(version="0.30.0", cache_dir=cache_dir)
    assert second == first
    assert manifest.stat().st_mtime_ns == mtime_before


@pytest.mark.vllm_wheel
def test_wheel_file_and_ops_library(cache_dir, tmp_path, ds_v3_args, monkeypatch):
    """The release's wheel file, verified and kept in the shared cache: fetched at most once per cache, then read
    from there (a second run downloads nothing)."""
    kept = locate(version="0.30.0", cache_dir=cache_dir, keep_wheel=True)
    (wheel,) = (cache_dir / "vllm" / "0.30.0" / "wheel").glob("vllm-0.30.0-*.whl")
    # The download was checked against the index's published sha256, which is the one the harness pinned.
    pinned = cache_module.PINNED_WHEELS["0.30.0"]
    assert cache_module.sha256_file(wheel) == pinned.wheel_sha256
    manifest = cache_module.CacheManifest.model_validate_json((kept.root / "manifest.json").read_text())
    assert (manifest.wheel_sha256, manifest.record.sha256) == (pinned.wheel_sha256, pinned.record_sha256)
    assert manifest.wheel_sha256_checked_against == "index" and manifest.schema_version == 3
    cutlass_file = next(f for f in manifest.hashes if f.path.endswith("experts/cutlass_moe.py"))
    assert cutlass_file.sha256 == cache_module.sha256_file(kept.root / cutlass_file.path)

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the release and its wheel are cached")

    with monkeypatch.context() as patched:
        patched.setattr(registry_module.subprocess, "run", no_pip)
        assert locate(version="0.30.0", cache_dir=cache_dir, keep_wheel=True) == kept

    # The kept file is a wheel like any other: a sizing-only entry of it has no ops library, one with_ops has it.
    sized = locate(wheel=wheel, cache_dir=tmp_path)
    assert sized.ops_library is None
    with pytest.raises(VllmSourceError, match=r"vllm 0\.30\.0 .*no compiled ops library.*torch==2\.13\.0"):
        ops_library(sized)
    from_wheel = locate(wheel=wheel, cache_dir=tmp_path, with_ops=True)
    assert from_wheel.kind == "wheel" and from_wheel.version == "0.30.0"
    assert from_wheel.torch_requirement == "torch==2.13.0"
    assert str(wheel.resolve()) in from_wheel.origin
    assert ops_library(from_wheel).name == "_C_stable_libtorch.abi3.so"
    assert ops_library(from_wheel).stat().st_size > 10_000_000
    cutlass = by_name(audit(from_wheel, ds_v3_args))["CutlassBatchedExpertsFp8"]
    assert cutlass.verdict == CONSISTENT and cutlass.total_bytes == FIXED_DS_V3_BYTES


@pytest.mark.vllm_wheel
def test_release_that_does_not_exist(tmp_path):
    with pytest.raises(VllmSourceError) as raised:
        locate(version="0.0.999", cache_dir=tmp_path)
    message = str(raised.value)
    assert "0.0.999" in message and "could not download" in message
    assert "Traceback" not in message
    assert not (tmp_path / "vllm" / "0.0.999").exists()
    # The attempt is logged where scripts/test.sh counts downloads: one line, naming the release.
    (line,) = (tmp_path / cache_module.DOWNLOAD_LOG_NAME).read_text().splitlines()
    assert json.loads(line)["version"] == "0.0.999"


@pytest.mark.vllm_wheel
@pytest.mark.parametrize(("version", "exit_code"), [("0.29.0", 1), ("0.30.0", 0)])
def test_run_audit_json(cache_dir, fake_scenarios, capsys, version, exit_code):
    assert run_audit(AuditRequest(vllm_version=version, cache_dir=cache_dir, json=True)) == exit_code
    report = json.loads(capsys.readouterr().out)
    assert report["vllm_version"] == version
    assert report["sizing"]["M"] == 8192 and report["source"]["kind"] == "release"
    cutlass = next(c for c in report["classes"] if c["name"] == "CutlassBatchedExpertsFp8")
    assert cutlass["verdict"] == ("double-count" if exit_code else "consistent")
    assert cutlass["total_bytes"] == (LEGACY_DS_V3_BYTES if exit_code else FIXED_DS_V3_BYTES)
    for entry in report["classes"]:
        assert {"name", "file", "verdict", "total_bytes", "ws13", "ws2", "out", "reason"} <= set(entry)


@pytest.mark.vllm_wheel
def test_run_audit_table(cache_dir, fake_scenarios, capsys):
    assert run_audit(AuditRequest(vllm_version="0.29.0", cache_dir=cache_dir)) == 1
    shown = capsys.readouterr().out
    assert "# vllm 0.29.0" in shown and "T=256 D=32 M=8192" in shown
    assert "double-count" in shown and "112.00" in shown and "32.00" in shown
    assert shown.rstrip().splitlines()[-1].startswith("FAILED: 1 of 7")
    assert run_audit(AuditRequest(vllm_version="0.30.0", cache_dir=cache_dir)) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("OK: none of 7")


# --- run_audit without a network ---------------------------------------------------------------------------------


class FakeScenarioError(Exception):
    pass


@pytest.fixture
def fake_scenarios(monkeypatch, ds_v3_args, tmp_path):
    """Stand in for harness.scenario.schema, so these tests do not depend on the scenario loader."""
    module = types.ModuleType("harness.scenario.schema")
    module.SCENARIOS_DIR = tmp_path / "scenarios"
    module.ScenarioError = FakeScenarioError
    loaded: list[Path] = []

    def load_scenario(path):
        loaded.append(Path(path))
        if Path(path).name == "broken.yaml":
            raise FakeScenarioError(f"{path}: num_dispatchers (0) must be at least 1")
        return types.SimpleNamespace(sizing_args=lambda: ds_v3_args)

    module.load_scenario = load_scenario
    monkeypatch.setitem(sys.modules, "harness.scenario.schema", module)
    return loaded


def test_run_audit_default_scenario_and_src(fake_scenarios, synthetic_tree, capsys):
    assert run_audit(AuditRequest(vllm_src=synthetic_tree, json=True)) == 1
    assert fake_scenarios == [fake_scenarios[0]] and fake_scenarios[0].name == "deepseek-v3-dp32-pr55579.yaml"
    report = json.loads(capsys.readouterr().out)
    assert report["vllm_version"] == "0.9.9"
    assert {c["name"]: c["verdict"] for c in report["classes"]} == SYNTHETIC_VERDICTS


def test_run_audit_scenario_error(fake_scenarios, synthetic_tree, capsys):
    # The command raises; harness.cli.main shows it as `harness: error: MESSAGE` and exits with its code.
    with pytest.raises(HarnessError) as refused:
        run_audit(AuditRequest(vllm_src=synthetic_tree, scenario="broken.yaml"))
    assert capsys.readouterr().out == ""
    assert refused.value.exit_code == 2
    assert str(refused.value) == "broken.yaml: num_dispatchers (0) must be at least 1"


def test_run_audit_source_error(fake_scenarios, tmp_path):
    with pytest.raises(HarnessError) as refused:
        run_audit(AuditRequest(vllm_src=tmp_path))
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert message.startswith("--vllm-src") and "is not a vLLM tree" in message and len(message.splitlines()) == 1


def test_real_default_scenario(ds_v3_args):
    """The audit's default scenario sizes the PR case."""
    from harness.scenario import schema as scenario

    path = Path(scenario.SCENARIOS_DIR) / "deepseek-v3-dp32-pr55579.yaml"
    assert scenario.load_scenario(path).sizing_args() == ds_v3_args


# --- synthetic trees: older API shapes, inheritance, unevaluable classes ------------------------------------------

# Written for these tests in the style of older vLLM releases: `activation_formats` as a property returning a pair,
# `workspace_shapes(a, aq, M, ...)` reading padded M from aq and returning a dtype as a fourth item.
SYNTHETIC_MODULES = {
    "modular_kernel.py": """
        from enum import Enum

        class FusedMoEActivationFormat(Enum):
            Standard = "standard"
            BatchedExperts = "batched"

        class ExpertsBase:
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                raise NotImplementedError

        class BatchedBase(ExpertsBase):
            @property
            def activation_formats(self) -> tuple[FusedMoEActivationFormat, FusedMoEActivationFormat]:
                return (FusedMoEActivationFormat.BatchedExperts, FusedMoEActivationFormat.BatchedExperts)
    """,
    "cutlass_moe.py": """
        import torch
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk

        class OldCutlassBatched(mk.ExpertsBase):
            @property
            def activation_formats(self) -> tuple[mk.FusedMoEActivationFormat, mk.FusedMoEActivationFormat]:
                return (mk.FusedMoEActivationFormat.BatchedExperts, mk.FusedMoEActivationFormat.BatchedExperts)

            def workspace_shapes(self, a: torch.Tensor, aq: torch.Tensor, M: int, N: int, K: int, topk: int,
                                 global_num_experts: int, local_num_experts: int, expert_tokens_meta=None):
                slots = aq.size(1)
                dispatchers = self.num_dispatchers
                first = (self.max_experts_per_worker, slots * dispatchers, max(N, K))
                second = (self.max_experts_per_worker, slots * dispatchers, max(N // 2, K))
                return (first, second, (self.max_experts_per_worker, slots, K), self.out_dtype or a.dtype)

        class OldCutlassStandard(mk.ExpertsBase):
            @property
            def activation_formats(self):
                return (mk.FusedMoEActivationFormat.Standard, mk.FusedMoEActivationFormat.Standard)

            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                return ((M * topk, N), (M * topk, N // 2), (M, K))
    """,
    "batched_base.py": """
        from vllm.model_executor.layers.fused_moe.modular_kernel import BatchedBase
        from vllm.platforms import current_platform

        class InheritsBatched(BatchedBase):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                rows = self.max_num_tokens * self.num_dispatchers
                E = local_num_experts
                return ((E, rows, max(N, K)), (E, rows, N // 2), (E, rows, K))

        class NeedsPlatform(BatchedBase):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                if current_platform.is_cuda():
                    return ((M,), (M,), (M,))
                return ((0,), (0,), (M, K))

        class SquaresTokens(BatchedBase):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                return ((M * M, K), (M, N), (M, K))

        class AbstractBatched(BatchedBase):
            pass
    """,
    "utils.py": """
        SLOT_ALIGNMENT = 1

        def slots_per_expert(max_num_tokens, num_dispatchers):
            return max_num_tokens * num_dispatchers * SLOT_ALIGNMENT
    """,
    "helper_user.py": """
        from vllm.model_executor.layers.fused_moe.batched_base import InheritsBatched
        from vllm.model_executor.layers.fused_moe.utils import slots_per_expert

        class UsesImportedHelper(InheritsBatched):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                rows = slots_per_expert(self.max_num_tokens, self.num_dispatchers)
                return ((local_num_experts * rows, K), (local_num_experts * rows, N // 2), (local_num_experts, M, K))
    """,
}
SYNTHETIC_VERDICTS = {
    "OldCutlassBatched": "double-count",
    "UsesImportedHelper": "consistent",
    "InheritsBatched": "consistent",
    "NeedsPlatform": "unevaluated",
    "SquaresTokens": "unevaluated",
}


@pytest.fixture
def synthetic_tree(tmp_path) -> Path:
    root = tmp_path / "vllm-src"
    package = root / FUSED_MOE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, text in SYNTHETIC_MODULES.items():
        (package / name).write_text(textwrap.dedent(text))
    (root / "vllm" / "_version.py").write_text("__version__ = version = '0.9.9'\n")
    (root / "requirements").mkdir()
    (root / "requirements" / "cuda.txt").write_text("# pins\ntorch==2.7.1\nnumba == 0.61\n")
    return root


def test_synthetic_tree_verdicts(synthetic_tree, ds_v3_args):
    source = locate(src=synthetic_tree)
    assert (source.kind, source.version, source.torch_requirement) == ("src", "0.9.9", "torch==2.7.1")
    assert source.ops_library is None
    result = audit(source, ds_v3_args)
    classes = by_name(result)
    assert {name: c.verdict for name, c in classes.items()} == SYNTHETIC_VERDICTS
    old = classes["OldCutlassBatched"]
    assert old.total_bytes == legacy_shapes(ds_v3_args).total_bytes
    assert old.file == "model_executor/layers/fused_moe/cutlass_moe.py"
    inherited = classes["InheritsBatched"]
    assert inherited.shapes.ws13 == (16, 8192, 7168) and inherited.shapes.policy == "vllm==0.9.9"
    assert "current_platform" in classes["NeedsPlatform"].reason
    assert "batched_base.py line" in classes["NeedsPlatform"].reason
    assert "ws13 x4 with D and x4 with T" in classes["SquaresTokens"].reason


def test_src_accepts_the_package_directory(synthetic_tree):
    assert locate(src=synthetic_tree / "vllm").root == synthetic_tree.resolve()


# --- locating: error paths ------------------------------------------------------------------------------------------


def test_directory_that_is_not_a_vllm_tree(tmp_path):
    (tmp_path / "vllm").mkdir()
    with pytest.raises(VllmSourceError) as raised:
        locate(src=tmp_path)
    message = str(raised.value)
    assert str(tmp_path) in message and "is not a vLLM tree" in message
    assert "vllm/model_executor/layers/fused_moe" in message


def test_missing_directory(tmp_path):
    with pytest.raises(VllmSourceError, match="no such directory"):
        locate(src=tmp_path / "absent")


def test_garbage_wheel(tmp_path):
    wheel = tmp_path / "vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(os.urandom(4096))
    with pytest.raises(VllmSourceError, match=r"is not a readable wheel"):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")


def make_wheel(path: Path, members: dict[str, bytes], *, record: bool = True) -> Path:
    """A wheel as pip builds one: the members, then a .dist-info/RECORD of their sha256 (urlsafe base64) and sizes."""
    lines = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        dist_info = next((n.split("/")[0] for n in members if n.endswith(".dist-info/METADATA")), None)
        if record and dist_info is not None:
            archive.writestr(f"{dist_info}/RECORD", "\n".join([*lines, f"{dist_info}/RECORD,,"]) + "\n")
    return path


METADATA = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.9\nRequires-Dist: torch==2.7.1\n"


def test_wheel_with_a_corrupted_member(tmp_path):
    body = textwrap.dedent(SYNTHETIC_MODULES["cutlass_moe.py"]).encode() * 50
    wheel = make_wheel(
        tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl",
        {"vllm-0.9.9.dist-info/METADATA": METADATA, f"{FUSED_MOE}/cutlass_moe.py": body},
    )
    data = bytearray(wheel.read_bytes())
    start = data.index(b"cutlass_moe.py") + 40  # inside the compressed member, past its local header
    data[start : start + 64] = bytes(64)
    wheel.write_bytes(bytes(data))
    with pytest.raises(VllmSourceError, match="is damaged"):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.partial-*"))


def test_zip_that_is_not_a_vllm_wheel(tmp_path):
    wheel = make_wheel(tmp_path / "other-1.0-py3-none-any.whl", {"other/__init__.py": b""})
    with pytest.raises(VllmSourceError, match="is not a vLLM wheel"):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")


def test_synthetic_wheel_is_extracted_and_reused(tmp_path, synthetic_tree, ds_v3_args):
    members = {
        "vllm-0.9.9.dist-info/METADATA": METADATA,
        "vllm/engine/huge.py": b"x = 1\n",
        "vllm/engine/arg_utils.py": b"class EngineArgs:\n    pass\n",
        "vllm/v1/worker/gpu_worker.py": b"x = 1\n",
        "vllm/v1/worker/gpu_model_runner.py": b"x = 1\n",
    }
    for path in (synthetic_tree / FUSED_MOE).rglob("*.py"):
        members[path.relative_to(synthetic_tree).as_posix()] = path.read_bytes()
    wheel = make_wheel(tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl", members)
    source = locate(wheel=wheel, cache_dir=tmp_path / "cache")
    assert source.kind == "wheel" and source.version == "0.9.9" and source.torch_requirement == "torch==2.7.1"
    assert source.root.parent == tmp_path / "cache" / "vllm" / "0.9.9"
    # Of the engine, only the parser the serve-line flags are read from (harness.sizing.release_flags).
    assert sorted(p.name for p in (source.root / "vllm" / "engine").iterdir()) == ["arg_utils.py"]
    # Of the worker, only Worker.load_model's file (harness.sizing.release_defaults.load_max_split_size).
    assert sorted(p.name for p in (source.root / "vllm" / "v1" / "worker").iterdir()) == ["gpu_worker.py"]
    assert not (source.root / "vllm" / "attention").exists()
    assert {c.name: c.verdict for c in audit(source, ds_v3_args).classes} == SYNTHETIC_VERDICTS
    assert locate(wheel=wheel, cache_dir=tmp_path / "cache") == source
    with pytest.raises(VllmSourceError, match=r"vllm 0\.9\.9 .*no compiled ops library.*torch==2\.7\.1"):
        ops_library(source)


def test_missing_wheel_file(tmp_path):
    with pytest.raises(VllmSourceError, match="no such file"):
        locate(wheel=tmp_path / "vllm-1.0.whl", cache_dir=tmp_path)


def test_version_that_is_not_a_version(tmp_path):
    with pytest.raises(VllmSourceError, match="'latest' is not a version number"):
        locate(version="latest", cache_dir=tmp_path)


def test_more_than_one_source(tmp_path):
    with pytest.raises(VllmSourceError, match="at most one"):
        locate(version="0.30.0", src=tmp_path)


def test_no_installed_vllm(monkeypatch):
    if importlib.util.find_spec("vllm") is None:
        # The real lookup, where this Python has no vLLM (as on CPU-only CI).
        with pytest.raises(VllmSourceError, match="no vLLM is installed"):
            locate()
    monkeypatch.setattr(sources_module, "_find_installed_spec", lambda: None)
    with pytest.raises(VllmSourceError) as raised:
        locate()
    message = str(raised.value)
    assert "no vLLM is installed" in message
    assert "--vllm-version" in message and "--vllm-wheel" in message and "--vllm-src" in message


def test_installed_vllm_is_found_without_import(monkeypatch, synthetic_tree):
    spec = types.SimpleNamespace(submodule_search_locations=[str(synthetic_tree / "vllm")])
    monkeypatch.setattr(sources_module, "_find_installed_spec", lambda: spec)
    source = locate()
    assert source.kind == "installed" and source.root == synthetic_tree
    assert "vllm" not in sys.modules


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("HARNESS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "moe-harness"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "moe-harness"


def test_ops_library_of_a_built_tree(synthetic_tree):
    library = synthetic_tree / "vllm" / "_C.abi3.so"
    library.write_bytes(b"\x7fELF")
    source = locate(src=synthetic_tree)
    assert ops_library(source) == library.resolve()
    with pytest.raises(VllmSourceError, match="no compiled ops library"):
        ops_library(dataclasses.replace(source, ops_library=None))


def test_audit_result_json_shape(synthetic_tree, ds_v3_args):
    report = audit(locate(src=synthetic_tree), ds_v3_args).to_json()
    assert set(report) >= {"vllm_version", "source", "sizing", "classes"}
    assert report["source"]["kind"] == "src"
    json.dumps(report)  # plain data only
    classes = {c["name"]: c for c in report["classes"]}
    assert all(c["reason"] for c in classes.values())
    # A call that failed has no shapes; one that ran but fits neither rule keeps its shapes for the reader.
    assert classes["NeedsPlatform"]["total_bytes"] is None and classes["NeedsPlatform"]["ws13"] is None
    assert classes["SquaresTokens"]["ws13"] == [8192 * 8192, 7168]


def test_vllm_source_is_a_frozen_dataclass(synthetic_tree):
    source = locate(src=synthetic_tree)
    assert isinstance(source, VllmSource)
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.version = "1.0"


def _locate_in_child(wheel: str, cache: str) -> str:
    return str(locate(wheel=Path(wheel), cache_dir=Path(cache)).root)


def test_concurrent_extractions_agree(tmp_path, synthetic_tree):
    """Ranks of one node may locate the same wheel at once; every one of them gets a complete extraction."""
    import concurrent.futures
    import multiprocessing

    members = {"vllm-0.9.9.dist-info/METADATA": METADATA}
    for path in (synthetic_tree / FUSED_MOE).rglob("*.py"):
        members[path.relative_to(synthetic_tree).as_posix()] = path.read_bytes() * 200
    wheel = make_wheel(tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl", members)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        roots = list(pool.map(_locate_in_child, [str(wheel)] * 8, [str(tmp_path / "cache")] * 8))
    assert len(set(roots)) == 1
    assert (Path(roots[0]) / "manifest.json").is_file()
    assert not list((tmp_path / "cache").rglob("*.partial-*"))


# --- the interpreter's subset, on a synthetic tree whose every method has a known result ---------------------------

SUBSET_MODULES = {
    "modular_kernel.py": """
        class FusedMoEActivationFormat:
            Standard = "standard"
            BatchedExperts = "batched"

        class ExpertsBase:
            SCALE = 3
            DOUBLE_SCALE = SCALE * 2  # a class attribute computed from an earlier one, in the class's own scope

            @staticmethod
            def activation_format():
                return FusedMoEActivationFormat.BatchedExperts

            @staticmethod
            def adjust_N_for_activation(N, activation):
                return N if not activation.is_gated else N // 2

            @classmethod
            def kind(cls):
                return "batched"

            @property
            def slots(self):
                return self.max_num_tokens * self.num_dispatchers
    """,
    "activation.py": """
        from enum import Enum

        class MoEActivation(Enum):
            SILU = "silu"
    """,
    "utils.py": """
        BLOCK = 64
        DOUBLE_BLOCK = BLOCK * 2

        def padded(rows, block=BLOCK):
            return round_up(rows, block)

        if SOME_FLAG:
            OPTIONAL = 1

        from vllm.utils.math_utils import round_up
    """,
    "subset.py": """
        import math
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.utils import BLOCK, DOUBLE_BLOCK, OPTIONAL, padded
        from vllm.utils.math_utils import cdiv

        class EveryConstruct(mk.ExpertsBase):
            \"\"\"Uses most of the subset; every line's result is checked by the shapes it returns.\"\"\"

            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                                 activation=MoEActivation.SILU):
                E, rows = local_num_experts, self.slots
                assert rows == M, f"rows {rows} != M {M}"
                total = 0
                for i in range(4):
                    if i == 3:
                        break
                    total += i
                else:
                    total = -1
                dims = [d for d in (E, rows, max(N, K)) if d > 0]
                by_name = {"E": E, **{"rows": rows}}
                out = (by_name["E"], by_name.get("rows"), K if total == 3 else -1)
                first, *rest = dims
                assert isinstance(first, int) and isinstance(activation, str)
                assert getattr(self, "missing", None) is None and hasattr(self, "slots") and not hasattr(self, "nope")
                assert self.kind() == "batched" and self.SCALE == 3 and self.DOUBLE_SCALE == 6
                assert DOUBLE_BLOCK == 2 * BLOCK
                assert padded(rows) == cdiv(rows, BLOCK) * BLOCK == math.prod((cdiv(rows, BLOCK), BLOCK))
                assert activation.is_gated and activation.value == "silu"
                act = self.adjust_N_for_activation(N, activation)
                ws2 = (E, rows, act if act > K else K)
                return (tuple([first, *rest]), ws2, out)

        class UsesSuper(EveryConstruct):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                                 activation=MoEActivation.SILU):
                ws13, ws2, out = super().workspace_shapes(
                    M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta, activation=activation
                )
                return ws13, ws2, out[:2] + (out[2],)

        class FailsAssert(EveryConstruct):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                assert self.num_dispatchers == 1, f"needs one dispatcher, has {self.num_dispatchers}"
                return ((M,), (M,), (M,))

        class ReadsOptional(EveryConstruct):
            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                return ((M * OPTIONAL,), (M,), (M,))

        class PropertyWins(EveryConstruct):
            @property
            def num_dispatchers(self):
                return 1

            def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta):
                return ((self.slots, K), (self.slots, N), (self.slots, K))
    """,
}


@pytest.fixture
def subset_tree(tmp_path) -> Path:
    root = tmp_path / "subset-src"
    package = root / FUSED_MOE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, text in SUBSET_MODULES.items():
        (package / name).write_text(textwrap.dedent(text))
    return root


def test_interpreter_subset(subset_tree, ds_v3_args):
    classes = by_name(audit(locate(src=subset_tree), ds_v3_args))
    E, M, K, T = 16, 8192, 7168, 256
    for name in ("EveryConstruct", "UsesSuper"):
        audited = classes[name]
        assert audited.verdict == CONSISTENT, f"{name}: {audited.reason}"
        assert (audited.shapes.ws13, audited.shapes.ws2, audited.shapes.out) == ((E, M, K), (E, M, K), (E, M, K))
    failed = classes["FailsAssert"]
    assert failed.verdict == UNEVALUATED
    line = line_of(SUBSET_MODULES["subset.py"], "assert self.num_dispatchers == 1")
    assert failed.reason == f"workspace_shapes failed an assert: needs one dispatcher, has 32 (subset.py line {line})"
    optional = classes["ReadsOptional"]
    assert optional.verdict == UNEVALUATED and "'OPTIONAL'" in optional.reason and "top-level if/try" in optional.reason
    # The release's property num_dispatchers = 1 wins over the stand-in's D = 32, as in Python: slots = T.
    assert classes["PropertyWins"].shapes.ws13 == (T, K)


def line_of(text: str, snippet: str) -> int:
    """The 1-based line of snippet in a module text as written to the tree."""
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if snippet in line)


def test_call_method_and_function(subset_tree):
    """The evaluator API other sizing code builds on: any method or module function, by keyword."""
    from harness.sizing.vllm_source.evaluate import SourceTree
    from harness.sizing.vllm_source.interpreter import Budget, Unevaluable

    tree = SourceTree(locate(src=subset_tree))
    utils = f"{FUSED_MOE}/utils.py"
    assert tree.call_function(utils, "padded", arguments={"rows": 100}) == 128
    assert tree.call_function(utils, "padded", arguments={"rows": 100, "block": 10}) == 100
    (cls,) = tree.class_named("EveryConstruct")
    attributes = {"max_num_tokens": 8, "num_dispatchers": 4}
    assert tree.call_method(cls, "slots", attributes=attributes) == 32  # a property reads as its value
    assert tree.call_method(cls, "adjust_N_for_activation", attributes={}, arguments={
        "N": 10, "activation": tree_activation("silu_no_mul")}) == 10  # fmt: skip
    with pytest.raises(Unevaluable, match=r"reads self.num_dispatchers, which the stand-in self does not carry"):
        tree.call_method(cls, "slots", attributes={"max_num_tokens": 8})
    with pytest.raises(Unevaluable, match=r"exceeded the step budget of 5 evaluated AST nodes"):
        tree.call_function(utils, "padded", arguments={"rows": 100}, budget=Budget(max_steps=5))


def tree_activation(name: str):
    from harness.sizing.vllm_source.interpreter import Activation

    return Activation(name)


# --- the cache: fetched against the index's hash, checked on every use ----------------------------------------------

CUTLASS_FILE = f"{FUSED_MOE}/cutlass_moe.py"


@pytest.fixture
def wheel_entry(tmp_path, synthetic_tree) -> tuple[Path, Path, Path]:
    """A synthetic wheel extracted into a fresh cache: (the wheel, the cache directory, the entry)."""
    members = {"vllm-0.9.9.dist-info/METADATA": METADATA}
    for path in (synthetic_tree / FUSED_MOE).rglob("*.py"):
        members[path.relative_to(synthetic_tree).as_posix()] = path.read_bytes()
    wheel = make_wheel(tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl", members)
    cache = tmp_path / "cache"
    return wheel, cache, locate(wheel=wheel, cache_dir=cache).root


def _swap_for_link(root: Path) -> None:
    (root / CUTLASS_FILE).unlink()
    (root / CUTLASS_FILE).symlink_to(root / FUSED_MOE / "utils.py")


def _bad_field(root: Path) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["hashes"][0]["sha256"] = "not-a-hash"
    (root / "manifest.json").write_text(json.dumps(manifest))


TAMPERING = {
    "a changed file": (
        lambda root: (root / CUTLASS_FILE).write_text((root / CUTLASS_FILE).read_text() + "# changed\n"),
        f"holds {CUTLASS_FILE}, which changed after extraction",
    ),
    "an extra file": (
        lambda root: (root / FUSED_MOE / "planted.py").write_text("x = 1\n"),
        f"holds {FUSED_MOE}/planted.py, which its manifest does not list",
    ),
    "a missing file": (lambda root: (root / CUTLASS_FILE).unlink(), f"lacks {CUTLASS_FILE}, which its manifest lists"),
    "a file swapped for a link": (_swap_for_link, f"holds {CUTLASS_FILE}, which is not a regular file"),
    "a garbage manifest": (
        lambda root: (root / "manifest.json").write_bytes(b"\xff\xfe{" * 20),
        "has a manifest.json that cannot be read (UnicodeDecodeError)",
    ),
    "a manifest with a bad field": (_bad_field, "has a manifest that does not parse (hashes.0.sha256: String should"),
    "no manifest": (lambda root: (root / "manifest.json").unlink(), "has no manifest.json"),
    "a file anyone may write": (lambda root: (root / CUTLASS_FILE).chmod(0o666), "which anyone may write"),
}


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_tampered_entry_is_refused(wheel_entry, tampering):
    wheel, cache, root = wheel_entry
    tamper, says = TAMPERING[tampering]
    tamper(root)
    with pytest.raises(VllmSourceError) as raised:
        locate(wheel=wheel, cache_dir=cache)
    message = str(raised.value)
    assert says in message, message
    assert message.startswith(f"cache entry {root} ") and f"delete {root} (rm -r)" in message
    assert len(message.splitlines()) == 1


def test_consistent_forgery_of_a_wheel_entry_is_refused(wheel_entry):
    """Files, RECORD and manifest rewritten to agree, as by someone who read cache.py: the wheel's own RECORD
    still tells."""
    from vllm_cache_utils import entry_files, forge_entry

    wheel, cache, root = wheel_entry
    files = entry_files(root) | {CUTLASS_FILE: b"class Planted:\n    pass\n"}
    forge_entry(root, files, kind="wheel", version="0.9.9", wheel_sha256=cache_module.sha256_file(wheel))
    with pytest.raises(VllmSourceError, match=rf"^cache entry {root} was not extracted from {wheel}; .* delete"):
        locate(wheel=wheel, cache_dir=cache)


def test_entry_of_an_older_schema_is_extracted_again(wheel_entry):
    wheel, cache, root = wheel_entry
    (root / "manifest.json").write_text(json.dumps({"schema": 1, "version": "0.9.9", "files": []}))
    (root / CUTLASS_FILE).write_text("planted = 1\n")
    assert locate(wheel=wheel, cache_dir=cache).root == root
    assert (root / CUTLASS_FILE).read_text() == textwrap.dedent(SYNTHETIC_MODULES["cutlass_moe.py"])
    assert json.loads((root / "manifest.json").read_text())["schema_version"] == 3


def test_wheel_member_that_does_not_match_its_record(tmp_path, synthetic_tree):
    members = {"vllm-0.9.9.dist-info/METADATA": METADATA, CUTLASS_FILE: b"x = 1\n"}
    wheel = make_wheel(tmp_path / "vllm-0.9.9-cp38-abi3-linux_x86_64.whl", members)
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr(f"{FUSED_MOE}/added_later.py", b"y = 2\n")  # in the zip, not in its RECORD
    with pytest.raises(VllmSourceError, match=rf"{FUSED_MOE}/added_later.py is not in the wheel's RECORD"):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")
    without_record = make_wheel(tmp_path / "vllm-0.9.8-cp38-abi3-linux_x86_64.whl", members, record=False)
    with pytest.raises(VllmSourceError, match=r"is not a valid wheel: it has no vllm-\*\.dist-info/RECORD"):
        locate(wheel=without_record, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.py"))


def test_kept_wheel_that_is_not_the_published_one_is_refused(tmp_path):
    kept = tmp_path / "vllm" / "0.30.0" / "wheel"
    kept.mkdir(parents=True)
    members = {"vllm-0.30.0.dist-info/METADATA": METADATA.replace(b"0.9.9", b"0.30.0"), CUTLASS_FILE: b"x = 1\n"}
    planted = make_wheel(kept / "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl", members)
    with pytest.raises(VllmSourceError) as raised:
        locate(version="0.30.0", cache_dir=tmp_path)
    pinned = cache_module.PINNED_WHEELS["0.30.0"].wheel_sha256
    assert f"kept wheel {planted} has sha256 {cache_module.sha256_file(planted)}, not vllm==0.30.0's {pinned}" in str(
        raised.value
    )
    assert f"delete {planted}" in str(raised.value)
    assert not (tmp_path / "vllm" / "0.30.0" / "release").exists()


def test_pinned_release_whose_index_hash_changed_is_not_downloaded(tmp_path, monkeypatch):
    """Fault injection: the index (or a mirror in front of it) answers another hash for a pinned release."""
    monkeypatch.setattr(registry_module, "published_sha256", lambda version, scratch: "0" * 64)
    with pytest.raises(VllmSourceError) as raised:
        locate(version="0.30.0", cache_dir=tmp_path)
    pinned = cache_module.PINNED_WHEELS["0.30.0"].wheel_sha256
    assert str(raised.value) == (
        f"the index publishes sha256 {'0' * 64} for vllm==0.30.0, not the {pinned} the harness pinned; refusing the "
        "download"
    )
    assert not (tmp_path / "vllm").exists() or not any((tmp_path / "vllm").rglob("*"))


@pytest.mark.vllm_wheel
@pytest.mark.parametrize("version", ["0.29.0", "0.30.0"])
def test_published_hashes_are_the_pinned_ones(tmp_path, version):
    published = registry_module.published_sha256(version, tmp_path / "target")
    assert published == cache_module.PINNED_WHEELS[version].wheel_sha256
    assert not (tmp_path / "target").exists()


def test_older_harness_code_accepts_the_entries(wheel_entry):
    """Code from before the hashes reads `schema` 1, the `layer_files` mark and `files` as paths; it keeps
    accepting the new entries, so a shared cache is not re-extracted back and forth."""
    _, _, root = wheel_entry
    data = json.loads((root / "manifest.json").read_text())
    assert data["schema"] == 1 and data["layer_files"] is True and data["schema_version"] == 3
    assert data["files"] and all(isinstance(path, str) and (root / path).is_file() for path in data["files"])
    older_fields = ("version", "kind", "origin", "wheel_name", "wheel_sha256", "wheel_bytes", "torch_requirement",
                    "ops_library_in_wheel", "ops_extracted")  # fmt: skip
    assert set(older_fields) <= set(data)
