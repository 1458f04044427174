"""Find a vLLM source to read: an installed package, a wheel file, a source tree, or a release number.

Nothing here imports vLLM. A release is fetched with `pip download --no-deps` into the cache; only the
fused-MoE python sources (and, on request, the compiled ops library) are extracted, and the ~300 MB wheel is
deleted afterwards unless asked to keep it. A small manifest lets the next call reuse the extraction.

    <cache>/vllm/<version>/release/          a release fetched by number
    <cache>/vllm/<version>/wheel-<sha12>/    a wheel file the user handed us
        manifest.json
        vllm/model_executor/layers/fused_moe/**.py
        vllm/_version.py
        vllm/envs.py, vllm/distributed/device_communicators/all2all.py, vllm/config/{parallel,scheduler}.py
                                             (LAYER_FILES: what the whole-layer memory model reads)
        vllm/_C_stable_libtorch.abi3.so      (with_ops only; vllm/_C.abi3.so in older releases)
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

FUSED_MOE_DIR = "vllm/model_executor/layers/fused_moe"
VERSION_FILE = "vllm/_version.py"
# The first one present wins: the stable-ABI library holds cutlass_moe_mm, get_cutlass_batched_moe_mm_data and
# silu_and_mul from 0.22.0 on; vllm/_C.abi3.so is where older releases kept them.
OPS_LIBRARY_NAMES = ("vllm/_C_stable_libtorch.abi3.so", "vllm/_C.abi3.so")
# Files outside fused_moe/ that the whole-layer memory model reads (harness.sizing.layer): the all-to-all
# managers and the defaults of their buffer sizes. A release that lacks one simply does not extract it.
LAYER_FILES = (
    "vllm/envs.py",
    "vllm/distributed/device_communicators/all2all.py",
    "vllm/config/parallel.py",
    "vllm/config/scheduler.py",
)
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = 1
# An extraction that also took LAYER_FILES says so; one without the mark (older harness code) is extracted again.
# A mark rather than a schema bump: code that predates it still accepts the newer entries, so the two never
# re-extract each other's work in a shared cache.
LAYER_FILES_MARK = "layer_files"

# Any local python can fetch the Linux x86-64 wheel: vLLM ships one cp38-abi3 wheel per release.
PIP_PLATFORM_ARGS = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.12", "--implementation", "cp")
PIP_TIMEOUT_S = 900

SOURCE_FLAGS_HINT = "pass --vllm-version X.Y.Z, --vllm-wheel FILE or --vllm-src DIR"


class VllmSourceError(Exception):
    """A vLLM source could not be found, fetched, read or evaluated; the message says which and why."""


@dataclass(frozen=True)
class VllmSource:
    """Where one vLLM's files are: `root` holds the `vllm/` package (or the part of it we extracted)."""

    kind: str  # "installed" | "wheel" | "src" | "release"
    version: str | None
    root: Path
    torch_requirement: str | None  # e.g. "torch==2.13.0"
    ops_library: Path | None
    origin: str  # human description: the wheel path, the install location, ...

    @property
    def fused_moe_dir(self) -> Path:
        return self.root / FUSED_MOE_DIR

    @property
    def label(self) -> str:
        """`vllm X.Y.Z` or, when the tree carries no version, where it came from."""
        return f"vllm {self.version}" if self.version else f"vllm ({self.kind} {self.origin})"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "version": self.version,
            "root": str(self.root),
            "torch_requirement": self.torch_requirement,
            "ops_library": str(self.ops_library) if self.ops_library else None,
            "origin": self.origin,
        }


def default_cache_dir() -> Path:
    """$HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/moe-harness, else ~/.cache/moe-harness."""
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "moe-harness"


def locate(
    *,
    version: str | None = None,
    wheel: Path | None = None,
    src: Path | None = None,
    cache_dir: Path | None = None,
    with_ops: bool = False,
    keep_wheel: bool = False,
) -> VllmSource:
    """Find the vLLM named by at most one of version / wheel / src; none of them means the installed one."""
    given = [name for name, value in (("version", version), ("wheel", wheel), ("src", src)) if value is not None]
    if len(given) > 1:
        raise VllmSourceError(f"give at most one vLLM source, got {' and '.join(given)}")
    if src is not None:
        return _locate_src(Path(src))
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if wheel is not None:
        return _locate_wheel(Path(wheel), cache, with_ops=with_ops)
    if version is not None:
        return _locate_release(version, cache, with_ops=with_ops, keep_wheel=keep_wheel)
    return _locate_installed()


def ops_library(source: VllmSource) -> Path:
    """The compiled ops library (cutlass_moe_mm, silu_and_mul, ...) of this source, or a clear error."""
    if source.ops_library is not None and source.ops_library.is_file():
        return source.ops_library
    torch_note = f"it needs {source.torch_requirement}" if source.torch_requirement else "its torch pin is unknown"
    raise VllmSourceError(
        f"{source.label} from {source.origin} has no compiled ops library "
        f"({' or '.join(OPS_LIBRARY_NAMES)}); {torch_note} and a CUDA runtime. "
        "Locate it with with_ops=True (a wheel or release), or build/install vLLM."
    )


# --- installed -------------------------------------------------------------------------------------------------


def _find_installed_spec():
    """importlib's spec for the top-level `vllm` package; finding it does not import it."""
    return importlib.util.find_spec("vllm")


def _locate_installed() -> VllmSource:
    spec = _find_installed_spec()
    if spec is None or not spec.submodule_search_locations:
        raise VllmSourceError(
            f"no vLLM is installed in this Python ({sys.executable}); {SOURCE_FLAGS_HINT}"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    root = package_dir.parent
    _require_vllm_tree(root, what=f"the installed vLLM at {package_dir}")
    version: str | None = None
    torch_requirement: str | None = None
    try:
        dist = importlib.metadata.distribution("vllm")
        version = dist.version
        torch_requirement = _torch_requirement(dist.requires or [])
    except importlib.metadata.PackageNotFoundError:
        # An editable or copied tree without dist metadata: fall back to the version file.
        version = _version_from_tree(root)
    return VllmSource(
        kind="installed",
        version=version,
        root=root,
        torch_requirement=torch_requirement,
        ops_library=_find_ops_library(root),
        origin=f"installed at {package_dir}",
    )


# --- source tree -----------------------------------------------------------------------------------------------


def _locate_src(src: Path) -> VllmSource:
    src = src.expanduser()
    if not src.is_dir():
        raise VllmSourceError(f"--vllm-src {src}: no such directory")
    # Accept both the repository root and the `vllm/` package directory itself.
    root = src.parent if (src / "model_executor").is_dir() and src.name == "vllm" else src
    _require_vllm_tree(root, what=f"--vllm-src {src}")
    root = root.resolve()
    return VllmSource(
        kind="src",
        version=_version_from_tree(root),
        root=root,
        torch_requirement=_torch_requirement_from_repo(root),
        ops_library=_find_ops_library(root),
        origin=f"source tree {src.resolve()}",
    )


def _require_vllm_tree(root: Path, *, what: str) -> None:
    fused_moe = root / FUSED_MOE_DIR
    if not fused_moe.is_dir() or not any(fused_moe.rglob("*.py")):
        raise VllmSourceError(
            f"{what} is not a vLLM tree: expected the fused-MoE package at {fused_moe} "
            "(a directory holding vllm/model_executor/layers/fused_moe/*.py)"
        )


def _version_from_tree(root: Path) -> str | None:
    """`__version__` from vllm/_version.py (written by the build), read with ast rather than imported."""
    path = root / VERSION_FILE
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if names & {"__version__", "version"} and isinstance(node.value.value, str):
                return node.value.value
    return None


def _torch_requirement_from_repo(root: Path) -> str | None:
    for name in ("requirements/cuda.txt", "requirements-cuda.txt", "requirements/build.txt"):
        path = root / name
        if path.is_file():
            found = _torch_requirement(path.read_text(encoding="utf-8").splitlines())
            if found:
                return found
    return None


def _torch_requirement(requirements: list[str]) -> str | None:
    """The unconditional `torch...` pin among requirement lines (dist metadata or requirements files)."""
    for line in requirements:
        line = line.split("#", 1)[0].strip()
        if line.startswith("Requires-Dist:"):
            line = line.removeprefix("Requires-Dist:").strip()
        if ";" in line:
            continue  # an extra or a platform marker: not the pin every install gets
        if re.match(r"^torch\s*(==|>=|<=|~=|<|>|$)", line):
            return line.replace(" ", "")
    return None


def _find_ops_library(root: Path) -> Path | None:
    for name in OPS_LIBRARY_NAMES:
        if (root / name).is_file():
            return root / name
    return None


# --- wheels and releases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Manifest:
    """What one extraction holds; lets a later call reuse it without the wheel."""

    version: str | None
    kind: str
    origin: str
    wheel_name: str
    wheel_sha256: str
    wheel_bytes: int
    torch_requirement: str | None
    files: tuple[str, ...]
    ops_library_in_wheel: str | None  # the member name, known even when not extracted
    ops_extracted: bool

    def to_json(self) -> dict:
        return {
            "schema": MANIFEST_SCHEMA,
            LAYER_FILES_MARK: True,
            "version": self.version,
            "kind": self.kind,
            "origin": self.origin,
            "wheel_name": self.wheel_name,
            "wheel_sha256": self.wheel_sha256,
            "wheel_bytes": self.wheel_bytes,
            "torch_requirement": self.torch_requirement,
            "files": list(self.files),
            "ops_library_in_wheel": self.ops_library_in_wheel,
            "ops_extracted": self.ops_extracted,
        }

    @classmethod
    def from_json(cls, data: dict) -> _Manifest:
        return cls(
            version=data["version"],
            kind=data["kind"],
            origin=data["origin"],
            wheel_name=data["wheel_name"],
            wheel_sha256=data["wheel_sha256"],
            wheel_bytes=int(data["wheel_bytes"]),
            torch_requirement=data["torch_requirement"],
            files=tuple(data["files"]),
            ops_library_in_wheel=data["ops_library_in_wheel"],
            ops_extracted=bool(data["ops_extracted"]),
        )


def _read_manifest(directory: Path) -> _Manifest | None:
    """The manifest of a complete extraction, or None when absent, stale or damaged."""
    path = directory / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != MANIFEST_SCHEMA or data.get(LAYER_FILES_MARK) is not True:
            return None
        manifest = _Manifest.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all((directory / name).is_file() for name in manifest.files):
        return None
    return manifest


def _source_from_manifest(directory: Path, manifest: _Manifest) -> VllmSource:
    ops = None
    if manifest.ops_extracted and manifest.ops_library_in_wheel:
        ops = directory / manifest.ops_library_in_wheel
    return VllmSource(
        kind=manifest.kind,
        version=manifest.version,
        root=directory,
        torch_requirement=manifest.torch_requirement,
        ops_library=ops,
        origin=manifest.origin,
    )


def _manifest_serves(manifest: _Manifest | None, *, with_ops: bool) -> bool:
    if manifest is None:
        return False
    # A wheel without an ops library cannot do better on a second try, so it still serves with_ops.
    return not with_ops or manifest.ops_extracted or manifest.ops_library_in_wheel is None


def _check_version_text(version: str) -> str:
    try:
        Version(version)
    except InvalidVersion:
        raise VllmSourceError(f"--vllm-version {version!r} is not a version number (expected e.g. 0.30.0)") from None
    return version


def _locate_release(version: str, cache: Path, *, with_ops: bool, keep_wheel: bool) -> VllmSource:
    version = _check_version_text(version.strip())
    version_dir = cache / "vllm" / version
    directory = version_dir / "release"
    manifest = _read_manifest(directory)
    if _manifest_serves(manifest, with_ops=with_ops):
        return _source_from_manifest(directory, manifest)
    kept_dir = version_dir / "wheel"
    kept = sorted(kept_dir.glob("vllm-*.whl"))
    # Each process downloads into its own directory: ranks of one node may ask for the same release at once.
    download_dir = version_dir / f"download-{os.getpid()}"
    try:
        wheel_path = kept[0] if kept else _download_release(version, download_dir)
        manifest = _extract_wheel(
            wheel_path,
            directory,
            kind="release",
            origin=f"vllm=={version} from the package index ({wheel_path.name})",
            with_ops=with_ops,
        )
        if keep_wheel and not kept:
            kept_dir.mkdir(parents=True, exist_ok=True)
            os.replace(wheel_path, kept_dir / wheel_path.name)
    finally:
        shutil.rmtree(download_dir, ignore_errors=True)
        _remove_if_empty(version_dir)  # a release that does not exist leaves nothing behind
    # PEP 440 equality: pip resolves vllm==0.30 to 0.30.0.
    if manifest.version is None or Version(manifest.version) != Version(version):
        shutil.rmtree(directory, ignore_errors=True)
        raise VllmSourceError(
            f"pip returned {wheel_path.name} for vllm=={version}, but its METADATA says version {manifest.version}"
        )
    return _source_from_manifest(directory, manifest)


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _download_release(version: str, download_dir: Path) -> Path:
    """`pip download --no-deps vllm==X` into download_dir."""
    download_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
        "--disable-pip-version-check", *PIP_PLATFORM_ARGS, "-d", str(download_dir), f"vllm=={version}",
    ]  # fmt: skip
    # Minutes on a slow link, with pip's own output captured: say what is happening, and how it went.
    print(f"harness: downloading vllm=={version} with pip (a wheel of about 300 MB, once per release; cached in "
          f"{download_dir.parent.parent})", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise VllmSourceError(f"downloading vllm=={version} with pip took over {PIP_TIMEOUT_S} s; gave up") from None
    except OSError as error:
        raise VllmSourceError(f"could not run pip to download vllm=={version}: {error}") from None
    found = sorted(download_dir.glob("vllm-*.whl"))  # this process's own directory: any vllm wheel is the one
    if completed.returncode != 0 or not found:
        raise VllmSourceError(f"could not download vLLM release {version}: {_pip_failure(completed)}")
    print(f"harness: downloaded {found[0].name} ({found[0].stat().st_size / 2**20:.0f} MiB in "
          f"{time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return found[0]


def _pip_failure(completed: subprocess.CompletedProcess) -> str:
    """pip's own ERROR lines, which say e.g. which versions exist; else the tail of its output."""
    text = (completed.stderr or "") + "\n" + (completed.stdout or "")
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR:")]
    if errors:
        return "; ".join(line.removeprefix("ERROR:").strip() for line in errors)
    tail = [line.strip() for line in text.splitlines() if line.strip()][-3:]
    return " / ".join(tail) or f"pip exited with status {completed.returncode} and printed nothing"


def _locate_wheel(wheel: Path, cache: Path, *, with_ops: bool) -> VllmSource:
    wheel = wheel.expanduser()
    if not wheel.is_file():
        raise VllmSourceError(f"--vllm-wheel {wheel}: no such file")
    sha256 = _sha256(wheel)
    version = _read_wheel_metadata(wheel)[0]
    directory = cache / "vllm" / (version or "unknown") / f"wheel-{sha256[:12]}"
    manifest = _read_manifest(directory)
    if _manifest_serves(manifest, with_ops=with_ops) and manifest.wheel_sha256 == sha256:
        return _source_from_manifest(directory, manifest)
    manifest = _extract_wheel(
        wheel, directory, kind="wheel", origin=f"wheel {wheel.resolve()}", with_ops=with_ops, sha256=sha256
    )
    return _source_from_manifest(directory, manifest)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# What zipfile raises, on reading a member, for a truncated or corrupted archive (CRC, inflate, unknown method).
_DAMAGED_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, RuntimeError, NotImplementedError)


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise VllmSourceError(f"{wheel} is not a readable wheel (a wheel is a zip archive): {error}") from None


def _metadata_member(archive: zipfile.ZipFile) -> str | None:
    for name in archive.namelist():
        if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", name):
            return name
    return None


def _read_wheel_metadata(wheel: Path) -> tuple[str | None, str | None]:
    """(version, torch requirement) from the wheel's METADATA."""
    with _open_wheel(wheel) as archive:
        member = _metadata_member(archive)
        if member is None:
            raise VllmSourceError(f"{wheel} is not a vLLM wheel: it has no vllm-*.dist-info/METADATA")
        try:
            text = archive.read(member).decode("utf-8", errors="replace")
        except (*_DAMAGED_ZIP_ERRORS, OSError) as error:
            raise VllmSourceError(f"{wheel} is damaged: cannot read {member}: {error}") from None
    version = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Version:")), None)
    return version, _torch_requirement(text.splitlines())


def _wanted_member(name: str) -> bool:
    if ".." in name.split("/") or name.startswith("/"):
        return False
    if name == VERSION_FILE or name in LAYER_FILES:
        return True
    return name.startswith(FUSED_MOE_DIR + "/") and name.endswith(".py")


def _extract_wheel(
    wheel: Path, directory: Path, *, kind: str, origin: str, with_ops: bool, sha256: str | None = None
) -> _Manifest:
    """Extract the fused-MoE sources (and the ops library if asked) into directory, atomically."""
    version, torch_requirement = _read_wheel_metadata(wheel)
    sha256 = sha256 or _sha256(wheel)
    staging = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with _open_wheel(wheel) as archive:
            names = set(archive.namelist())
            members = sorted(name for name in names if _wanted_member(name))
            if not any(name.startswith(FUSED_MOE_DIR + "/") for name in members):
                raise VllmSourceError(
                    f"{wheel} is not a vLLM wheel with fused-MoE sources: it has no {FUSED_MOE_DIR}/*.py"
                )
            ops_member = next((name for name in OPS_LIBRARY_NAMES if name in names), None)
            if with_ops and ops_member is not None:
                members.append(ops_member)
            for name in members:
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(name) as source_handle, target.open("wb") as target_handle:
                    shutil.copyfileobj(source_handle, target_handle, 1 << 22)
        manifest = _Manifest(
            version=version,
            kind=kind,
            origin=origin,
            wheel_name=wheel.name,
            wheel_sha256=sha256,
            wheel_bytes=wheel.stat().st_size,
            torch_requirement=torch_requirement,
            files=tuple(members),
            ops_library_in_wheel=ops_member,
            ops_extracted=with_ops and ops_member is not None,
        )
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")
        # Another process may have finished the same extraction meanwhile: keep and use it rather than
        # deleting files it may be reading.
        winner = _read_manifest(directory)
        if winner is not None and winner.wheel_sha256 == sha256 and _manifest_serves(winner, with_ops=with_ops):
            return winner
        shutil.rmtree(directory, ignore_errors=True)
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staging, directory)
        except OSError:
            winner = _read_manifest(directory)
            if winner is None or not _manifest_serves(winner, with_ops=with_ops):
                raise
            manifest = winner
    except _DAMAGED_ZIP_ERRORS as error:
        # zipfile reports a truncated or corrupted member only when it is read.
        raise VllmSourceError(f"{wheel} is damaged: {type(error).__name__}: {error}") from None
    except OSError as error:
        raise VllmSourceError(f"could not extract {wheel} into {directory}: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest
