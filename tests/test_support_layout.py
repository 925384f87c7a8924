"""Test modules import helpers from tests/support, never from conftest.py or from another test module.

A test module that imports another runs that module's import-time code and shares its
globals; conftest.py is pytest's to load. Shared pieces live in `tests.support` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MODULES = sorted([*TESTS.rglob("test_*.py"), *(TESTS / "support").glob("*.py")])


def _forbidden(name: str) -> bool:
    """A module name that is conftest or a test module (`conftest`, `tests.conftest`, `tests.test_x`, ...)."""
    last = name.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def forbidden_imports(source: str) -> list[str]:
    """The imports in `source` of conftest or of a test module, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _forbidden(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and _forbidden(node.module):
                found.append(module)
            else:  # `from tests import <conftest or test_x>`, `from . import <the same>`
                prefix = module if module.endswith(".") else module + "."
                found += [prefix + alias.name for alias in node.names if _forbidden(alias.name)]
    return found


def test_the_check_sees_every_kind_of_forbidden_import() -> None:
    # Joined from pieces, so that a plain grep of the tree for such imports finds none here.
    conf, test = "conf" + "test", "te" + "st_"
    source = (
        f"import {conf}\nfrom tests.{conf} import x\nfrom tests.{test}a import y\nfrom tests import {test}b\n"
        f"from . import {conf}\nfrom .{test}c import z\nimport tests.{test}d\n"
        "from tests.support.fixtures import ray_session\nfrom spikeloop.bridge.wire.ports import free_port\n"
    )
    assert forbidden_imports(source) == [
        "conftest",
        "tests.conftest",
        "tests.test_a",
        "tests.test_b",
        ".conftest",
        ".test_c",
        "tests.test_d",
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_module_imports_conftest_or_a_test_module(path: Path) -> None:
    assert forbidden_imports(path.read_text()) == [], f"{path.relative_to(TESTS)}: move what it needs to tests/support"
