"""`harness vllm diff BASE HEAD`: what a change to vLLM does to the MoE workspace, as a pull request's CI job.

    BASE, HEAD: each a release X.Y.Z, a wheel file or a source tree (harness.sizing.vllm_source.locate)
    1. every experts class's workspace_shapes over the sweep grid (sweep.py), on both: where it changed
    2. the reference deployments (harness/defaults/reference-deployments.yaml, or --references FILE), planned on both
       through the deployment model (deployment_plan.plan_source): MoE workspace, KV tokens, concurrency, verdict
    3. a Markdown comment ready to post, JSON (VllmDiff, schema 1), JUnit XML

Exit codes: 1 when a regression passes --threshold (a class's workspace or a reference deployment's MoE workspace
grows by more than it, a deployment's KV cache shrinks by more than it, or a deployment's verdict flips from
`starts`); 0 otherwise; 2 on bad input, one line. Nothing of either source is imported or executed.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.contract import SizingArgs
from harness.core.errors import BadInput
from harness.core.exits import EXIT_FAILED, EXIT_OK
from harness.core.units import GIB

DIFF_SCHEMA = 1
REFERENCES_SCHEMA = 1
REFERENCES_FILE = Path(__file__).resolve().parent.parent / "defaults" / "reference-deployments.yaml"
MAX_REFERENCES_BYTES = 1 << 20
MAX_REFERENCES = 64
DEFAULT_THRESHOLD_PCT = 1.0
VERSION_RE = re.compile(r"\d+\.\d+(\.\d+)*([a-z]+\d*)?(\.post\d+)?")


class DiffInputError(BadInput):
    """Bad input: one line naming the argument, the value and what is allowed."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReferenceDeployment(_Model):
    name: str = Field(min_length=1, max_length=120)
    serve: str = Field(min_length=1, max_length=4000)  # `vllm serve MODEL FLAGS`
    gpu: str = Field(min_length=1, max_length=40)  # a GPU of harness.scenario.sections.GPU_MEMORY_BYTES


class ReferenceSet(_Model):
    schema_version: Literal[1] = 1  # REFERENCES_SCHEMA
    deployments: list[ReferenceDeployment] = Field(max_length=MAX_REFERENCES)


class Side(_Model):
    """One side's plan of a reference deployment (bytes are per GPU)."""

    vllm: str
    verdict: str
    verdict_text: str
    moe_workspace_bytes: int | None
    moe_workspace_source: str | None  # file:line of the release that sizes it
    non_kv_bytes: int
    kv_tokens: int
    concurrency: float
    # the plan's other outcomes (DeploymentPlan.other_outcomes): "NAME: VERDICT, TOKENS tokens", and whether the
    # deployment starts in every one of them
    other_outcomes: list[str] = []
    starts_every_time: bool = True


class DeploymentDiff(_Model):
    name: str
    serve: str
    gpu: str
    skipped: str | None = None  # why the deployment model cannot size it (yet)
    base: Side | None = None
    head: Side | None = None
    kv_tokens_delta: int | None = None
    concurrency_delta: float | None = None
    workspace_ratio: float | None = None  # head / base MoE workspace bytes
    verdict_flip: str | None = None  # "starts -> oom", ...
    regression: str | None = None
    improvement: str | None = None


class PointChange(_Model):
    where: dict[str, object]  # the grid point (sweep.Point fields)
    base_bytes: int
    head_bytes: int
    base_shapes: list[list[int]]
    head_shapes: list[list[int]]


class ClassDiff(_Model):
    name: str
    format: str
    file: str  # head's (base's when removed)
    line: int | None  # workspace_shapes in that file
    change: Literal["grew", "shrank", "mixed", "same", "added", "removed", "not comparable"]
    points_compared: int
    points_grew: int
    points_shrank: int
    max_growth: float | None  # the largest head / base over the grid
    min_ratio: float | None  # the smallest head / base
    worst: PointChange | None  # the point of max_growth (or of min_ratio when nothing grew)
    where_grew: list[str] = []  # the grid points where it grew, as boxes (`D=2..256, E=16, ...`)
    where_shrank: list[str] = []
    verdict_base: str | None
    verdict_head: str | None
    regression: str | None = None


class VllmDiff(_Model):
    schema_version: Literal[1] = 1  # DIFF_SCHEMA
    kind: Literal["vllm-diff"] = "vllm-diff"
    harness_version: str
    base: str
    head: str
    threshold_pct: float
    classes: list[ClassDiff]
    deployments: list[DeploymentDiff]
    regressions: list[str]
    improvements: list[str]
    limits: list[str]
    exit_code: int


# --- inputs ----------------------------------------------------------------------------------------------------


def locate_side(text: str, what: str, cache_dir: Path | None):
    """A release X.Y.Z, a wheel file or a source tree directory."""
    from harness.sizing.vllm_source.sources import locate

    if len(text) > 4096 or "\0" in text or not text:
        raise DiffInputError(f"{what} {text[:40]!r}: not a release X.Y.Z, a wheel file or a source tree directory")
    path = Path(text)
    if path.is_dir():
        return locate(src=path, cache_dir=cache_dir)
    if path.is_file():
        if not text.endswith(".whl"):
            raise DiffInputError(f"{what} {text[:80]}: a file that is not a wheel (*.whl); allowed: a release X.Y.Z, "
                                 "a wheel file or a source tree directory")  # fmt: skip
        return locate(wheel=path, cache_dir=cache_dir)
    if VERSION_RE.fullmatch(text):
        return locate(version=text, cache_dir=cache_dir)
    raise DiffInputError(f"{what} {text[:80]}: no such file or directory, and not a release number X.Y.Z")


def load_references(path: Path | None) -> list[ReferenceDeployment]:
    file = path or REFERENCES_FILE
    try:
        if file.stat().st_size > MAX_REFERENCES_BYTES:
            raise DiffInputError(f"--references {file}: over {MAX_REFERENCES_BYTES} bytes")
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise DiffInputError(f"--references {file}: cannot be read ({error.strerror or error})") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as error:
        raise DiffInputError(f"--references {file}: not YAML ({str(error).splitlines()[0][:120]})") from None
    try:
        return ReferenceSet.model_validate(data).deployments
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise DiffInputError(f"--references {file}: {where}: {first['msg']} (allowed: schema_version: 1 and a list "
                             "`deployments` of {name, serve, gpu})") from None  # fmt: skip


# --- the grid ----------------------------------------------------------------------------------------------------


def _class_line(tree, cls) -> int | None:
    found = tree.find_method(cls, "workspace_shapes")
    return found[1].lineno if found is not None else None


def _shapes(outcome) -> list[list[int]]:
    return [list(s) for s in outcome.shapes] if outcome.shapes else []


def compare_classes(base, head, base_tree, head_tree, threshold: float) -> list[ClassDiff]:
    """Each class of either sweep: its workspace bytes (common + ws2) point by point."""
    from harness.sizing.vllm_source.sweep import AXES

    base_by = {c.name: c for c in base.classes}
    head_by = {c.name: c for c in head.classes}
    trees = {id(c): (base_tree, c) for c in base.classes} | {id(c): (head_tree, c) for c in head.classes}
    found: list[ClassDiff] = []
    for name in list(dict.fromkeys([*head_by, *base_by])):
        b, h = base_by.get(name), head_by.get(name)
        shown = h or b
        assert shown is not None
        tree, _ = trees[id(shown)]
        parsed = next((c for c in tree.class_named(name) if c.file.removeprefix("vllm/") == shown.file), None)
        line = _class_line(tree, parsed) if parsed is not None else None
        common: dict = {
            "name": name,
            "format": shown.format,
            "file": shown.file,
            "line": line,
            "verdict_base": b.verdict if b else None,
            "verdict_head": h.verdict if h else None,
        }
        if b is None or h is None:
            found.append(ClassDiff(change="added" if b is None else "removed", points_compared=0, points_grew=0,
                                   points_shrank=0, max_growth=None, min_ratio=None, worst=None, **common))  # fmt: skip
            continue
        ratios = []
        for point, ob in b.outcomes.items():
            oh = h.outcomes.get(point)
            if oh is None or not ob.total_bytes or oh.total_bytes is None:
                continue
            ratios.append((oh.total_bytes / ob.total_bytes, point, ob, oh))
        if not ratios:
            found.append(ClassDiff(change="not comparable", points_compared=0, points_grew=0, points_shrank=0,
                                   max_growth=None, min_ratio=None, worst=None, **common))  # fmt: skip
            continue
        grew = [r for r in ratios if r[0] > 1]
        shrank = [r for r in ratios if r[0] < 1]
        top = max(ratios, key=lambda r: (r[0], -r[1].D))
        low = min(ratios, key=lambda r: r[0])
        pick = top if grew else low
        worst = PointChange(where={a: getattr(pick[1], a) for a in AXES}, base_bytes=pick[2].total_bytes,
                            head_bytes=pick[3].total_bytes, base_shapes=_shapes(pick[2]),
                            head_shapes=_shapes(pick[3]))  # fmt: skip
        change: Literal["grew", "shrank", "mixed", "same"] = (
            "mixed" if grew and shrank else "grew" if grew else "shrank" if shrank else "same"
        )
        regression = None
        if top[0] > 1 + threshold:
            regression = (f"{name}'s workspace grows x{top[0]:.3g} at {_where(top[1])} "
                          f"({_gib(top[2].total_bytes)} -> {_gib(top[3].total_bytes)} GiB; "
                          f"{shown.file}:{line})")  # fmt: skip
        found.append(ClassDiff(change=change, points_compared=len(ratios), points_grew=len(grew),
                               points_shrank=len(shrank), max_growth=top[0], min_ratio=low[0], worst=worst,
                               regression=regression, where_grew=_boxes([r[1] for r in grew], h),
                               where_shrank=_boxes([r[1] for r in shrank], h), **common))  # fmt: skip
    return found


def _boxes(points: list, swept) -> list[str]:
    from harness.sizing.vllm_source.sweep import boxes
    from harness.sizing.vllm_source.sweep_report import box_text

    return [box_text(box, swept) for box in boxes(points)][:32] if points else []


def _where(point) -> str:
    return (
        f"D={point.D} E={point.E} T={point.T} K={point.K} I={point.I} {point.activation} {point.quant}"
        + ("" if point.experts == "E·D" else " EPLB")
        + ("" if point.dispatchers == "set" else " dispatchers unset")
    )


def _gib(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / GIB:.2f}"


# --- the reference deployments -----------------------------------------------------------------------------------


def plan_reference(ref: ReferenceDeployment, source) -> Side | str:
    """The deployment planned on one source, or why the deployment model cannot size it."""
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.deployment import device_total
    from harness.sizing.deployment_plan import plan_source
    from harness.sizing.model_config import ModelConfigError, load_model
    from harness.sizing.serve_args import ServeArgsError, parse_serve

    if ref.gpu not in GPU_MEMORY_BYTES:
        raise DiffInputError(f"--references: deployment {ref.name!r}: gpu {ref.gpu[:40]!r} is not one of "
                             f"{', '.join(GPU_MEMORY_BYTES)}")  # fmt: skip
    try:
        model, spec, _ = parse_serve(ref.serve.split())
    except ServeArgsError as error:
        raise DiffInputError(f"--references: deployment {ref.name!r}: {error}") from None
    try:
        facts = load_model(model)
    except ModelConfigError as error:
        return f"the deployment model cannot size it yet: {error}"
    total = device_total(ref.gpu, GPU_MEMORY_BYTES[ref.gpu])[0]
    try:
        plan = plan_source(facts, spec, source, gpu=ref.gpu, total_bytes=total)
    except Exception as error:  # a deployment the model refuses is reported, not fatal
        from harness.scenario.source import ScenarioError
        from harness.sizing.vllm_source.interpreter import Unevaluable
        from harness.sizing.vllm_source.sources import VllmSourceError

        if isinstance(error, (ScenarioError, VllmSourceError, ValueError, ModelConfigError, Unevaluable)):
            return f"the deployment model cannot size it on {source.label}: {str(error).splitlines()[0][:200]}"
        raise
    line = plan.line("moe-workspace")
    return Side(vllm=source.label, verdict=plan.verdict.outcome, verdict_text=plan.verdict.text,
                moe_workspace_bytes=line.bytes if line else None, moe_workspace_source=line.source if line else None,
                non_kv_bytes=plan.non_kv_bytes, kv_tokens=plan.kv_tokens, concurrency=plan.concurrency,
                other_outcomes=[f"{o.name}: {o.verdict.outcome}, {o.kv_tokens:,} tokens" for o in plan.other_outcomes],
                starts_every_time=plan.starts_every_time)  # fmt: skip


def reference_sizing(source, references: list[ReferenceDeployment] | None = None) -> dict[str, SizingArgs]:
    """Each reference deployment's MoE layer sizing (SizingArgs: T, D, local experts, K, I, top-k) as the deployment
    model resolves it on this source; those it cannot size are left out."""
    from harness.scenario.sections import GPU_MEMORY_BYTES
    from harness.sizing.deployment import device_total, resolve
    from harness.sizing.deployment_plan import layer_scenario
    from harness.sizing.model_config import ModelConfigError, load_model
    from harness.sizing.serve_args import ServeArgsError, parse_serve
    from harness.sizing.vllm_source.interpreter import Unevaluable
    from harness.sizing.vllm_source.layer_source import release_files
    from harness.sizing.vllm_source.sources import VllmSourceError

    files = release_files(source)
    found: dict[str, SizingArgs] = {}
    for ref in references if references is not None else load_references(None):
        try:
            model, spec, _ = parse_serve(ref.serve.split())
            facts = load_model(model)
            total = device_total(ref.gpu, GPU_MEMORY_BYTES[ref.gpu])[0]
            r = resolve(facts, spec, files, source.version, gpu_bytes=total, gpu=ref.gpu)
            layer = layer_scenario(facts, r)
        except (ServeArgsError, ModelConfigError, KeyError, ValueError, VllmSourceError, Unevaluable):
            continue
        if layer is not None:
            found[ref.name] = layer.sizing_args()
    return found


def compare_deployment(ref: ReferenceDeployment, base_source, head_source, threshold: float) -> DeploymentDiff:
    base, head = plan_reference(ref, base_source), plan_reference(ref, head_source)
    common: dict = {"name": ref.name, "serve": " ".join(ref.serve.split()), "gpu": ref.gpu}
    if isinstance(base, str) or isinstance(head, str):
        return DeploymentDiff(skipped=base if isinstance(base, str) else head, **common)  # type: ignore[arg-type]
    tokens = head.kv_tokens - base.kv_tokens
    concurrency = head.concurrency - base.concurrency
    ratio = (head.moe_workspace_bytes / base.moe_workspace_bytes
             if head.moe_workspace_bytes and base.moe_workspace_bytes else None)  # fmt: skip
    flip = f"{base.verdict} -> {head.verdict}" if base.verdict != head.verdict else None
    grown = (
        head.moe_workspace_bytes is not None
        and base.moe_workspace_bytes is not None
        and head.moe_workspace_bytes > base.moe_workspace_bytes
    )
    regression = improvement = None
    cost = (f"MoE workspace {_gib(base.moe_workspace_bytes)} -> {_gib(head.moe_workspace_bytes)} GiB per GPU "
            f"({head.moe_workspace_source or 'no MoE workspace line'}); KV cache {base.kv_tokens:,} -> "
            f"{head.kv_tokens:,} tokens ({tokens:+,}), concurrency {base.concurrency:.2f}x -> "
            f"{head.concurrency:.2f}x")  # fmt: skip
    chance = base.verdict == head.verdict == "starts" and base.starts_every_time != head.starts_every_time
    if base.verdict == "starts" and head.verdict != "starts":
        regression = f"{ref.name}: {base.verdict} -> {head.verdict} ({head.verdict_text}); {cost}"
    elif chance and not head.starts_every_time:
        regression = f"{ref.name}: starts -> starts or not, by chance ({'; '.join(head.other_outcomes)}); {cost}"
    elif chance:
        improvement = f"{ref.name}: starts or not, by chance ({'; '.join(base.other_outcomes)}) -> starts; {cost}"
    elif (ratio is not None and ratio > 1 + threshold) or (base.kv_tokens and tokens < -threshold * base.kv_tokens):
        regression = f"{ref.name}: {cost}"
    elif (head.verdict == "starts" and base.verdict != "starts") or tokens > 0 or (ratio is not None and ratio < 1):
        improvement = f"{ref.name}: " + (f"{base.verdict} -> {head.verdict}; " if flip else "") + cost
    elif grown:
        improvement = None
    return DeploymentDiff(base=base, head=head, kv_tokens_delta=tokens, concurrency_delta=concurrency,
                          workspace_ratio=ratio, verdict_flip=flip, regression=regression, improvement=improvement,
                          **common)  # fmt: skip


# --- the whole diff --------------------------------------------------------------------------------------------


def diff(base_source, head_source, references: list[ReferenceDeployment], *, threshold_pct: float,
         budget=None) -> VllmDiff:  # fmt: skip
    from harness import __version__
    from harness.sizing.vllm_source.evaluate import source_tree
    from harness.sizing.vllm_source.sweep import sweep

    threshold = threshold_pct / 100
    base_tree, head_tree = source_tree(base_source), source_tree(head_source)
    # The workspace is compared, not judged: apply() is not traced (that is `vllm audit --sweep`'s job).
    base = sweep(base_tree, budget=budget, trace=False)
    head = sweep(head_tree, budget=budget, trace=False)
    classes = compare_classes(base, head, base_tree, head_tree, threshold)
    deployments = [compare_deployment(ref, base_source, head_source, threshold) for ref in references]
    regressions = [c.regression for c in classes if c.regression] + [d.regression for d in deployments if d.regression]
    improvements = [d.improvement for d in deployments if d.improvement]
    improvements += [f"{c.name}'s workspace shrinks to x{c.min_ratio:.3g} at {_where_json(c.worst.where)}"
                     for c in classes if c.change == "shrank" and c.min_ratio is not None and c.worst]  # fmt: skip
    limits = [f"base: {line}" for line in base.limits] + [f"head: {line}" for line in head.limits]
    code = EXIT_FAILED if regressions or limits else EXIT_OK
    return VllmDiff(harness_version=__version__, base=base_source.label, head=head_source.label,
                    threshold_pct=threshold_pct, classes=classes, deployments=deployments, regressions=regressions,
                    improvements=improvements, limits=limits, exit_code=code)  # fmt: skip


def _where_json(where: dict[str, object]) -> str:
    return " ".join(f"{k}={where[k]}" for k in ("D", "E", "T", "K", "I", "activation", "quant"))


# --- outputs -------------------------------------------------------------------------------------------------------


def markdown(result: VllmDiff) -> str:
    """The comment a CI job posts on the pull request."""
    failed = result.exit_code != EXIT_OK
    lines = [
        f"### MoE workspace: `{result.base}` -> `{result.head}` (`harness vllm diff`)",
        "",
        (f"**FAILED**: {len(result.regressions)} regression(s) past the {result.threshold_pct:g}% threshold"
         if failed else f"**OK**: no regression past the {result.threshold_pct:g}% threshold"),
        "",
    ]  # fmt: skip
    for text in result.regressions:
        lines.append(f"- :x: {text}")
    for text in result.limits:
        lines.append(f"- :warning: {text}")
    for text in result.improvements:
        lines.append(f"- :white_check_mark: {text}")
    lines += ["", "#### Reference deployments (per GPU)", "",
              "| deployment | GPU | verdict | MoE workspace GiB | KV tokens | concurrency | sized at |",
              "|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    for d in result.deployments:
        if d.base is None or d.head is None:
            lines.append(f"| {d.name} | {d.gpu} | skipped: {_cell(d.skipped or '')} | | | | |")
            continue
        verdict = d.verdict_flip or d.head.verdict
        lines.append(
            f"| {d.name} | {d.gpu} | {verdict} | {_gib(d.base.moe_workspace_bytes)} -> "
            f"{_gib(d.head.moe_workspace_bytes)} | {d.base.kv_tokens:,} -> {d.head.kv_tokens:,} "
            f"({d.kv_tokens_delta:+,}) | {d.base.concurrency:.2f}x -> {d.head.concurrency:.2f}x | "
            f"{_cell((d.head.moe_workspace_source or '-').split(' ')[0])} |")  # fmt: skip
    changed = [c for c in result.classes if c.change not in ("same", "not comparable")]
    blind = [c.name for c in result.classes if c.change == "not comparable"]
    lines += ["", f"#### Experts classes whose workspace changed ({len(changed)} of {len(result.classes)})", ""]
    if changed:
        lines += ["| class | format | change | points grew / shrank / compared | largest change | where | file:line |",
                  "|---|---|---|---:|---:|---|---|"]  # fmt: skip
        for c in changed:
            ratio = (f"x{c.max_growth:.3g}" if c.change in ("grew", "mixed") else
                     f"x{c.min_ratio:.3g}" if c.min_ratio is not None else "-")  # fmt: skip
            where = _where_json(c.worst.where) if c.worst else "-"
            lines.append(f"| {c.name} | {c.format} | {c.change} | {c.points_grew} / {c.points_shrank} / "
                         f"{c.points_compared} | {ratio} | {where} | {c.file}:{c.line or '?'} |")  # fmt: skip
        for c in changed:
            if c.where_grew:
                lines.append(f"- {c.name} grew at: {'; '.join(c.where_grew[:6])}"
                             + (" ..." if len(c.where_grew) > 6 else ""))  # fmt: skip
    else:
        lines.append("None: every class's workspace is the same at every point of the grid.")
    if blind:
        lines += ["", ("Not comparable (workspace_shapes evaluated on neither side, or at no common point): "
                       f"{', '.join(blind)}.")]  # fmt: skip
    lines += ["", "<sub>Grid and verdicts: docs/vllm-sources.md; this job: docs/vllm-ci.md.</sub>", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def write_junit(result: VllmDiff, path: Path) -> None:
    from harness.sizing.vllm_source.sweep_report import write_junit_suite

    suite = ET.Element("testsuite", name=f"harness vllm diff {result.base} {result.head}")
    cases = failures = skipped = 0
    for d in result.deployments:
        cases += 1
        case = ET.SubElement(suite, "testcase", classname="deployment", name=d.name)
        if d.regression:
            failures += 1
            ET.SubElement(case, "failure", message=d.regression, type="regression")
        elif d.skipped:
            skipped += 1
            ET.SubElement(case, "skipped", message=d.skipped)
        else:
            ET.SubElement(case, "system-out").text = d.improvement or "no change past the threshold"
    for c in result.classes:
        cases += 1
        case = ET.SubElement(suite, "testcase", classname=c.name, name=f"workspace over the grid ({c.format})")
        if c.regression:
            failures += 1
            ET.SubElement(case, "failure", message=c.regression, type="regression")
        elif c.change in ("added", "removed", "not comparable"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{c.name}: {c.change}")
        else:
            ET.SubElement(case, "system-out").text = f"{c.name}: {c.change} ({c.points_compared} points compared)"
    write_junit_suite(suite, path, limits=result.limits, cases=cases, failures=failures, skipped=skipped)


@dataclass(frozen=True, kw_only=True)
class DiffRequest:
    base: str
    head: str
    references: Path | None = None
    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    json: bool = False
    junit: Path | None = None
    markdown: Path | None = None
    cache_dir: Path | None = None
    budget_s: float | None = None


def run_diff(request: DiffRequest) -> int:
    from harness.sizing.vllm_source.sources import VllmSourceError
    from harness.sizing.vllm_source.sweep import SweepBudget

    if not math.isfinite(request.threshold_pct) or not 0 <= request.threshold_pct <= 1000:
        return _error(f"--threshold {request.threshold_pct}: a percentage from 0 to 1000 is allowed")
    try:
        references = load_references(request.references)
        base = locate_side(request.base, "BASE", request.cache_dir)
        head = locate_side(request.head, "HEAD", request.cache_dir)
        budget = SweepBudget(cpu_s=request.budget_s) if request.budget_s else SweepBudget()
        result = diff(base, head, references, threshold_pct=request.threshold_pct, budget=budget)
    except (DiffInputError, VllmSourceError) as error:
        return _error(str(error))
    text = markdown(result)
    try:
        if request.junit is not None:
            write_junit(result, request.junit)
        if request.markdown is not None:
            request.markdown.parent.mkdir(parents=True, exist_ok=True)
            request.markdown.write_text(text, encoding="utf-8")
    except OSError as error:
        return _error(f"cannot write the report ({error.strerror or error}: {error.filename})")
    if request.json:
        print(json.dumps(result.model_dump(mode="json"), indent=1))
    else:
        print(text)
    return result.exit_code


def _error(message: str) -> NoReturn:
    """Refuse in one line: harness.cli.main shows it and exits 2."""

    raise BadInput(message)
