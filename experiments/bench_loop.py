"""`spikeloop bench loop`: closed-loop env steps per second while sampling.

Two conditions, each a real env runner driving a simulated culture through the
bridge, with feedback on:

* paced: the device runs in real time with the reference 50 + 50 ms artifact
  and collection windows, so one device allows at most 1 / (0.05 + 0.05) = 10
  steps/s; the question is how close the loop gets to that limit;
* unpaced: zero windows, as fast as possible: what the software costs per tick.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bridge.bench_record import provenance, write_result

DEFAULT_OUTPUT = Path("docs/benchmarks/loop.json")


def _experiment(paced: bool, scenario: str, extra: dict[str, Any] | None = None):
    from experiments.schema import experiment_from_dict

    device = {"device_id": "bench", "backend": "sim", "realtime": paced, "seed": 1,
              "artifact_wait_ms": 50.0 if paced else 0.0, "collect_window_ms": 50.0 if paced else 0.0}
    data = {"name": "bench-loop", "devices": [device], "env": {"scenario": scenario},
            "resources": {"num_env_runners": 1}, "loop": {"timeout_s": 1.0}} | (extra or {})
    return experiment_from_dict(data, source="bench loop")


def _sample_rate(experiment, steps: int, warmup_steps: int) -> dict[str, float]:
    from experiments.loop import finish

    algo = experiment.algorithm_config().build_algo()
    try:
        def timed(runner, n=steps, w=warmup_steps):
            runner.sample(num_timesteps=w, explore=True)
            t0 = time.perf_counter()
            episodes = runner.sample(num_timesteps=n, explore=True)
            elapsed = time.perf_counter() - t0
            return sum(len(e) for e in episodes), elapsed

        (n, elapsed), = algo.env_runner_group.foreach_env_runner(timed, local_env_runner=False)
        return {"steps": n, "seconds": elapsed, "steps_per_s": n / elapsed}
    finally:
        finish(algo, reason="benchmark")
        algo.stop()


def run(paced_steps: int, unpaced_steps: int, scenario: str) -> dict[str, Any]:
    """Measure both conditions and return the results."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        print(f"paced: {paced_steps} steps against 50 + 50 ms windows in real time...", file=sys.stderr)
        paced = _sample_rate(_experiment(True, scenario), paced_steps, warmup_steps=20)
        print(f"unpaced: {unpaced_steps} steps with zero windows...", file=sys.stderr)
        unpaced = _sample_rate(_experiment(False, scenario), unpaced_steps, warmup_steps=200)
    finally:
        ray.shutdown()
    limit = 1.0 / (0.050 + 0.050)
    return {
        "paced_steps_per_s": paced["steps_per_s"],
        "limit_steps_per_s": limit,
        "paced_fraction_of_limit": paced["steps_per_s"] / limit,
        "unpaced_steps_per_s": unpaced["steps_per_s"],
        "unpaced_ms_per_step": 1000.0 / unpaced["steps_per_s"],
        "paced": paced,
        "unpaced": unpaced,
        "target": {"paced_steps_per_s": 9.5},
        "settings": {"scenario": scenario, "device": "sim backend via the device program and CL1Bridge actor",
                     "env_runners": 1, "feedback": "on (reference)", "explore": True},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(prog="spikeloop bench loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paced-steps", type=int, default=300, help="steps timed against the paced device (300)")
    parser.add_argument("--unpaced-steps", type=int, default=3000, help="steps timed as fast as possible (3000)")
    parser.add_argument("--scenario", default="basic", help="VizDoom scenario (default basic)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    if args.paced_steps < 10 or args.unpaced_steps < 10:
        parser.error("time at least 10 steps per condition")
    result = run(args.paced_steps, args.unpaced_steps, args.scenario)
    result |= provenance("loop", argv)
    write_result(args.output, result)
    print(f"paced {result['paced_steps_per_s']:.2f} steps/s (limit {result['limit_steps_per_s']:.1f}, target 9.5); "
          f"unpaced {result['unpaced_steps_per_s']:.1f} steps/s; written to {args.output}")
    return 0
