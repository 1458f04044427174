"""The sweep's outputs: a compact table (points grouped into boxes), JSON, and JUnit XML for a CI job.

harness vllm audit --sweep [--vllm-version X.Y.Z | --vllm-wheel FILE | --vllm-src DIR] [--json] [--junit FILE]
    exit 0: no class double-counts or is under-sized; 1: one is; 2: bad input (one line on stderr)
"""

from __future__ import annotations

import json
import logging
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import JustifyMethod

from harness.core.errors import BadInput
from harness.core.exits import EXIT_ERROR, EXIT_OK
from harness.sizing.vllm_source.sweep import (
    AXES,
    CONSISTENT,
    DOUBLE,
    FAILING,
    GRID_D,
    GRID_E,
    GRID_KI,
    GRID_T,
    NOT_DERIVED,
    OVER,
    REFUSED,
    UNDER,
    UNEVALUATED,
    UNSUPPORTED,
    ClassSweep,
    SweepResult,
    groups,
    sweep,
)

log = logging.getLogger(__name__)

EXIT_FAILED = 1
SWEEP_SCHEMA = 2  # 2: standard-format classes, per-point shapes, bytes and uses, findings, limits (+ a variant)
MAX_ROWS_PER_CLASS = 8  # the rest is in --json and --junit
STYLE = {DOUBLE: "bold red", UNDER: "bold red", OVER: "yellow", UNEVALUATED: "yellow", REFUSED: "dim",
         UNSUPPORTED: "dim", NOT_DERIVED: "yellow"}  # fmt: skip
POINT_FIELDS = ("D", "dispatchers", "experts", "quant", "activation", "K", "I", "E", "T", "N", "status", "ws13", "ws2",
                "out", "total_bytes", "uses_ws13_bytes", "uses_ws2_bytes", "variant")  # fmt: skip


def verdict_line(result: ClassSweep) -> str:
    """The class's one verdict, with the points that produced it."""
    verdict = result.verdict
    if verdict == CONSISTENT:
        judged = sum(o.status == CONSISTENT for o in result.outcomes.values())
        rest = len(result.outcomes) - judged
        return "consistent everywhere" + (f" it takes ({rest} points refused, unsupported or unevaluated)"
                                          if rest else "")  # fmt: skip
    if verdict == NOT_DERIVED:
        count = sum(o.status == NOT_DERIVED for o in result.outcomes.values())
        why = result.live_set.split(": ", 1)[-1]
        return (
            f"not derived at {count} points: what apply() uses is not derived ({why}) and no growth check fails; "
            "not a pass"
        )
    if verdict == UNEVALUATED:
        unevaluated = Counter(o.detail for o in result.outcomes.values() if o.status == UNEVALUATED)
        if unevaluated:
            return "unevaluated: " + unevaluated.most_common(1)[0][0]
        declined = Counter(o.detail for o in result.outcomes.values())
        return (
            "unevaluated: the class takes none of the swept points (most often: " + declined.most_common(1)[0][0] + ")"
        )
    found = [(o, points, box) for o, points, box in groups(result) if o.status == verdict]
    where = "; ".join(box_text(box, result) for _, _, box in found[:3]) + (" ..." if len(found) > 3 else "")
    count = sum(len(points) for _, points, _ in found)
    if verdict == DOUBLE:
        return f"double-counts at {count} points: {where}"
    if verdict == UNDER:
        return f"under-sized against the class's live set at {count} points: {where}"
    worst = max(o.ratio or 1 for o, _, _ in found)
    return f"over-allocated by up to x{worst:.3g} at {count} points: {where}"


def headline(result: ClassSweep) -> str:
    """The verdict in a form that stays the same across releases whose grids differ only in detail (the
    activations a release defines, line numbers): what the committed table folds releases by."""
    verdict = result.verdict
    judged = {p: o for p, o in result.outcomes.items() if o.status not in (REFUSED, UNSUPPORTED, UNEVALUATED)}
    if verdict == DOUBLE:
        doubled = [p for p, o in judged.items() if o.status == DOUBLE]
        at_d = sorted({p.D for p in doubled})
        everywhere = all(o.status == DOUBLE for p, o in judged.items() if p.D in at_d)
        clean_d1 = all(o.status == CONSISTENT for p, o in judged.items() if p.D == 1)
        where = f"every point it takes with D >= {at_d[0]}" if everywhere else f"points with D in {at_d}"
        return f"double-counts at {where}" + ("; consistent at D = 1" if clean_d1 else "")
    if verdict == UNDER:
        under = [p for p, o in judged.items() if o.status == UNDER]
        forms = sorted({"non-gated" if p.activation.endswith("_no_mul") else "gated" for p in under})
        return f"under-sized at {len(under)} points ({' and '.join(forms)} activations)"
    if verdict == OVER:
        ratios = sorted({round(o.ratio, 2) for o in judged.values() if o.status == OVER and o.ratio})
        return (
            f"over-allocated by x{ratios[0]:g} to x{ratios[-1]:g} against apply()'s views"
            if len(ratios) > 1
            else f"over-allocated by x{ratios[0]:g} against apply()'s views"
        )
    if verdict == CONSISTENT:
        return "consistent everywhere it takes"
    if verdict == NOT_DERIVED:
        return "not derived (what apply() uses)"
    return re.sub(r" \([^()]* line \d+\)", "", verdict_line(result))


def box_text(box: dict[str, tuple], result: ClassSweep) -> str:
    """`D=2..256, T=any, ...`: each axis whose values are not all those the class was swept at."""
    seen = {axis: sorted({getattr(p, axis) for p in result.outcomes}) for axis in AXES}
    parts = []
    for axis in AXES:
        if axis == "I":
            continue
        values = list(box[axis])
        if axis == "K":
            pairs = sorted({(k, i) for k in box["K"] for i in box["I"]})
            if len(pairs) == len({(p.K, p.I) for p in result.outcomes}):
                continue
            parts.append("(K,I)=" + ",".join(f"({k},{i})" for k, i in pairs))
            continue
        if values == seen[axis]:
            continue
        parts.append(f"{axis}={_values_text(values, seen[axis])}")
    return ", ".join(parts) or "every point"


def _values_text(values: list, domain: list) -> str:
    if len(values) == 1:
        return str(values[0])
    if all(isinstance(v, int) for v in values):
        start, end = domain.index(values[0]), domain.index(values[-1])
        if domain[start : end + 1] == values and len(values) > 2:
            return f"{values[0]}..{values[-1]}"
    if all(isinstance(v, str) for v in values) and all(v.endswith("_no_mul") for v in values):
        gated = [v for v in domain if v.endswith("_no_mul")]
        if values == gated:
            return "every non-gated"
    if (
        all(isinstance(v, str) for v in values)
        and not any(v.endswith("_no_mul") for v in values)
        and values == [v for v in domain if not v.endswith("_no_mul")]
        and len(values) > 2
    ):
        return "every gated"
    return "{" + ",".join(str(v) for v in values) + "}"


def print_sweep(result: SweepResult, *, file=None) -> None:
    from rich.table import Table

    from harness.core.console import make_console

    console = make_console(file=file if file is not None else sys.stdout, highlight=False)
    console.print(f"# {result.label} ({result.origin}): --sweep over D={_axis(GRID_D)} E={_axis(GRID_E)} "
                  f"T={_axis(GRID_T)} (K,I)={' '.join(f'({k},{i})' for k, i in GRID_KI)}; "
                  f"activations: {', '.join(result.activations)}")  # fmt: skip
    table = Table(show_lines=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("class", "left"),
        ("outcome", "left"),
        ("points", "right"),
        ("where", "left"),
        ("what", "left"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold")
    for cls in result.classes:
        rows = [g for g in groups(cls) if g[0].status not in (CONSISTENT, UNSUPPORTED)]
        shown = rows[:MAX_ROWS_PER_CLASS]
        table.add_row(cls.name, cls.verdict, str(len(cls.outcomes)), _counts(cls), f"live set: {cls.live_set}",
                      style="bold " + STYLE.get(cls.verdict, "") if cls.verdict in FAILING else "bold",
                      end_section=not shown)  # fmt: skip
        for index, (outcome, points, box) in enumerate(shown):
            last = index == len(shown) - 1 and len(rows) == len(shown)
            table.add_row("", outcome.status, str(len(points)), box_text(box, cls), outcome.detail,
                          style=STYLE.get(outcome.status, ""), end_section=last)  # fmt: skip
        if len(rows) > len(shown):
            table.add_row("", "", "", f"... {len(rows) - len(shown)} more groups in --json and --junit", "",
                          style="dim", end_section=True)  # fmt: skip
    console.print(table)
    for cls in result.classes:
        console.print(f"{cls.name}: {verdict_line(cls)}", style=STYLE.get(cls.verdict, "") if cls.failed else "")
    for file, why in result.unparsed.items():
        console.print(f"  unparsed: {file}: {why}")
    for _cls, finding in result.findings:
        console.print(f"FINDING: {finding_line(finding)}", style="bold yellow")
    for line in result.limits:
        console.print(f"LIMIT: {line}", style="bold yellow")
    console.print(footer(result))


def attach_reference_bytes(
    result: SweepResult, source, reference_sizing: Callable[[Any], dict[str, Any]] | None
) -> None:
    """Each finding's buffer in bytes per GPU at the reference deployments the deployment model sizes (their
    T, D, local experts, K, I): the class's own workspace_shapes evaluated there. reference_sizing gives those
    sizings on a source (the deployment model's, handed in by the caller); without it the findings stand alone."""
    if not result.findings or reference_sizing is None:
        return
    try:
        sizings = reference_sizing(source)
    except Exception as error:  # noqa: BLE001 - the finding stands without its bytes; say why
        for _, finding in result.findings:
            finding.notes.append(f"reference deployments not sized: {(str(error).splitlines() or [''])[0][:160]}")
        return
    from harness.sizing.vllm_source.evaluate import source_tree
    from harness.sizing.vllm_source.sweep import buffer_bytes

    tree = source_tree(source)
    for cls, finding in result.findings:
        for name, args in sizings.items():
            found = buffer_bytes(tree, cls, finding.buffer, args)
            if found is not None:
                finding.bytes_at[name] = found


def finding_line(finding) -> str:
    at = "; ".join(f"{name}: {b / 2**20:,.0f} MiB" for name, b in finding.bytes_at.items())
    return (
        f"{finding.detail}: {finding.buffer} is sized at {finding.file}:{finding.line}"
        + (f"; bytes per GPU at the reference deployments: {at}" if at else "")
        + "".join(f"; {note}" for note in finding.notes)
    )


def footer(result: SweepResult) -> str:
    batched = sum(c.format == "batched" for c in result.classes)
    counted = f"{len(result.classes)} experts classes ({batched} batched, {len(result.classes) - batched} standard)"
    if result.selected is not None:
        counted += f", the {len(result.classes)} of {result.selected[1]} that --classes names"
    parts = []
    for verdict in (NOT_DERIVED, UNEVALUATED):
        names = [c.name for c in result.classes if c.verdict == verdict]
        if names:
            parts.append(f"{len(names)} {verdict} ({', '.join(names[:8])}{' ...' if len(names) > 8 else ''})")
    rest = f"; not a pass: {'; '.join(parts)}" if parts else ""
    if result.failed:
        failed = ", ".join(f"{c.name} ({c.verdict})" for c in result.failed)
        return f"FAILED: {len(result.failed)} of {counted}: {failed}{rest}"
    if result.limits:
        return (
            f"INCOMPLETE: the sweep stopped at a limit (LIMIT lines above); none of what was judged of {counted} "
            f"fails{rest}"
        )
    return f"OK: none of {counted} double-counts or is under-sized{rest}"


def _axis(values: tuple) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def _counts(cls: ClassSweep) -> str:
    counts: dict[str, int] = {}
    for outcome in cls.outcomes.values():
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def sweep_json(result: SweepResult) -> dict:
    return {
        "schema_version": SWEEP_SCHEMA,
        "vllm_version": result.version,
        "source": result.label,
        "origin": result.origin,
        "activations": list(result.activations),
        "grid": {"D": list(GRID_D), "E": list(GRID_E), "T": list(GRID_T), "K_I": [list(p) for p in GRID_KI]},
        "failed": [c.name for c in result.failed],
        "unparsed": result.unparsed,
        "limits": result.limits,
        "selected": None
        if result.selected is None
        else {"classes": list(result.selected[0]), "of": result.selected[1]},
        "findings": [finding_json(c, f) for c, f in result.findings],
        "point_fields": list(POINT_FIELDS),
        "classes": [
            {
                "name": c.name,
                "file": c.file,
                "format": c.format,
                "n_rule": c.n_rule,
                "verdict": c.verdict,
                "summary": verdict_line(c),
                "live_set": c.live_set,
                "points": len(c.outcomes),
                "point_rows": [point_row(p, o) for p, o in sorted(c.outcomes.items())],
                "groups": [
                    {
                        "status": o.status,
                        "detail": o.detail,
                        "ratio": o.ratio,
                        "points": len(points),
                        "where": {axis: list(values) for axis, values in box.items()},
                    }
                    for o, points, box in groups(c)
                ],
            }
            for c in result.classes
        ],
    }


def point_row(point, outcome) -> list:
    """One point as the values of POINT_FIELDS: where it is, its verdict, the shapes, the bytes (common + ws2) and the
    bytes of each workspace apply()'s views need (null: not derived or not traced there)."""
    shapes = outcome.shapes or (None, None, None)
    uses = outcome.uses or (None, None)
    return [point.D, point.dispatchers, point.experts, point.quant, point.activation, point.K, point.I, point.E,
            point.T, outcome.N, outcome.status, *(list(s) if s is not None else None for s in shapes),
            outcome.total_bytes, *uses, point.variant]  # fmt: skip


def point_text(point, outcome) -> str:
    row = dict(zip(POINT_FIELDS, point_row(point, outcome), strict=False))
    where = " ".join(f"{k}={row[k]}" for k in POINT_FIELDS[:10])
    shapes = " ".join(f"{k}={tuple(row[k]) if row[k] is not None else '-'}" for k in ("ws13", "ws2", "out"))
    uses = " ".join(f"{k}={row[k] if row[k] is not None else 'not derived'}"
                    for k in ("uses_ws13_bytes", "uses_ws2_bytes"))  # fmt: skip
    variant = f" ({point.variant})" if point.variant else ""
    return f"{where}{variant}: {outcome.status}; {shapes}; bytes={row['total_bytes']}; {uses}"


def finding_json(cls, finding) -> dict:
    return {"class": cls.name, "kind": finding.kind, "buffer": finding.buffer, "file": finding.file,
            "line": finding.line, "detail": finding.detail, "bytes_at": finding.bytes_at, "notes": finding.notes,
            "text": finding_line(finding)}  # fmt: skip


def write_junit(result: SweepResult, path: Path) -> None:
    """One testcase per (class, point group): a failure for a double count or under-size, skipped for points
    the class refuses, does not take, or that were not evaluated."""
    suite = ET.Element("testsuite", name=f"harness vllm audit --sweep ({result.label})")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="vllm_version", value=result.version or "")
    ET.SubElement(properties, "property", name="source", value=result.origin)
    failures = skipped = cases = 0
    for cls in result.classes:
        for outcome, points, box in groups(cls):
            cases += 1
            # The class alone: a release's dots in a classname would read as packages in CI viewers.
            case = ET.SubElement(suite, "testcase", classname=cls.name,
                                 name=f"{outcome.status}: {box_text(box, cls)}")  # fmt: skip
            message = (
                f"{cls.name} ({cls.file}, {cls.format}) {outcome.status} at {len(points)} points: {outcome.detail}"
            )
            if outcome.status in FAILING:
                failures += 1
                ET.SubElement(case, "failure", message=message, type=outcome.status).text = box_text(box, cls)
            elif outcome.status in (UNEVALUATED, REFUSED, UNSUPPORTED, NOT_DERIVED):
                skipped += 1
                ET.SubElement(case, "skipped", message=message + ("; not a pass" if outcome.status == NOT_DERIVED
                                                                  else ""))  # fmt: skip
            # Every point of the group: where, the shapes, the bytes, what apply() uses, the verdict.
            ET.SubElement(case, "system-out").text = "\n".join(
                [message] + [point_text(p, cls.outcomes[p]) for p in sorted(points)]
            )
    for cls, finding in result.findings:
        cases += 1
        case = ET.SubElement(suite, "testcase", classname=cls.name, name=f"finding: {finding.kind} {finding.buffer}")
        ET.SubElement(case, "system-out").text = finding_line(finding)
    write_junit_suite(suite, path, limits=result.limits, cases=cases, failures=failures, skipped=skipped)


def write_junit_suite(
    suite: ET.Element, path: Path, *, limits: list[str], cases: int, failures: int, skipped: int
) -> None:
    """Close a JUnit suite: each limit the run hit as a failed case, the counts, then the file (its folder made)."""
    for line in limits:
        cases += 1
        failures += 1
        case = ET.SubElement(suite, "testcase", classname="sweep", name="limit")
        ET.SubElement(case, "failure", message=line, type="limit")
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


@dataclass(frozen=True, kw_only=True)
class SweepRequest:
    """`harness vllm audit --sweep` of one located source: how to print it, and where JUnit XML goes."""

    json: bool = False
    junit: Path | None = None
    budget_s: float | None = None  # CPU seconds for the whole sweep; None: SweepBudget's default
    reference_sizing: Callable[[Any], dict[str, Any]] | None = None  # see AuditRequest.reference_sizing
    classes: tuple[str, ...] | None = None  # `--classes`: sweep only these experts classes; None: every one


def selected_classes(tree, names: tuple[str, ...]) -> tuple[set[str], int]:
    """The experts classes `--classes` names, each one the tree sweeps, and how many it has; a name it does not have
    is bad input naming the closest ones."""
    import difflib

    available = {c.name for c in (*tree.batched_classes(), *tree.standard_classes())}
    for name in names:
        if name not in available:
            close = difflib.get_close_matches(name, sorted(available), n=3, cutoff=0.5)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise BadInput(f"--classes {name}: {tree.source.label} has no experts class of that name that sizes a "
                           f"workspace ({len(available)} do){hint}")  # fmt: skip
    return set(names), len(available)


def run_sweep(request: SweepRequest, source) -> int:
    """The sweep of a located source: 0, 1 on a double count or under-size, 2 when the JUnit file cannot be
    written."""
    from harness.sizing.vllm_source.evaluate import source_tree
    from harness.sizing.vllm_source.sweep import SweepBudget

    tree = source_tree(source)
    budget = SweepBudget(cpu_s=request.budget_s) if request.budget_s else None
    if request.classes is None:
        result = sweep(tree, budget=budget)
    else:
        named, available = selected_classes(tree, request.classes)
        result = sweep(tree, budget=budget, class_filter=named.__contains__)
        result.selected = (tuple(sorted(named)), available)
    attach_reference_bytes(result, source, request.reference_sizing)
    junit = request.junit
    if junit is not None:
        try:
            write_junit(result, junit)
        except OSError as error:
            raise BadInput(f"--junit {junit}: cannot be written ({error.strerror or error})") from None
    if request.json:
        print(json.dumps(sweep_json(result), indent=1))
    else:
        print_sweep(result)
    return EXIT_FAILED if result.failed or result.limits else EXIT_OK


# --- across releases: the committed table ------------------------------------------------------------------------


def release_rows(results: list[SweepResult]) -> list[dict]:
    """Per class, the runs of consecutive releases with the same verdict line."""
    rows: list[dict] = []
    names = list(dict.fromkeys(c.name for r in results for c in r.classes))
    for name in names:
        current: dict | None = None
        for result in results:
            cls = next((c for c in result.classes if c.name == name), None)
            if cls is None:
                current = None  # a release without the class ends a run
                continue
            line = headline(cls)
            if current is not None and current["verdict_line"] == line and current["file"] == cls.file:
                current["last"] = result.version
                continue
            current = {"class": name, "first": result.version, "last": result.version, "verdict_line": line,
                       "verdict": cls.verdict, "file": cls.file}  # fmt: skip
            rows.append(current)
    return rows


def releases_markdown(results: list[SweepResult], errors: dict[str, str]) -> str:
    lines = [
        f"Releases swept: {', '.join(r.version or r.label for r in results)}.",
        *[f"Not swept: {version}: {why}" for version, why in errors.items()],
        "",
        f"Grid: D {_axis(GRID_D)}, local experts {_axis(GRID_E)}, T {_axis(GRID_T)}, (K, I) "
        f"{' '.join(f'({k},{i})' for k, i in GRID_KI)}, every activation of the release's MoEActivation, the "
        "quantization formats each class takes, num_dispatchers unset, EPLB (`harness vllm audit --sweep`, "
        "docs/vllm-sources.md).",
        "",
        "The verdicts with the points that produced them are in sweep-audit.json (`summary`), per release.",
        "",
        "| experts class | releases | file | verdict |",
        "|---|---|---|---|",
    ]
    for row in release_rows(results):
        span = row["first"] if row["first"] == row["last"] else f"{row['first']}-{row['last']}"
        file = row["file"].split("fused_moe/", 1)[-1]
        lines.append(f"| {row['class']} | {span} | {file} | {row['verdict_line'].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def releases_json(results: list[SweepResult], errors: dict[str, str]) -> dict:
    return {
        "schema_version": SWEEP_SCHEMA,
        "releases": [
            {
                "vllm_version": r.version,
                "failed": [c.name for c in r.failed],
                "classes": [
                    {
                        "name": c.name,
                        "file": c.file,
                        "verdict": c.verdict,
                        "summary": verdict_line(c),
                        "live_set": c.live_set,
                        "points": len(c.outcomes),
                        "counts": _counts(c),
                    }
                    for c in r.classes
                ],
            }
            for r in results
        ],
        "not_swept": errors,
        "runs": release_rows(results),
    }


@dataclass(frozen=True, kw_only=True)
class SweepReleasesRequest:
    """`harness vllm audit --sweep --releases A..B|X,Y [--out DIR]`: the releases, as the user wrote them."""

    releases: str  # "A..B" or "X.Y.Z[,X.Y.Z...]", resolved by the resolve_releases run_sweep_releases is given
    cache_dir: Path | None = None
    out: Path | None = None  # the directory for sweep-audit.json and sweep-audit.md
    json: bool = False


def run_sweep_releases(request: SweepReleasesRequest, resolve_releases: Callable[[str], list[str]]) -> int:
    """`--sweep --releases A..B [--out DIR]`: the verdicts per release; 0 when every release was swept (the
    verdicts are data here), 2 when one could not be had or on bad input. resolve_releases: A..B -> versions
    (harness.sizing.layer_audit's, passed in: that module sits above this one)."""
    from harness.core.records import write_json_atomic, write_text_atomic
    from harness.sizing.vllm_source.evaluate import source_tree
    from harness.sizing.vllm_source.sources import VllmSourceError, locate

    out = request.out
    if out is not None and out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is not a directory")
    versions = resolve_releases(request.releases)  # VllmSourceError: one line, exit 2
    if not versions:
        raise BadInput(f"--releases {request.releases!r} names no release")
    results, errors = [], {}
    for version in versions:
        log.info(f"sweeping vllm {version}")
        try:
            results.append(sweep(source_tree(locate(version=version, cache_dir=request.cache_dir))))
        except VllmSourceError as error:
            errors[version] = str(error)
    table = releases_markdown(results, errors)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "sweep-audit.json", releases_json(results, errors))
        write_text_atomic(out / "sweep-audit.md", table)
    if request.json:
        print(json.dumps(releases_json(results, errors), indent=1))
    else:
        print(table, end="")
    return EXIT_ERROR if errors else EXIT_OK
