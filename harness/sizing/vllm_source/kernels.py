"""The kernels: which vLLM release's compiled ops library the vllm-ops backend loads, found apart from the sizing.

A scenario's `vllm` section names the kernels (harness.scenario.schema.VllmSpec):

    vllm.kernels: 0.30.0                       that release's library, from the cache (fetched with pip if absent)
    vllm.kernels: installed                    the installed vLLM's library (found, never imported)
    vllm.version: 0.30.0                       the same as vllm.kernels: 0.30.0
    vllm.wheel: FILE / vllm.src: DIR           the library inside a wheel or a built tree
    vllm.ops_library: FILE                     the file itself; its release is read from the cache's manifests
                                               when a cached release holds a file with the same sha256
    vllm.kernels: 0.26.0 + vllm.ops_library    the file, stated to be 0.26.0's (a machine without a registry);
                                               a cache manifest that says otherwise is an error

`resolve_kernels` returns a KernelsLibrary: the path, the release when known and how it is known, the sha256
and size of the file, and the release's torch pin. The driver resolves it before any rank starts (so a release is
fetched once, and a missing library is one line, not a failure per rank) and hands the result to every rank
(harness.launch.contract.RankEntry.kernels), which loads it and records it. On a node where the driver's path
does not exist (a multi-node Ray cluster, each node with its own cache), `on_this_node` fetches the same release
into that node's cache and accepts it only with the driver's sha256: the driver's decision, materialised locally.
Nothing here loads or imports the library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.scenario.schema import Scenario
from harness.scenario.sections import VllmSpec
from harness.sizing.vllm_source.cache import sha256_file as file_sha256
from harness.sizing.vllm_source.sources import VllmSourceError, default_cache_dir, locate, ops_library


@dataclass(frozen=True, kw_only=True)
class KernelsLibrary:
    """One ops library file and what is known about it."""

    path: Path
    release: str | None
    # How the release is known: "release" (fetched by number), "wheel", "src", "installed" (their metadata),
    # "given" (the scenario said so for a file), "cache" (a cached release holds a file with the same sha256).
    release_from: str | None
    sha256: str
    num_bytes: int
    torch_requirement: str | None
    origin: str

    def describe(self) -> str:
        """e.g. "vLLM 0.30.0 _C_stable_libtorch.abi3.so (sha256 0123abcd4567, 78014032 B)"."""
        release = f"vLLM {self.release}" if self.release else "vLLM (release unknown)"
        return f"{release} {self.path.name} (sha256 {self.sha256[:12]}, {self.num_bytes} B)"


def needs_kernels(scenario: Scenario) -> bool:
    """Whether the scenario's experts backend loads vLLM's ops: vllm-ops always, auto when a source is named."""
    v = scenario.vllm
    named = any((v.kernels, v.version, v.wheel, v.src, v.ops_library))
    return scenario.experts_backend == "vllm-ops" or (scenario.experts_backend == "auto" and named)


def resolve_kernels(vllm: VllmSpec, *, cache_dir: Path | None = None) -> KernelsLibrary:
    """The library `vllm` names (none named: the installed vLLM's). Raises VllmSourceError with one line."""
    if vllm.ops_library:
        return _given_file(Path(vllm.ops_library).expanduser(), vllm.kernels, cache_dir)
    release = vllm.kernels if vllm.kernels != "installed" else None
    release = release or vllm.version
    source = locate(
        version=release,
        wheel=Path(vllm.wheel) if vllm.wheel else None,
        src=Path(vllm.src) if vllm.src else None,
        cache_dir=cache_dir,
        with_ops=True,
    )
    path = ops_library(source)
    return KernelsLibrary(
        path=path,
        release=source.version,
        release_from=source.kind if source.version else None,
        sha256=file_sha256(path),
        num_bytes=path.stat().st_size,
        torch_requirement=source.torch_requirement,
        origin=source.origin,
    )


def on_this_node(kernels: KernelsLibrary, *, cache_dir: Path | None = None) -> KernelsLibrary:
    """The driver's `kernels` as a file on this node: its own path where it exists, else the same release fetched
    into this node's cache, which must have the driver's sha256. Raises VllmSourceError with one line."""
    if kernels.path.is_file():
        return kernels
    if kernels.release is None or kernels.release_from != "release":
        raise VllmSourceError(
            f"kernels {kernels.describe()}: {kernels.path} is not on this node; name the release (vllm.kernels: "
            "X.Y.Z) so every node fetches it into its own cache, or put the file at the same path on every node"
        )
    local = resolve_kernels(VllmSpec(kernels=kernels.release), cache_dir=cache_dir)
    if (local.sha256, local.num_bytes) != (kernels.sha256, kernels.num_bytes):
        raise VllmSourceError(
            f"kernels vLLM {kernels.release}: this node's copy {local.path} has sha256 {local.sha256[:12]} "
            f"({local.num_bytes} B), the driver's has {kernels.sha256[:12]} ({kernels.num_bytes} B)"
        )
    return local


def _given_file(path: Path, stated: str | None, cache_dir: Path | None) -> KernelsLibrary:
    if not path.is_file():
        raise VllmSourceError(f"vllm.ops_library {path}: no such file")
    sha256, num_bytes = file_sha256(path), path.stat().st_size
    cached = release_of_library(sha256, num_bytes, cache_dir=cache_dir)
    if stated and stated != "installed":
        if cached is not None and cached[0] != stated:
            raise VllmSourceError(
                f"vllm.ops_library {path} is vLLM {cached[0]}'s library (sha256 {sha256[:12]} in the cache), "
                f"not {stated}'s as vllm.kernels says"
            )
        torch_requirement = cached[1] if cached else None
        return KernelsLibrary(
            path=path.resolve(),
            release=stated,
            release_from="given",
            sha256=sha256,
            num_bytes=num_bytes,
            torch_requirement=torch_requirement,
            origin=f"file {path.resolve()}",
        )
    return KernelsLibrary(
        path=path.resolve(),
        release=cached[0] if cached else None,
        release_from="cache" if cached else None,
        sha256=sha256,
        num_bytes=num_bytes,
        torch_requirement=cached[1] if cached else None,
        origin=f"file {path.resolve()}",
    )


def release_of_library(sha256: str, num_bytes: int, *, cache_dir: Path | None = None) -> tuple[str, str | None] | None:
    """(release, torch pin) of the cached release or wheel whose extracted ops library has this sha256, if any.

    Reads only the cache entries' manifest.json (JSON): the sha256 each lists for its files, or, in an entry that
    lists none, the file itself when its size matches.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    for manifest_path in sorted((cache / "vllm").glob("*/*/manifest.json")):
        try:
            data = json.loads(manifest_path.read_text(encoding="utf-8"))
            member = data.get("ops_library_in_wheel") if data.get("ops_extracted") else None
            version, listed = data.get("version"), data.get("hashes") or []
            torch_requirement = data.get("torch_requirement")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(member, str) or not isinstance(version, str) or ".." in member.split("/"):
            continue
        pin = torch_requirement if isinstance(torch_requirement, str) else None
        hashes = {f.get("path"): (f.get("sha256"), f.get("size_bytes")) for f in listed if isinstance(f, dict)}
        if member in hashes:
            if hashes[member] == (sha256, num_bytes):
                return version, pin
            continue
        candidate = manifest_path.parent / member
        try:
            same_size = candidate.stat().st_size == num_bytes
        except OSError:
            continue
        if same_size and file_sha256(candidate) == sha256:
            return version, pin
    return None
