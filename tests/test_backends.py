"""The backend declarations (harness.core.backends) are the one source: every declared name has an
implementation and no implementation lacks a declaration; the CLI's choices and help, the schema's allowed values,
the schema reference, the fit check and the rank's selection all answer from them, with the declared reasons."""

from __future__ import annotations

import argparse
import typing

import pytest
import torch

from cli_utils import run_cli_inproc
from harness.cli import build_parser
from harness.core.backends import AUTO, COMM, EXPERTS, KINDS, BackendQuery
from harness.rank import comm as rank_comm
from harness.rank import experts as rank_experts
from harness.scenario.doc import schema_markdown
from harness.scenario.fit import Machine, can_run
from harness.scenario.schema import Scenario, ScenarioError
from scenario_utils import tiny

CPU2 = BackendQuery(device_type="cpu", num_ranks=2, num_local_experts=8)
GPU1 = BackendQuery(device_type="cuda", num_ranks=1, num_local_experts=8)
GPU2 = BackendQuery(device_type="cuda", num_ranks=2, num_local_experts=8)


def test_every_declared_backend_has_one_implementation_of_that_name():
    assert set(rank_experts.IMPLEMENTATIONS) == set(EXPERTS.names) == {"reference", "torch-cutlass", "vllm-ops"}
    assert set(rank_comm.IMPLEMENTATIONS) == set(COMM.names) == {"symm-mem", "nccl", "gloo"}
    for name, cls in rank_experts.IMPLEMENTATIONS.items():
        assert cls.name == name
    for name, impl in rank_comm.IMPLEMENTATIONS.items():
        assert impl.cls.name == name


def _option(parser: argparse.ArgumentParser, command: str, flag: str) -> argparse.Action:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if flag in a.option_strings)


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_choices_and_help_come_from_the_declarations(command):
    parser = build_parser()
    for flag, kind in (("--experts-backend", EXPERTS), ("--comm", COMM)):
        action = _option(parser, command, flag)
        assert tuple(action.choices) == kind.choices == (AUTO, *kind.names)
        for backend in kind.backends:
            assert f"{backend.name} ({backend.description})" in (action.help or "")
        assert kind.auto_text() in (action.help or "")


def test_schema_allows_exactly_the_declared_names_and_lists_them_when_refusing():
    for kind in KINDS:
        assert typing.get_args(Scenario.model_fields[kind.field].annotation) == kind.choices
        quoted = ", ".join(f"'{n}'" for n in kind.choices[:-1]) + f" or '{kind.choices[-1]}'"
        with pytest.raises(ScenarioError) as refused:
            tiny(**{kind.field: "mystery"})
        lines = str(refused.value).splitlines()
        assert len(lines) == 1 and kind.field in lines[0] and "(got 'mystery')" in lines[0] and quoted in lines[0]
    reference = schema_markdown()
    for kind in KINDS:
        for backend in kind.backends:
            assert f"| `{kind.field}` | `{backend.name}` | {', '.join(backend.devices)} |" in reference


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.field)
def test_fit_refuses_exactly_what_the_declarations_refuse(kind, device_type):
    machine = Machine(num_cpus=64, num_gpus=2, description="test", cpu_memory_bytes=2**40, gpu_memory_bytes=2**40)
    other = {"experts_backend": "reference", "comm": "auto"}
    query = BackendQuery(device_type=device_type, num_ranks=2, num_local_experts=8)
    refused = set()
    for name in kind.choices:
        scenario = tiny(**{**other, kind.field: name, "device": device_type})
        reason = can_run(scenario, device_type=device_type, machine=machine)
        assert reason == kind.reason(name, query), name
        if reason is not None:
            refused.add(name)
    assert refused == {("experts_backend", "cpu"): {"torch-cutlass", "vllm-ops"}, ("experts_backend", "cuda"): set(),
                       ("comm", "cpu"): {"symm-mem", "nccl"}, ("comm", "cuda"): {"gloo"}}[kind.field, device_type]


def test_each_declared_reason_reads_as_one_line_naming_field_value_and_what_is_allowed():
    assert EXPERTS.reason("torch-cutlass", CPU2) == (
        "experts_backend torch-cutlass needs GPUs (device cuda); allowed on 2 cpu ranks: auto, reference")
    assert EXPERTS.reason("vllm-ops", CPU2) == (
        "experts_backend vllm-ops needs GPUs (device cuda); allowed on 2 cpu ranks: auto, reference")
    assert COMM.reason("nccl", CPU2) == "comm nccl needs GPUs (device cuda); allowed on 2 cpu ranks: auto, gloo"
    assert COMM.reason("gloo", GPU2) == (
        "comm gloo needs CPU ranks (device cpu); allowed on 2 cuda ranks: auto, symm-mem, nccl")
    assert COMM.reason("symm-mem", GPU1) is None  # torch's CUDA symmetric memory runs at world size 1
    fp16 = BackendQuery(device_type="cuda", num_ranks=1, num_local_experts=8, workspace_dtype="float16")
    assert COMM.reason("symm-mem", fp16) == (  # its push kernels combine bf16 rows
        "comm symm-mem takes model.workspace_dtype bfloat16 only, not float16; allowed on 1 cuda rank: auto, nccl")
    assert COMM.reason("symm-mem", GPU2) is None and COMM.reason("mpi", GPU2) == (
        "comm 'mpi' is not one of auto, symm-mem, nccl, gloo")
    gelu = BackendQuery(device_type="cpu", num_ranks=2, num_local_experts=8, activation="gelu")
    silu_only = "experts_backend reference computes silu only, not model.activation gelu"
    assert EXPERTS.reason("reference", gelu) == silu_only
    assert EXPERTS.reason(AUTO, gelu) == (
        f"experts_backend auto: none of vllm-ops, torch-cutlass, reference can run this: {silu_only}")
    e5m2 = BackendQuery(device_type="cuda", num_ranks=2, num_local_experts=8, quant_dtype="float8_e5m2")
    assert EXPERTS.reason("torch-cutlass", e5m2) == (
        "experts_backend torch-cutlass takes model.quant_dtype float8_e4m3fn only, not float8_e5m2")
    fp32 = BackendQuery(device_type="cpu", num_ranks=2, num_local_experts=8, workspace_dtype="float32")
    assert EXPERTS.reason("reference", fp32) == (
        "experts_backend reference takes model.workspace_dtype bfloat16, float16 only, not float32")


def test_auto_orders_are_the_declared_ones():
    assert [b.name for b in EXPERTS.auto_order] == ["vllm-ops", "torch-cutlass", "reference"]
    assert [b.name for b in COMM.auto_order] == ["symm-mem", "nccl", "gloo"]
    assert [b.name for b in COMM.auto_candidates(GPU1)] == ["symm-mem", "nccl"]  # one GPU too
    assert [b.name for b in COMM.auto_candidates(CPU2)] == ["gloo"]
    assert [b.name for b in EXPERTS.auto_candidates(CPU2)] == ["reference"]


def test_selection_on_a_cpu_rank_reads_the_declarations():
    cpu = torch.device("cpu")
    assert rank_experts.select_backend(AUTO, cpu, CPU2).name == "reference"
    assert rank_experts.select_backend("reference", cpu, CPU2).name == "reference"
    for name in ("torch-cutlass", "vllm-ops"):
        with pytest.raises(rank_experts.BackendUnavailable) as refused:
            rank_experts.select_backend(name, cpu, CPU2)
        assert str(refused.value) == EXPERTS.reason(name, CPU2)
    with pytest.raises(rank_experts.BackendUnavailable, match="'cutlass' is not one of auto, reference, torch-cutlass"):
        rank_experts.select_backend("cutlass", cpu, CPU2)
    name, why = rank_comm.resolve_comm(AUTO, device_type="cpu", num_local_experts=8, num_ranks=2)
    assert name == "gloo" and why == ("auto: gloo, the first of symm-mem, nccl, gloo that runs here (not symm-mem: "
                                      "needs GPUs (device cuda); not nccl: needs GPUs (device cuda))")
    for comm in ("symm-mem", "nccl"):
        assert rank_comm.unavailable_reason(comm, device_type="cpu", num_local_experts=8,
                                            num_ranks=2) == COMM.reason(comm, CPU2)


def test_run_with_a_gpu_experts_backend_on_cpu_is_the_declared_line_and_exit_2(tmp_path):
    done = run_cli_inproc("run", "smoke", "--device", "cpu", "--experts-backend", "torch-cutlass", "--out",
                          str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(EXPERTS.reason("torch-cutlass", CPU2) or "?"), lines
    assert not (tmp_path / "out").exists()
