"""EP+DP MoE workspace harness: reproduce, measure and guard vLLM's batched-experts workspace sizing.

One rank's data path mirrors vLLM's modular kernel:

    [route] -> [quantize + dispatch] -> [experts: GEMM1 -> silu_and_mul -> quant -> GEMM2] -> [combine]
     topk ids    all_to_all_single       writes into views of the policy's workspaces          all_to_all back
     + weights   (nccl / gloo)           (ws13/common, ws2, out aliasing common)               weighted sum

Letters (docs/design.md, terms and letters):
    T  per-rank token capacity (max_tokens_per_rank)
    D  number of dispatch ranks (num_dispatchers); may be emulated by P <= D physical ranks
    M  per-expert slots in the batched buffer, M = T * D
    E  local experts per rank
    K  hidden size
    I  expert intermediate size; GEMM1 outputs N = 2I (gate + up), GEMM2 maps I -> K
"""

import importlib
import importlib.metadata

UNKNOWN_VERSION = "0+unknown"  # neither installed nor built from git


def _read_version() -> str:
    """The version setuptools-scm derived from git when this tree was installed (harness/_version.py), else the
    installed distribution's, else UNKNOWN_VERSION."""
    try:
        return str(importlib.import_module("harness._version").version)
    except ImportError:
        pass
    try:
        return importlib.metadata.version("moe-workspace-harness")
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


__version__ = _read_version()  # not `_version`: that name is the generated submodule harness/_version.py


def _configure_log() -> None:
    from harness.core.log import configure, default_level

    configure(default_level())


_configure_log()
