"""`spikeloop train EXP.yaml`: one closed-loop training run."""

from __future__ import annotations

import argparse
import sys

from spikeloop.experiments.commands.common import (
    add_experiment_arguments,
    add_start_argument,
    load_or_exit,
    start_or_exit,
)


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop train`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop train",
        description="Train the closed loop (encoder -> culture -> decoder) with PPO. Writes a run directory under "
        "output.root_dir with the resolved experiment, TensorBoard event files, episodes.jsonl, "
        "learning_curve.png and checkpoints; prints one progress line per training iteration.",
    )
    add_experiment_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the newest run of this experiment's name from its last checkpoint (after the driver was "
        "killed, or a lost device stopped it: bring the device back on the same ports first)",
    )
    add_start_argument(parser)
    return parser


def main(argv: list[str]) -> int:
    """Run `spikeloop train`."""
    args = build_parser().parse_args(argv)
    experiment = load_or_exit(args)
    if experiment.design is not None:
        print(
            "spikeloop train: the experiment has a design (cultures taking conditions in turn), which runs one "
            "trial per culture: use `spikeloop tune` for it",
            file=sys.stderr,
        )
        return 2
    start_from = start_or_exit(args, experiment)
    from spikeloop.experiments.runner import run

    command = " ".join(["spikeloop", "train", *argv])
    run(experiment, sweep=False, resume=args.resume, start_from=start_from, command=command)
    return 0
