"""`spikeloop tune EXP.yaml`: a Ray Tune sweep over the experiment's `tune.search_space`."""

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
    """Flags of `spikeloop tune`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop tune",
        description="Sweep settings (tune.search_space: dotted keys -> grid/choice/uniform/loguniform/randint) with "
        "Ray Tune. Each trial gets its own directory, checkpoints and TensorBoard files; failed trials are retried "
        "from their last checkpoint (tune.max_failures). With a `design:` section, one trial per culture instead: "
        "its blocks in the order the design dealt it, a rest before each, `sequence.json` as it goes.",
    )
    add_experiment_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="resume the newest sweep of this experiment's name (e.g. after the driver was killed); "
        "unfinished and errored trials, and those a lost device stopped, continue from their checkpoints (a "
        "design's culture: at the block it stopped in, which starts again)",
    )
    add_start_argument(parser)
    return parser


def main(argv: list[str]) -> int:
    """Run `spikeloop tune`."""
    args = build_parser().parse_args(argv)
    experiment = load_or_exit(args)
    if not experiment.tune.search_space and experiment.design is None and not args.resume:
        print(
            "spikeloop tune: the experiment has no tune.search_space and no design; use `spikeloop train` for a "
            "single run"
        )
        return 2
    start_from = start_or_exit(args, experiment)
    if start_from is not None and experiment.design is not None:
        print(
            "spikeloop tune: --from with a design: each block starts a fresh learner on its culture "
            "(design.fresh: learner), so a checkpoint's weights have no block to go to; leave out --from",
            file=sys.stderr,
        )
        return 2
    from spikeloop.experiments.runner import run

    command = " ".join(["spikeloop", "tune", *argv])
    run(experiment, sweep=True, resume=args.resume, start_from=start_from, command=command)
    return 0
