"""`spikeloop export nwb RUN_DIR`: each session record of a run (or trial) as an NWB file, beside the record."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from spikeloop.experiments.export_nwb import CultureSubject
from spikeloop.models.closed_loop.session_record import RECORD_DIR, RecordError, find_records

FORMATS = ("nwb",)


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop export`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop export",
        description=f"Convert a run's session records ({RECORD_DIR}/*.h5 in each trial directory, written while it "
        "trained) into NWB files, one beside each record (needs the `nwb` extra: pip install -e '.[nwb]').",
    )
    parser.add_argument("format", choices=FORMATS, help="the format to write: nwb (Neurodata Without Borders)")
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory (<output.root_dir>/<name>-<timestamp>/) or one trial directory inside it",
    )
    parser.add_argument(
        "--species",
        default="Homo sapiens",
        help="the culture's species for NWB's subject (Latin binomial; default Homo sapiens, the CL1's human neurons)",
    )
    parser.add_argument(
        "--age",
        default="P0D",
        help="the culture's age at the session (ISO 8601 duration, e.g. P35D for 35 days in vitro; default P0D)",
    )
    parser.add_argument(
        "--sex", default="U", choices=("M", "F", "U", "O"), help="the donor's sex: M, F, U (unknown, default) or O"
    )
    return parser


def export(run_dir: Path, subject: CultureSubject | None = None) -> tuple[list[Path], list[str]]:
    """Write an NWB file beside every session record under `run_dir`; returns their paths and what failed."""
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such directory; pass the run directory `spikeloop train` printed")
    if not run_dir.is_dir():
        raise NotADirectoryError(f"{run_dir}: not a directory; pass a run directory or one of its trial directories")
    records = find_records(run_dir)
    if not records:
        raise FileNotFoundError(
            f"{run_dir} holds no session record ({RECORD_DIR}/*.h5 in a trial directory): records are written by "
            "runs with output.record: true (the default) that drive a culture; pass such a run directory"
        )
    from spikeloop.experiments.export_nwb import record_to_nwb

    if importlib.util.find_spec("pynwb") is None:  # found, not imported: it takes seconds to load
        raise RuntimeError("NWB export needs pynwb; install it with: pip install -e '.[nwb]'")
    written, failed = [], []
    for record in records:  # a damaged record does not keep the others from being converted
        try:
            written.append(record_to_nwb(record, record.with_suffix(".nwb"), subject or CultureSubject()))
        except RecordError as exc:
            failed.append(str(exc))
    return written, failed


def main(argv: list[str]) -> int:
    """Run `spikeloop export`."""
    args = build_parser().parse_args(argv)
    try:
        subject = CultureSubject(species=args.species, age=args.age, sex=args.sex)
        written, failed = export(Path(args.run_dir).resolve(), subject)
    except (OSError, RuntimeError) as exc:
        print(f"spikeloop export: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    for problem in failed:
        print(f"spikeloop export: {problem}", file=sys.stderr)
    return 1 if failed else 0
