"""The whole-layer audit across releases: every experts class and all-to-all kind, per release, with the files
that changed a verdict.

    for each release (0.22.0..0.33.0, as the registry offers them)
        for each AUDIT_CASES case (a curated scenario with a layer: all-to-all kind x experts backend x quant)
            plan_layer -> components with bytes and verdicts, and the release files each was read from
    transitions: per (case, component), the runs of consecutive releases with the same verdicts and bytes;
        where one run ends, the files it was read from whose content differs between the two releases

`harness vllm audit --layer --releases 0.22.0..0.33.0 --out results/audit` writes layer-audit.json (a typed,
versioned record) and layer-audit.md (the table docs/vllm-sources.md carries).
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

import harness
from harness.core.errors import BadInput
from harness.core.records import Record
from harness.core.units import GIB
from harness.scenario.schema import Scenario, load_scenario
from harness.sizing.layer import plan_layer_from
from harness.sizing.vllm_source.sources import VllmSource, VllmSourceError, locate

log = logging.getLogger(__name__)

LAYER_AUDIT_SCHEMA = 1
FILE_REF = re.compile(r"([A-Za-z0-9_./-]+\.py):\d+")


@dataclass(frozen=True)
class AuditCase:
    """A curated scenario with its layer set to one all-to-all kind, experts backend and quantization."""

    name: str
    scenario: str  # a file in scenarios/
    all2all: str
    moe_backend: str
    quant: str

    def load(self) -> Scenario:
        scenario = load_scenario(self.scenario)
        layer = scenario.layer.model_copy(
            update={"all2all": self.all2all, "moe_backend": self.moe_backend, "quant": self.quant, "expect": {}}
        )
        return scenario.model_copy(update={"layer": layer})


AUDIT_CASES = (
    AuditCase("55579 LL cutlass", "deepseek-v3-dp32-pr55579", "deepep-low-latency", "cutlass", "fp8-per-token"),
    AuditCase("55579 LL deep_gemm", "deepseek-v3-dp32-pr55579", "deepep-low-latency", "deep_gemm", "fp8-block"),
    AuditCase("55579 LL triton", "deepseek-v3-dp32-pr55579", "deepep-low-latency", "triton", "fp8-per-token"),
    AuditCase("55579 HT cutlass", "deepseek-v3-dp32-pr55579", "deepep-high-throughput", "cutlass", "fp8-per-token"),
    AuditCase("55579 HT deep_gemm", "deepseek-v3-dp32-pr55579", "deepep-high-throughput", "deep_gemm", "fp8-block"),
    AuditCase("57894 LL deep_gemm", "vllm-57894-eplb-deepep-ll", "deepep-low-latency", "deep_gemm", "fp8-block"),
    AuditCase("53241 none triton wna16", "vllm-53241-triton-wna16-tp4", "none", "triton", "wna16"),
    AuditCase("53241 none triton bf16", "vllm-53241-triton-wna16-tp4", "none", "triton", "bf16"),
)


class AuditedComponent(Record):
    name: str
    bytes: int | None
    needed_bytes: int | None
    verdicts: list[str]
    files: list[str]  # the release files (below vllm/) it was read from
    detail: str


class AuditedCase(Record):
    case: str
    experts_class: str
    components: list[AuditedComponent]


class ReleaseLayerAudit(Record):
    vllm_version: str
    file_sha256: dict[str, str]  # every file a component was read from -> sha256 of its content
    cases: list[AuditedCase]
    error: str | None = None  # the release could not be had


class Transition(Record):
    """A run of consecutive releases where one (case, component) keeps its verdicts and bytes."""

    case: str
    component: str
    first: str
    last: str
    verdicts: list[str]
    bytes: int | None
    changed_files: list[str]  # files that differ from the previous run's last release (empty for the first run)


class LayerAudit(Record):
    schema_version: int = LAYER_AUDIT_SCHEMA
    kind: Literal["layer-audit"] = "layer-audit"
    harness_version: str
    releases: list[ReleaseLayerAudit]
    transitions: list[Transition]


def audit_release(source: VllmSource) -> ReleaseLayerAudit:
    """Every AUDIT_CASES case planned on one release."""
    cases = []
    files: set[str] = set()
    for case in AUDIT_CASES:
        plan = plan_layer_from(case.load(), source)
        components = []
        for c in plan.components:
            read_from = sorted({m.group(1) for m in FILE_REF.finditer(f"{c.source} {c.detail}")})
            files.update(read_from)
            components.append(AuditedComponent(name=c.name, bytes=c.bytes, needed_bytes=c.needed_bytes,
                                               verdicts=c.verdicts, files=read_from, detail=c.detail))  # fmt: skip
        cases.append(AuditedCase(case=case.name, experts_class=plan.experts_class, components=components))
    sha = {f: _sha256(source.root / "vllm" / f) for f in sorted(files)}
    return ReleaseLayerAudit(vllm_version=source.version or "?", file_sha256=sha, cases=cases)


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "absent"


def audit_releases(versions: list[str], *, cache_dir: Path | None = None, progress=None) -> LayerAudit:
    releases = []
    for version in versions:
        if progress is not None:
            progress(version)
        try:
            releases.append(audit_release(locate(version=version, cache_dir=cache_dir)))
        except VllmSourceError as error:
            releases.append(ReleaseLayerAudit(vllm_version=version, file_sha256={}, cases=[], error=str(error)))
    return LayerAudit(harness_version=harness.__version__, releases=releases, transitions=transitions(releases))


def transitions(releases: list[ReleaseLayerAudit]) -> list[Transition]:
    """Per (case, component) in the order of AUDIT_CASES, the runs of releases with equal verdicts and bytes."""
    usable = [r for r in releases if r.error is None]
    keys: list[tuple[str, str]] = []
    for release in usable:
        for case in release.cases:
            keys += [(case.case, c.name) for c in case.components if (case.case, c.name) not in keys]
    runs: list[Transition] = []
    for case_name, component_name in keys:
        previous: tuple[ReleaseLayerAudit, AuditedComponent] | None = None
        for release in usable:
            component = _component(release, case_name, component_name)
            if component is None:
                continue
            same = previous is not None and (previous[1].verdicts, previous[1].bytes) == (component.verdicts,
                                                                                          component.bytes)  # fmt: skip
            if same:
                runs[-1] = runs[-1].model_copy(update={"last": release.vllm_version})
            else:
                changed = _changed_files(previous, release, component) if previous is not None else []
                runs.append(Transition(case=case_name, component=component_name, first=release.vllm_version,
                                       last=release.vllm_version, verdicts=component.verdicts, bytes=component.bytes,
                                       changed_files=changed))  # fmt: skip
            previous = (release, component)
    return runs


def _component(release: ReleaseLayerAudit, case_name: str, name: str) -> AuditedComponent | None:
    case = next((c for c in release.cases if c.case == case_name), None)
    return next((c for c in case.components if c.name == name), None) if case is not None else None


def _changed_files(previous: tuple[ReleaseLayerAudit, AuditedComponent], release: ReleaseLayerAudit,
                   component: AuditedComponent) -> list[str]:  # fmt: skip
    """The files either release read this component from whose content differs between the two."""
    before, before_component = previous
    files = sorted(set(before_component.files) | set(component.files))
    return [f for f in files if before.file_sha256.get(f, "absent") != release.file_sha256.get(f, "absent")]


# --- which releases ----------------------------------------------------------------------------------------------


def resolve_releases(text: str) -> list[str]:
    """ "0.30.0,0.33.0" as given; "A..B" every release the registry offers from A to B (pip index versions)."""
    if ".." not in text:
        return [v.strip() for v in text.split(",") if v.strip()]
    low, high = (part.strip() for part in text.split("..", 1))
    try:
        bounds = Version(low), Version(high)
    except InvalidVersion:
        raise VllmSourceError(f"--releases {text!r}: expected A..B with versions, e.g. 0.22.0..0.33.0") from None
    offered = registry_versions()
    return [v for v in offered if bounds[0] <= Version(v) <= bounds[1] and not Version(v).is_prerelease]


def registry_versions() -> list[str]:
    """The vLLM versions the package index offers, oldest first (`pip index versions vllm`)."""
    command = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise VllmSourceError(f"could not ask the package index for vLLM's versions: {error}") from None
    match = re.search(r"Available versions:\s*(.+)", completed.stdout)
    if completed.returncode != 0 or match is None:
        raise VllmSourceError("the package index did not list vLLM's versions (pip index versions vllm)")
    versions = []
    for text in match.group(1).split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue
    return [str(v) for v in sorted(versions)]


# --- the table ---------------------------------------------------------------------------------------------------


def audit_markdown(audit: LayerAudit) -> str:
    """One row per run of releases with the same verdicts and bytes, per case and component."""
    versions = [r.vllm_version for r in audit.releases if r.error is None]
    lines = [
        f"Releases: {', '.join(versions)}.",
        *[f"Not audited: {r.vllm_version}: {r.error}" for r in audit.releases if r.error is not None],
        "",
        "| case | experts class | component | releases | verdicts | GiB | files that changed it |",
        "|---|---|---|---|---|---:|---|",
    ]
    classes = {(c.case): c.experts_class for r in audit.releases for c in r.cases}
    for t in audit.transitions:
        span = t.first if t.first == t.last else f"{t.first}-{t.last}"
        gib = "-" if t.bytes is None else f"{t.bytes / GIB:.2f}"
        changed = ", ".join(f"`{f}`" for f in t.changed_files) or ("" if t.first == versions[0] else "(none read)")
        lines.append(f"| {t.case} | {classes.get(t.case, '')} | {t.component} | {span} | {', '.join(t.verdicts)} "
                     f"| {gib} | {changed} |")  # fmt: skip
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class LayerAuditRequest:
    """`harness vllm audit --layer`: the releases as the user wrote them (--releases, else --vllm-version)."""

    releases: str | None = None  # "A..B" or "X.Y.Z[,X.Y.Z...]" (resolve_releases)
    vllm_version: str | None = None  # one release, taken when releases is None
    cache_dir: Path | None = None
    out: Path | None = None  # the directory for layer-audit.json and layer-audit.md
    json: bool = False


def run_layer_audit(request: LayerAuditRequest) -> int:
    """`harness vllm audit --layer`: 0 when every release was audited, 2 when one could not be had or on bad
    input; the verdicts themselves are data (the table), not failures."""
    from harness.core.exits import EXIT_ERROR, EXIT_OK
    from harness.core.records import write_json_atomic, write_text_atomic

    versions = resolve_releases(request.releases or request.vllm_version or "")  # VllmSourceError: one line, exit 2
    if not versions:
        raise BadInput("--layer needs --releases A..B or X.Y.Z[,X.Y.Z...]")
    audit = audit_releases(versions, cache_dir=request.cache_dir,
                           progress=lambda v: log.info(f"auditing vllm {v}"))  # fmt: skip
    table = audit_markdown(audit)
    out = request.out
    if out is not None:
        if out.exists() and not out.is_dir():
            raise BadInput(f"--out {out} is not a directory")
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "layer-audit.json", audit.model_dump(mode="json"))
        write_text_atomic(out / "layer-audit.md", table)
    if request.json:
        import json

        print(json.dumps(audit.model_dump(mode="json"), indent=1))
    else:
        print(table, end="")
    failed = [r.vllm_version for r in audit.releases if r.error is not None]
    return EXIT_ERROR if failed else EXIT_OK
