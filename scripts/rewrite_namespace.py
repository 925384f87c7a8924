"""Rewrite references to the four source folders' modules to their installed names (`spikeloop.<folder>...`).

Issue 28 item 4 installs `bridge`, `envs`, `models` and `experiments` as `spikeloop.bridge`, ... (pyproject.toml's
`package-dir`), so `import models` no longer means spikeloop. This script made that change in the tree and can be run
again on a branch written before it (it is idempotent): in every tracked text file (code, tests, notebooks' JSON,
scripts, docs) it prefixes `spikeloop.` to each dotted name that is a real module of the four folders
(`bridge.trainer.core`, `envs.doom_env:DoomEnv`, `-m experiments.cli`), and to `import X` / `from X import` of a bare
folder. Paths (`bridge/wire/protocol.py`) and attribute chains that name no module (`bridge.exchange(...)`) are left.

    python scripts/rewrite_namespace.py          # rewrite, print each file changed
    python scripts/rewrite_namespace.py --check  # change nothing; exit 1 when something would change
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("bridge", "envs", "models", "experiments")
SUFFIXES = {".py", ".ipynb", ".md", ".toml", ".sh", ".yaml", ".yml", ".cfg", ".txt", ".js", ".html", ""}
SKIP = {
    "scripts/rewrite_namespace.py",
    "experiments/checkpoint_upgrade.py",
    "tests/test_checkpoint_upgrade.py",
    "tests/test_namespace_imports.py",
    "tests/test_namespace_install.py",
}
"""Files that name the old modules on purpose (the checkpoint upgrade's table, and the tests that a bare name is
found, refused or another package's)."""

DOTTED = re.compile(r"(?<![\w.])(?:" + "|".join(FOLDERS) + r")(?:\.\w+)+")
BARE_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)(" + "|".join(FOLDERS) + r")(?=\s|$|,)", re.MULTILINE)


def module_names() -> set[str]:
    """Every module and package of the four folders, by its old dotted name."""
    names = set(FOLDERS)
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join(parts))
    return names


def rewrite(text: str, modules: set[str]) -> str:
    """The text with each old module name prefixed by `spikeloop.`."""

    def dotted(match: re.Match[str]) -> str:
        parts = match.group(0).split(".")
        # A module name when its first two parts are one (what follows may be a submodule or an attribute).
        return "spikeloop." + match.group(0) if ".".join(parts[:2]) in modules else match.group(0)

    return BARE_IMPORT.sub(r"\1spikeloop.\2", DOTTED.sub(dotted, text))


def main(argv: list[str] | None = None) -> int:
    """Rewrite the tracked files (or, with --check, only say which would change)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file would change")
    args = parser.parse_args(argv)
    modules = module_names()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    changed = []
    for name in tracked.splitlines():
        path = REPO / name
        if name in SKIP or path.suffix not in SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, modules)
        if new != text:
            changed.append(name)
            if not args.check:
                path.write_text(new)
    for name in changed:
        print(name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
