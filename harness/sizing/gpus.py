"""The NVIDIA GPUs vLLM deployments run on: what the deployment model needs of each, with a source per row.

    total_bytes     what vLLM divides by gpu_memory_utilization: torch.cuda.mem_get_info's total (the CUDA
                    context's view, a few hundred MiB under NVML's), as torch or vLLM printed it on that GPU
                    (`total_kind` "torch"); where no such print was found, NVML's or the datasheet's total
                    (`total_kind` "nvml" / "datasheet"), which overstates what vLLM sees, and the plan says so
    num_sms         the Triton top-k/top-p sampler's program count (harness.sizing.profile_run)
    capability      (major, minor): the cuBLAS workspace, the default experts backend (CUTLASS FP8 grouped GEMM
                    needs 9.0 or 10.x: vLLM's cutlass_group_gemm_supported), FlashInfer/TRT-LLM kernels
    interconnect    "nvlink": GPUs of one host on NVLink/NVSwitch (vLLM's custom all-reduce registers its IPC
                    buffers, NCCL sets up NVLink channels); "pcie": none (custom all-reduce disabled beyond two
                    GPUs, vLLM's custom_all_reduce.py `_is_full_nvlink`)

SMs, compute capability and nominal memory are NVIDIA's datasheet figures for the SKU (the source column names
the page); a `--gpu-memory-gib X [--gpu-sms N] [--gpu-capability M.m]` stands for any GPU not listed here.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal

from harness.core.errors import BadInput
from harness.core.units import GIB, MIB

TotalKind = Literal["torch", "nvml", "datasheet", "given"]
Interconnect = Literal["nvlink", "pcie"]


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    total_bytes: int
    total_kind: TotalKind
    num_sms: int
    capability: tuple[int, int]
    interconnect: Interconnect
    source: str
    aliases: tuple[str, ...] = ()

    @property
    def total_is_measured(self) -> bool:
        """True when the total is what torch/vLLM reported on this GPU (not a datasheet or NVML figure)."""
        return self.total_kind in ("torch", "given")

    @property
    def describe(self) -> str:
        return (f"{self.name}: {self.total_bytes / GIB:.2f} GiB ({self.total_kind}), {self.num_sms} SMs, compute "
                f"capability {self.capability[0]}.{self.capability[1]}, {self.interconnect}")  # fmt: skip


def _gib(value: float) -> int:
    return round(value * GIB)


def _mib(value: int) -> int:
    return value * MIB


_NV = "https://www.nvidia.com/en-us/data-center"
# The rows. `torch`: a total that torch or vLLM printed on that GPU (URL). `nvml`: nvidia-smi's MiB total (URL).
# `datasheet`: the SKU's nominal GB taken as GiB, as HBM
# sizes are (the B200's "180 GB" is 178.35 GiB to torch), from NVIDIA's page: an upper bound on what torch sees.
GPUS: tuple[Gpu, ...] = (
    Gpu(name="A10", total_bytes=_mib(23028), total_kind="nvml", num_sms=72, capability=(8, 6), interconnect="pcie",
        source="nvidia-smi 23028 MiB (github.com/modal-labs/modal-client/pull/2797); GA102, 72 SMs, sm_86 "
        f"({_NV}/products/a10-gpu/)"),
    Gpu(name="A10G", total_bytes=_mib(23028), total_kind="nvml", num_sms=80, capability=(8, 6), interconnect="pcie",
        source="AWS G5's A10G: 24 GB GDDR6, 80 SMs, sm_86 (aws.amazon.com/ec2/instance-types/g5/); nvidia-smi total "
        "taken as the A10's 23028 MiB (same 24 GB board memory)"),
    Gpu(name="A30", total_bytes=_gib(23.53), total_kind="torch", num_sms=56, capability=(8, 0), interconnect="pcie",
        source="torch: 'GPU 0 has a total capacty of 23.53 GiB' on an A30 (github.com/google/RB-Modulation/issues/5);"
        f" 56 SMs, sm_80 ({_NV}/products/a30-gpu/)"),
    Gpu(name="A40", total_bytes=_mib(46068), total_kind="nvml", num_sms=84, capability=(8, 6), interconnect="pcie",
        source=f"48 GB GDDR6 with ECC, 84 SMs, sm_86 ({_NV}/a40/); nvidia-smi 46068 MiB as the other 48 GB "
        "boards (L40S, github.com/modal-labs/modal-client/pull/2797)"),
    Gpu(name="L4", total_bytes=_mib(23034), total_kind="nvml", num_sms=58, capability=(8, 9), interconnect="pcie",
        source=f"nvidia-smi 23034 MiB (github.com/modal-labs/modal-client/pull/2797); 58 SMs, sm_89 ({_NV}/l4/)"),
    Gpu(name="L40", total_bytes=_gib(44.40), total_kind="torch", num_sms=142, capability=(8, 9), interconnect="pcie",
        source="torch: 'GPU 0 has a total capacity of 44.40 GiB' on one L40 (github.com/QwenLM/Qwen3-VL/issues/2097); "
        f"142 SMs, sm_89 ({_NV}/l40/)"),
    Gpu(name="L40S", total_bytes=_mib(46068), total_kind="nvml", num_sms=142, capability=(8, 9), interconnect="pcie",
        source=f"nvidia-smi 46068 MiB (github.com/modal-labs/modal-client/pull/2797); 142 SMs, sm_89 ({_NV}/l40s/)"),
    Gpu(name="A100-40GB", total_bytes=_gib(39.50), total_kind="torch", num_sms=108, capability=(8, 0),
        interconnect="nvlink", aliases=("A100-SXM4-40GB", "A100-SXM-40GB"),
        source="torch: 'GPU 0 has a total capacity of 39.50 GiB' on an A100 40GB (github.com/TianheWu/CoSeR/issues/"
        f"10); 108 SMs, sm_80, SXM4 on NVLink ({_NV}/a100/)"),
    Gpu(name="A100-PCIe-40GB", total_bytes=_gib(39.50), total_kind="torch", num_sms=108, capability=(8, 0),
        interconnect="pcie", aliases=("A100-PCIE-40GB",),
        source="the A100 40GB's torch total (github.com/TianheWu/CoSeR/issues/10); 108 SMs, sm_80, PCIe "
        f"({_NV}/a100/)"),
    Gpu(name="A100-80GB", total_bytes=_gib(79.14), total_kind="torch", num_sms=108, capability=(8, 0),
        interconnect="nvlink", aliases=("A100-SXM4-80GB", "A100-SXM-80GB"),
        source="torch: 'GPU 0 has a total capacity of 79.14 GiB' on an A100 80GB (github.com/lianqi1008/Control-GIC/"
        f"issues/6); NVML 81920 MiB; 108 SMs, sm_80, SXM4 on NVLink ({_NV}/a100/)"),
    Gpu(name="A100-PCIe-80GB", total_bytes=_gib(79.14), total_kind="torch", num_sms=108, capability=(8, 0),
        interconnect="pcie", aliases=("A100-PCIE-80GB", "A100-80GB-PCIe"),
        source=f"the A100 80GB's torch total (github.com/lianqi1008/Control-GIC/issues/6); 108 SMs, sm_80, PCIe "
        f"({_NV}/a100/)"),
    Gpu(name="H100-80GB", total_bytes=_gib(79.19), total_kind="torch", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("H100-SXM", "H100-SXM5-80GB", "H100"),
        source="vLLM 0.19.0's worker snapshot total_memory=79.19GiB (llm-d-planner's H100 logs, tests/data/"
        f"startup_logs); NVML 81559 MiB; 132 SMs, sm_90, SXM5 on NVSwitch ({_NV}/h100/)"),
    Gpu(name="H100-PCIe", total_bytes=_mib(81559), total_kind="nvml", num_sms=114, capability=(9, 0),
        interconnect="pcie", aliases=("H100-PCIE-80GB",),
        source=f"80 GB HBM2e, 114 SMs, sm_90, PCIe ({_NV}/h100/); NVML total taken as the SXM's 81559 MiB"),
    Gpu(name="H100-NVL", total_bytes=_mib(95830), total_kind="nvml", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("H100-94GB", "H100-NVL-94GB"),
        source=f"94 GB HBM3, 132 SMs, sm_90, NVLink bridge pairs ({_NV}/h100/); NVML 95830 MiB (the harness's "
        "GPU_MEMORY_BYTES H100-94GB)"),
    Gpu(name="H800", total_bytes=_mib(81559), total_kind="nvml", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("H800-80GB",),
        source="the H100 SXM5's export variant: 80 GB HBM3, 132 SMs, sm_90; eight on NVLink (NV8 in vLLM's "
        "collect_env on H800s, github.com/vllm-project/vllm/issues/40755); NVML total taken as the H100 SXM's "
        "81559 MiB"),
    Gpu(name="H20-96GB", total_bytes=_mib(97871), total_kind="nvml", num_sms=78, capability=(9, 0),
        interconnect="nvlink", aliases=("H20",),
        source="NVML 97871 MiB (the harness's GPU_MEMORY_BYTES H20-96GB); the H100's silicon capped for export, "
        "compute capability 9.0 (github.com/tile-ai/TileOPs/pull/1658), 78 SMs enabled, NVLink 900 GB/s"),
    Gpu(name="H20-141GB", total_bytes=_mib(143771), total_kind="nvml", num_sms=78, capability=(9, 0),
        interconnect="nvlink", aliases=("H20-3e", "H20-141G"),
        source="the H20-3e: 141 GB HBM3e as the H200's (NVML 143771 MiB), compute capability 9.0 "
        "(github.com/tile-ai/TileOPs/pull/1658); 78 SMs, NVLink"),
    Gpu(name="H200-141GB", total_bytes=150_109_880_320, total_kind="torch", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("H200", "H200-SXM", "H200-SXM-141GB"),
        source="torch.cuda.mem_get_info's total on an H200 SXM, driver 580.159.04 (results/h200: every run's "
        "device_total_bytes; torch's 'GPU has a total capacity of 139.80 GiB', vLLM 0.26.0's 139.8 GiB); "
        f"NVML 143771 MiB; 132 SMs, sm_90, NVSwitch ({_NV}/h200/)"),
    Gpu(name="H200-NVL", total_bytes=150_109_880_320, total_kind="torch", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("H200-NVL-141GB",),
        source=f"141 GB HBM3e as the SXM's (torch total 139.80 GiB); 132 SMs, sm_90, NVLink bridges ({_NV}/h200/)"),
    Gpu(name="GH200", total_bytes=_gib(96), total_kind="datasheet", num_sms=132, capability=(9, 0),
        interconnect="nvlink", aliases=("GH200-96GB",),
        source=f"Grace Hopper: 96 GB HBM3 on the H100 die, 132 SMs, sm_90 ({_NV}/grace-hopper-superchip/)"),
    Gpu(name="B200", total_bytes=_gib(178.35), total_kind="torch", num_sms=148, capability=(10, 0),
        interconnect="nvlink", aliases=("B200-180GB",),
        source="cudaGetDeviceProperties on a B200: 'Total Global Memory: 178.35 GB' (GiB), 148 SMs, compute "
        "capability 10.0 (github.com/pytorch/ao/pull/4002); NVLink 5 on NVSwitch"),
    Gpu(name="B300", total_bytes=_gib(288), total_kind="datasheet", num_sms=148, capability=(10, 3),
        interconnect="nvlink", aliases=("B300-288GB",),
        source=f"Blackwell Ultra: 288 GB HBM3e, sm_103 ({_NV}/dgx-b300/); SMs taken as the B200's 148"),
    Gpu(name="GB200", total_bytes=_gib(186), total_kind="datasheet", num_sms=148, capability=(10, 0),
        interconnect="nvlink", aliases=("GB200-NVL72",),
        source=f"one Blackwell GPU of a GB200 superchip: 186 GB HBM3e, sm_100, NVLink 5 ({_NV}/gb200-nvl72/); SMs as "
        "the B200's 148"),
    Gpu(name="RTX-6000-Ada", total_bytes=_mib(49140), total_kind="nvml", num_sms=142, capability=(8, 9),
        interconnect="pcie", aliases=("RTX6000-Ada", "RTX-6000-Ada-Generation"),
        source="48 GB GDDR6, AD102 with 142 SMs, sm_89 (www.nvidia.com/en-us/design-visualization/rtx-6000/); "
        "NVML 49140 MiB"),
    Gpu(name="RTX-PRO-6000", total_bytes=_mib(97887), total_kind="nvml", num_sms=188, capability=(12, 0),
        interconnect="pcie", aliases=("RTX-PRO-6000-Blackwell", "RTX-PRO-6000-Blackwell-Server-Edition"),
        source="96 GB GDDR7, GB202 with 188 SMs (github.com/NVIDIA/cudnn-frontend/pull/1164's spec table), sm_120 "
        "(github.com/NVIDIA/cutlass/pull/2511); NVML 97887 MiB"),
)  # fmt: skip


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY: dict[str, Gpu] = {}
for _gpu in GPUS:
    for _name in (_gpu.name, *_gpu.aliases):
        _BY_KEY[_key(_name)] = _gpu


def names() -> list[str]:
    return [g.name for g in GPUS]


class UnknownGpuError(BadInput, ValueError):
    """One line: the name, the closest rows, and --gpu-memory-gib."""


def lookup(name: str) -> Gpu:
    """The row of a GPU by its name or an alias (case, spaces, dashes and underscores do not matter)."""
    found = _BY_KEY.get(_key(name))
    if found is not None:
        return found
    close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=4, cutoff=0.5)
    shown = list(dict.fromkeys(_BY_KEY[c].name for c in close))
    hint = f"; closest: {', '.join(shown)}" if shown else ""
    raise UnknownGpuError(f"--gpu {name[:40]!r} is not a known GPU; allowed: {', '.join(names())}, or for another "
                          f"GPU --gpu-memory-gib X (and --gpu-sms N, --gpu-capability M.m){hint}")  # fmt: skip


def given(memory_gib: float, *, num_sms: int | None = None, capability: str | None = None,
          interconnect: Interconnect = "nvlink") -> Gpu:  # fmt: skip
    """A GPU described on the command line: its torch total in GiB, optionally its SMs and compute capability
    (unknown ones are an H100's, labelled)."""
    if not 0 < memory_gib < 10**5:
        raise UnknownGpuError(f"--gpu-memory-gib {memory_gib}: allowed: a total in GiB above 0")
    cap = (9, 0)
    if capability is not None:
        match = re.fullmatch(r"(\d{1,2})\.(\d)", capability.strip())
        if match is None:
            raise UnknownGpuError(f"--gpu-capability {capability[:20]!r}: allowed: MAJOR.MINOR, e.g. 8.0, 9.0, 10.0")
        cap = (int(match.group(1)), int(match.group(2)))
    if num_sms is not None and not 0 < num_sms < 10**4:
        raise UnknownGpuError(f"--gpu-sms {num_sms}: allowed: an SM count above 0")
    assumed = [what for what, missing in (("132 SMs", num_sms is None), ("compute capability 9.0", capability is None))
               if missing]  # fmt: skip
    return Gpu(name=f"GPU-{memory_gib:g}GiB", total_bytes=_gib(memory_gib), total_kind="given", num_sms=num_sms or 132,
               capability=cap, interconnect=interconnect,
               source=f"given: --gpu-memory-gib {memory_gib:g}" + (f" (assumed as an H100's: {', '.join(assumed)})"
                                                                   if assumed else ""))  # fmt: skip


def find(name: str | None) -> Gpu | None:
    """The row for a name, or None (no GPU named, or one not in the table)."""
    if not name:
        return None
    return _BY_KEY.get(_key(name))


def resolve(gpu: str | Gpu | None) -> Gpu | None:
    """A row from a name, a given Gpu as is, None for none (or a name not in the table)."""
    return gpu if isinstance(gpu, Gpu) else find(gpu)


def label(gpu: str | Gpu | None) -> str | None:
    return gpu.name if isinstance(gpu, Gpu) else gpu
