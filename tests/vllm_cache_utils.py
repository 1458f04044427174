"""Write vLLM cache entries the way the harness does, from any files: what someone forging an entry would do."""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path
from typing import Literal

from harness.sizing.vllm_source.cache import MANIFEST_NAME, CachedFile, CacheManifest


def forge_entry(
    root: Path, files: dict[str, bytes], *, kind: Literal["release", "wheel"], version: str, wheel_sha256: str
) -> CacheManifest:
    """A cache entry at root holding files, with a RECORD and a manifest that agree with them in every hash."""
    shutil.rmtree(root, ignore_errors=True)
    record_name = f"vllm-{version}.dist-info/RECORD"
    lines, listed = [], []
    for path, data in sorted(files.items()):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        digest = hashlib.sha256(data)
        lines.append(f"{path},sha256={base64.urlsafe_b64encode(digest.digest()).rstrip(b'=').decode()},{len(data)}")
        listed.append(CachedFile(path=path, sha256=digest.hexdigest(), size_bytes=len(data)))
    record = ("\n".join([*lines, f"{record_name},,"]) + "\n").encode()
    (root / record_name).parent.mkdir(parents=True, exist_ok=True)
    (root / record_name).write_bytes(record)
    manifest = CacheManifest(
        kind=kind,
        version=version,
        origin="planted",
        wheel_name=f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl",
        wheel_sha256=wheel_sha256,
        wheel_bytes=len(record),
        wheel_sha256_checked_against="index" if kind == "release" else "file",
        record=CachedFile(path=record_name, sha256=hashlib.sha256(record).hexdigest(), size_bytes=len(record)),
        files=tuple(f.path for f in listed),
        hashes=tuple(listed),
        torch_requirement=None,
        ops_library_in_wheel=None,
        ops_extracted=False,
    )
    (root / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def entry_files(root: Path) -> dict[str, bytes]:
    """The extracted files of an entry, by the paths its manifest lists."""
    manifest = CacheManifest.model_validate_json((root / MANIFEST_NAME).read_text())
    return {path: (root / path).read_bytes() for path in manifest.files}
