"""What this machine offers local ranks, probed without torch: CPUs, available RAM, GPUs and their memory.

`harness run` checks a scenario against it (harness.scenario.fit.can_run) before it imports torch or spawns a
rank, so a scenario this machine cannot hold is refused in a fraction of a second. GPUs come from NVML
(nvidia-ml-py), limited to CUDA_VISIBLE_DEVICES as CUDA would; no NVML means no GPU.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from harness.scenario.fit import Machine

CGROUP_DIR = Path("/sys/fs/cgroup")


def _num_cpus() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cgroup_free_bytes() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), or None when it has no limit or none is found."""
    try:
        limit = (CGROUP_DIR / "memory.max").read_text().strip()
        current = int((CGROUP_DIR / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit():
        return None  # "max": no limit
    return max(0, int(limit) - current)


def _meminfo_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what psutil reports), or None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _available_ram_bytes() -> int | None:
    """RAM this machine can give its ranks: MemAvailable, within the cgroup's limit; None when unknown."""
    available = _meminfo_available_bytes()
    cgroup = _cgroup_free_bytes()
    known = [b for b in (available, cgroup) if b is not None]
    return min(known) if known else None


def _num_visible(num_devices: int) -> int:
    """How many of the NVML devices CUDA would use under CUDA_VISIBLE_DEVICES."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return num_devices
    count = 0
    for entry in (e.strip() for e in text.split(",")):
        if not entry or (entry.lstrip("-").isdigit() and not 0 <= int(entry) < num_devices):
            break  # CUDA stops at the first invalid entry ("", "-1", an index past the last device)
        count += 1  # an index, or a UUID / MIG name CUDA maps
    return min(count, num_devices)


def _gpus() -> tuple[int, int | None]:
    """(number of GPUs CUDA would see, total memory of the smallest), from NVML; (0, None) without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library, no device: no GPU for this run
        return 0, None
    try:
        num_devices = pynvml.nvmlDeviceGetCount()
        # The smallest of all devices: which ones CUDA_VISIBLE_DEVICES picks is the CUDA runtime's business.
        totals = [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in range(num_devices)
        ]
    except Exception:  # noqa: BLE001
        return 0, None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    num_visible = _num_visible(num_devices)
    return num_visible, (min(totals) if totals and num_visible else None)


def local_machine() -> Machine:
    """This machine, for the local launcher: every rank shares its CPUs and RAM."""
    num_cpus = _num_cpus()
    num_gpus, gpu_memory = _gpus()
    return Machine(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        cpu_memory_bytes=_available_ram_bytes(),
        gpu_memory_bytes=gpu_memory,
        description=f"this machine: {num_cpus} CPU, {num_gpus} GPU",
        shared=True,
    )
