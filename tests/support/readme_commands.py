"""The README's shell commands, read out of it so that tests run exactly what a user is told to run.

A command is an indented code line of README.md (continued by a trailing
backslash) that, joined, starts with a given prefix; exactly one must match, so a test
breaks as soon as the README and the test disagree. Tests then fill in the
README's placeholders (HEAD, <device_id>, paths) and add only what makes them
local (free ports, temporary directories, short runs) with `with_options`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_command(prefix: str) -> str:
    """The one README command line starting with `prefix` (continuation lines joined)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        if not line.startswith("    ") or (i and lines[i - 1].rstrip().endswith("\\")):
            continue  # not code, or the continuation of a command above
        command = line.strip()
        j = i
        while command.endswith("\\"):
            j += 1
            command = command[:-1].rstrip() + " " + lines[j].strip()
        if command.startswith(prefix):
            found.append(command)
    if len(found) != 1:
        raise AssertionError(
            f"README.md has {len(found)} command lines starting with {prefix!r}, expected one: {found}"
        )
    return found[0]


def readme_argv(prefix: str, replace: dict[str, str] | None = None) -> list[str]:
    """The README command as an argument list, with placeholders replaced inside every word."""
    words = shlex.split(readme_command(prefix))
    for old, new in (replace or {}).items():
        assert any(old in w for w in words), f"placeholder {old!r} not in the README command {words}"
        words = [w.replace(old, new) for w in words]
    return words


def with_options(argv: list[str], options: dict[str, str]) -> list[str]:
    """`argv` with each `--option VALUE` set: replaced where the command has it, else added before a `--`."""
    argv = list(argv)
    for option, value in options.items():
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            at = argv.index("--") if "--" in argv else len(argv)
            argv[at:at] = [option, value]
    return argv


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value words (as in `RAY_AUTH_MODE=token ray start ...`) and the command after them."""
    env = {}
    while argv and "=" in argv[0] and not argv[0].startswith("-") and argv[0].split("=", 1)[0].isupper():
        name, value = argv[0].split("=", 1)
        env[name] = value
        argv = argv[1:]
    return env, argv
