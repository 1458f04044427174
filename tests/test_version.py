"""The version comes from git (setuptools-scm): a checkout's names its commit, a tree without git metadata builds as
pyproject.toml's fallback, and the package reports what its install recorded."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.version import Version

import harness

REPO_DIR = Path(__file__).resolve().parent.parent
SCM = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["tool"]["setuptools_scm"]

setuptools_scm = pytest.importorskip("setuptools_scm", reason="setuptools-scm comes with the test extra")


def test_pyproject_takes_the_version_from_git() -> None:
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert any(r.startswith("setuptools-scm") for r in project["build-system"]["requires"])
    assert SCM["version_file"] == "harness/_version.py"
    Version(SCM["fallback_version"])


def test_the_package_version_is_a_version() -> None:
    assert Version(harness.__version__) >= Version("0")


@pytest.mark.skipif(not (REPO_DIR / ".git").exists(), reason="not a git checkout")
def test_a_checkout_is_versioned_by_its_commit() -> None:
    head = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    version = setuptools_scm.get_version(root=str(REPO_DIR), fallback_version=SCM["fallback_version"])
    local = Version(version).local or ""
    commit = local.split(".")[0]
    assert commit.startswith("g") and len(commit) > 7 and head.startswith(commit[1:]), (version, head)


def test_a_tree_without_git_metadata_builds_as_the_fallback(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((REPO_DIR / "pyproject.toml").read_text())
    version = setuptools_scm.get_version(root=str(tmp_path), fallback_version=SCM["fallback_version"])
    assert version == SCM["fallback_version"]


def test_the_version_falls_back_to_the_install_then_to_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = importlib.import_module

    def no_version_file(name: str, package: str | None = None) -> ModuleType:
        if name == "harness._version":
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", no_version_file)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.2.3")
    assert harness._read_version() == "1.2.3"

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert harness._read_version() == harness.UNKNOWN_VERSION == "0+unknown"
