"""No import cycles among spikeloop's modules, counting the imports inside functions too.

An import deferred into a function still ties two modules together: it only moves the failure from import time
to the first call. Imports under `if TYPE_CHECKING:` are for type checkers only and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("bridge", "envs", "models", "experiments")
"""The folders, each installed as `spikeloop.<folder>` (pyproject.toml's package-dir)."""


def module_files() -> dict[str, Path]:
    """Dotted module name as installed (`spikeloop.bridge.wire.core`) -> file, for every module of the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = ("spikeloop", *path.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node, skipping the bodies of `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = child.test if isinstance(child, ast.If) else None
            if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a `from package import name` names the submodule when it is one)."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else owner(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_scan_finds_a_cycle_that_is_there() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_scan_reads_deferred_imports_and_skips_type_checking(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "one.py").write_text("def f():\n    from pkg import two\n")
    (tmp_path / "pkg" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.one import f\nfrom . import three\n"
    )
    (tmp_path / "pkg" / "three.py").write_text("import pkg.one\n")
    modules = {p.stem if p.stem != "__init__" else "pkg": p for p in (tmp_path / "pkg").glob("*.py")}
    modules = {("pkg." + k if k != "pkg" else k): v for k, v in modules.items()}
    graph = import_graph(modules)
    assert graph["pkg.one"] == {"pkg.two"} and graph["pkg.two"] == {"pkg.three"}
    assert cycles(graph) == [["pkg.one", "pkg.three", "pkg.two"]]


def test_no_module_imports_itself_back() -> None:
    modules = module_files()
    assert len(modules) > 100  # the scan really reads the project
    graph = import_graph(modules)
    assert sum(map(len, graph.values())) > 300, "the scan must see the modules' imports of each other"
    found = cycles(graph)
    assert found == [], "import cycles (break them: move the shared piece into a module both can import):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )
