"""`spikeloop watch CHECKPOINT`: play episodes with a trained policy, no training (see `spikeloop.experiments.watch_checkpoint`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spikeloop.experiments.schema import ExperimentError


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop watch`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop watch",
        description="Play episodes with a checkpoint's policy and its culture in the loop, with no training: the "
        "weights are compared before and after and must not change. The experiment is rebuilt from the "
        "experiment.yaml of the checkpoint's trial directory. Feedback and episode_end events are sent as in "
        "training, training_complete at the end. Episodes run in this process (one local env runner, one "
        "culture): for a cl1 device run watch on the node that owns it (a local Ray started here advertises "
        "the device resources itself). Writes a new <root>/watch-<name>-<timestamp>/ with watch.yaml, "
        "experiment.yaml and episodes.jsonl; nothing existing is overwritten.",
    )
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a checkpoint directory (checkpoint_00000N/ inside a trial directory), a trial directory (its "
        "newest checkpoint) or a run directory (the best checkpoint in its summary.yaml)",
    )
    parser.add_argument("--episodes", type=int, default=5, metavar="N", help="episodes to play (default 5)")
    parser.add_argument(
        "--feedback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send reward/event/episode feedback stimulation to the culture as in training (default); "
        "--no-feedback sets feedback.enabled=false (episode_end and training_complete events are still sent)",
    )
    parser.add_argument(
        "--explore",
        action="store_true",
        help="sample stimulation and actions from the policy's distributions instead of taking their "
        "deterministic values, as the reference trainer's watch does (default: deterministic, the policy as "
        "learned without sampling noise)",
    )
    parser.add_argument(
        "--update-spike-mean",
        action="store_true",
        help="keep updating the decoder's running spike mean and std from the spikes of each watched episode, as "
        "the reference trainer's watch does (default: frozen at the checkpoint's, so a watch leaves the policy "
        "exactly as trained and two watches of one checkpoint compare)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting of the checkpoint's experiment by its dotted key, e.g. --set env.scenario=basic "
        "--set 'devices=[{device_id: cl1-a, backend: cl1, host: 10.0.0.5}]'; repeatable",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory under which watch-<name>-<timestamp>/ is created (default: the experiment's output.root_dir)",
    )
    return parser


def main(argv: list[str]) -> int:
    """Run `spikeloop watch`."""
    args = build_parser().parse_args(argv)
    if args.episodes < 1:
        print("spikeloop watch: --episodes must be >= 1", file=sys.stderr)
        return 2
    from spikeloop.experiments.watch_checkpoint import WatchSettings, watch

    settings = WatchSettings(
        checkpoint=Path(args.checkpoint),
        episodes=args.episodes,
        feedback=args.feedback,
        explore=args.explore,
        update_spike_mean=args.update_spike_mean,
        overrides=list(args.overrides),
        output_root=args.output,
    )
    try:
        watch(settings, log=lambda line: print(line, flush=True))
    except ExperimentError as exc:
        print(f"spikeloop watch: invalid experiment\n{exc}", file=sys.stderr)
        return 2
    return 0
