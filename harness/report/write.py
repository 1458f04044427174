"""Writing one report as one generation: report.json, report.md, junit.xml, report.html and status.json (the
verdict alone, harness.report.status), each atomic.

    write_report()        report.json first, then the renderings of the same report; stray temporaries removed;
                          never over a file collect did not write (foreign_outputs); returns report.json's sha256
    output_generations()  the generation each output in a directory carries, to tell a half-rewritten set
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.core.records import write_text_atomic
from harness.report.html import render_html
from harness.report.junit import render_junit
from harness.report.load import read_contained
from harness.report.markdown import render_markdown
from harness.report.model import Report, RunReport
from harness.report.status import status_text

REPORT_FILES = ("report.json", "report.md", "junit.xml", "report.html", "status.json")


_GENERATION_RE = {
    "report.json": re.compile(r'"generation": "([^"]+)"'),
    "report.md": re.compile(r"^# generation: (\S+)$", re.M),
    "junit.xml": re.compile(r'<property name="generation" value="([^"]+)"'),
    "report.html": re.compile(r'<meta name="harness-generation" content="([^"]+)"'),
    "status.json": re.compile(r'"generation": "([^"]+)"'),
}


_STAMP_HEAD_BYTES = 1 << 20  # each output's stamp is in its first lines: a matrix's junit.xml can be 50 MB


def output_generations(out_dir: Path) -> dict[str, str | None]:
    """The generation each of the four outputs in `out_dir` carries (None: absent, unreadable or unstamped). Each
    file's head is searched first; the whole file only when the head has no stamp."""
    root = Path(out_dir).resolve()
    found: dict[str, str | None] = {}
    for name, pattern in _GENERATION_RE.items():
        match = None
        for head in (_STAMP_HEAD_BYTES, None):
            data = read_contained(root, Path(out_dir) / name, limit=256 * 2**20, head=head)
            match = pattern.search(data.decode("utf-8", "replace")) if isinstance(data, bytes) else None
            if match or not isinstance(data, bytes) or len(data) < _STAMP_HEAD_BYTES:
                break
        found[name] = match.group(1) if match else None
    return found


def _remove_stray_temporaries(out_dir: Path) -> None:
    """Temporary files of an earlier collect that was killed mid-write (atomic writes clean up on any exception,
    not on SIGKILL); only this collect's own names."""
    for name in REPORT_FILES:
        for tmp in out_dir.glob(f".{name}.*.tmp"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)


class ForeignOutputError(Exception):
    """A file where an output goes that collect did not write (it carries no generation stamp): not overwritten."""


def foreign_outputs(out_dir: Path, generations: dict[str, str | None] | None = None) -> list[str]:
    """The outputs' names in `out_dir` that exist but carry no generation stamp: a user's own report.md, say.
    Every output collect writes carries one, so a file without it is not collect's to replace."""
    generations = output_generations(out_dir) if generations is None else generations
    return [
        name
        for name in REPORT_FILES
        if generations.get(name) is None and ((out_dir / name).is_file() or (out_dir / name).is_symlink())
    ]


def file_sha256(data: bytes) -> str:
    """ "sha256:<hex>" of a file's bytes: how a matrix report names each cell's report.json (MatrixCell.report_sha256)
    and its matrix.json, so compare checks them by hashing, without parsing."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Written:
    """What write_report wrote: the paths, notes on outputs of another generation it replaced, and the sha256 of the
    report.json bytes it wrote."""

    paths: tuple[Path, ...]
    notes: tuple[str, ...]
    report_sha256: str


def write_report(
    out_dir: Path, report: Report, *, plots: bool = True, cell_reports: Mapping[str, RunReport] | None = None
) -> Written:
    """report.json first (machine-readable first), then the renderings of the same report; every write atomic.

    Outputs of another generation (a collect that was killed between writes, or records that changed since) are
    detected, rewritten and named in the notes. `plots=False` draws no matplotlib figure in report.html (a matrix
    cell's page: the matrix's page plots the cells). `cell_reports`: a matrix's cells' whole reports, by name, for
    the sections of its pages that show per-rank detail (its report.json holds the cells' summaries only).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    before = output_generations(out_dir)
    foreign = foreign_outputs(out_dir, before)
    if foreign:
        raise ForeignOutputError(
            f"{out_dir / foreign[0]} exists and is not an output of collect (it carries no "
            "generation stamp): not overwritten; move it away and collect again"
        )
    _remove_stray_temporaries(out_dir)
    notes = tuple(
        f"{name} was of generation {gen}; rewritten as {report.generation}"
        for name, gen in before.items()
        if gen is not None and gen != report.generation
    )
    cells = cell_reports or {}
    texts = {
        "report.json": report.to_json_text(),
        "report.md": render_markdown(report, cells),
        "junit.xml": render_junit(report, cells),
        "report.html": render_html(report, plots=plots, cells=cells),
        "status.json": status_text(report),
    }
    paths = tuple(write_text_atomic(out_dir / name, texts[name]) for name in REPORT_FILES)
    return Written(paths=paths, notes=notes, report_sha256=file_sha256(texts["report.json"].encode()))
