"""Wheel extraction is bounded by what the wheel's RECORD declares: a member is copied only as far as its listed
size (and a cap), a RECORD that lies is refused before more than the declared size is written, and the staging
folder of a killed extraction is removed by the next one."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.sizing.vllm_source import VllmSourceError, locate
from harness.sizing.vllm_source.cache import MAX_MEMBER_BYTES
from test_vllm_source import METADATA, make_wheel

WHEEL = "vllm-0.9.9-cp38-abi3-linux_x86_64.whl"
MOE = "vllm/model_executor/layers/fused_moe"  # what the audit extracts


def _record_line(name: str, data: bytes, size: int | None = None) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data) if size is None else size}"


def _lying_wheel(path: Path, member: bytes, *, listed_size: int) -> Path:
    """A wheel whose RECORD lists its fused_moe/big.py with `listed_size` bytes, whatever the member holds."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("vllm-0.9.9.dist-info/METADATA", METADATA)
        archive.writestr(f"{MOE}/big.py", member)
        lines = [
            _record_line("vllm-0.9.9.dist-info/METADATA", METADATA),
            _record_line(f"{MOE}/big.py", member, listed_size),
            "vllm-0.9.9.dist-info/RECORD,,",
        ]
        archive.writestr("vllm-0.9.9.dist-info/RECORD", "\n".join(lines) + "\n")
    return path


def _biggest_file(root: Path) -> int:
    return max((p.stat().st_size for p in root.rglob("*") if p.is_file()), default=0)


def test_a_record_that_understates_a_member_is_refused_before_it_is_written(tmp_path: Path) -> None:
    member = b"x = 1\n" * (8 << 20 // 6)  # 8 MiB that compress to kilobytes
    wheel = _lying_wheel(tmp_path / WHEEL, member, listed_size=1000)
    assert wheel.stat().st_size < 1 << 20
    with pytest.raises(
        VllmSourceError,
        match=r"fused_moe/big\.py is \d+ bytes in the zip's directory, 1000 by the "
        r"wheel's RECORD",
    ):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")
    assert _biggest_file(tmp_path / "cache") < 1 << 20 and not list((tmp_path / "cache").rglob("*.partial-*"))


def test_a_member_over_the_cap_is_refused_by_its_record_line(tmp_path: Path) -> None:
    wheel = _lying_wheel(tmp_path / WHEEL, b"x = 1\n", listed_size=2 << 30)  # "2 GiB" in a wheel of a kilobyte
    with pytest.raises(
        VllmSourceError,
        match=f"fused_moe/big.py is {2 << 30} bytes by its RECORD line; a member of a "
        f"vLLM wheel is at most {MAX_MEMBER_BYTES} bytes",
    ):
        locate(wheel=wheel, cache_dir=tmp_path / "cache")


def test_a_killed_extractions_staging_folder_is_removed(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / WHEEL, {"vllm-0.9.9.dist-info/METADATA": METADATA, f"{MOE}/a.py": b"x = 1\n"})
    source = locate(wheel=wheel, cache_dir=tmp_path / "cache")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = source.root.with_name(f"{source.root.name}.partial-{dead.pid}")
    live = source.root.with_name(f"{source.root.name}.partial-{dead.pid}0")  # no such pid: stale too
    ours = source.root.with_name(f"{source.root.name}.partial-1")  # pid 1 runs: left to it
    for folder in (stale, live, ours):
        (folder / "vllm").mkdir(parents=True)
        (folder / "vllm" / "big.so").write_bytes(b"\0" * 4096)
    import shutil

    shutil.rmtree(source.root)  # the next locate extracts again, and sweeps what killed extractions left
    assert locate(wheel=wheel, cache_dir=tmp_path / "cache").root == source.root
    assert not stale.exists() and not live.exists() and ours.exists()
