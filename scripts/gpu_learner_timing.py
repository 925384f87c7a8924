"""Seconds per PPO iteration and per learner update of an experiment, with the learner on CPU and on CUDA.

    python scripts/gpu_learner_timing.py experiments/quickstart.yaml --iterations 8 --output gpu.json
    python scripts/gpu_learner_timing.py experiments/quickstart.yaml --devices cpu cuda \
        --set ppo.train_batch_size_per_learner=4096 --set ppo.minibatch_size=1024 --set resources.num_env_runners=4

Builds the experiment's algorithm in this process (one local learner, as `spikeloop train` has by default) once per
device, runs warm-up iterations and then timed ones, and writes per-iteration wall time, the learner update's time
(`LearnerGroup.update`, CUDA synchronised before the clock stops), the sampling timer, where the learner's
parameters live and the GPU memory it used. Needs a GPU only when `cuda` is among --devices; without one, ask for
`--devices cpu`. Timings are of this machine and its load at the time: compare devices only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run from a checkout: the project's packages are beside scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build_parser() -> argparse.ArgumentParser:
    """Flags of this script."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment", metavar="EXP.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--devices",
        nargs="+",
        default=["cpu", "cuda"],
        metavar="DEVICE[:THREADS]",
        help="cpu or cuda, each optionally with the torch CPU threads of this process, e.g. cpu:1 (what a "
        "`spikeloop train` trial's learner gets from its one-CPU bundle) cpu:16 cuda:1 (default: cpu cuda, "
        "torch's own thread count)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="iterations run before timing (default 1)")
    parser.add_argument("--iterations", type=int, default=6, help="timed iterations per device (default 6)")
    parser.add_argument("--output", type=Path, default=None, help="JSON file for the figures (default: stdout only)")
    return parser


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def parse_device(spec: str) -> tuple[str, int | None]:
    """ "cuda" -> ("cuda", None); "cpu:4" -> ("cpu", 4); anything else is refused with what to write."""
    name, _, threads = spec.partition(":")
    if name not in ("cpu", "cuda") or (threads and not threads.isdigit()) or threads == "0":
        raise SystemExit(f"gpu_learner_timing: --devices {spec!r}: write cpu or cuda, optionally :THREADS (e.g. cpu:1)")
    return name, int(threads) if threads else None


def time_device(experiment_path: str, overrides: list[str], spec: str, warmup: int, iterations: int) -> dict:
    """Build the experiment's algorithm with its learner on the device `spec` names, train, return the figures."""
    import torch

    device, threads = parse_device(spec)
    if threads is not None:
        torch.set_num_threads(threads)

    from spikeloop.experiments.schema import load_experiment
    from spikeloop.models.closed_loop.ppo import finish

    gpus = 1 if device == "cuda" else 0
    experiment = load_experiment(experiment_path, [*overrides, f"resources.num_gpus_per_learner={gpus}"])
    if experiment.resources.num_learners != 0:
        raise SystemExit("resources.num_learners must be 0: this script times the local learner in this process")
    algo = experiment.algorithm_config().build_algo()
    learner = algo.learner_group._learner  # the local learner (num_learners 0) lives in this process
    modules = learner.module  # a MultiRLModule: one RLModule per policy id
    param_device = str(next(modules[next(iter(modules.keys()))].parameters()).device)
    updates: list[float] = []
    update = algo.learner_group.update

    def timed_update(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = update(*args, **kwargs)
        if gpus:
            torch.cuda.synchronize()  # kernels still queued belong to this update
        updates.append(time.perf_counter() - t0)
        return out

    algo.learner_group.update = timed_update  # a stopwatch around RLlib's call, nothing else changed
    if gpus:
        torch.cuda.reset_peak_memory_stats()
    rows = []
    try:
        for i in range(warmup + iterations):
            updates.clear()
            t0 = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t0
            steps = int(result.get("env_runners", {}).get("num_env_steps_sampled", 0) or 0)
            row = {
                "iteration": int(result.get("training_iteration", i + 1)),
                "warmup": i < warmup,
                "wall_s": wall,
                "learner_update_s": sum(updates),
                "env_steps_sampled": steps,
                "sampling_timer_ema_s": result.get("timers", {}).get("env_runner_sampling_timer"),
                "learner_update_timer_ema_s": result.get("timers", {}).get("learner_update_timer"),
            }
            rows.append(row)
            print(
                f"[{spec} iter {row['iteration']}{' warm-up' if row['warmup'] else ''}] wall {wall:.3f} s  "
                f"learner update {row['learner_update_s']:.3f} s  env steps sampled {steps}",
                flush=True,
            )
    finally:
        finish(algo, reason="benchmark")
        algo.stop()
    timed = [r for r in rows if not r["warmup"]]
    figures = {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "learner_parameter_device": param_device,
        "train_batch_size_per_learner": experiment.algorithm_config().train_batch_size_per_learner,
        "minibatch_size": experiment.algorithm_config().minibatch_size,
        "num_epochs": experiment.algorithm_config().num_epochs,
        "num_env_runners": experiment.resources.num_env_runners,
        "s_per_iteration_median": _median([r["wall_s"] for r in timed]),
        "learner_update_s_median": _median([r["learner_update_s"] for r in timed]),
        "sampling_and_rest_s_median": _median([r["wall_s"] - r["learner_update_s"] for r in timed]),
        "iterations": rows,
    }
    if gpus:
        figures["cuda_device_name"] = torch.cuda.get_device_name(0)
        figures["cuda_max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return figures


def main(argv: list[str] | None = None) -> int:
    """Time the experiment on each asked device and print (and write) the figures."""
    args = build_parser().parse_args(argv)
    import torch

    if any(parse_device(d)[0] == "cuda" for d in args.devices) and not torch.cuda.is_available():
        print("gpu_learner_timing: CUDA is not available here; use --devices cpu", file=sys.stderr)
        return 2
    from spikeloop.experiments.ray_session import init_ray
    from spikeloop.experiments.schema import load_experiment

    experiment = load_experiment(args.experiment, args.overrides)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    init_ray(resources=experiment.culture_settings().node_resources())
    results = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "experiment": args.experiment,
        "overrides": args.overrides,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "devices": {},
    }
    for spec in args.devices:
        results["devices"][spec] = time_device(args.experiment, args.overrides, spec, args.warmup, args.iterations)
    summary = {
        device: {k: v for k, v in figures.items() if k != "iterations"}
        for device, figures in results["devices"].items()
    }
    print(json.dumps(summary, indent=2), flush=True)
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
