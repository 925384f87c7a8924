"""`spikeloop checkpoint RUN_DIR`: ask a running experiment to save a checkpoint now.

The trainable polls for a request file after every training iteration (see
`experiments.runner`): in a trial directory it asks that trial, in a run
directory every trial of the run. Writing the file is all this command does, so
it works from any machine that sees the run directory, with no Ray connection.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiments.runner import CHECKPOINT_REQUEST, RESOLVED_FILE


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop checkpoint`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop checkpoint",
        description=f"Ask a running experiment to save a checkpoint now. Writes {CHECKPOINT_REQUEST!r} into "
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


def main(argv: list[str]) -> int:
    """Run `spikeloop checkpoint`."""
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
