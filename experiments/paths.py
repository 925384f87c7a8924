"""Will the file system take a run directory under `output.root_dir`? Asked before Ray starts.

A path the kernel refuses (a NUL byte; a component longer than the file system's NAME_MAX; the whole longer
than PATH_MAX) would otherwise pass `check` and fail inside `train` with an OSError that names no key. The
limits are the file system's own (`os.pathconf` on the nearest existing directory), not a guess.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_NAME_SUFFIX = len("-20261207-161500")
"""What the runner appends to the experiment's name for the run directory (`name-YYYYmmdd-HHMMSS`)."""
TRIAL_PATH_ROOM = 512
"""Bytes kept free below the run directory for Tune's trial directories and their files (checkpoints, records)."""
DEFAULT_NAME_MAX = 255
DEFAULT_PATH_MAX = 4096


def _limit(directory: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):  # no such limit here (or no pathconf): the common Linux value
        return default
    return value if value and value > 0 else default


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG and the like: what the checks below name
        return False


def _nearest_existing(path: Path) -> Path:
    existing = path
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    return existing


def root_path_problem(root_dir: str, experiment_name: str) -> tuple[str, str] | None:
    """(key, problem and fix) for what the file system would refuse about runs under `root_dir`, or None."""
    if "\0" in root_dir:
        return (
            "output.root_dir",
            f"{root_dir!r} holds a NUL byte, which no file name may hold; give a directory path without it",
        )
    try:
        path = Path(root_dir).expanduser().absolute()
    except (RuntimeError, OSError, ValueError) as exc:  # `~user` of no user, or a cwd that is gone
        return "output.root_dir", f"{root_dir!r} cannot be resolved ({exc}); give a directory path"
    existing = _nearest_existing(path)
    directory = existing if existing.is_dir() else existing.parent
    name_max = _limit(directory, "PC_NAME_MAX", DEFAULT_NAME_MAX)
    path_max = _limit(directory, "PC_PATH_MAX", DEFAULT_PATH_MAX)
    for part in path.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            return "output.root_dir", (
                f"the directory name {part[:40]!r}... is {size} bytes, past this file system's limit of {name_max} "
                "per name (NAME_MAX); give a shorter path"
            )
    run_name = len(os.fsencode(experiment_name)) + RUN_NAME_SUFFIX
    if run_name > name_max:
        return "name", (
            f"a run directory is named after the experiment (`name`, {run_name - RUN_NAME_SUFFIX} bytes) plus "
            f"{RUN_NAME_SUFFIX} for the time, past this file system's {name_max} per name; use a name of at most "
            f"{name_max - RUN_NAME_SUFFIX} bytes"
        )
    total = len(os.fsencode(str(path))) + 1 + run_name + TRIAL_PATH_ROOM
    if total > path_max:
        return "output.root_dir", (
            f"{str(path)[:60]!r}... is {len(os.fsencode(str(path)))} bytes long: with the run directory and "
            f"{TRIAL_PATH_ROOM} bytes kept for the trials' files below it, paths would pass this file system's "
            f"limit of {path_max} (PATH_MAX); give a shorter path"
        )
    return None


def output_root_problem(root_dir: str) -> str | None:
    """What keeps runs from being written under `root_dir` (None: it is a writable directory or can be made)."""
    path = Path(root_dir).expanduser()
    if path.exists() and not path.is_dir():
        return f"{root_dir!r} is an existing file, not a directory; give a directory for the runs (e.g. runs)"
    existing = _nearest_existing(path)
    if existing != path and not existing.is_dir():
        return f"{root_dir!r} cannot be made: {existing} is a file; give a directory for the runs (e.g. runs)"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be made: {existing} is not writable"
        return f"{root_dir!r} {what} by this user; give a directory you can write to"
    return None


def runs_root_problem(root_dir: str, experiment_name: str) -> tuple[str, str] | None:
    """(key, problem and fix) for what keeps runs from being written under `root_dir`: what the file system would
    refuse about its paths, then a file in the way or no permission to write; None if runs can be written there."""
    refused = root_path_problem(root_dir, experiment_name)
    if refused is not None:
        return refused
    problem = output_root_problem(root_dir)
    return None if problem is None else ("output.root_dir", problem)
