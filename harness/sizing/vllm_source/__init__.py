"""vLLM sources for the harness: locate a release, wheel, tree or install, and evaluate its own sizing.

    locate(version= | wheel= | src= | installed)  -> VllmSource   (harness.sizing.vllm_source.sources)
    audit(source, SizingArgs)                      -> AuditResult  (harness.sizing.vllm_source.auditor)
        SourceTree: ast-parse fused_moe/**.py, rebuild each batched-experts class,     (.evaluate)
        call its workspace_shapes on a stand-in self; vLLM is never imported
    release_shapes("X.Y.Z", SizingArgs)            -> WorkspaceShapes of CutlassBatchedExpertsFp8 ("vllm==X.Y.Z")
    run_audit(argparse.Namespace)                  -> exit code of `harness vllm audit`
    ops_library(source)                            -> the compiled ops library for the vllm-ops backend

See docs/vllm-sources.md.
"""

from harness.sizing.vllm_source.auditor import (
    CONSISTENT,
    DOUBLE_COUNT,
    UNEVALUATED,
    AuditResult,
    ClassAudit,
    audit,
    print_audit_table,
    release_shapes,
    run_audit,
)
from harness.sizing.vllm_source.sources import VllmSource, VllmSourceError, default_cache_dir, locate, ops_library

__all__ = [
    "CONSISTENT",
    "DOUBLE_COUNT",
    "UNEVALUATED",
    "AuditResult",
    "ClassAudit",
    "VllmSource",
    "VllmSourceError",
    "audit",
    "default_cache_dir",
    "locate",
    "ops_library",
    "print_audit_table",
    "release_shapes",
    "run_audit",
]
