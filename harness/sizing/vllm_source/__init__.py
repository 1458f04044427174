"""vLLM sources for the harness: locate a release, wheel, tree or install, and evaluate its own sizing.

    locate(version= | wheel= | src= | installed)  -> VllmSource   (harness.sizing.vllm_source.sources)
    audit(source, SizingArgs)                      -> AuditResult  (harness.sizing.vllm_source.auditor)
        SourceTree: ast-parse fused_moe/**.py, find each batched-experts class,         (.evaluate)
        interpret its workspace_shapes over the AST on a stand-in self                 (.interpreter)
        within a step and size budget; release code is never imported, exec'd or compiled
    release_shapes("X.Y.Z", SizingArgs)            -> WorkspaceShapes of CutlassBatchedExpertsFp8 ("vllm==X.Y.Z")
    run_audit(AuditRequest)                        -> exit code of `harness vllm audit`
    ops_library(source)                            -> the compiled ops library for the vllm-ops backend
    resolve_kernels(VllmSpec)                      -> KernelsLibrary: the library a scenario's kernels name, its
                                                      release, sha256 and size   (harness.sizing.vllm_source.kernels)

Behind locate: `cache` (verified, contained cache entries and wheel extraction) and `registry` (the package
index: published sha256, versions, downloads with pip). See docs/vllm-sources.md and docs/kernels.md.
"""

from harness.sizing.vllm_source.auditor import (
    CONSISTENT,
    DOUBLE_COUNT,
    UNEVALUATED,
    AuditRequest,
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
    "AuditRequest",
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
