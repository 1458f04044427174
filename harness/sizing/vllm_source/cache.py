"""The cache of extracted vLLM wheels: fetching a release checked against the index, and checking an entry on use.

    <cache>/vllm/<version>/release/          a release fetched by number
    <cache>/vllm/<version>/wheel-<sha12>/    a wheel file the user handed in
    <cache>/vllm/<version>/wheel/            the release's wheel itself, kept on request (verified again on use)
    <cache>/downloads.log                    one JSON line per download started: a CI run with a warm cache adds none
        manifest.json                        CacheManifest: the wheel's sha256, every file's sha256 and size
        vllm-X.Y.Z.dist-info/RECORD          the wheel's own list of its members' sha256
        vllm/...                             the extracted members

The chain of checks, from the index to each file the harness reads or loads:

    the index's published sha256 == sha256 of the downloaded wheel           (pip --require-hashes, then again here)
        == PINNED_WHEELS[version].wheel_sha256 for the releases the harness was checked against
    sha256 of the wheel's RECORD == PINNED_WHEELS[version].record_sha256     (pinned releases)
    each extracted member's sha256 == its RECORD line                        (at extraction and on every use)
    each file of the entry == its manifest line, and nothing else is there   (on every use)

A user's wheel file is its own anchor: its sha256 names the entry and its RECORD is compared on every use. An entry
that breaks a link, or is not owned by the user, or is writable by others, is refused with one line naming the
path and what to delete; the harness never repairs it silently. An entry of an older manifest schema is extracted
again. Nothing in an entry is imported or executed (see evaluate.py); the ops library is loaded by the vllm-ops
backend only after this check.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import json
import os
import re
import shutil
import stat
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypeGuard

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.core.errors import InfrastructureError
from harness.core.files import remove_dead_staging
from harness.core.records import Record

MANIFEST_NAME = "manifest.json"
DOWNLOAD_LOG_NAME = "downloads.log"
# 3: every file's sha256 and the wheel's RECORD. A manifest without `schema_version` (older harness code, no
# hashes) is extracted again. The fields older code reads (`schema` 1, `layer_files`, `files` as paths) stay as
# they were, so that code accepts these entries too and the two never re-extract each other's work in a shared
# cache.
MANIFEST_SCHEMA: Final = 3
MAX_MANIFEST_BYTES = 4 << 20  # a release's manifest is about 40 kB
MAX_RECORD_BYTES = 16 << 20  # a vLLM wheel's RECORD is about 0.5 MB
MAX_MEMBER_BYTES = 1 << 30  # the largest member, the ops library, is about 80 MB (0.26.0 and 0.30.0)

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class CacheError(InfrastructureError):
    """A wheel or cache entry failed a check; the message is one line naming the path and what to do."""


@dataclass(frozen=True)
class PinnedWheel:
    wheel_sha256: str  # the index's published sha256 of the Linux x86-64 wheel
    record_sha256: str  # sha256 of the wheel's .dist-info/RECORD


# The releases the harness was checked against (docs/vllm-sources.md, "Releases checked"): the index's published
# hash of each wheel, and of the RECORD inside it, as fetched on 2026-11-30. A cache entry of one of these
# releases must carry exactly these, whoever wrote the entry.
PINNED_WHEELS: dict[str, PinnedWheel] = {
    "0.22.0": PinnedWheel(
        wheel_sha256="c387a977e35795e8f77b009e019e69722963819c26b55e4a679e09d4279ae35d",
        record_sha256="0fb4bae08f5764476e0fdb2acd9aa9e41a4b7fabb53d76469bf52b12bdb208af",
    ),
    "0.22.1": PinnedWheel(
        wheel_sha256="cc50536c93827a577b2bc45f038b8b866c31ed220631008521a337c9b2558f4d",
        record_sha256="330eb862a18485284901699c5561ca91e30573672dc313e8ee35c9050e006e8c",
    ),
    "0.23.0": PinnedWheel(
        wheel_sha256="872aeb7c36a1ea942216af067ce870ffdf960804e829367e1b4eb36d4831c03c",
        record_sha256="4b69f24e00ca417d7ae84bb7cbf104a29200f7d43622657b89ca17164288526c",
    ),
    "0.24.0": PinnedWheel(
        wheel_sha256="2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf",
        record_sha256="faedfff053a871980816cea1bc6b20aea1108b8fb2e951047c196a6548e9e6c5",
    ),
    "0.25.0": PinnedWheel(
        wheel_sha256="c82e96b01af2142ef398ca92f1e9c5f4ffc119f2cc09fe68ea28865323532f0c",
        record_sha256="0f70614630e7701d90f98024c4fd541fa7bc11e667d184d5c4896286a37a27a5",
    ),
    "0.25.1": PinnedWheel(
        wheel_sha256="16fc7a28df1576eb6f7ca0455026551b8f9adb674c19c66059359ef3e964bd1e",
        record_sha256="e00862c005fbd5da372f3970fb0f5c6ca8f6ea1dd5c75ea205ce0f58ea74a1a5",
    ),
    "0.26.0": PinnedWheel(
        wheel_sha256="adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de",
        record_sha256="e550ed7cec142a9512ef43c8c9a0adedcddec5973b0b2e97a600bfdd2864a44e",
    ),
    "0.27.0": PinnedWheel(
        wheel_sha256="02d8265e71bab1cf50f93026211c9a75562a7f0a72b3a32ec5e0e8bcdd62ec75",
        record_sha256="eedb76cb97341791d466e03f60e09dd9e5dd7117dd1e1ee17800d693583c039f",
    ),
    "0.27.1": PinnedWheel(
        wheel_sha256="98e9fc2a1ed8549a733c9d1b242e2002b82367da9e29e37801761438cb3a2670",
        record_sha256="389a70dc3f95d2514f29065d97ff149f851f557f9e97d6c797323abdff6f8961",
    ),
    "0.28.0": PinnedWheel(
        wheel_sha256="addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
        record_sha256="91d2edd6f8af9544a8c1cd4b7a23ed700cc75f748e9abb7ffaec2dd9f56402d0",
    ),
    "0.29.0": PinnedWheel(
        wheel_sha256="09d48617fc2be9c6cdcd5db480651ab0d84817b257204f2cc2e3ecbb70bbb635",
        record_sha256="368879410efb3da4db74f47ab1953ad674075c4a1d2e8d59c464d004681e4ee4",
    ),
    "0.30.0": PinnedWheel(
        wheel_sha256="ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
        record_sha256="98c60262010a2fe2759540bd49bd260712f1a2275eb5c4a55d67b2751abe5630",
    ),
    "0.31.0": PinnedWheel(
        wheel_sha256="39132b433967f0962d03d8a5f633b9bee6b32708f566c7d5637b79f8d0ef3433",
        record_sha256="42b2205c6fa3ede3ad329ec24a4f0ce5358534c47ffc73c0d67d7e844c929d2d",
    ),
    "0.32.0": PinnedWheel(
        wheel_sha256="5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611",
        record_sha256="7de1ca9fab186868f4794671b450d274a40739fd887f7e5a52bc5ca76aab0f85",
    ),
    "0.33.0": PinnedWheel(
        wheel_sha256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
        record_sha256="a860951d44545b1b68c2d1484b9a03bbde52f6eae34850a6c22741c60ac386c4",
    ),
}


class CachedFile(Record):
    path: str  # relative to the entry, "/"-separated
    sha256: str = Field(pattern=SHA256_PATTERN)
    size_bytes: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _relative_inside(cls, path: str) -> str:
        if not safe_member(path):
            raise ValueError(f"{path!r} is not a relative path inside the entry")
        return path


class CacheManifest(Record):
    """What one cache entry holds and where it came from; written once, checked on every use."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_version: Literal[3] = MANIFEST_SCHEMA
    # What older harness code reads and checks (see MANIFEST_SCHEMA): the entry holds LAYER_FILES.
    legacy_schema: Literal[1] = Field(1, alias="schema")
    layer_files: Literal[True] = True
    kind: Literal["release", "wheel"]
    version: str | None
    origin: str
    wheel_name: str
    wheel_sha256: str = Field(pattern=SHA256_PATTERN)
    wheel_bytes: int = Field(ge=0)
    # "index": equal to the index's published sha256 when downloaded; "file": the sha256 of the user's wheel file.
    wheel_sha256_checked_against: Literal["index", "file"]
    record: CachedFile  # the wheel's RECORD, kept in the entry
    files: tuple[str, ...]  # the extracted members' paths
    hashes: tuple[CachedFile, ...]  # the same members, in the same order, each as its RECORD line lists it
    torch_requirement: str | None
    ops_library_in_wheel: str | None  # the member name, known even when not extracted
    ops_extracted: bool

    @model_validator(mode="after")
    def _hashes_for_every_file(self) -> CacheManifest:
        if tuple(f.path for f in self.hashes) != self.files:
            raise ValueError("hashes must list the files, in the same order")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=1) + "\n"


def serves(manifest: CacheManifest | None, *, with_ops: bool) -> TypeGuard[CacheManifest]:
    if manifest is None:
        return False
    # A wheel without an ops library cannot do better on a second try, so it still serves with_ops.
    return not with_ops or manifest.ops_extracted or manifest.ops_library_in_wheel is None


# --- checking an entry -----------------------------------------------------------------------------------------


def load_entry(directory: Path, *, wheel: Path | None = None) -> CacheManifest | None:
    """The manifest of a cache entry that passes every check; None when there is no entry or it is of an older
    schema (extract again). Raises CacheError, one line, for an entry that fails a check.

    wheel: for an entry of a user's wheel file, that file; its RECORD must be the one the entry was made from.
    An entry that another process replaced while it was being checked is checked again (see _install).
    """
    for _ in range(3):
        try:
            before = directory.lstat()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise _refused(directory, f"cannot be read ({error})") from None
        try:
            return _load_entry_once(directory, before, wheel)
        except CacheError:
            if _same_directory(directory, before):
                raise
    raise CacheError(f"cache entry {directory} kept being replaced while it was checked; run again")


def _same_directory(directory: Path, before: os.stat_result) -> bool:
    try:
        after = directory.lstat()
    except OSError:
        return False
    return (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def _load_entry_once(directory: Path, info: os.stat_result, wheel: Path | None) -> CacheManifest | None:
    if not stat.S_ISDIR(info.st_mode):
        raise _refused(directory, "is not a directory")
    _check_owner(directory, directory, info)
    data = _read_manifest_json(directory)
    if "schema_version" not in data:
        return None  # written by older harness code, without hashes: extract again
    try:
        manifest = CacheManifest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "manifest"
        raise _refused(directory, f"has a manifest that does not parse ({where}: {first['msg']})") from None
    _check_files(directory, manifest)
    _check_record(directory, manifest)
    _check_pins(directory, manifest)
    if wheel is not None:
        _check_against_wheel(directory, manifest, wheel)
    return manifest


def _refused(directory: Path, why: str) -> CacheError:
    return CacheError(
        f"cache entry {directory} {why}; it is refused: delete {directory} (rm -r) and run again to fetch it afresh"
    )


def _check_owner(directory: Path, path: Path, info: os.stat_result) -> None:
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise _refused(directory, f"holds {path}, owned by uid {info.st_uid}, not by this user")
    if info.st_mode & stat.S_IWOTH:
        raise _refused(directory, f"holds {path}, which anyone may write")


def _read_manifest_json(directory: Path) -> dict:
    path = directory / MANIFEST_NAME
    try:
        raw = read_regular_file(path, MAX_MANIFEST_BYTES)
        _check_owner(directory, path, path.lstat())
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise _refused(directory, f"has no {MANIFEST_NAME}") from None
    except (OSError, ValueError, RecursionError) as error:
        raise _refused(directory, f"has a {MANIFEST_NAME} that cannot be read ({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise _refused(directory, f"has a {MANIFEST_NAME} that is not a JSON object")
    return data


def _check_files(directory: Path, manifest: CacheManifest) -> None:
    """The entry holds exactly the manifest's files, regular and unchanged, and nothing else."""
    expected = {f.path: f for f in (*manifest.hashes, manifest.record)}
    if len(expected) != len(manifest.hashes) + 1:
        raise _refused(directory, "has a manifest that lists a file twice")
    found: set[str] = set()
    for current, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs:
            path = Path(current) / name
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode):
                raise _refused(directory, f"holds {path}, which is a link, not a directory")
            _check_owner(directory, path, info)
        for name in files:
            path = Path(current) / name
            relative = path.relative_to(directory).as_posix()
            if relative == MANIFEST_NAME:
                continue
            if relative not in expected:
                raise _refused(directory, f"holds {relative}, which its manifest does not list")
            _check_file(directory, path, expected[relative])
            found.add(relative)
    missing = sorted(set(expected) - found)
    if missing:
        raise _refused(directory, f"lacks {missing[0]}, which its manifest lists")


def _check_file(directory: Path, path: Path, listed: CachedFile) -> None:
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        raise _refused(directory, f"holds {listed.path}, which is not a regular file")
    _check_owner(directory, path, info)
    if info.st_size != listed.size_bytes or sha256_file(path) != listed.sha256:
        raise _refused(directory, f"holds {listed.path}, which changed after extraction")


def _check_record(directory: Path, manifest: CacheManifest) -> None:
    record = parse_record(read_regular_file(directory / manifest.record.path, MAX_RECORD_BYTES))
    for listed in manifest.hashes:
        if record.get(listed.path) != (listed.sha256, listed.size_bytes):
            raise _refused(directory, f"holds {listed.path}, which the wheel's RECORD lists with another hash")


def _check_pins(directory: Path, manifest: CacheManifest) -> None:
    pinned = PINNED_WHEELS.get(manifest.version or "")
    if manifest.kind != "release" or pinned is None:
        return
    if manifest.wheel_sha256 != pinned.wheel_sha256:
        raise _refused(directory, f"claims wheel sha256 {manifest.wheel_sha256}, not vllm {manifest.version}'s")
    if manifest.record.sha256 != pinned.record_sha256:
        raise _refused(directory, f"holds a RECORD that is not vllm {manifest.version}'s")


def _check_against_wheel(directory: Path, manifest: CacheManifest, wheel: Path) -> None:
    with open_wheel(wheel) as archive:
        member = record_member(archive)
        data = _read_member(archive, member, wheel) if member is not None else b""
    if manifest.kind != "wheel" or hashlib.sha256(data).hexdigest() != manifest.record.sha256:
        raise _refused(directory, f"was not extracted from {wheel}")


# --- reading wheels --------------------------------------------------------------------------------------------

# What zipfile raises, on reading a member, for a truncated or corrupted archive (CRC, inflate, unknown method).
DAMAGED_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, RuntimeError, NotImplementedError)


def open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise CacheError(f"{wheel} is not a readable wheel (a wheel is a zip archive): {error}") from None


def record_member(archive: zipfile.ZipFile) -> str | None:
    return next((n for n in archive.namelist() if re.fullmatch(r"vllm-[^/]+\.dist-info/RECORD", n)), None)


def _read_member(archive: zipfile.ZipFile, member: str, wheel: Path) -> bytes:
    try:
        with archive.open(member) as handle:
            data = handle.read(MAX_RECORD_BYTES + 1)
    except (*DAMAGED_ZIP_ERRORS, OSError) as error:
        raise CacheError(f"{wheel} is damaged: cannot read {member}: {error}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise CacheError(f"{wheel}: {member} is over {MAX_RECORD_BYTES} bytes; not a vLLM wheel")
    return data


def parse_record(data: bytes) -> dict[str, tuple[str, int]]:
    """RECORD lines `path,sha256=<urlsafe base64>,size` as {path: (hex sha256, size)}; lines without a hash
    (the RECORD itself) are left out. The same bytes are parsed once per process (every use of a cache entry checks
    its files against its RECORD, of several thousand lines); each caller gets its own dict."""
    return dict(_parse_record_once(data))


@functools.lru_cache(maxsize=16)
def _parse_record_once(data: bytes) -> dict[str, tuple[str, int]]:
    entries: dict[str, tuple[str, int]] = {}
    for row in csv.reader(io.StringIO(data.decode("utf-8", errors="replace"))):
        if len(row) != 3 or not row[1].startswith("sha256=") or not row[2].isdigit():
            continue
        digest = base64.urlsafe_b64decode(row[1].removeprefix("sha256=") + "==").hex()
        entries[row[0]] = (digest, int(row[2]))
    return entries


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file that is not a link, at most max_bytes; OSError otherwise."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{path} is over {max_bytes} bytes")
    return data


# --- extracting a wheel into an entry --------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelOrigin:
    """Where a wheel came from, as the manifest records it."""

    kind: Literal["release", "wheel"]
    origin: str
    sha256: str
    checked_against: Literal["index", "file"]
    version: str | None
    torch_requirement: str | None


def extract_wheel(
    wheel: Path,
    directory: Path,
    wheel_origin: WheelOrigin,
    *,
    wanted: Callable[[str], bool],
    ops_names: tuple[str, ...],
    with_ops: bool,
) -> CacheManifest:
    """Extract the wanted members (and the ops library if asked) into directory, atomically, each checked
    against the wheel's RECORD; the manifest lists every file with its sha256."""
    staging = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    remove_dead_staging(directory, ("partial", "replaced"))  # what killed extractions left
    try:
        with open_wheel(wheel) as archive:
            manifest = _extract_members(archive, wheel, staging, wheel_origin, wanted, ops_names, with_ops)
        (staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        return _install(staging, directory, manifest, with_ops=with_ops)
    except DAMAGED_ZIP_ERRORS as error:
        # zipfile reports a truncated or corrupted member only when it is read.
        raise CacheError(f"{wheel} is damaged: {type(error).__name__}: {error}") from None
    except OSError as error:
        raise CacheError(f"could not extract {wheel} into {directory}: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract_members(
    archive: zipfile.ZipFile,
    wheel: Path,
    staging: Path,
    wheel_origin: WheelOrigin,
    wanted: Callable[[str], bool],
    ops_names: tuple[str, ...],
    with_ops: bool,
) -> CacheManifest:
    names = set(archive.namelist())
    record_name = record_member(archive)
    if record_name is None:
        raise CacheError(f"{wheel} is not a valid wheel: it has no vllm-*.dist-info/RECORD")
    record_data = _read_member(archive, record_name, wheel)
    record = parse_record(record_data)
    members = sorted(name for name in names if wanted(name) and safe_member(name))
    ops_member = next((name for name in ops_names if name in names), None)
    if with_ops and ops_member is not None:
        members.append(ops_member)
    files = [_extract_member(archive, wheel, staging, name, record) for name in members]
    (staging / record_name).parent.mkdir(parents=True, exist_ok=True)
    (staging / record_name).write_bytes(record_data)
    return CacheManifest(
        kind=wheel_origin.kind,
        version=wheel_origin.version,
        origin=wheel_origin.origin,
        wheel_name=wheel.name,
        wheel_sha256=wheel_origin.sha256,
        wheel_bytes=wheel.stat().st_size,
        wheel_sha256_checked_against=wheel_origin.checked_against,
        record=CachedFile(
            path=record_name, sha256=hashlib.sha256(record_data).hexdigest(), size_bytes=len(record_data)
        ),
        files=tuple(f.path for f in files),
        hashes=tuple(files),
        torch_requirement=wheel_origin.torch_requirement,
        ops_library_in_wheel=ops_member,
        ops_extracted=with_ops and ops_member is not None,
    )


def safe_member(name: str) -> bool:
    """A relative "/"-separated path with no empty, `.` or `..` part (a zip member may name anything)."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and "\x00" not in name and not any(p in ("", ".", "..") for p in parts)


def _extract_member(
    archive: zipfile.ZipFile, wheel: Path, staging: Path, name: str, record: dict[str, tuple[str, int]]
) -> CachedFile:
    """One member, copied only as far as its RECORD line's size (and MAX_MEMBER_BYTES): a member the RECORD does
    not list, one bigger than listed (in the zip's directory or as it streams) or over the cap is refused before
    more than its declared size is written."""
    if name not in record:
        raise CacheError(f"{wheel} is damaged or altered: {name} is not in the wheel's RECORD")
    want_sha256, want_size = record[name]
    if want_size > MAX_MEMBER_BYTES:
        raise CacheError(
            f"{wheel}: {name} is {want_size} bytes by its RECORD line; a member of a vLLM wheel is at "
            f"most {MAX_MEMBER_BYTES} bytes here"
        )
    if (in_zip := archive.getinfo(name).file_size) != want_size:
        raise CacheError(
            f"{wheel} is damaged or altered: {name} is {in_zip} bytes in the zip's directory, {want_size} "
            "by the wheel's RECORD"
        )
    target = staging / name
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with archive.open(name) as source_handle, target.open("wb") as target_handle:
        while True:
            block = source_handle.read(min(1 << 22, want_size - size + 1))  # one byte past the size shows a lie
            if not block:
                break
            size += len(block)
            if size > want_size:
                raise CacheError(
                    f"{wheel} is damaged or altered: {name} holds more than the {want_size} bytes its "
                    "RECORD line says; not extracted"
                )
            digest.update(block)
            target_handle.write(block)
    listed = CachedFile(path=name, sha256=digest.hexdigest(), size_bytes=size)
    if (want_sha256, want_size) != (listed.sha256, listed.size_bytes):
        raise CacheError(f"{wheel} is damaged or altered: {name} does not match the wheel's RECORD")
    return listed


def _install(staging: Path, directory: Path, manifest: CacheManifest, *, with_ops: bool) -> CacheManifest:
    """Move the finished extraction into place with one rename, which never overwrites an entry.

    Ranks of one node may extract the same wheel at once: the first rename wins and the others use its entry. An
    entry that does not serve (stale, damaged, without the ops library) is renamed aside first, then removed;
    a process that was checking it sees the directory change and checks the new one (load_entry).
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    aside = directory.with_name(f"{directory.name}.replaced-{os.getpid()}")
    for _ in range(3):
        try:
            os.rename(staging, directory)  # fails when a non-empty directory is there
            return manifest
        except OSError:
            pass
        try:
            winner = load_entry(directory)
        except CacheError:
            winner = None  # damaged: this extraction replaces it
        # the entry there wins unless it holds fewer files than this extraction (made when fewer were wanted)
        if winner is not None and winner.wheel_sha256 == manifest.wheel_sha256 and serves(winner, with_ops=with_ops) \
                and set(manifest.files) <= set(winner.files):  # fmt: skip
            return winner
        try:
            os.rename(directory, aside)
        except FileNotFoundError:
            continue  # another process moved it meanwhile
        shutil.rmtree(aside, ignore_errors=True)
    raise CacheError(f"could not install {directory}: other processes kept replacing it; run again")


# --- fetching a release ------------------------------------------------------------------------------------------
