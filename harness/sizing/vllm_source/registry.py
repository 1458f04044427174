"""The package index: a release's published sha256, the versions it lists, and downloading a wheel with pip (any
Linux x86-64 platform tag), with progress and a line in the cache's downloads.log per download. What a download
brings is verified and extracted by harness.sizing.vllm_source.cache."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness.core.units import MIB
from harness.sizing.vllm_source.cache import (
    DOWNLOAD_LOG_NAME,
    PINNED_WHEELS,
    SHA256_PATTERN,
    CacheError,
    sha256_file,
)

log = logging.getLogger(__name__)

# Any local python can fetch the Linux x86-64 wheel: vLLM ships one cp38-abi3 wheel per release, under whichever
# manylinux tag its build had (manylinux_2_28 from 0.22.0, manylinux_2_24 in 0.21.0, manylinux_2_31 in 0.15.0, ...):
# pip is offered every glibc tag, newest first, and the legacy aliases.
LINUX_X86_64_TAGS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(40, 4, -1)),
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64",
)  # fmt: skip
PIP_PLATFORM_ARGS = (
    *(arg for tag in LINUX_X86_64_TAGS for arg in ("--platform", tag)),
    "--python-version", "3.12", "--implementation", "cp",
)  # fmt: skip
PIP_TIMEOUT_S = 900


def published_sha256(version: str, scratch: Path) -> str:
    """The sha256 the package index publishes for `vllm==version`'s Linux x86-64 wheel (pip's install report).

    scratch: a path that does not exist; pip needs a --target with --platform, and a dry run creates nothing there.
    """
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--only-binary=:all:",
        *PIP_PLATFORM_ARGS, "--target", str(scratch), "--quiet", "--no-input", "--disable-pip-version-check",
        "--report", "-", f"vllm=={version}",
    ]  # fmt: skip
    try:
        completed = _run_pip(command, f"could not download vLLM release {version} (asking the index for its sha256)")
    except CacheError as error:
        if "No matching distribution" in str(error) or "Could not find a version" in str(error):
            raise CacheError(_no_linux_wheel(version, str(error))) from None
        raise
    try:
        report = json.loads(completed.stdout)
        (install,) = report["install"]
        digest = install["download_info"]["archive_info"]["hashes"]["sha256"]
    except (ValueError, KeyError, TypeError):
        raise CacheError(f"the index published no sha256 for vllm=={version}: {pip_failure(completed)}") from None
    if not re.fullmatch(SHA256_PATTERN, digest or ""):
        raise CacheError(f"the index published {digest!r} as vllm=={version}'s sha256, which is not a sha256")
    return digest


def _no_linux_wheel(version: str, pip_said: str) -> str:
    """What to say when pip found no wheel: whether the release exists at all but has no Linux x86-64 wheel."""
    try:
        offered = all_registry_versions()
    except CacheError:
        return pip_said
    failure = f"could not download vLLM release {version}"
    if version in offered:
        return (
            f"{failure}: vllm=={version} is on the package index, but has no Linux x86-64 wheel under any "
            f"platform tag ({LINUX_X86_64_TAGS[0]} .. {LINUX_X86_64_TAGS[-1]}); pass --vllm-wheel FILE or "
            "--vllm-src DIR"
        )
    pip_reason = pip_said.split("): ", 1)[-1]  # after "(asking the index for its sha256)"
    return f"{failure}: the package index has no vllm=={version} (pip: {pip_reason})"


def all_registry_versions() -> list[str]:
    """Every version the index lists for vllm, whatever its files' platforms (pip index versions, no --platform)."""
    command = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check", "--no-input"]
    completed = _run_pip(command, "could not list vLLM's versions on the package index")
    match = re.search(r"Available versions:\s*(.+)", completed.stdout)
    if match is None:
        raise CacheError("the package index did not list vLLM's versions (pip index versions vllm)")
    return [text.strip() for text in match.group(1).split(",") if text.strip()]


def download_release(version: str, download_dir: Path) -> tuple[Path, str]:
    """`pip download --require-hashes vllm==X` into download_dir: (the wheel, its sha256), equal to the index's
    published hash and, for a pinned release, to the pin."""
    # Minutes on a slow link, with pip's own output captured: say what is happening, and how it went.
    log_download(download_dir.parents[2], version)
    log.info(f"harness: downloading vllm=={version} with pip (a wheel of about 300 MB, once per release; cached in "
             f"{download_dir.parent.parent})")  # fmt: skip
    started = time.monotonic()
    expected = published_sha256(version, download_dir / "pip-report-target")
    pinned = PINNED_WHEELS.get(version)
    if pinned is not None and pinned.wheel_sha256 != expected:
        raise CacheError(
            f"the index publishes sha256 {expected} for vllm=={version}, not the {pinned.wheel_sha256} the harness "
            "pinned; refusing the download"
        )
    download_dir.mkdir(parents=True, exist_ok=True)
    requirements = download_dir / "requirements.txt"
    requirements.write_text(f"vllm=={version} --hash=sha256:{expected}\n", encoding="utf-8")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes", "--no-input",
        "--disable-pip-version-check", *PIP_PLATFORM_ARGS, "-d", str(download_dir), "-r", str(requirements),
    ]  # fmt: skip
    completed = _run_pip(
        command, f"could not download vLLM release {version}", progress=(f"vllm=={version}", download_dir / "pip-tmp")
    )
    found = sorted(download_dir.glob("vllm-*.whl"))  # this process's own directory: any vllm wheel is the one
    if not found:
        raise CacheError(f"could not download vLLM release {version}: {pip_failure(completed)}")
    digest = sha256_file(found[0])
    if digest != expected:
        raise CacheError(f"the download of vllm=={version} has sha256 {digest}, not the index's {expected}")
    log.info(f"harness: downloaded {found[0].name} ({found[0].stat().st_size / MIB:.0f} MiB in "
             f"{time.monotonic() - started:.0f} s, sha256 as published)")  # fmt: skip
    return found[0], digest


def log_download(cache_dir: Path, version: str) -> None:
    """One JSON line in <cache>/downloads.log per wheel download started (scripts/test.sh counts them; the tests
    refuse one from a test without the vllm_wheel mark). A log that cannot be written never stops the download."""
    line = json.dumps({"version": version, "pid": os.getpid(), "at": round(time.time(), 3)})
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(cache_dir / DOWNLOAD_LOG_NAME, "a", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        pass


def check_kept_wheel(wheel: Path, version: str, scratch: Path) -> str:
    """A wheel kept in the cache may be used again only if it is still the published one; its sha256."""
    digest = sha256_file(wheel)
    pinned = PINNED_WHEELS.get(version)
    expected = pinned.wheel_sha256 if pinned is not None else published_sha256(version, scratch)
    if digest != expected:
        raise CacheError(
            f"kept wheel {wheel} has sha256 {digest}, not vllm=={version}'s {expected}; delete {wheel} and run again"
        )
    return digest


def _run_pip(
    command: list[str], failure: str, *, progress: tuple[str, Path] | None = None
) -> subprocess.CompletedProcess:
    """Run pip; on any failure raise CacheError(f"{failure}: why"). With `progress` (a label and a scratch
    directory), a download: a byte progress bar on a terminal, a line every few seconds in a log, on stderr."""
    from harness.sizing.vllm_source.download_progress import run_with_progress

    try:
        if progress is None:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        else:
            completed = run_with_progress(
                command, label=progress[0], scratch=progress[1], timeout_s=PIP_TIMEOUT_S, out=sys.stderr
            )
    except subprocess.TimeoutExpired:
        raise CacheError(f"{failure}: pip took over {PIP_TIMEOUT_S} s; gave up") from None
    except OSError as error:
        raise CacheError(f"{failure}: could not run pip: {error}") from None
    if completed.returncode != 0:
        raise CacheError(f"{failure}: {pip_failure(completed)}")
    return completed


def pip_failure(completed: subprocess.CompletedProcess) -> str:
    """pip's own ERROR lines, which say e.g. which versions exist; else the tail of its output."""
    text = (completed.stderr or "") + "\n" + (completed.stdout or "")
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR:")]
    if errors:
        return "; ".join(line.removeprefix("ERROR:").strip() for line in errors)
    tail = [line.strip() for line in text.splitlines() if line.strip()][-3:]
    return " / ".join(tail) or f"pip exited with status {completed.returncode} and printed nothing"
