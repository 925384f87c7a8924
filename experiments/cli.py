"""The `spikeloop` command line.

Each subcommand lives in its own module with a `main(argv) -> int` (and its own
argparse parser, so `--help` explains every flag); this file only dispatches,
importing the module lazily so that `spikeloop --help` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from spikeloop.experiments.stop_signals import sigterm_as_ctrl_c

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spikeloop.experiments.commands.train", "train the closed loop from an experiment YAML"),
    "tune": ("spikeloop.experiments.commands.tune", "sweep experiment settings with Ray Tune (--resume to continue)"),
    "device": ("spikeloop.bridge.device.program", "run the device-side program (sim, cl, random or zero backend)"),
    "check": (
        "spikeloop.experiments.commands.check",
        "preflight an experiment: config, scenario, device latency, envelope",
    ),
    "watch": (
        "spikeloop.experiments.commands.watch",
        "play episodes with a checkpoint's policy (no training), feedback on/off",
    ),
    "checkpoint": (
        "spikeloop.experiments.commands.checkpoint",
        "ask a running experiment to save a checkpoint now; `checkpoint upgrade DIR`: upgrade an old checkpoint",
    ),
    "replay": (
        "spikeloop.experiments.commands.replay",
        "replay a run's session record (or step log): what the spikes carried, and how much of the policy they decided",
    ),
    "export": (
        "spikeloop.experiments.commands.export",
        "write a run's session records as NWB files (spikeloop export nwb RUN_DIR)",
    ),
    "analyze": (
        "spikeloop.experiments.commands.analyze",
        "compare a run's configurations over seeds (exact tests, Holm); --power: seeds a comparison needs",
    ),
}

BENCHMARKS: dict[str, tuple[str, str]] = {
    "bridge": (
        "spikeloop.experiments.benchmarks.bridge",
        "added latency of one exchange through the bridge actor vs a raw UDP round trip",
    ),
    "device": ("spikeloop.experiments.benchmarks.device", "device reply latency and simulated-culture speed"),
    "culture": (
        "spikeloop.experiments.benchmarks.culture",
        "how much of its stimulation the simulated culture passes on to the spike groups",
    ),
    "env": ("spikeloop.experiments.benchmarks.env", "VizDoom env steps/s against raw DoomGame.make_action"),
    "ablation": (
        "spikeloop.experiments.benchmarks.ablation",
        "the learning benchmark's sim, zero and random conditions only",
    ),
    "feedback": (
        "spikeloop.experiments.benchmarks.feedback",
        "feedback on vs off with dopamine-STDP, STDP and fixed-weight cultures, direct path cut or not",
    ),
    "loop": (
        "spikeloop.experiments.benchmarks.loop",
        "closed-loop env steps/s against a paced (50+50 ms) and an unpaced device",
    ),
    "learning": (
        "spikeloop.experiments.benchmarks.learning",
        "learning curves: direct, transparent, sim, zero, random over seeds, with statistics",
    ),
    "protocol": (
        "spikeloop.experiments.benchmarks.protocol",
        "the culture protocol's four conditions over paired seeds: early vs late play, rest before vs after",
    ),
    "flood": (
        "spikeloop.experiments.benchmarks.flood",
        "a device flooded with valid commands: the pulse-rate ceiling held, memory flat, every stimulation answered",
    ),
    "design": (
        "spikeloop.experiments.benchmarks.design",
        "the culture design validated on simulated cultures' blocks: a planted effect, the null, a carry-over",
    ),
    "soak": (
        "spikeloop.experiments.benchmarks.soak",
        "an hour of paced training with device faults and a device restart: memory, descriptors, lost episodes",
    ),
}


def _usage() -> str:
    lines = [
        "usage: spikeloop COMMAND [ARGS...]",
        "",
        "Closed-loop RL with a neural culture in the loop.",
        "",
        "commands:",
    ]
    for name, (_, text) in COMMANDS.items():
        lines.append(f"  {name:<22}{text}")
    lines.append(f"  {'bench NAME':<22}run a benchmark and write docs/benchmarks/NAME.json:")
    for name, (_, text) in BENCHMARKS.items():
        lines.append(f"      {name:<18}{text}")
    lines += ["", "Run `spikeloop COMMAND --help` for the flags of a command."]
    return "\n".join(lines)


def _dispatch(table: dict[str, tuple[str, str]], name: str, argv: list[str], prog: str) -> int:
    if name not in table:
        print(f"spikeloop: unknown {prog} {name!r}; choose from: {', '.join(table)}", file=sys.stderr)
        return 2
    module = importlib.import_module(table[name][0])
    try:
        # A SIGTERM stops every command as Ctrl-C does: its `finally` blocks stop the trainers and device programs
        # it started in sessions of their own, which the default (end at once) would leave running.
        with sigterm_as_ctrl_c():
            return int(module.main(argv) or 0)
    except KeyboardInterrupt:
        print(f"spikeloop {name}: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, ValueError) as exc:
        if os.environ.get("SPIKELOOP_DEBUG"):
            raise
        # A clear line, not a traceback from deep inside; SPIKELOOP_DEBUG=1 shows the traceback.
        print(f"spikeloop {name}: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `spikeloop` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "bench":
        if not rest or rest[0] in ("-h", "--help"):
            print(_usage())
            return 0 if rest else 2
        return _dispatch(BENCHMARKS, rest[0], rest[1:], "benchmark")
    return _dispatch(COMMANDS, command, rest, "command")


if __name__ == "__main__":
    sys.exit(main())
