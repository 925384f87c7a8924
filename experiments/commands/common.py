"""Pieces every `spikeloop` subcommand shares: the experiment argument and error reporting."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spikeloop.experiments.preflight import preflight
from spikeloop.experiments.schema import Experiment, ExperimentError, load_experiment


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """EXP.yaml and repeatable --set KEY=VALUE."""
    parser.add_argument("experiment", metavar="EXP.yaml", help="experiment file (see experiments/*.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting by its dotted key, e.g. --set stop.iterations=2 --set devices.0.seed=3 "
        "(values are YAML: numbers, true/false, [lists]); repeatable",
    )


def load_or_exit(args: argparse.Namespace) -> Experiment:
    """The validated experiment, or a clear message and exit status 2."""
    try:
        experiment = load_experiment(args.experiment, args.overrides)
        preflight(experiment, args.experiment)
        return experiment
    except ExperimentError as exc:
        print(f"spikeloop: invalid experiment\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None


def add_start_argument(parser: argparse.ArgumentParser) -> None:
    """--from CHECKPOINT: a new run on a checkpoint's weights (train and tune)."""
    parser.add_argument(
        "--from",
        dest="start_from",
        metavar="CHECKPOINT",
        help="start a NEW run from this checkpoint's weights and running statistics (feature normalisation, spike "
        "mean and std, value targets), with a fresh optimizer, its own run directory, iterations and episode numbers "
        "from 1; e.g. pre-train on the simulated culture, then continue on a CL1. CHECKPOINT is a checkpoint_* "
        "directory, a trial directory (its newest) or a run directory (its best). The model settings must match "
        "the checkpoint's",
    )


def start_or_exit(args: argparse.Namespace, experiment: Experiment) -> Path | None:
    """The checked `--from` checkpoint (None without --from), or a clear message and exit status 2."""
    if not args.start_from:
        return None
    if args.resume:
        print(
            "spikeloop: --from starts a new run and --resume continues an old one; give one of them",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from spikeloop.experiments.start_from import StartError, check_start

    try:
        checkpoint, line = check_start(experiment, Path(args.start_from))
    except StartError as exc:
        print(f"spikeloop: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(line, flush=True)
    return checkpoint
