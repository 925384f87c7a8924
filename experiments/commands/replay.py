"""`spikeloop replay RUN_DIR`: what a recorded session's spikes carried, and how much of the policy they decided."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from spikeloop.experiments.analysis.replay import AUTO, SOURCES


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop replay`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop replay",
        description="Replay a run's recorded sessions offline, per trial: from the trial's session record "
        "(record/*.h5, written unless output.record: false; only its committed rows, so a run cut short by a kill "
        "replays up to the record's last flush), or, for a trial without one, from its step log (steps/*.npz, "
        "output.step_log: true). The report says which it read. Per trial: the culture "
        "information meter over the session (bits per tick the counts carry about the stimulation and about the "
        "action), a decoder trained afresh on the first 80% of episodes and tested on the rest (how much of the "
        "policy the spikes alone determine, against chance), and the newest checkpoint's decoder on the recorded "
        "spikes. Writes replay.json and replay.png into each trial directory and prints a summary.",
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a run or trial directory with record/*.h5 or steps/*.npz"
    )
    parser.add_argument(
        "--source",
        choices=SOURCES,
        default=AUTO,
        help="what to read: the session record where a trial has one, else its step log (auto, the default); "
        "only the record; only the step log",
    )
    return parser


def _bits(entry: dict | None) -> str:
    return "-" if not entry else f"{entry['bits']:+.3f}±{3 * entry['shuffle_bits_sd']:.3f}"


def _source(report: dict[str, Any]) -> str:
    if report["source"] == "steps":
        return "step log (steps/*.npz)"
    files = report["record_files"]
    killed = [f["file"] for f in files if not f["closed"]]
    line = f"session record ({len(files)} file{'s' * (len(files) != 1)} in record/)"
    if killed:
        line += f"; not closed (run killed?), read up to its last flush: {', '.join(killed)}"
    if report["unfinished_steps"]:
        line += f"; {report['unfinished_steps']} steps of unfinished episodes left out"
    return line


def main(argv: list[str] | None = None) -> int:
    """Replay every trial of RUN_DIR; 2 with the reason when there is nothing to replay."""
    args = build_parser().parse_args(argv)
    from spikeloop.experiments.analysis.replay import REPORT_JSON, ReplayError, replay_trial, trial_dirs

    try:
        trials = trial_dirs(args.run_dir, args.source)
    except ReplayError as exc:
        print(f"spikeloop replay: {exc}", file=sys.stderr)
        return 2
    for i, trial_dir in enumerate(trials, 1):
        print(f"[{i}/{len(trials)}] {trial_dir.name}", flush=True)
        try:
            report = replay_trial(trial_dir, args.source)
        except ReplayError as exc:
            print(f"spikeloop replay: {exc}", file=sys.stderr)
            return 2
        last = report["information"][-1]
        fresh, saved = report["fresh_decoder"], report["saved_decoder"]
        print(f"  source: {_source(report)}")
        print(f"  {report['ticks']} ticks, {report['episodes']} episodes")
        print(f"  bits/tick, last chunk: stimulation {_bits(last['stimulation'])}, action {_bits(last['action'])}")
        if "skipped" in fresh:
            print(f"  fresh decoder: skipped ({fresh['skipped']})")
        else:
            print(
                f"  fresh decoder on {fresh['test_episodes']} held-out episodes: accuracy {fresh['accuracy']:.3f} "
                f"(chance {fresh['chance_accuracy']:.3f}), {fresh['bits']:+.3f}±{3 * fresh['shuffle_bits_sd']:.3f} bits/tick"
            )
        if "skipped" in saved:
            print(f"  saved decoder: skipped ({saved['skipped']})")
        else:
            print(
                f"  saved decoder: agrees with {saved['agreement']:.3f} of the actions taken; mean log-likelihood "
                f"{saved['mean_log_likelihood']:.3f} (uniform {saved['uniform_log_likelihood']:.3f})"
            )
        print(f"  written: {trial_dir / REPORT_JSON}")
    return 0
