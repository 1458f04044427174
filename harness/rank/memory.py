"""Memory per rank: exact accounting of the harness's own allocations, a peak sampler, budgets and OOM records.

GPU: NVML device-used and per-process used memory (the handle found by the torch device's UUID, since NVML
indices ignore CUDA_VISIBLE_DEVICES), plus the torch allocator's exact peaks.
CPU, or no NVML: process RSS, labelled as CPU memory.

A budget emulates a smaller GPU. On GPU the caching allocator enforces it (a per-process memory fraction) and
raises torch.OutOfMemoryError; on CPU the accountant refuses the allocation itself with the same error, before
allocating, so the OOM path is the same code and runs in CI.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import mmap
import os
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import psutil
import torch

from harness.core.rounding import BASELINE_ROUNDING_BYTES
from harness.core.units import UNIT_BYTES

CATEGORIES = ("weights", "dispatch", "comm", "common", "ws2", "combine", "ballast")
_TRIED_RE = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_FREE_RE = re.compile(r"of which ([\d.]+) (B|KiB|MiB|GiB|TiB) is free")


class BudgetExceeded(torch.OutOfMemoryError):
    """The accountant refused an allocation over the budget (CPU); carries the bytes asked for."""

    def __init__(self, message: str, requested_bytes: int, free_bytes: int):
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes


def _bytes_from(pattern: re.Pattern[str], message: str) -> int | None:
    match = pattern.search(message)
    if not match:
        return None
    return int(float(match.group(1)) * UNIT_BYTES[match.group(2)])


def requested_bytes_from_message(message: str) -> int | None:
    """torch's "Tried to allocate 56.00 GiB" as bytes, when the message carries it."""
    return _bytes_from(_TRIED_RE, message)


def free_bytes_from_message(message: str) -> int | None:
    """torch's "... of which 78.16 GiB is free" as bytes: the free memory when the allocation failed."""
    return _bytes_from(_FREE_RE, message)


def _torch_size(num_bytes: int) -> str:
    """A size as torch's OOM message writes it: two decimals in the largest unit it reaches ("56.00 GiB")."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if num_bytes >= UNIT_BYTES[unit]:
            return f"{num_bytes / UNIT_BYTES[unit]:.2f} {unit}"
    return f"{num_bytes} B"


FIRST_OP_BYTES = 1 << 20  # above torch's parallel grain (32768 elements): the zeroing runs on the thread pool


def _cpu_mapped(shape: tuple[int, ...], dtype: torch.dtype, num_bytes: int) -> torch.Tensor:
    """A CPU tensor on its own anonymous mapping: its pages join RSS when touched and leave it when freed,
    as a cudaMalloc'd block shows in NVML. malloc would reuse freed heap memory and hide the growth."""
    mapping = mmap.mmap(-1, num_bytes)
    flat = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps `mapping` alive as long as the tensor lives
    return flat.view(dtype).view(shape)


def pay_first_op_costs(device: torch.device) -> None:
    """On CPU, a process's first tensor op pages in torch's code for it and may start its thread pool: megabytes of
    RSS that would otherwise land in the first measured step (about 5.5 MiB in a rank forked from the local
    launcher's fork server, which imports torch but runs no op; 1.4 MiB in a spawned one). One op of the kind the
    steps run (zeroing a mapped tensor, large enough to run on the pool), freed at once, pays it up front."""
    if device.type == "cpu":
        _cpu_mapped((FIRST_OP_BYTES,), torch.uint8, FIRST_OP_BYTES).zero_()


class Accountant:
    """Allocates the harness's tensors by category and keeps exact byte counts; enforces a CPU budget."""

    def __init__(self, device: torch.device, *, budget_bytes: int | None = None, touch_cpu_pages: bool = True):
        self.device = device
        self.budget_bytes = budget_bytes
        self.touch_cpu_pages = touch_cpu_pages
        self._bytes: dict[str, int] = defaultdict(int)
        self._untouched_bytes = 0  # CPU ballast: counted against the budget, never paged in
        self.num_tensors = 0  # allocated so far (the rounding a measured step may show is per tensor)

    def alloc(self, category: str, shape: tuple[int, ...], dtype: torch.dtype, *, touch: bool = True) -> torch.Tensor:
        """An uninitialised tensor on the device, counted under `category`.

        On CPU the pages are touched (zeroed) so RSS shows them as NVML shows a cudaMalloc, unless touch=False.
        """
        if category not in CATEGORIES:
            raise ValueError(f"category {category!r} is not one of {', '.join(CATEGORIES)}")
        num_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self.device.type == "cpu" and self.budget_bytes is not None:
            in_use = self.total_bytes  # the CPU budget covers the harness's tensors
            if in_use + num_bytes > self.budget_bytes:
                # torch's wording ("Tried to allocate 16.00 MiB"), so a CPU OOM reads like the GPU's it stands for.
                raise BudgetExceeded(
                    f"CPU budget exceeded: Tried to allocate {_torch_size(num_bytes)} ({num_bytes} bytes) for "
                    f"{category} with {in_use} bytes in use of a {self.budget_bytes}-byte budget "
                    f"({_torch_size(self.budget_bytes - in_use)} free)",
                    requested_bytes=num_bytes,
                    free_bytes=self.budget_bytes - in_use,
                )
        if self.device.type == "cpu" and num_bytes:
            tensor = _cpu_mapped(shape, dtype, num_bytes)
            if touch and self.touch_cpu_pages:
                tensor.view(torch.uint8).zero_()
            else:
                self._untouched_bytes += num_bytes
        else:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
        self._bytes[category] += num_bytes
        self.num_tensors += 1
        return tensor

    def adopt(self, category: str, tensor: torch.Tensor) -> torch.Tensor:
        """Count a tensor allocated elsewhere (a symmetric-memory buffer) under `category`; returns it."""
        if category not in CATEGORIES:
            raise ValueError(f"category {category!r} is not one of {', '.join(CATEGORIES)}")
        self._bytes[category] += tensor.numel() * tensor.element_size()
        return tensor

    def release(self, category: str, tensor: torch.Tensor) -> None:
        """Forget a tensor's bytes (the caller drops its last reference)."""
        self._bytes[category] -= tensor.numel() * tensor.element_size()

    def bytes_of(self, category: str) -> int:
        return self._bytes.get(category, 0)

    @property
    def total_bytes(self) -> int:
        return sum(self._bytes.values())

    @property
    def untouched_bytes(self) -> int:
        return self._untouched_bytes


@dataclass(frozen=True)
class NvmlDevice:
    handle: object
    uuid: str


def nvml_device_for(device: torch.device) -> NvmlDevice | None:
    """The NVML handle whose UUID matches the torch device; None without NVML or on CPU."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library or no driver: fall back to RSS
        return None
    props = torch.cuda.get_device_properties(device)
    torch_uuid = str(getattr(props, "uuid", "")).removeprefix("GPU-")
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid.removeprefix("GPU-") == torch_uuid:
            return NvmlDevice(handle=handle, uuid=uuid)
    return None


class MemoryProbe:
    """Reads device-used and this process's used memory: NVML on GPU, RSS on CPU or without NVML."""

    def __init__(self, device: torch.device, *, use_nvml: bool = True):
        self.device = device
        self.nvml = nvml_device_for(device) if use_nvml else None
        self._process = psutil.Process(os.getpid())

    @property
    def method(self) -> Literal["nvml", "rss"]:
        return "nvml" if self.nvml is not None else "rss"

    @property
    def label(self) -> str:
        if self.nvml is not None:
            return "GPU memory (NVML device used)"
        if self.device.type == "cuda":
            return "GPU memory unavailable without NVML: CPU memory (process RSS) shown"
        return "CPU memory (process RSS)"

    def used_bytes(self) -> int:
        if self.nvml is not None:
            import pynvml

            return int(pynvml.nvmlDeviceGetMemoryInfo(self.nvml.handle).used)
        return int(self._process.memory_info().rss)

    def process_used_bytes(self) -> int | None:
        if self.nvml is None:
            return None
        import pynvml

        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self.nvml.handle)
        except pynvml.NVMLError:
            return None
        for proc in procs:
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None


class PeakSampler:
    """A thread that samples `probe` every interval and keeps the maximum, so short spikes are seen."""

    def __init__(self, probe: MemoryProbe, *, interval_s: float = 0.001):
        self.probe = probe
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.process_peak_bytes: int | None = None
        self.num_samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        used = self.probe.used_bytes()
        self.peak_bytes = max(self.peak_bytes, used)
        self.num_samples += 1
        # Per-process queries are slow on NVML; every 16th sample is enough for a peak that lasts.
        if self.probe.nvml is not None and self.num_samples % 16 == 1:
            proc = self.probe.process_used_bytes()
            if proc is not None:
                self.process_peak_bytes = max(self.process_peak_bytes or 0, proc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self.peak_bytes = 0
        self.num_samples = 0
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="memory-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def baseline_rounding_bytes(device: torch.device) -> int:
    """How far two policies' baselines may differ on this device although both start from the same state
    (harness.core.rounding: NVML's pages on a GPU, RSS's bookkeeping on a CPU)."""
    return BASELINE_ROUNDING_BYTES["nvml" if device.type == "cuda" else "rss"]


def _malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc), as empty_cache does on GPU; nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def release_cached(device: torch.device) -> None:
    """Return cached blocks so every policy starts from the same device-used baseline."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    else:
        _malloc_trim()


def apply_budget(device: torch.device, budget_bytes: int | None) -> None:
    """Cap the caching allocator at the budget (GPU). On CPU the Accountant enforces it."""
    if device.type != "cuda" or budget_bytes is None:
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)


def free_and_total_bytes(device: torch.device, accountant: Accountant) -> tuple[int | None, int | None]:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    if accountant.budget_bytes is not None:
        return accountant.budget_bytes - accountant.total_bytes, accountant.budget_bytes
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


class SnapshotRecorder:
    """Keeps the CUDA allocator's history while a policy runs, to dump a snapshot next to the records on OOM."""

    def __init__(self, device: torch.device, enabled: bool):
        self.enabled = enabled and device.type == "cuda"

    def __enter__(self) -> SnapshotRecorder:
        if self.enabled:
            torch.cuda.memory._record_memory_history(max_entries=20000)
        return self

    def dump(self, path: os.PathLike[str] | str) -> bool:
        if not self.enabled:
            return False
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        return True

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            torch.cuda.memory._record_memory_history(enabled=None)
