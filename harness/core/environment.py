"""What software and hardware a record was made on.

A rank has imported torch and asks it. A driver (run.json's versions) does not import torch for this: torch's
version and CUDA build come from the installed package (its metadata, and its `version.py` read as text), and NCCL's
version from the ranks' records, which the report prefers anyway.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import harness
from harness.core.records import Hardware, Versions

if TYPE_CHECKING:
    import torch


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nccl_version() -> str | None:
    import torch

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


def _installed_torch_cuda() -> str | None:
    """The CUDA build of the installed torch (`torch.version.cuda`), from its version.py read as text."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return cuda_of_version_file(Path(next(iter(spec.submodule_search_locations))) / "version.py")


def cuda_of_version_file(path: Path) -> str | None:
    """`cuda = '13.0'` (or `cuda: Optional[str] = ...`) of a torch version.py, parsed, never executed."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target: ast.expr
        value: ast.expr | None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "cuda":
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return None


def collect_versions(*, vllm_source: str | None = None, vllm_kernels: str | None = None) -> Versions:
    if "torch" in sys.modules:  # a rank: torch is imported, and it knows its NCCL
        import torch

        torch_version, cuda, nccl = str(torch.__version__), torch.version.cuda, nccl_version()
    else:  # a driver: the installed package says as much, without the import
        torch_version, cuda, nccl = _dist_version("torch") or "unknown", _installed_torch_cuda(), None
    return Versions(
        harness=harness.__version__,
        python=platform.python_version(),
        torch=torch_version,
        cuda=cuda,
        nccl=nccl,
        driver=driver_version(),
        ray=_dist_version("ray"),
        vllm_source=vllm_source,
        vllm_kernels=vllm_kernels,
    )


def node_ip() -> str:
    """This node's address as Ray sees it when Ray is up, else the hostname's."""
    # Ray not imported is Ray not initialized: a local rank does not import it (0.3 s of CPU) to learn so.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def collect_hardware(device: torch.device) -> Hardware:
    if device.type == "cuda":
        import torch

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
