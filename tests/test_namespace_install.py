"""spikeloop installs under one name, `spikeloop`: a package with its own top-level `models` or `envs` is left alone.

The wheel of spikeloop and the wheel of a tiny package that has its own `models` package and `envs` module go into
a fresh venv, which reaches the main dependencies (torch, Ray, ...) through a .pth line to this venv's
site-packages, so nothing large is installed again. A subprocess outside the repository then imports both.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.support.hardware_rig import REPO

FOLDERS = ("bridge", "envs", "models", "experiments")

OTHER_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "other-models"
version = "1.0"

[tool.setuptools]
packages = ["models"]
py-modules = ["envs"]
"""

CHECK_IMPORTS = r"""
import json, sys
import envs, models
import spikeloop.envs
import spikeloop.models.closed_loop_module as module
print(json.dumps({
    "models": models.OWNER,
    "envs": envs.OWNER,
    "spikeloop_module": module.__file__,
    "spikeloop_envs": spikeloop.envs.__file__,
    "class": module.ClosedLoopRLModule.__module__,
}))
"""


def _package_list() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_folder_is_installed_under_spikeloop() -> None:
    """Nothing missed: each folder with an __init__.py under the four is in pyproject.toml's package list."""
    folders = sorted(
        "spikeloop." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in FOLDERS
        for init in (REPO / folder).rglob("__init__.py")
    )
    assert len(folders) > len(FOLDERS), "the scan must see the subpackages"
    assert sorted(_package_list()) == folders
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert package_dir == {f"spikeloop.{folder}": folder for folder in FOLDERS}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_spikeloop_beside_a_package_with_its_own_models_and_envs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    other = tmp_path / "other"
    (other / "models").mkdir(parents=True)
    (other / "pyproject.toml").write_text(OTHER_PYPROJECT)
    (other / "models" / "__init__.py").write_text('OWNER = "other-models"\n')
    (other / "envs.py").write_text('OWNER = "other-models"\n')
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    # Built from a copy of what the wheel needs, so that setuptools' build/ and egg-info stay out of the checkout.
    source = tmp_path / "spikeloop-source"
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    _run([*pip_wheel, str(source)], cwd=tmp_path)
    _run([*pip_wheel, str(other)], cwd=tmp_path)
    spikeloop_wheel = next(wheels.glob("spikeloop-*.whl"))
    names = zipfile.ZipFile(spikeloop_wheel).namelist()
    assert not [n for n in names if n.split("/")[0] in FOLDERS], "nothing of spikeloop at the top level"
    for data in ("spikeloop/envs/scenarios/arena.cfg", "spikeloop/experiments/quickstart.yaml"):
        assert data in names, f"{data} missing from the wheel"
    assert "spikeloop/experiments/live_view/dashboard.html" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).stdout.strip()
    )
    outer = _run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).stdout
    (site / "main_dependencies.pth").write_text(outer.strip() + "\n")  # a plain path line: no editable finder runs
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    _run([*install, str(spikeloop_wheel), str(next(wheels.glob("other_models-*.whl")))], cwd=tmp_path)

    proc = _run([str(python), "-c", CHECK_IMPORTS], cwd=tmp_path)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["models"] == "other-models" and found["envs"] == "other-models", found
    assert found["spikeloop_module"].startswith(str(site / "spikeloop" / "models")), found
    assert found["spikeloop_envs"].startswith(str(site / "spikeloop" / "envs")), found
    assert found["class"] == "spikeloop.models.closed_loop_module"
    usage = _run([str(venv / "bin" / "spikeloop"), "--help"], cwd=tmp_path).stdout
    assert "usage: spikeloop COMMAND" in usage and "checkpoint upgrade" in usage
