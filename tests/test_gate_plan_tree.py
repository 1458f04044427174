"""`harness plan SCENARIO --vllm-src TREE` sizes the deployment from the tree it was asked about, as it sizes the layer
table: a tree whose layer double-counts shows its workspace, and the OOM, in the deployment verdict, whatever version
number its _version.py claims. What a tree's _version.py says reaches the terminal escaped."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.scenario.sections import REPO_DIR
from harness.sizing.vllm_source.sources import locate

CASE_55579 = REPO_DIR / "scenarios/deepseek-v3-dp32-pr55579.yaml"
GIB = 2**30


@pytest.fixture
def cache_dir() -> Path:
    explicit = os.environ.get("HARNESS_CACHE_DIR")
    return Path(explicit) if explicit else Path.home() / ".cache" / "moe-harness"


def _tree(cache_dir: Path, where: Path, version: str, *, claims: str) -> Path:
    """`version`'s vllm/ package copied, its _version.py claiming `claims` (a Python string literal's body)."""
    release = locate(version=version, cache_dir=cache_dir)
    shutil.copytree(release.root / "vllm", where / "vllm")
    (where / "vllm/_version.py").write_text(f"__version__ = '{claims}'\n")
    return where


def _plan(capsys, *argv: str) -> dict:
    code = main(["plan", str(CASE_55579), "--gpu", "H200-141GB", "--json", *argv])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    return json.loads(out)


def _workspace(deployment: dict) -> int:
    (line,) = [line for line in deployment["lines"] if line["name"] == "moe-workspace"]
    return line["bytes"]


@pytest.mark.vllm_wheel
def test_the_deployment_verdict_comes_from_the_tree_not_the_release_of_its_version(cache_dir, tmp_path, capsys):
    # 0.29.0's double-counting layer behind the version number of the release that fixed it
    tree = _tree(cache_dir, tmp_path / "tree", "0.29.0", claims="0.30.0")
    by_tree = _plan(capsys, "--vllm-src", str(tree), "--cache-dir", str(cache_dir))
    by_release = _plan(capsys, "--vllm-version", "0.30.0", "--cache-dir", str(cache_dir))
    (layer,) = by_tree["layers"]
    (deployment,) = by_tree["deployments"]
    (released,) = by_release["deployments"]
    assert layer["vllm_version"] == deployment["vllm_version"] == released["vllm_version"] == "0.30.0"
    assert deployment["verdict"]["outcome"] == "oom" and deployment["verdict"]["component"] == "moe-workspace"
    assert released["verdict"]["outcome"] == "starts"
    assert _workspace(deployment) == 112 * GIB and _workspace(released) == 3.5 * GIB  # the tree's own workspace


@pytest.mark.vllm_wheel
def test_a_trees_version_string_is_printed_escaped(cache_dir, tmp_path, capsys):
    tree = _tree(cache_dir, tmp_path / "tree", "0.30.0", claims="0.30.0\\n\\x1b[31mRED")
    code = main(["plan", str(CASE_55579), "--gpu", "H200-141GB", "--vllm-src", str(tree),
                 "--cache-dir", str(cache_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    shown = [line for line in captured.out.splitlines() if "RED" in line]
    assert shown and all("0.30.0\\n\\x1b[31mRED" in line for line in shown)  # one line each, the codes as text
    assert "\x1b" not in captured.out + captured.err


def test_a_model_name_is_printed_escaped(tmp_path, capsys):
    model = tmp_path / "deep\nseek\x1b[2J"
    model.mkdir()
    code = main(["plan", "--vllm-version", "0.30.0", "--gpu", "H200-141GB", "--", "vllm", "serve", str(model)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "\x1b" not in err
    assert "deep\\nseek\\x1b[2J: the directory has no config.json" in err


def test_what_a_model_directory_holds_is_printed_escaped(tmp_path, capsys):
    model = tmp_path / "m\nodel"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Evil\x1b[31mForCausalLM"], "hidden_size": 8}))
    code = main(["plan", "--vllm-version", "0.30.0", "--gpu", "H200-141GB", "--", "vllm", "serve", str(model)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "\x1b" not in err, err
    assert "m\\nodel" in err


@pytest.mark.vllm_wheel
def test_a_wheels_deployment_verdict_comes_from_the_wheel(cache_dir, tmp_path, capsys):
    """--vllm-wheel feeds the deployment plan as --vllm-src does: a wheel of 0.29.0's files whose METADATA claims
    0.30.0 is sized from its own double-counting layer."""
    import base64
    import hashlib
    import zipfile

    release = locate(version="0.29.0", cache_dir=cache_dir)
    wheel = tmp_path / "vllm-0.30.0-py3-none-any.whl"
    members = {str(p.relative_to(release.root)): p.read_bytes() for p in sorted((release.root / "vllm").rglob("*.py"))}
    members["vllm-0.30.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n"
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in members.items())
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("vllm-0.30.0.dist-info/RECORD", record + "vllm-0.30.0.dist-info/RECORD,,\n")
    (deployment,) = _plan(capsys, "--vllm-wheel", str(wheel), "--cache-dir", str(tmp_path / "cache"))["deployments"]
    assert deployment["vllm_version"] == "0.30.0" and deployment["verdict"]["outcome"] == "oom"
    assert _workspace(deployment) == 112 * GIB


@pytest.mark.parametrize("claimed,read", [("0.30.0", "0.30.0"), ("../../x", "unknown"), ("1.0\x1b[2J", "unknown")])
def test_a_wheels_version_is_one_safe_path_component(tmp_path, claimed: str, read: str) -> None:
    """A wheel's METADATA version names its cache directory and is printed: kept to one path component, and escaped."""
    import zipfile

    from harness.sizing.vllm_source.sources import _read_wheel_metadata

    wheel = tmp_path / "vllm-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {claimed}\n")
    assert _read_wheel_metadata(wheel)[0] == read
