"""What software and hardware a record was made on."""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata

import torch

import harness
from harness.core.records import Hardware, Versions


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    return str(version)


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no driver or no NVML means "unknown", never a failure
        return None


def collect_versions(*, vllm_source: str | None = None, vllm_kernels: str | None = None) -> Versions:
    return Versions(
        harness=harness.__version__,
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=nccl_version(),
        driver=driver_version(),
        ray=_dist_version("ray"),
        vllm_source=vllm_source,
        vllm_kernels=vllm_kernels,
    )


def node_ip() -> str:
    """This node's address as Ray sees it when Ray is up, else the hostname's."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def collect_hardware(device: torch.device) -> Hardware:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        uuid = str(getattr(props, "uuid", "")) or None
        if uuid and not uuid.startswith("GPU-"):
            uuid = f"GPU-{uuid}"
        return Hardware(
            hostname=socket.gethostname(),
            node_ip=node_ip(),
            device_kind="cuda",
            device_name=props.name,
            device_uuid=uuid,
            device_total_bytes=int(props.total_memory),
            device_capability=f"{props.major}.{props.minor}",
            num_cpus=os.cpu_count() or 1,
        )
    return Hardware(
        hostname=socket.gethostname(),
        node_ip=node_ip(),
        device_kind="cpu",
        device_name=platform.processor() or platform.machine(),
        device_total_bytes=None,
        num_cpus=os.cpu_count() or 1,
    )
