"""`spikeloop bench ablation`: does the decoder need the culture's spikes?

The same short training on the simulated culture with the decoder input set to
the real spikes (`none`), to zeros (`zero`) and to Poisson noise (`random`),
several seeds each. Mean episode return per iteration is written per run; the
reading goes in docs/benchmarks.md. A measurement, not a pass/fail test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bridge.bench_record import provenance, write_result

DEFAULT_OUTPUT = Path("docs/benchmarks/ablation.json")
ABLATIONS = ("none", "zero", "random")


def _train(ablation: str, seed: int, iterations: int, batch: int, scenario: str, reward_mode: str) -> list[float]:
    from experiments.loop import finish
    from experiments.schema import experiment_from_dict

    experiment = experiment_from_dict({
        "name": f"ablation-{ablation}-{seed}",
        "seed": seed,
        "ablation": ablation,
        "devices": [{"device_id": "ablation", "backend": "sim", "realtime": False, "seed": seed,
                     "artifact_wait_ms": 10.0, "collect_window_ms": 20.0}],
        "env": {"scenario": scenario, "reward_mode": reward_mode},
        "ppo": {"train_batch_size_per_learner": batch, "minibatch_size": min(128, batch), "num_epochs": 4},
        "resources": {"num_env_runners": 1},
    }, source="bench ablation")
    algo = experiment.algorithm_config().build_algo()
    returns = []
    try:
        for _ in range(iterations):
            result = algo.train()
            returns.append(float(result["env_runners"].get("episode_return_mean", float("nan"))))
    finally:
        finish(algo, reason="benchmark")
        algo.stop()
    return returns


def run(seeds: int, iterations: int, batch: int, scenario: str, reward_mode: str) -> dict[str, Any]:
    """Train every (ablation, seed) and collect the curves."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    curves: dict[str, dict[str, list[float]]] = {a: {} for a in ABLATIONS}
    t0 = time.monotonic()
    try:
        for seed in range(seeds):
            for ablation in ABLATIONS:  # interleaved so that drift in machine load hits every condition
                curves[ablation][str(seed)] = _train(ablation, seed, iterations, batch, scenario, reward_mode)
                print(f"{ablation:>6} seed {seed}: {[round(r, 1) for r in curves[ablation][str(seed)]]}",
                      file=sys.stderr)
    finally:
        ray.shutdown()
    summary = {}
    for ablation, by_seed in curves.items():
        per_iter = list(zip(*by_seed.values()))
        summary[ablation] = {
            "mean_return_per_iteration": [sum(v) / len(v) for v in per_iter],
            "final_mean_return": sum(per_iter[-1]) / len(per_iter[-1]),
        }
    return {
        "curves": curves,
        "summary": summary,
        "settings": {"seeds": seeds, "iterations": iterations, "env_steps_per_iteration": batch,
                     "scenario": scenario, "reward_mode": reward_mode, "culture": "sim, as fast as possible, 10+20 ms"},
        "wall_s": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(prog="spikeloop bench ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per condition (default 3)")
    parser.add_argument("--iterations", type=int, default=8, help="training iterations per run (default 8)")
    parser.add_argument("--batch", type=int, default=512, help="env steps per iteration (default 512)")
    parser.add_argument("--scenario", default="basic", help="VizDoom scenario (default basic)")
    parser.add_argument("--reward-mode", default="scenario", choices=("shaped", "scenario", "both"),
                        help="reward the agent trains on (default: the scenario's own)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.iterations < 1 or args.batch < 64:
        parser.error("need --seeds >= 1, --iterations >= 1 and --batch >= 64")
    result = run(args.seeds, args.iterations, args.batch, args.scenario, args.reward_mode)
    result |= provenance("ablation", argv)
    write_result(args.output, result)
    for ablation, s in result["summary"].items():
        print(f"{ablation:>6}: final mean return {s['final_mean_return']:.1f}")
    print(f"written to {args.output}")
    return 0
