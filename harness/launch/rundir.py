"""The output directory of `harness run`: checked before anything runs, claimed atomically when the run starts.

    choose_run_dir(out, run_id)   --out as given (a new path, or an empty writable directory; for a matrix, also
                                  that matrix's own directory, to add cells to it), else results/<run-id>;
                                  creates nothing, so --dry-run and refusals write nothing
    claim_run_dir(run_dir)        mkdir (never exist_ok for results/<run-id>) and an O_EXCL claim file: of two
                                  runs given the same --out at once, the second is refused, naming the first.
                                  Done before the launcher starts (and before torch is imported), so a --out
                                  this user cannot create is refused at once. RunDirClaim.release() at the end
                                  removes the claim file, and the directory too when the run wrote nothing.

Directories and files are created with the default modes, so they follow the user's umask.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.files import pid_alive, probe_writable
from harness.launch.contract import LaunchError
from harness.report.load import read_contained
from harness.report.write import REPORT_FILES, output_generations
from harness.scenario.matrix import MATRIX_MANIFEST
from harness.scenario.sections import safe_name
from harness.scenario.limits import shown as shown_value
from harness.scenario.source import display

RESULTS_DIR = Path("results")
CLAIM_FILE = ".harness-run"  # who writes this directory: "pid 123 on host since 2026-..., run <run-id>"
MAX_CLAIM_BYTES = 4096
# Free space --out must have before a run starts: run.json and the rank records (tens of KiB a rank), the reports.
RUN_DIR_MIN_FREE_BYTES = 8 * 2**20
# Ray's job supervisor sets this in the driver of every `ray job submit` job (ray/_private/runtime_env/constants.py).
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
MAX_MANIFEST_BYTES = 64 * 2**20  # matrix.json: every cell's scenario, 1024 cells at most
CLAIM_READ_ATTEMPTS, CLAIM_READ_INTERVAL_S = 20, 0.05  # up to 1 s for the owner to write its one line
DEFAULT_START_S = 60.0  # launch.placement_timeout_s's default: how long a run may take to start its ranks


def make_run_id(name: str, *, now: datetime.datetime | None = None) -> str:
    """'YYYYmmdd-HHMMSS-<name>' in UTC; the name made a safe path component whatever it holds."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{safe_name(name)}"


def _claim_owner(run_dir: Path) -> str:
    """The claim file's line; its owner writes it right after creating the file, so an empty one is re-read."""
    text = ""
    for _ in range(CLAIM_READ_ATTEMPTS):
        try:
            with open(run_dir / CLAIM_FILE, "rb") as f:
                text = f.read(MAX_CLAIM_BYTES).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        if text:
            return display(text)
        time.sleep(CLAIM_READ_INTERVAL_S)
    return ""


_CLAIM_RE = re.compile(r"^pid (\d+) on (\S+) since (\S+), run (\S+)$")


def _stale_claim(run_dir: Path, owner: str, stale_after_s: float) -> str | None:
    """Why the claim in run_dir belongs to no live run (then it may be taken over), or None while it may.

    A claim naming a pid on this host that is no longer running is stale; so is an empty claim (its writer died
    between creating it and writing its line: a full disk) older than `stale_after_s`, the longest a run takes
    to start. A claim of another host cannot be checked from here."""
    match = _CLAIM_RE.match(owner)
    if match is not None:
        pid, host = int(match.group(1)), match.group(2)
        if host == socket.gethostname() and not pid_alive(pid):
            return f"its claim names pid {pid} on {host}, which is no longer running"
        return None
    if owner:
        return None  # a line of another writer: not ours to judge
    try:
        age = time.time() - (run_dir / CLAIM_FILE).stat().st_mtime
    except OSError:
        return None
    if age > stale_after_s:
        return (f"its claim file is empty and {age:.0f} s old (a run writes it at once; its writer stopped, e.g. "
                f"on a full disk), beyond the {stale_after_s:g} s a run takes to start")
    return None


def _claimed_by_other(run_dir: Path, *, stale_after_s: float) -> str | None:
    """None when run_dir's claim was stale and is removed now (one line says so), else the refusal: who holds it
    and how to clear it."""
    owner = _claim_owner(run_dir)
    why = _stale_claim(run_dir, owner, stale_after_s)
    shown = display(run_dir)
    if why is not None:
        (run_dir / CLAIM_FILE).unlink(missing_ok=True)
        _clear_dead_run(run_dir, _CLAIM_RE.match(owner).group(4) if _CLAIM_RE.match(owner) else None)
        print(f"harness: --out {shown}: {why}: taken over", file=sys.stderr, flush=True)
        return None
    match = _CLAIM_RE.match(owner)
    if match is not None and match.group(2) != socket.gethostname():
        how = (f"if that run is gone (check on {match.group(2)}), delete {display(run_dir / CLAIM_FILE)} to take "
               "the directory over")
    else:
        how = f"if it is gone, delete {display(run_dir / CLAIM_FILE)} to take the directory over"
    return (f"--out {shown} is being written by another run ({owner or 'a run that is still starting'}); give "
            f"another directory, or {how}")


def clear_interrupted(run_dir: Path, *, stale_after_s: float = DEFAULT_START_S) -> None:
    """`harness run --resume`: what an interrupted run left in `run_dir` (run.json, no report.json), cleared so
    it can run again; its claim, if any, must be stale (LaunchError naming it otherwise)."""
    run_id = None
    if (run_dir / CLAIM_FILE).exists():
        refusal = _claimed_by_other(run_dir, stale_after_s=stale_after_s)  # clears a stale claim's run itself
        if refusal is not None:
            raise LaunchError(refusal)
        return
    try:
        manifest = run_dir / "run.json"
        if manifest.stat().st_size <= MAX_MANIFEST_BYTES:
            run_id = json.loads(manifest.read_bytes()).get("run_id")
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    _clear_dead_run(run_dir, run_id if isinstance(run_id, str) else None)


def _json_of(run_dir: Path, path: Path) -> object:
    """A JSON file inside run_dir, read within bounds; None when it cannot be read as JSON."""
    raw = read_contained(run_dir.resolve(), path, limit=MAX_MANIFEST_BYTES)
    if not isinstance(raw, bytes):
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def records_ended(run_dir: Path) -> bool:
    """Whether the launch of the run in run_dir ended, by its records alone: run.json names its ranks, and every
    rank has its final record (`complete: true`) or a failure record other than an interruption (a rank that died
    or hung ended too). Such a run's records are final: it is collected again, never run again or cleared.
    A run killed before that (ranks still running, or stopped by an interrupt) is not ended."""
    manifest = _json_of(run_dir, run_dir / "run.json")
    if not isinstance(manifest, dict):
        return False
    run_id, num_ranks = manifest.get("run_id"), manifest.get("num_ranks")
    if not isinstance(run_id, str) or not isinstance(num_ranks, int) or isinstance(num_ranks, bool) \
            or not 0 < num_ranks <= 1 << 20:
        return False
    for rank in range(num_ranks):
        final = _json_of(run_dir, run_dir / "ranks" / f"rank-{rank:05d}.json")
        if isinstance(final, dict) and final.get("run_id") == run_id and final.get("record_kind") == "rank" \
                and final.get("complete") is True:
            continue
        failed = _json_of(run_dir, run_dir / "ranks" / f"rank-{rank:05d}.failed.json")
        if isinstance(failed, dict) and failed.get("run_id") == run_id and \
                failed.get("record_kind") == "rank-failure" and isinstance(failed.get("cause"), str) and \
                not failed["cause"].startswith("interrupted"):
            continue
        return False
    return True


def remove_temporaries(run_dir: Path) -> None:
    """Temporary files that writers killed mid-write left in run_dir (each atomic write removes its own on any
    exception, not on SIGKILL): the reports', the records', the write probe's. Only these writers' own names."""
    names = [f".{name}.*.tmp" for name in (*REPORT_FILES, "run.json", "launch.json")] + [".harness-probe.*.tmp"]
    for pattern in names:
        for entry in run_dir.glob(pattern):
            if entry.is_file() and not entry.is_symlink():
                entry.unlink(missing_ok=True)
    ranks = run_dir / "ranks"
    if ranks.is_dir() and not ranks.is_symlink():
        for entry in ranks.iterdir():
            if re.fullmatch(r"\.rank-\d{5,}(\.failed)?\.json\.[^/]*\.tmp", entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)


def _clear_dead_run(run_dir: Path, run_id: str | None) -> None:
    """What a run that was killed left in its directory, when run.json says it is that run's: its manifest, its
    rank records, launch.json, OOM snapshots, every writer's temporaries, and reports collected from them (stamped;
    nothing else), so the directory can be run into again. Another run's files, and files collect did not write,
    are left alone. A run whose records are final (records_ended: it was killed after its launch ended, while it
    collected) is never cleared: only its temporaries go, and it is collected again, not run again."""
    manifest = run_dir / "run.json"
    if run_id is None or not manifest.is_file() or manifest.is_symlink():
        remove_temporaries(run_dir)
        return
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES or json.loads(manifest.read_bytes()).get("run_id") != run_id:
            return
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    remove_temporaries(run_dir)
    if records_ended(run_dir):
        return
    ranks = run_dir / "ranks"
    if ranks.is_dir() and not ranks.is_symlink():
        for entry in ranks.iterdir():
            if re.fullmatch(r"rank-\d{5,}(\.failed)?\.json", entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)
        if not any(ranks.iterdir()):
            ranks.rmdir()
    oom = run_dir / "oom"  # the ranks' memory snapshots at an OOM
    if oom.is_dir() and not oom.is_symlink():
        for entry in oom.glob("rank-*.pickle"):
            entry.unlink(missing_ok=True)
        if not any(oom.iterdir()):
            oom.rmdir()
    (run_dir / "launch.json").unlink(missing_ok=True)  # where each rank ran
    stamped = output_generations(run_dir)  # reports a collect of the partial run wrote: collect's, stamped
    for name in REPORT_FILES:
        if stamped.get(name) is not None:
            (run_dir / name).unlink(missing_ok=True)
    manifest.unlink(missing_ok=True)


def take_over_stale_claim(run_dir: Path, *, stale_after_s: float = DEFAULT_START_S) -> None:
    """A claim file in run_dir that names no live run is removed (one line says why), and nothing else: what the
    dead run left is the caller's to judge (a matrix cell whose records ended is collected again). LaunchError
    naming the owner when the claim may be live."""
    if not (run_dir / CLAIM_FILE).exists():
        return
    owner = _claim_owner(run_dir)
    why = _stale_claim(run_dir, owner, stale_after_s)
    if why is None:
        refusal = _claimed_by_other(run_dir, stale_after_s=stale_after_s)
        if refusal is not None:
            raise LaunchError(refusal)
        return
    (run_dir / CLAIM_FILE).unlink(missing_ok=True)
    print(f"harness: --out {display(run_dir)}: {why}: taken over", file=sys.stderr, flush=True)


def _entries(directory: Path) -> list[str]:
    with os.scandir(directory) as it:
        return [entry.name for entry in it]


def holds_matrix(directory: Path) -> bool:
    return (directory / MATRIX_MANIFEST).is_file()


def _matrix_name(directory: Path) -> object:
    """The name in a matrix directory's matrix.json, read within bounds; LaunchError when it cannot be read."""
    path = directory / MATRIX_MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError("too big")
        return json.loads(path.read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError, RecursionError):
        raise LaunchError(f"--out {display(directory)}: {MATRIX_MANIFEST} is unreadable; give a new directory") from None


def _check_existing_dir(out: Path, matrix_name: str | None, stale_after_s: float) -> None:
    shown = display(out)
    entries = _entries(out)
    if CLAIM_FILE in entries:
        refusal = _claimed_by_other(out, stale_after_s=stale_after_s)
        if refusal is not None:
            raise LaunchError(refusal)
        entries = _entries(out)
    if matrix_name is not None and holds_matrix(out):  # this matrix's directory again: its cells are added
        existing = _matrix_name(out)
        if existing != matrix_name:
            raise LaunchError(f"--out {shown} holds matrix {shown_value(existing)}, not {matrix_name!r}; give a "
                              "new directory")
        return _probe(out)
    if "run.json" in entries or "ranks" in entries:
        if records_ended(out):
            raise LaunchError(f"--out {shown} already holds a run whose records are complete (`harness collect "
                              f"{shown}` reports it); give a new directory")
        raise LaunchError(f"--out {shown} already holds a run; give a new directory")
    if entries:
        raise LaunchError(f"--out {shown} is not empty ({len(entries)} entries); allowed: a new or empty directory")
    if not os.access(out, os.W_OK | os.X_OK):
        raise LaunchError(f"--out {shown} is not writable by this user; allowed: a writable directory")
    _probe(out)


def check_out_dir(out: Path, *, matrix_name: str | None = None, stale_after_s: float = DEFAULT_START_S) -> None:
    """Refuse an --out that is a file, a non-empty or read-only directory, or under one; create nothing.

    With matrix_name: a directory holding that matrix (matrix.json) is taken too, to add cells to it.
    """
    shown = display(out)
    try:
        if out.is_dir():
            return _check_existing_dir(out, matrix_name, stale_after_s)
        if out.exists() or out.is_symlink():
            raise LaunchError(f"--out {shown} exists and is not a directory; allowed: a new or empty directory")
        parent = out.absolute().parent
        while not parent.exists():
            parent = parent.parent
    except OSError as exc:  # a name too long, a loop of links
        raise LaunchError(f"--out {shown}: not a usable path ({exc.strerror})") from None
    if not parent.is_dir():
        raise LaunchError(f"--out {shown}: {display(parent)} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LaunchError(f"--out {shown}: cannot create it, {display(parent)} is not writable by this user")
    _probe(out)


def _probe(out: Path) -> None:
    """A file is written and removed where the run will write (root passes os.access on a read-only directory, and
    no access check sees a read-only or full filesystem): refused before anything runs, not after."""
    try:
        probe_writable(out, need_bytes=RUN_DIR_MIN_FREE_BYTES)
    except OSError as exc:
        what = "cannot write the run's records there" if out.is_dir() else "cannot create it"
        raise LaunchError(f"--out {display(out)}: {what} ({exc.strerror}); allowed: a writable directory with "
                          f"{RUN_DIR_MIN_FREE_BYTES // 2**20} MiB free at least") from None


def choose_run_dir(out: Path | None, run_id: str, *, matrix_name: str | None = None,
                   stale_after_s: float = DEFAULT_START_S) -> Path:
    """--out as given (checked: new, or an empty writable directory), else results/<run-id> (made unique).

    `stale_after_s`: the longest the run takes to start (the scenario's launch.placement_timeout_s): an empty claim
    older than that is no run still starting, and is taken over."""
    if out is not None:
        check_out_dir(out, matrix_name=matrix_name, stale_after_s=stale_after_s)
        return out.resolve()
    if RAY_JOB_ENV in os.environ:
        # A job's working directory is Ray's temporary copy of --working-dir, deleted when the job ends.
        raise LaunchError("inside a `ray job submit` job results/ is Ray's temporary copy of the working directory, "
                          "deleted when the job ends: give --out an absolute path on the head node "
                          "(README: Running on a Ray cluster)")
    run_dir = RESULTS_DIR / run_id
    suffix = 2
    while run_dir.exists():
        run_dir = RESULTS_DIR / f"{run_id}-{suffix}"
        suffix += 1
    return run_dir.resolve()  # absolute: ranks on other nodes and in other working directories get it as is


def _write_claim(run_dir: Path, run_id: str, *, reuse: bool, stale_after_s: float = DEFAULT_START_S) -> None:
    """O_EXCL: exactly one run creates the claim file; the others are refused, naming its owner."""
    try:
        fd = os.open(run_dir / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        refusal = _claimed_by_other(run_dir, stale_after_s=stale_after_s)
        if refusal is not None:
            raise LaunchError(refusal) from None
        return _write_claim(run_dir, run_id, reuse=reuse, stale_after_s=stale_after_s)
    except OSError as exc:
        raise LaunchError(f"--out {display(run_dir)}: cannot write in it ({exc.strerror})") from None
    since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"pid {os.getpid()} on {socket.gethostname()} since {since}, run {run_id}\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # a full disk: no empty claim is left behind to block the directory
        (run_dir / CLAIM_FILE).unlink(missing_ok=True)
        raise LaunchError(f"--out {display(run_dir)}: cannot write in it ({exc.strerror})") from None
    others = [name for name in _entries(run_dir) if name != CLAIM_FILE]
    if others and not reuse:  # written between the check and the claim: not ours to mix with
        (run_dir / CLAIM_FILE).unlink(missing_ok=True)
        raise LaunchError(f"--out {display(run_dir)} is not empty ({len(others)} entries); allowed: a new or empty "
                          "directory")


@dataclass(frozen=True)
class RunDirClaim:
    path: Path
    created: bool  # this run made the directory (else it took one given as --out)

    def release(self) -> None:
        """The run is over: remove the claim file, and the directory when this run made it and wrote nothing."""
        try:
            (self.path / CLAIM_FILE).unlink(missing_ok=True)
            if self.created and not _entries(self.path):
                self.path.rmdir()
        except OSError:
            pass  # left as it is: a claim file left behind names the run that made it


def claim_run_dir(run_dir: Path, run_id: str, *, exact: bool = True, reuse: bool = False,
                  stale_after_s: float = DEFAULT_START_S) -> RunDirClaim:
    """Create run_dir (or take it empty) and claim it.

    exact=False (results/<run-id>): a directory that appeared meanwhile is skipped for the next free suffix.
    reuse=True: the directory may hold files already (a matrix directory that gets more cells).
    """
    candidate, suffix = run_dir, 2
    while True:
        try:
            candidate.mkdir(parents=True)
            created = True
            break
        except FileExistsError:
            if exact:
                created = False  # an existing --out: the claim file decides
                break
            candidate = run_dir.with_name(f"{run_dir.name}-{suffix}")
            suffix += 1
        except OSError as exc:
            raise LaunchError(f"--out {display(candidate)}: cannot create it ({exc.strerror})") from None
    if created is False and not candidate.is_dir():
        raise LaunchError(f"--out {display(candidate)} exists and is not a directory; allowed: a new or empty "
                          "directory")
    _write_claim(candidate, run_id, reuse=reuse, stale_after_s=stale_after_s)
    return RunDirClaim(candidate, created)
