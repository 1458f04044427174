"""Reading one run directory back, contained and bounded: run.json and ranks/*.json into typed records.

    read_contained()   the bytes of a regular file inside the run directory, under a size limit, or why not
    load_run()         the manifest, the rank records and failures (sorted by rank), every bad file as a Problem;
                       with a RecordSink, each record is handed over as it is read and not kept (collect streams)
    invalid_value()    the first NaN, infinity or negative size in a record
    input_hash()       load_run's input hash from the bytes alone (verifying a collected report cheaply)

Only canonical file names are read (ranks/rank-00001.json, never rank-1.json); nothing is read through a link out
of the run directory, nor anything that is not a regular file; no bad file raises.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.core.records import (
    RankFailure,
    RankRecord,
    Record,
    RecordError,
    RunManifest,
    parse_record,
    scenario_digest,
)
from harness.report.model import Problem, ProblemKind
from harness.scenario.limits import MAX_NUM_RANKS, MAX_POLICIES

MAX_RECORD_BYTES = 64 * 2**20  # a rank record is kilobytes; anything this large is not one
MAX_RANK_FILES = 1 << 20

_RANK_FILE_RE = re.compile(r"^rank-(\d{5,})(\.failed)?\.json$")
# Fields of a record that are signed by nature: a delta can be negative (RSS returned to the OS), so can "other".
_SIGNED_FIELDS = frozenset(
    {"delta_bytes", "workspace_delta_bytes", "other_bytes", "started_at", "finished_at", "ready_at", "at"}
)


@dataclass(frozen=True, kw_only=True)
class LoadedRun:
    """A run directory read back: the manifest, readable records sorted by rank, and every problem found."""

    run_dir: Path
    manifest: RunManifest | None
    records: tuple[RankRecord, ...]
    failures: tuple[RankFailure, ...]
    problems: tuple[Problem, ...]
    input_hash: str  # sha256 over every input file's name and bytes: the generation's content part


class RecordSink(Protocol):
    """Takes a run's rank records one at a time, in rank order, after run.json and every failure record were read."""

    def begin(self, manifest: RunManifest | None, failures: dict[int, RankFailure]) -> None: ...

    def add(self, record: RankRecord) -> None: ...


@dataclass
class _Inputs:
    """What load_run gathers step by step."""

    run_dir: Path
    root: Path  # run_dir resolved: nothing outside it is read
    problems: list[Problem] = field(default_factory=list)
    digests: list[tuple[str, str]] = field(default_factory=list)  # (relative path, sha256 of the bytes)
    unreadable_ranks: set[int] = field(default_factory=set)
    scenario_differs: bool = False  # run.json's scenario is not the one a rank recorded (said once)

    def problem(self, kind: ProblemKind, cause: str, *, rank: int | None = None, path: str | None = None) -> None:
        self.problems.append(Problem(kind=kind, cause=cause, rank=rank, path=path))


def read_contained(
    root: Path, path: Path, *, limit: int = MAX_RECORD_BYTES, head: int | None = None
) -> bytes | tuple[ProblemKind, str]:
    """The bytes of a regular file inside `root` (resolved), or (problem kind, cause): a link out of the directory,
    a FIFO or device (which would block or never end), a file over `limit`, or one that cannot be read.
    `head`: at most that many bytes, the file's first (a stamp near the top of a large output)."""
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        return "missing", "missing"
    except (OSError, RuntimeError) as exc:  # a link loop
        return "outside", f"cannot resolve: {exc}"
    if not real.is_relative_to(root):
        return "outside", f"a link to {real}, outside the run directory: not read"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return "corrupt", f"cannot open: {exc.strerror}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "outside", "not a regular file: not read"
        if info.st_size > limit:
            return "corrupt", f"{info.st_size} bytes, more than a record can be ({limit}): not read"
        with os.fdopen(os.dup(fd), "rb") as f:
            if head is not None and info.st_size > head:
                return f.read(head)
            # The size fstat gave, and one byte more: asking for limit + 1 at once would allocate the whole limit
            # (64 MiB) for every kilobyte-sized record. A file that grew since is read on, up to the limit.
            data = f.read(info.st_size + 1)
            if len(data) > info.st_size:
                data += f.read(limit + 1 - len(data))
    except OSError as exc:
        return "corrupt", f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)
    if len(data) > limit:
        return "corrupt", f"more than {limit} bytes: not read"
    return data


def _digested(inputs: _Inputs, rel: str) -> bytes | tuple[ProblemKind, str]:
    """read_contained, with the file's digest (or why it could not be read) added to the input hash."""
    data = read_contained(inputs.root, inputs.run_dir / rel)
    if isinstance(data, tuple):
        if data[0] != "missing":
            inputs.digests.append((rel, data[0]))
    else:
        inputs.digests.append((rel, hashlib.sha256(data).hexdigest()))
    return data


def _input_hash(digests: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(sorted(digests)).encode()).hexdigest()


def _read_record_file(inputs: _Inputs, rel: str, *, rank: int | None) -> Record | None:
    """One record file: read contained, hashed, parsed; a Problem instead of any exception."""
    data = _digested(inputs, rel)
    if isinstance(data, tuple):
        kind, cause = data
        inputs.problem(kind, f"{rel}: {cause}", rank=rank, path=rel)
        return None
    try:
        record = parse_record(data, where=rel)
    except RecordError as exc:
        inputs.problem(exc.reason if exc.reason != "unreadable" else "corrupt", str(exc), rank=rank, path=rel)
        return None
    invalid = invalid_value(record) if _may_hold_invalid(data) else None
    if invalid is not None:
        inputs.problem("invalid", f"{rel}: {invalid}", rank=rank, path=rel)
        return None
    return record


_NEGATIVE_NUMBER_RE = re.compile(rb"[:\[,]\s*-[0-9]")


def _may_hold_invalid(data: bytes) -> bool:
    """A cheap look at the bytes: only a record holding NaN, Infinity or a negative number needs the full walk."""
    return b"NaN" in data or b"Infinity" in data or _NEGATIVE_NUMBER_RE.search(data) is not None


def invalid_value(record: Record) -> str | None:
    """The first NaN, infinity or negative size in a record, named by its field path; None when it has none."""
    for where, value in _leaves(record.model_dump(), ()):
        name = where[-1] if where else ""
        path = ".".join(str(p) for p in where)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{path} is {value}: a record holds finite numbers only"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            sized = (
                isinstance(name, int) or name.endswith(("_bytes", "_us", "_gbps", "_tflops")) or name.startswith("num_")
            )
            if sized and name not in _SIGNED_FIELDS:
                return f"{path} is {value}: sizes, counts and times are >= 0"
    return None


def _leaves(value: Any, where: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    if isinstance(value, dict):
        if where and where[-1] == "scenario":
            return  # the scenario is checked by its own schema
        for key, item in value.items():
            yield from _leaves(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*where, i))
    else:
        yield where, value


def _load_manifest(inputs: _Inputs) -> RunManifest | None:
    if not (inputs.run_dir / "run.json").exists() and not (inputs.run_dir / "run.json").is_symlink():
        inputs.problem("no-manifest", "run.json is missing: cannot tell how many ranks were launched", path="run.json")
        return None
    loaded = _read_record_file(inputs, "run.json", rank=None)
    if loaded is None or isinstance(loaded, RunManifest):
        return loaded
    inputs.problem(
        "mismatch",
        f"run.json holds a {loaded.record_kind!r} record, not the run manifest",  # type: ignore[attr-defined]
        path="run.json",
    )
    return None


def _scan_ranks_dir(inputs: _Inputs) -> list[tuple[int, bool, str]]:
    """(rank, is_failure, relative path) of every canonical file in ranks/; anything else there is a problem."""
    ranks_dir = inputs.run_dir / "ranks"
    if not ranks_dir.is_dir():
        return []
    if not ranks_dir.resolve().is_relative_to(inputs.root):
        inputs.problem(
            "outside", f"ranks/ is a link to {ranks_dir.resolve()}, outside the run directory: not read", path="ranks/"
        )
        return []
    found: list[tuple[int, bool, str]] = []
    with os.scandir(ranks_dir) as entries:
        names = sorted(entry.name for _, entry in zip(range(MAX_RANK_FILES), entries, strict=False))
    for name in names:
        rel = f"ranks/{name}"
        match = _RANK_FILE_RE.match(name)
        if match is None or name != f"rank-{int(match.group(1)):05d}{match.group(2) or ''}.json":
            why = (
                "a temporary file left by a writer that was stopped"
                if name.endswith(".tmp")
                else "not a canonical rank-NNNNN[.failed].json name (five digits at least, no extra zeros)"
            )
            inputs.problem("unexpected-file", f"{rel}: {why}; not read", path=rel)
            continue
        found.append((int(match.group(1)), match.group(2) is not None, rel))
    return found


def _check_rank_record(
    inputs: _Inputs, record: Record, rank: int, is_failure: bool, rel: str, manifest: RunManifest | None
) -> bool:
    """Whether a parsed rank file belongs here: its kind, rank, run and scenario; a mismatch problem if not."""
    expected = RankFailure if is_failure else RankRecord
    cause = None
    if not isinstance(record, expected):
        cause = f"{rel}: holds a {record.record_kind!r} record"  # type: ignore[attr-defined]
    elif record.rank != rank:
        cause = f"{rel}: the record says rank {record.rank}, the file name says {rank}"
    elif manifest is not None and record.run_id != manifest.run_id:
        cause = f"{rel}: run_id {record.run_id!r} is not this run's ({manifest.run_id!r})"
    elif isinstance(record, RankRecord) and manifest is not None and record.scenario_hash != manifest.scenario_hash:
        cause = (
            f"{rel}: scenario hash {record.scenario_hash} differs from the run's {manifest.scenario_hash}; "
            "left out of the aggregates"
        )
    if cause is not None:
        inputs.unreadable_ranks.add(rank)
        inputs.problem("mismatch", cause, rank=rank, path=rel)
        return False
    if manifest is not None and rank >= manifest.num_ranks:
        inputs.problem(
            "mismatch",
            f"{rel}: rank {rank} is outside the {manifest.num_ranks} ranks run.json names",
            rank=rank,
            path=rel,
        )
    if isinstance(record, RankRecord) and len(record.policies) > MAX_POLICIES:
        inputs.unreadable_ranks.add(rank)
        inputs.problem(
            "mismatch",
            f"{rel}: {len(record.policies)} policies; allowed: at most {MAX_POLICIES} (the scenario's limit)",
            rank=rank,
            path=rel,
        )
        return False
    if isinstance(record, RankRecord) and manifest is not None:
        allowed = manifest.scenario.get("policies")
        outside = [p.policy for p in record.policies if isinstance(allowed, list) and p.policy not in allowed]
        if outside:
            inputs.unreadable_ranks.add(rank)
            inputs.problem(
                "mismatch",
                f"{rel}: policy {outside[0][:80]!r} is not one of the scenario's "
                f"({', '.join(str(a) for a in allowed or ())}); left out of the aggregates",
                rank=rank,
                path=rel,
            )
            return False
        if record.scenario != manifest.scenario and not inputs.scenario_differs:
            inputs.scenario_differs = True  # said once, of run.json: the ranks ran the scenario they record
            inputs.problem(
                "mismatch",
                f"run.json: its scenario differs from the one rank {rank} ran ({rel}): edited after the run",
                path="run.json",
            )
    return True


def _check_manifest(inputs: _Inputs, manifest: RunManifest) -> RunManifest | None:
    """run.json's own bounds and integrity: num_ranks within the scenario's limit (so no 10^8-rank set is built
    from it), its scenario still the one it was written with (scenario_sha256, when the record has one)."""
    if not 1 <= manifest.num_ranks <= MAX_NUM_RANKS:
        inputs.problem(
            "invalid",
            f"run.json: num_ranks {manifest.num_ranks}; allowed: 1 to {MAX_NUM_RANKS} (the scenario's limit)",
            path="run.json",
        )
        return None
    if manifest.scenario_sha256 is not None and scenario_digest(manifest.scenario) != manifest.scenario_sha256:
        inputs.problem(
            "mismatch",
            "run.json: its scenario is not the one the run was started with (its "
            "scenario_sha256 does not match: edited after the run); not judged against it",
            path="run.json",
        )
        return None
    return manifest


def load_run(run_dir: Path, *, sink: RecordSink | None = None) -> LoadedRun:
    """Read run.json and ranks/*.json inside `run_dir`; never raises for a bad file, it becomes a Problem.

    With `sink`, each rank record goes to sink.add as it is read (failure records first, then the records by
    rank) and the LoadedRun holds none: memory stays one record, not the run (54 KB a record otherwise)."""
    run_dir = Path(run_dir)
    inputs = _Inputs(run_dir=run_dir, root=run_dir.resolve())
    manifest = _load_manifest(inputs)
    manifest = _check_manifest(inputs, manifest) if manifest is not None else None
    records: dict[int, RankRecord] = {}
    record_ranks: set[int] = set()
    failures: dict[int, RankFailure] = {}
    begun = False
    # Failure records first (a handful), so a sink judging each rank as it comes knows which ranks failed.
    for rank, is_failure, rel in sorted(_scan_ranks_dir(inputs), key=lambda found: (not found[1], found[0])):
        if not is_failure and sink is not None and not begun:
            sink.begin(manifest, failures)
            begun = True
        record = _read_record_file(inputs, rel, rank=rank)
        if record is None:
            inputs.unreadable_ranks.add(rank)
        elif _check_rank_record(inputs, record, rank, is_failure, rel, manifest):
            if isinstance(record, RankFailure):
                failures[rank] = record
            elif sink is not None:
                record_ranks.add(rank)
                sink.add(record)  # type: ignore[arg-type]
            else:
                record_ranks.add(rank)
                records[rank] = record  # type: ignore[assignment]
    if sink is not None and not begun:
        sink.begin(manifest, failures)
    if manifest is not None:  # num_ranks is within MAX_NUM_RANKS here
        for rank in sorted(set(range(manifest.num_ranks)) - record_ranks - set(failures) - inputs.unreadable_ranks):
            rel = f"ranks/rank-{rank:05d}.json"
            inputs.problem(
                "missing-rank", f"rank {rank}: no record and no failure record ({rel} is missing)", rank=rank, path=rel
            )
    if not record_ranks:
        inputs.problem("no-records", "no readable rank records in ranks/", path="ranks/")
    digest = _input_hash(inputs.digests)
    return LoadedRun(
        run_dir=run_dir,
        manifest=manifest,
        records=tuple(records[r] for r in sorted(records)),
        failures=tuple(failures[r] for r in sorted(failures)),
        problems=tuple(inputs.problems),
        input_hash=digest,
    )


def input_hash(run_dir: Path) -> str:
    """The input hash load_run computes (LoadedRun.input_hash), from the files' bytes alone: nothing is parsed and
    one file is held at a time, so checking a collected report against 16384 records costs a read and a sha256 of
    each. The same files, in the same way: run.json and the canonical names in ranks/. A rank file is opened in
    ranks/ without following a link (no path resolved per file); anything but a regular file within the size
    limit (a link, a FIFO, an unreadable file) is digested as load_run digests it (read_contained)."""
    run_dir = Path(run_dir)
    inputs = _Inputs(run_dir=run_dir, root=run_dir.resolve())
    if (run_dir / "run.json").exists() or (run_dir / "run.json").is_symlink():
        _digested(inputs, "run.json")
    found = _scan_ranks_dir(inputs)  # ranks/ is inside the run directory, else nothing is found
    dir_fd = _open_dir(run_dir / "ranks") if found else None
    try:
        for _, _, rel in found:
            digest = _regular_file_sha256(dir_fd, rel.removeprefix("ranks/")) if dir_fd is not None else None
            if digest is None:
                _digested(inputs, rel)
            else:
                inputs.digests.append((rel, digest))
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return _input_hash(inputs.digests)


def _open_dir(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def _regular_file_sha256(dir_fd: int, name: str) -> str | None:
    """The sha256 (hex) of `name` in the directory `dir_fd` when it is a regular file of at most MAX_RECORD_BYTES,
    opened without following a link; None for anything else (read_contained then says what it is)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RECORD_BYTES:
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(info.st_size + 1)  # one byte more tells a file that grew since fstat: read_contained's
    except OSError:
        return None
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest() if len(data) == info.st_size else None
