"""A wheel download's progress: pip's captured output gives the total, the bytes pip has written under its TMPDIR
give the progress; a log gets a line every few seconds. The child here does what pip does: it prints pip's
"Downloading NAME (SIZE)" line and streams the bytes into a file under $TMPDIR, in steps."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from harness.sizing.vllm_source.download_progress import bytes_under, run_with_progress, total_from_pip

CHILD = r"""
import os, sys, time
print("Collecting vllm==0.30.0", flush=True)
print("  Downloading vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl (4.2 MB)", flush=True)
tmp = os.path.join(os.environ["TMPDIR"], "pip-unpack-x")
os.makedirs(tmp)
with open(os.path.join(tmp, "vllm.whl"), "wb") as f:
    for _ in range(8):
        f.write(b"\0" * 525_000)
        f.flush()
        time.sleep(0.3)
print("Saved ./vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl", flush=True)
print("ERROR: nothing, just stderr", file=sys.stderr)
"""


def test_pip_sizes_are_read_as_pip_writes_them():
    assert total_from_pip("  Downloading vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl (312.6 MB)") == 312_600_000
    assert total_from_pip("Downloading x.whl (980 kB)") == 980_000
    assert total_from_pip("Collecting vllm==0.30.0") is None


def test_a_log_gets_lines_of_bytes_so_far_and_the_output_is_kept(tmp_path: Path):
    log = io.StringIO()
    done = run_with_progress(
        [sys.executable, "-c", CHILD],
        label="vllm==0.30.0",
        scratch=tmp_path / "pip-tmp",
        timeout_s=120,
        out=log,
        interval_s=0.5,
    )
    assert done.returncode == 0
    assert "Saved ./vllm-0.30.0" in done.stdout and "ERROR: nothing" in done.stderr  # captured whole for pip_failure
    lines = log.getvalue().splitlines()
    assert len(lines) >= 2, lines
    pattern = re.compile(r"^harness: vllm==0\.30\.0: (\S+ \S+) of 4\.01 MiB \((\d+)%\), \S+ \S+/s$")
    percents = []
    for line in lines:
        match = pattern.match(line)
        assert match, line
        percents.append(int(match.group(2)))
    assert percents == sorted(percents) and percents[-1] > percents[0]  # growing as the file grows
    assert bytes_under(tmp_path / "pip-tmp") == 8 * 525_000


def test_a_download_past_its_time_is_killed(tmp_path: Path):
    import subprocess

    import pytest

    with pytest.raises(subprocess.TimeoutExpired):
        run_with_progress(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            label="vllm==0.30.0",
            scratch=tmp_path / "pip-tmp",
            timeout_s=1,
            out=io.StringIO(),
        )
