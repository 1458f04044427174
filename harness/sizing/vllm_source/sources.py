"""Find a vLLM source to read: an installed package, a wheel file, a source tree, or a release number.

Nothing here imports vLLM. A release is fetched with `pip download --require-hashes` into the cache, checked
against the index's published sha256 (cache.py); only the fused-MoE python sources (and, on request, the compiled
ops library) are extracted, and the ~300 MB wheel is deleted afterwards unless asked to keep it. A manifest of
every file's sha256 lets the next call reuse the extraction after checking it.

    <cache>/vllm/<version>/release/          a release fetched by number
    <cache>/vllm/<version>/wheel-<sha12>/    a wheel file the user handed us
        manifest.json, vllm-X.Y.Z.dist-info/RECORD     (cache.py: what is checked on every use)
        vllm/model_executor/layers/fused_moe/**.py
        vllm/_version.py
        vllm/envs.py, vllm/distributed/device_communicators/all2all.py, vllm/config/{parallel,scheduler}.py
                                             (LAYER_FILES: what the whole-layer memory model reads)
        vllm/_C_stable_libtorch.abi3.so      (with_ops only; vllm/_C.abi3.so in older releases)
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.core.errors import InfrastructureError
from harness.scenario.limits import shown_text
from harness.sizing.vllm_source.cache import (
    DAMAGED_ZIP_ERRORS,
    CacheError,
    CacheManifest,
    WheelOrigin,
    extract_wheel,
    load_entry,
    open_wheel,
    serves,
    sha256_file,
)
from harness.sizing.vllm_source.registry import check_kept_wheel, download_release

FUSED_MOE_DIR = "vllm/model_executor/layers/fused_moe"
VERSION_FILE = "vllm/_version.py"
# The first one present wins: the stable-ABI library holds cutlass_moe_mm, get_cutlass_batched_moe_mm_data and
# silu_and_mul from 0.22.0 on; vllm/_C.abi3.so is where older releases kept them.
OPS_LIBRARY_NAMES = ("vllm/_C_stable_libtorch.abi3.so", "vllm/_C.abi3.so")
# Files outside fused_moe/ that the whole-layer memory model reads (harness.sizing.layer): the all-to-all
# managers and the defaults of their buffer sizes. A release that lacks one simply does not extract it.
LAYER_FILES = (
    "vllm/envs.py",
    "vllm/_custom_ops.py",  # the fake implementations its ops register (harness.sizing.release_defaults)
    "vllm/distributed/device_communicators/all2all.py",
    "vllm/config/parallel.py",
    "vllm/config/scheduler.py",
    "vllm/config/cache.py",  # gpu_memory_utilization's default (harness.sizing.release_defaults)
    # the flags `vllm serve` accepts (harness.sizing.release_flags): the engine's and the frontend's parsers
    "vllm/engine/arg_utils.py",
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/cli/serve.py",
    "vllm/utils/argparse_utils.py",
    "vllm/config.py",  # the config classes before vllm/config/ was a package
    "vllm/model_executor/layers/quantization/fp8.py",  # Fp8MoEMethod's experts selection (harness.sizing.moe_selection)
    # the startup's allocations that harness.sizing.release_defaults reads per release: DeepGEMM resolved at the
    # model's build (QuantFP8.__init__ -> is_deep_gemm_e8m0_used -> _lazy_init -> set_pdl), the load's
    # max_split_size (Worker.load_model), the Triton MXFP4 backend's Hopper padding (value layout, scale groups)
    "vllm/model_executor/layers/quantization/input_quant_fp8.py",
    "vllm/utils/deep_gemm.py",
    "vllm/third_party/deep_gemm/__init__.py",
    "vllm/v1/worker/gpu_worker.py",
    "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py",
    "vllm/third_party/triton_kernels/tensor_details/layout_details/hopper_value.py",
    # what the checkpoint formats build (harness.sizing.release_defaults): ModelOpt's ignore key and lm_head, GPTQ's
    # quantized layers listed from the checkpoint's safetensors
    "vllm/model_executor/layers/quantization/modelopt.py",
    "vllm/model_executor/layers/quantization/auto_gptq.py",
    "vllm/model_executor/layers/quantization/gptq_marlin.py",
    "vllm/model_executor/layers/quantization/auto_awq.py",  # AWQ's linears through the mixed-precision kernels
    "vllm/model_executor/layers/quantization/awq_marlin.py",
    # the experts a WNA16 (AWQ, GPTQ, compressed-tensors W4A16) MoE checkpoint gets (harness.sizing.moe_selection):
    # whether Marlin runs the layer, the compressed-tensors MoE methods, the MoeWNA16 fallback
    "vllm/model_executor/layers/quantization/utils/marlin_utils.py",
    "vllm/model_executor/layers/quantization/moe_wna16.py",
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py",
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py",
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_wna16.py",
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
    "compressed_tensors_moe_wna16_marlin.py",
)
# Whole directories of python files the deployment model reads: the config classes (field types, Literal choices).
LAYER_DIRS = ("vllm/config/",)
# An entry made before LAYER_FILES were extracted has no hashes either (cache.py): it is extracted again.

SOURCE_FLAGS_HINT = "pass --vllm-version X.Y.Z, --vllm-wheel FILE or --vllm-src DIR"


class VllmSourceError(InfrastructureError):
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


@functools.lru_cache(maxsize=32)
def _release_once(version: str, cache_dir: Path) -> VllmSource:
    return locate(version=version, cache_dir=cache_dir)


def locate_release(version: str, *, cache_dir: Path | None = None) -> VllmSource:
    """locate(version=...), fetched and verified once per process: a matrix plan asks for the same release in
    every cell, and checking the entry's hashes each time cost 17 ms a cell. A release that failed is asked again."""
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()).expanduser().resolve()
    return _release_once(version.strip(), cache)


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
        raise VllmSourceError(f"no vLLM is installed in this Python ({sys.executable}); {SOURCE_FLAGS_HINT}")
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
                return shown_text(node.value.value, 64)  # the tree's text, printed: control characters escaped
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


@contextlib.contextmanager
def _cache_errors() -> Iterator[None]:
    """The cache's one-line refusals, as the VllmSourceError every caller of locate handles."""
    try:
        yield
    except CacheError as error:
        raise VllmSourceError(str(error)) from None


def _source_from_manifest(directory: Path, manifest: CacheManifest) -> VllmSource:
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


def _check_version_text(version: str) -> str:
    try:
        Version(version)
    except InvalidVersion:
        raise VllmSourceError(f"--vllm-version {version!r} is not a version number (expected e.g. 0.30.0)") from None
    return version


def _locate_release(version: str, cache_dir: Path, *, with_ops: bool, keep_wheel: bool) -> VllmSource:
    version = _check_version_text(version.strip())
    version_dir = cache_dir / "vllm" / version
    directory = version_dir / "release"
    with _cache_errors():
        manifest = load_entry(directory)
        if manifest is not None and (manifest.kind != "release" or not _same_version(manifest.version, version)):
            raise CacheError(
                f"cache entry {directory} holds {manifest.kind} {manifest.version}, not release {version}; it is "
                f"refused: delete {directory} (rm -r) and run again to fetch it afresh"
            )
        # keep_wheel: the verified wheel file stays in the cache too (a caller that needs the file, not the tree),
        # fetched once; later calls find it and download nothing.
        wheel_kept = not keep_wheel or any((version_dir / "wheel").glob("vllm-*.whl"))
        if serves(manifest, with_ops=with_ops) and wheel_kept and not _lacks_wanted(directory, manifest):
            return _source_from_manifest(directory, manifest)
        # An ops library extracted earlier stays: re-extracting (an older entry, a sizing-only reader) must not
        # drop the kernels, which would cost the next kernels run a 300 MB download.
        with_ops = with_ops or _find_ops_library(directory) is not None
        manifest = _fetch_release(version, version_dir, with_ops=with_ops, keep_wheel=keep_wheel)
    return _source_from_manifest(directory, manifest)


def _lacks_wanted(directory: Path, manifest: CacheManifest) -> bool:
    """An entry extracted before a file the harness now reads was wanted: its wheel's RECORD (kept in the entry,
    checked on use) lists a wanted member the entry does not hold. It is extracted again."""
    from harness.sizing.vllm_source.cache import MAX_RECORD_BYTES, parse_record, read_regular_file

    try:
        listed = parse_record(read_regular_file(directory / manifest.record.path, MAX_RECORD_BYTES))
    except (CacheError, OSError, ValueError):
        return False  # load_entry checked the RECORD already; nothing more to learn here
    held = set(manifest.files)
    return any(_wanted_member(name) and name not in held for name in listed)


def _same_version(found: str | None, asked: str) -> bool:
    """PEP 440 equality: pip resolves vllm==0.30 to 0.30.0."""
    try:
        return found is not None and Version(found) == Version(asked)
    except InvalidVersion:
        return False


def _fetch_release(version: str, version_dir: Path, *, with_ops: bool, keep_wheel: bool) -> CacheManifest:
    """Download (or reuse the kept wheel), check its sha256 against the index, and extract it."""
    directory = version_dir / "release"
    kept_dir = version_dir / "wheel"
    kept = sorted(kept_dir.glob("vllm-*.whl"))
    # Each process downloads into its own directory: ranks of one node may ask for the same release at once.
    download_dir = version_dir / f"download-{os.getpid()}"
    try:
        if kept:
            wheel_path, sha256 = kept[0], check_kept_wheel(kept[0], version, download_dir / "pip-report-target")
        else:
            wheel_path, sha256 = download_release(version, download_dir)
        wheel_version, torch_requirement = _read_wheel_metadata(wheel_path)
        if not _same_version(wheel_version, version):
            raise VllmSourceError(
                f"pip returned {wheel_path.name} for vllm=={version}, but its METADATA says version {wheel_version}"
            )
        origin = WheelOrigin(
            kind="release", origin=f"vllm=={version} from the package index ({wheel_path.name})", sha256=sha256,
            checked_against="index", version=wheel_version, torch_requirement=torch_requirement,
        )  # fmt: skip
        manifest = _extract(wheel_path, directory, origin, with_ops=with_ops)
        if keep_wheel and not kept:
            kept_dir.mkdir(parents=True, exist_ok=True)
            os.replace(wheel_path, kept_dir / wheel_path.name)
    finally:
        shutil.rmtree(download_dir, ignore_errors=True)
        _remove_if_empty(version_dir)  # a release that does not exist leaves nothing behind
    return manifest


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()


def _locate_wheel(wheel: Path, cache_dir: Path, *, with_ops: bool) -> VllmSource:
    wheel = wheel.expanduser()
    if not wheel.is_file():
        raise VllmSourceError(f"--vllm-wheel {wheel}: no such file")
    with _cache_errors():
        sha256 = sha256_file(wheel)
        version, torch_requirement = _read_wheel_metadata(wheel)
        directory = cache_dir / "vllm" / (version or "unknown") / f"wheel-{sha256[:12]}"
        manifest = load_entry(directory, wheel=wheel)
        if manifest is not None and manifest.wheel_sha256 != sha256:
            raise CacheError(
                f"cache entry {directory} was made from another wheel than {wheel}; it is refused: delete "
                f"{directory} (rm -r) and run again"
            )
        if not serves(manifest, with_ops=with_ops):
            with_ops = with_ops or _find_ops_library(directory) is not None  # keep the kernels extracted earlier
            origin = WheelOrigin(
                kind="wheel", origin=f"wheel {wheel.resolve()}", sha256=sha256, checked_against="file",
                version=version, torch_requirement=torch_requirement,
            )  # fmt: skip
            manifest = _extract(wheel, directory, origin, with_ops=with_ops)
    return _source_from_manifest(directory, manifest)


def _extract(wheel: Path, directory: Path, origin: WheelOrigin, *, with_ops: bool) -> CacheManifest:
    if not any(name.startswith(FUSED_MOE_DIR + "/") for name in _wheel_names(wheel)):
        raise VllmSourceError(f"{wheel} is not a vLLM wheel with fused-MoE sources: it has no {FUSED_MOE_DIR}/*.py")
    return extract_wheel(
        wheel, directory, origin, wanted=_wanted_member, ops_names=OPS_LIBRARY_NAMES, with_ops=with_ops
    )


def _wheel_names(wheel: Path) -> list[str]:
    with open_wheel(wheel) as archive:
        return archive.namelist()


def _metadata_member(names: list[str]) -> str | None:
    return next((name for name in names if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", name)), None)


def _read_wheel_metadata(wheel: Path) -> tuple[str | None, str | None]:
    """(version, torch requirement) from the wheel's METADATA."""
    with open_wheel(wheel) as archive:
        member = _metadata_member(archive.namelist())
        if member is None:
            raise CacheError(f"{wheel} is not a vLLM wheel: it has no vllm-*.dist-info/METADATA")
        try:
            with archive.open(member) as handle:
                text = handle.read(1 << 20).decode("utf-8", errors="replace")
        except (*DAMAGED_ZIP_ERRORS, OSError) as error:
            raise CacheError(f"{wheel} is damaged: cannot read {member}: {error}") from None
    version = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Version:")), None)
    # the wheel's text, printed and named in the cache: control characters escaped, and kept to one path component
    shown = shown_text(version, 64) if version is not None else None
    return (
        shown if shown is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}", shown) else "unknown",
        _torch_requirement(text.splitlines()),
    )


def _wanted_member(name: str) -> bool:
    if ".." in name.split("/") or name.startswith("/"):
        return False
    if name == VERSION_FILE or name in LAYER_FILES:
        return True
    if name.endswith(".py") and any(name.startswith(d) and "/" not in name[len(d) :] for d in LAYER_DIRS):
        return True
    return name.startswith(FUSED_MOE_DIR + "/") and name.endswith(".py")
