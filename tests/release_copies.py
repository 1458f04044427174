"""A cached release's files copied into a temporary source tree with one construct changed: how the tests show that a
reading of a release's source follows the construct it names (harness.sizing.release_defaults). Nothing of vLLM is
committed; the copies live in the test's tmp_path."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from harness.sizing.vllm_source import locate
from harness.sizing.vllm_source.layer_source import ReleaseFiles

# What makes a source tree beside the files a reading takes
TREE_FILES = ("vllm/_version.py", "vllm/envs.py", "vllm/model_executor/layers/fused_moe/__init__.py")


def planted(tmp_path: Path, release_root: Path, files: Iterable[str], file: str, old: str, new: str) -> ReleaseFiles:
    """`files` (those the release has) and TREE_FILES copied from release_root, with `old` replaced by `new` in file
    (exactly once), read as a source tree."""
    root = tmp_path / "vllm-src"
    for name in (*files, *TREE_FILES):
        if (release_root / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(release_root / name, root / name)
    text = (root / file).read_text()
    assert text.count(old) == 1, f"{old!r} is not in {file} exactly once"
    (root / file).write_text(text.replace(old, new))
    return ReleaseFiles(locate(src=root))
