"""Ray's non-public names that spikeloop uses (models/ray_internals.py) exist in the installed Ray.

A Ray upgrade that moves or renames one fails here, naming it, instead of inside a run. Also: no other module
of the project reaches into Ray's private modules.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import ray

from spikeloop.models.ray_internals import PRIVATE_NAMES, ray_cpu_count

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("bridge", "envs", "models", "experiments")
PRIVATE_MODULES = {module for module, _ in PRIVATE_NAMES}


def _underscored(name: str) -> bool:
    """A dotted name with a private part (`ray._private`, `ray.train._internal`)."""
    return any(part.startswith("_") for part in name.split("."))


def private_imports(source: str) -> list[str]:
    """The modules of Ray's private API that `source` imports (`import X`, `from X import y`, `from P import X`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [n for n in names if n.split(".")[0] == "ray" and (n in PRIVATE_MODULES or _underscored(n))]
    return found


@pytest.mark.parametrize(("module", "name"), PRIVATE_NAMES, ids=[f"{m}.{n}" for m, n in PRIVATE_NAMES])
def test_each_private_name_exists_in_the_installed_ray(module: str, name: str) -> None:
    found = getattr(importlib.import_module(module), name, None)
    # A function, or a switch (a module constant ray_internals sets for a while): a bool is what Ray reads there.
    assert callable(found) or isinstance(found, bool), (
        f"Ray {ray.__version__} has no {module}.{name}: update models/ray_internals.py"
    )


def test_the_cpu_count_is_what_this_machine_offers() -> None:
    assert 1 <= ray_cpu_count() <= len(__import__("os").sched_getaffinity(0))


def test_the_import_check_sees_private_imports_and_passes_public_ones() -> None:
    source = (
        "import ray._private.utils\nfrom ray._private.utils import get_num_cpus\n"
        "from ray.experimental import internal_kv\nfrom ray.train._internal import storage\n"
        "import ray\nfrom ray import tune\nlogger_name = 'ray._private.worker'\n"
    )
    assert private_imports(source) == [
        "ray._private.utils",
        "ray._private.utils",
        "ray._private.utils.get_num_cpus",
        "ray.experimental.internal_kv",
        "ray.train._internal",
        "ray.train._internal.storage",
    ]


def test_no_other_module_imports_ray_private_modules() -> None:
    users = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name != "ray_internals.py" and (found := private_imports(path.read_text())):
                users[str(path.relative_to(REPO))] = found
    assert users == {}, f"move these uses of Ray's private API into models/ray_internals.py: {users}"
