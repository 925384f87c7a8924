"""The repository stands on its own: every file its code, tests and docs point to is in it.

A clone has nothing beside it. Paths in source, tests, docs, experiment files and notebooks that name one of the
repository's own folders must name a file (or, with a wildcard or placeholder, a pattern) that exists; nothing
may point at the design notes or specs the project was built from outside the repository.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("bridge", "docs", "envs", "experiments", "models", "notebooks", "scripts", "tests", ".ci")
SCANNED = ("*.py", "*.md", "*.yaml", "*.ipynb", "*.toml", "*.js", "*.html")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./<>*{}-]*[\w*>}])")
NOT_YET_WRITTEN = {
    "docs/benchmarks/feedback.json": "spikeloop bench feedback writes it; the full measurement has not run yet",
}
"""Result files the docs name as a benchmark's output before that benchmark has run, each with the reason."""
OUTSIDE = re.compile(r"\.\./shared|shared/(?:docs|spec)/|\bDESIGN\.md\b|doom-neuron/[\w/]+\.py")


def _files() -> list[Path]:
    skip = {".venv", ".venv312", ".git", "runs", "node_modules", "__pycache__", ".pytest_cache"}
    found = []
    for folder, folders, names in os.walk(ROOT):
        folders[:] = [f for f in folders if f not in skip]
        found += [Path(folder) / n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in SCANNED)]
    return sorted(found)


def _exists(reference: str) -> bool:
    reference = reference.rstrip(".")
    # Placeholders: <run>, {name}, *, and words in capitals (NAME, deadly_corridor_N).
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}|(?<![A-Za-z])[A-Z]+(?![a-z])", "*", reference)
    if pattern != reference or "*" in reference:
        return any(ROOT.glob(pattern))
    return (ROOT / reference).exists()


def test_no_reference_leaves_the_repository() -> None:
    outside = []
    for path in _files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                outside.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not outside, "references to files outside the repository:\n" + "\n".join(outside)


def test_every_path_the_repository_names_exists() -> None:
    missing = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for reference in PATH.findall(line):
                if "." in Path(reference).name or reference.endswith("/"):
                    if not _exists(reference) and reference.rstrip(".") not in NOT_YET_WRITTEN:
                        missing.append(f"{path.relative_to(ROOT)}:{number}: {reference}")
    assert not missing, "paths that name no file of the repository:\n" + "\n".join(missing)


def test_results_not_yet_written_are_still_missing() -> None:
    """An entry of NOT_YET_WRITTEN goes once its benchmark has written the file: the allowance cannot outlive it."""
    assert not [name for name in NOT_YET_WRITTEN if (ROOT / name).exists()]
