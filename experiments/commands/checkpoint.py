"""`spikeloop checkpoint RUN_DIR`: ask a running experiment to save a checkpoint now; `spikeloop checkpoint upgrade
DIR`: rewrite a checkpoint written before spikeloop installed as `spikeloop.*` (spikeloop.experiments.checkpoint_upgrade).

The trainable polls for a request file after every training iteration (see
`spikeloop.experiments.runner`): in a trial directory it asks that trial, in a run
directory every trial of the run. Writing the file is all this command does, so
it works from any machine that sees the run directory, with no Ray connection.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

from spikeloop.experiments.checkpoint_upgrade import BACKUP_SUFFIX, OldCheckpointError, upgrade
from spikeloop.experiments.runner import CHECKPOINT_REQUEST, RESOLVED_FILE


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop checkpoint`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop checkpoint",
        description="Ask a running experiment to save a checkpoint now (`spikeloop checkpoint upgrade DIR`: "
        "upgrade an old checkpoint; see its --help). Writes {CHECKPOINT_REQUEST!r} into "
        "RUN_DIR; a trial saves after its current training iteration and removes the file. No Ray "
        "connection is needed, only access to the run directory.",
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help=f"a run directory (<output.root_dir>/<name>-<timestamp>/; in a sweep the first trial to finish an "
        f"iteration saves) or one trial directory inside it (that trial saves); either holds {RESOLVED_FILE}",
    )
    return parser


def request_checkpoint(run_dir: Path) -> Path:
    """Write the request file into a run or trial directory; returns its path."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory")
    if not (run_dir / RESOLVED_FILE).is_file():
        raise FileNotFoundError(
            f"{run_dir} is not a run or trial directory (it has no {RESOLVED_FILE}); pass the directory that "
            "`spikeloop train` printed as 'run directory', or one of its trial directories"
        )
    request = run_dir / CHECKPOINT_REQUEST
    request.write_text(f"requested {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    return request


def build_upgrade_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop checkpoint upgrade`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop checkpoint upgrade",
        description="Upgrade a checkpoint written before spikeloop installed as `spikeloop.*` (its pickles name "
        "`models.*`, `bridge.*`, `experiments.*`, `envs.*`, or modules that moved in the layout change): every .pkl "
        f"under DIR that names an old module is unpickled with the new names and pickled again; the original stays "
        f"beside it as *.pkl{BACKUP_SUFFIX}. Files that name no old module are left untouched.",
    )
    parser.add_argument(
        "directory",
        metavar="DIR",
        help="a checkpoint_* directory, a trial directory or a run directory (all its checkpoints and tuner.pkl)",
    )
    return parser


def upgrade_main(argv: list[str]) -> int:
    """Run `spikeloop checkpoint upgrade`."""
    args = build_upgrade_parser().parse_args(argv)
    directory = Path(args.directory).resolve()
    if not directory.exists():
        print(f"spikeloop checkpoint upgrade: {directory}: no such directory", file=sys.stderr)
        return 1
    try:
        changed = upgrade(directory)
    except (OldCheckpointError, ModuleNotFoundError, AttributeError, pickle.UnpicklingError) as exc:
        print(f"spikeloop checkpoint upgrade: {exc}", file=sys.stderr)
        return 1
    for path, renamed in changed.items():
        names = ", ".join(f"{old} -> {new}" for old, new in sorted(renamed.items()))
        print(f"upgraded {path.relative_to(directory) if path != directory else path}: {names}", flush=True)
    if changed:
        print(
            f"{len(changed)} file(s) upgraded under {directory}; the originals are kept as *.pkl{BACKUP_SUFFIX}",
            flush=True,
        )
    else:
        print(f"nothing to upgrade under {directory}: no pickle names an old module", flush=True)
    return 0


def main(argv: list[str]) -> int:
    """Run `spikeloop checkpoint` (or, first argument `upgrade`, `spikeloop checkpoint upgrade`)."""
    if argv and argv[0] == "upgrade":
        return upgrade_main(argv[1:])
    args = build_parser().parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    try:
        request = request_checkpoint(run_dir)
    except FileNotFoundError as exc:
        print(f"spikeloop checkpoint: {exc}", file=sys.stderr)
        return 1
    is_run = (run_dir / "tuner.pkl").exists() or any(
        p.is_dir() and (p / RESOLVED_FILE).exists() for p in run_dir.iterdir()
    )
    # The runner removes a run-level request when the first trial takes it: in a sweep one trial saves.
    who = (
        "the run's trial (in a sweep: the first trial to finish its iteration; pass a trial directory to choose)"
        if is_run
        else "this trial"
    )
    print(f"wrote {request}", flush=True)
    print(
        f"{who} will save a checkpoint after its current training iteration (and remove the request file); "
        "a run that is not running picks the request up when it is resumed",
        flush=True,
    )
    return 0
