"""The hostile-input corpus through the real CLI: `harness plan` and `harness run` refuse every input.

tests/hostile/ holds the corpus: one small file per input (its header says the category, what it tries and a
fragment the refusal must contain), and generated.yaml for inputs that cannot be literal files (FIFOs, devices,
sockets, links, files of megabytes), made in a temporary directory here. Every input goes through both commands,
each in a process of its own, and the test asserts, for each: exit code 2, exactly one line on stderr naming the
problem, no traceback, nothing on stdout, done within CPU_LIMIT_S of CPU time under an address-space limit of
ADDRESS_SPACE_BYTES, and no file created or removed anywhere under the temporary root (the working directory is
four levels down, so a name climbing out with ../../../ stays inside it) nor in the repository's results/.

The processes are forked from a server (tests/cli_forkserver.py) that has imported the CLI and what a refusal
needs (pydantic, PyYAML, rich) but not torch, and each runs `harness ARGS` as `python -m harness` does: the
corpus costs forks, not hundreds of interpreter starts. The bounds are the child's own CPU time and memory
(RLIMIT_CPU, RLIMIT_AS: the kernel stops it past either), not wall-clock time, so a loaded machine slows a case
without failing it. Both commands refuse before importing torch or spawning a rank. An input the checks miss costs
far more: `harness run` imports torch (more than 1 GiB of address space, so it fails under the limit with a
traceback) and starts ranks; a loop spends its CPU seconds. An input that blocks without spending CPU (a FIFO
read) is caught by HANG_S of wall clock: the scenario's own bound on starting a run
(launch.placement_timeout_s), far beyond any refusal under any load.

Inputs whose header says `plan: accepted` are well formed, so `harness plan` (pure data) plans them, exit 0; only
`harness run` refuses them, because this machine cannot hold them (ranks per core, memory per rank): the child
sees 2 CPUs (sched_setaffinity) and no GPU (CUDA_VISIBLE_DEVICES=""), the CI machine's shape. Headers with
`out: ...` prepare a hostile --out for `harness run`.
"""

from __future__ import annotations

import math
import os
import queue
import re
import signal
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli_forkserver import CliForkServer, Job
from cli_utils import REPO_DIR, harness_env
from harness.scenario.schema import parse_scenario
from scenario_utils import TINY

CORPUS_DIR = Path(__file__).resolve().parent / "hostile"
GENERATED_SPEC = CORPUS_DIR / "generated.yaml"
COMMANDS = ("plan", "run")
CATEGORIES = {"hang", "memory", "traceback", "accepted", "outside", "matrix"}
CPU_LIMIT_S = 5  # CPU seconds a refusal may spend (the kernel sends SIGXCPU past it)
HANG_S = parse_scenario(TINY, path="<tiny>").launch.placement_timeout_s  # the scenario's own bound on starting
ADDRESS_SPACE_BYTES = 2**30
NUM_CPUS_SEEN = 2
HEADER = re.compile(rb"^# (\w[\w-]*): (.*)$")


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    category: str
    what: str
    expect: str  # a fragment of the one line on stderr
    plan_accepted: bool = False
    out: str | None = None  # how `harness run`'s --out is prepared: file, readonly, nonempty, claimed, holds-run
    source: Path | None = None  # a literal corpus file
    make: dict[str, Any] = field(default_factory=dict)  # or how to make it (generated.yaml)


def _literal_case(path: Path) -> Case:
    headers: dict[str, str] = {}
    for line in path.read_bytes().splitlines():
        match = HEADER.match(line)
        if not match:
            break
        headers[match.group(1).decode()] = match.group(2).decode()
    category, _, what = headers["hostile"].partition(": ")
    return Case(
        id=path.stem,
        category=category,
        what=what,
        expect=headers["expect"],
        plan_accepted=headers.get("plan") == "accepted" or "out" in headers,
        out=headers.get("out"),
        source=path,
    )


def _generated_cases() -> list[Case]:
    return [
        Case(id=e["id"], category=e["category"], what=e["what"], expect=e["expect"], make=e["make"])
        for e in yaml.safe_load(GENERATED_SPEC.read_text())
    ]


LITERAL = [_literal_case(p) for p in sorted(CORPUS_DIR.glob("*.yaml")) if p != GENERATED_SPEC]
CASES = LITERAL + _generated_cases()
BASE_TEXT = yaml.safe_dump(TINY, sort_keys=False)


def _make(case: Case, directory: Path) -> Path:
    """The input file of a case: the corpus file itself, or a special or big file made in `directory`."""
    if case.source is not None:
        return case.source
    path = directory / f"{case.id}.yaml"
    make = case.make
    if "fifo" in make:
        os.mkfifo(path)
    elif "socket" in make:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))  # the bound name stays a socket file once closed
        server.close()
    elif "directory" in make:
        path.mkdir()
    elif "symlink" in make:
        path.symlink_to(make["symlink"])
    elif "symlink_loop" in make:
        path.symlink_to(path.name)
    elif "sparse_bytes" in make:
        with open(path, "wb") as f:
            f.truncate(make["sparse_bytes"])
    elif "mapping_keys" in make:
        path.write_text(BASE_TEXT + "x: {" + ", ".join(f"k{i}: 1" for i in range(make["mapping_keys"])) + "}\n")
    elif "matrix_base_loop" in make:
        (directory / "loop-a.yaml").symlink_to("loop-b.yaml")
        (directory / "loop-b.yaml").symlink_to("loop-a.yaml")
        path.write_text("matrix:\n  base_file: loop-a.yaml\n  axes:\n    seed: [1]\n")
    elif "matrix_base_keys" in make:
        keys = ", ".join(f"k{i}: 1" for i in range(make["matrix_base_keys"]))
        seeds = ", ".join(str(i) for i in range(make["matrix_cells"]))
        path.write_text(f"matrix:\n  base: {{x: {{{keys}}}}}\n  axes:\n    seed: [{seeds}]\n")
    else:
        path.write_text("".join((BASE_TEXT if piece == "$BASE" else piece) * count for piece, count in make["text"]))
    return path


def _unwritable_out(work: Path) -> Path | None:
    """An --out this user cannot create: under a read-only directory, or for root (who writes through modes) a
    path in sysfs, where mkdir fails even for root. None when neither works here."""
    if os.geteuid() != 0:
        read_only = work / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        return read_only / "out"
    candidate = Path("/sys/harness-hostile-out")
    try:
        candidate.mkdir()
    except OSError:
        return candidate
    candidate.rmdir()
    return None


def _prepare_out(kind: str | None, work: Path) -> Path | None:
    out = work / "out"
    if kind == "file":
        out.write_text("not a directory\n")
    elif kind == "readonly":
        return _unwritable_out(work)
    elif kind == "nonempty":
        out.mkdir()
        (out / "notes.txt").write_text("someone else's\n")
    elif kind == "claimed":
        out.mkdir()
        (out / ".harness-run").write_text("pid 4242 on another-host since 2026-11-30T12:00:00+00:00, run x\n")
    elif kind == "holds-run":
        out.mkdir()
        (out / "run.json").write_text("{}\n")
    return out


def _listing(root: Path) -> list[str]:
    """Every path under root (links not followed), with its kind: what must not change."""
    found = []
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory, name)
            found.append(f"{path.relative_to(root)} {'d' if path.is_dir() and not path.is_symlink() else 'f'}")
    return sorted(found)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    returncode: int | None  # None: still running after HANG_S without spending its CPU bound (blocked; killed)
    stdout: str
    stderr: str
    wall_s: float
    changed: list[str]  # paths created or removed under the case's root
    skipped: str | None = None


def _run(server: CliForkServer, case: Case, command: str, root: Path, streams: Path) -> Outcome:
    work = root / "w" / "x" / "y" / "z"
    work.mkdir(parents=True)
    inputs = root / "inputs"
    inputs.mkdir()
    path = _make(case, inputs)
    args = [command, str(path)]
    if command == "run":
        out = _prepare_out(case.out, work)
        if out is None:
            return Outcome(
                returncode=None,
                stdout="",
                stderr="",
                wall_s=0.0,
                changed=[],
                skipped="no directory here that this user cannot write",
            )
        args += ["--out", str(out)]
    before = _listing(root)
    answer = server.run(
        Job(
            args=args,
            cwd=str(work),
            stdout=str(streams / "stdout"),
            stderr=str(streams / "stderr"),
            wall_s=HANG_S,
            address_space_bytes=ADDRESS_SPACE_BYTES,
            cpu_s=CPU_LIMIT_S,
            num_cpus=NUM_CPUS_SEEN,
        )
    )
    stdout, stderr = (_read(streams / name) for name in ("stdout", "stderr"))
    after = _listing(root)
    changed = sorted(set(before) ^ set(after))
    return Outcome(returncode=answer.returncode, stdout=stdout, stderr=stderr, wall_s=answer.wall_s, changed=changed)


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
    except FileNotFoundError:
        return ""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Outcome]:
    """Every case through both commands, two processes at a time (the CI machine's cores)."""
    results_dir = REPO_DIR / "results"
    results_before = sorted(os.listdir(results_dir)) if results_dir.is_dir() else []
    jobs = [(case, command) for case in CASES for command in COMMANDS]
    roots = [tmp_path_factory.mktemp(f"{case.id}-{command}") for case, command in jobs]
    streams = [tmp_path_factory.mktemp("streams") for _ in jobs]  # outside each root: it must not change
    env = dict(harness_env(), CUDA_VISIBLE_DEVICES="")
    servers: queue.Queue[CliForkServer] = queue.Queue()
    started = [CliForkServer(env) for _ in range(NUM_CPUS_SEEN)]
    for server in started:
        servers.put(server)

    def one(job: tuple[tuple[Case, str], Path, Path]) -> Outcome:
        (case, command), root, stream_dir = job
        server = servers.get()
        try:
            return _run(server, case, command, root, stream_dir)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=NUM_CPUS_SEEN) as pool:
            done = list(pool.map(one, zip(jobs, roots, streams, strict=True)))
    finally:
        for server in started:
            server.close()
    for root in roots:  # the read-only directories, so pytest can remove the temporary tree
        for ro in root.rglob("read-only"):
            ro.chmod(0o755)
    results_after = sorted(os.listdir(results_dir)) if results_dir.is_dir() else []
    assert results_after == results_before, "the hostile inputs wrote into the repository's results/"
    return {(case.id, command): outcome for (case, command), outcome in zip(jobs, done, strict=True)}


def test_the_corpus_covers_every_category() -> None:
    assert len(LITERAL) >= 150, f"the corpus on disk holds {len(LITERAL)} inputs; it should hold 150 or more"
    counts = Counter(case.category for case in CASES)
    assert set(counts) == CATEGORIES, counts
    assert min(counts.values()) >= 10, counts
    assert len({case.id for case in CASES}) == len(CASES), "two inputs share an id"
    big = [c.id for c in LITERAL if c.source is not None and c.source.stat().st_size > 8192]
    assert not big, f"keep corpus files small; make big inputs in generated.yaml: {big}"


# The first test builds the module fixture: every invocation, NUM_CPUS_SEEN at a time, each bounded by HANG_S.
FIXTURE_BOUND_S = math.ceil(len(CASES) * len(COMMANDS) * HANG_S / NUM_CPUS_SEEN) + 60


@pytest.mark.slow
@pytest.mark.timeout(FIXTURE_BOUND_S)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_input_is_refused(outcomes: dict[tuple[str, str], Outcome], case: Case, command: str) -> None:
    outcome = outcomes[(case.id, command)]
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    where = f"{case.category}: {case.what}\nstdout: {outcome.stdout[-2000:]}\nstderr: {outcome.stderr[-2000:]}"
    assert outcome.returncode is not None, f"blocked: still running after {HANG_S} s; {where}"
    assert outcome.returncode != -signal.SIGXCPU, f"spent more than {CPU_LIMIT_S} s of CPU; {where}"
    assert "Traceback" not in outcome.stderr, where
    assert not outcome.changed, f"created or removed {outcome.changed}; {where}"
    if command == "plan" and case.plan_accepted:
        assert outcome.returncode == 0, f"well formed, so `harness plan` plans it; {where}"
        return
    assert outcome.returncode == 2, where
    assert outcome.stdout == "", where
    assert outcome.stderr.startswith("harness: error: ") and outcome.stderr.count("\n") == 1, (
        f"one line on stderr; {where}"
    )
    assert case.expect in outcome.stderr, f"{case.expect!r} not in the message; {where}"
