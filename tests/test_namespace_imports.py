"""No code, test, script or notebook imports spikeloop's folders by their bare names (`models`, `bridge`, ...).

They install as `spikeloop.<folder>`; a bare `import models` would find another package's `models`, or, run from the
repository root, load a second copy of ours whose classes are not the installed ones. Read from the syntax tree (as
tests/test_import_cycles.py reads the imports), deferred imports and notebook cells included.
"""

from __future__ import annotations

import ast
import json

from tests.support.hardware_rig import REPO

FOLDERS = ("bridge", "envs", "models", "experiments")
SCANNED = (*FOLDERS, "tests", "scripts", "notebooks")


def bare_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each absolute import whose first part is one of the folders."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in FOLDERS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FOLDERS:
                found.append((node.lineno, node.module))
    return found


def _sources() -> dict[str, str]:
    """Source text by where it is: every .py file, and every notebook's code cells."""
    out = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            out[str(path.relative_to(REPO))] = path.read_text()
        for path in sorted((REPO / top).rglob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            for number, cell in enumerate(cells):
                if cell["cell_type"] == "code":
                    source = "".join(cell["source"])
                    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
                    out[f"{path.relative_to(REPO)} cell {number}"] = "\n".join(lines)
    return out


def test_the_scan_finds_a_bare_import() -> None:
    tree = ast.parse(
        "import models\nfrom bridge.wire import core\ndef f():\n    import experiments.cli as c\n"
        "from spikeloop.models import learner\nimport modelsx\nfrom . import envs\n"
    )
    assert bare_imports(tree) == [(1, "models"), (2, "bridge.wire"), (4, "experiments.cli")]


def test_nothing_imports_the_folders_by_their_bare_names() -> None:
    sources = _sources()
    assert sum(name.endswith(".py") for name in sources) > 200 and any("cell" in name for name in sources)
    found = [
        f"{where}:{line}: {name}" for where, text in sources.items() for line, name in bare_imports(ast.parse(text))
    ]
    assert found == [], "import these as spikeloop.<name> (scripts/rewrite_namespace.py rewrites them):\n" + "\n".join(
        found
    )
