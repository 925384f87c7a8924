"""Pieces every `spikeloop` subcommand shares: the experiment argument and error reporting."""

from __future__ import annotations

import argparse
import sys

from experiments.schema import Experiment, ExperimentError, load_experiment


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
        return load_experiment(args.experiment, args.overrides)
    except ExperimentError as exc:
        print(f"spikeloop: invalid experiment\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
