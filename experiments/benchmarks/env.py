"""`spikeloop bench env`: DoomEnv steps/s against raw `DoomGame.make_action` on the same game.

Both loops drive the very same configured game (the env's own `DoomGame`: same scenario,
resolution, screen format, objects info, buttons and frame skip) with the same fixed action
sequence; the raw loop only calls `make_action` (and `new_episode` when an episode ends), the
env loop calls `env.step` (and `env.reset`). Rounds of the two alternate so that a noisy
machine slows both alike; the median round of each is reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import vizdoom

from spikeloop.envs.doom_env import DoomEnv
from spikeloop.envs.scenarios import DEFAULT_SCENARIO

DEFAULT_OUTPUT = Path("docs/benchmarks/env.json")


def _raw_seconds(env: DoomEnv, actions: list[int]) -> float:
    """Seconds taken by bare `make_action` calls on the env's game."""
    game, table, frame_skip = env.game, env._actions, env.frame_skip
    start = time.perf_counter()
    for action in actions:
        game.make_action(table[action], frame_skip)
        if game.is_episode_finished():
            game.new_episode()
    return time.perf_counter() - start


def _env_seconds(env: DoomEnv, actions: list[int]) -> float:
    """Seconds taken by `env.step` (resets included, as in training)."""
    # No reset here: the raw block before always leaves a running episode, which the env just
    # carries on (its reward deltas for one step are off, which a timing does not care about).
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return time.perf_counter() - start


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line flags of the benchmark."""
    parser = argparse.ArgumentParser(prog="spikeloop bench env", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="steps of each loop (default 20000)")
    parser.add_argument("--block", type=int, default=100, help="steps per alternating block (default 100)")
    parser.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help=f"scenario name or .cfg (default {DEFAULT_SCENARIO})"
    )
    parser.add_argument("--frame-skip", type=int, default=4, help="tics per step (default 4)")
    parser.add_argument("--action-set", default="joint", choices=["joint", "single"], help="default joint")
    parser.add_argument("--screen", action="store_true", help="include the screen observation")
    parser.add_argument("--seed", type=int, default=0, help="game seed and action-sequence seed (default 0)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"JSON result (default {DEFAULT_OUTPUT})")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the benchmark, print and write the JSON result; returns the exit status."""
    args = parse_args(argv)
    env = DoomEnv(args.scenario, frame_skip=args.frame_skip, action_set=args.action_set, screen=args.screen)
    try:
        rng = np.random.default_rng(args.seed)
        env.reset(seed=args.seed)
        _env_seconds(env, rng.integers(env.action_space.n, size=200).tolist())  # warm-up
        raw_rates, env_rates = [], []
        for done in range(0, args.steps, args.block):
            actions = rng.integers(env.action_space.n, size=min(args.block, args.steps - done)).tolist()
            raw_rates.append(len(actions) / _raw_seconds(env, actions))
            env_rates.append(len(actions) / _env_seconds(env, actions))
        screen = env.observation_space["screen"].shape if args.screen else None
        game_resolution = [env.game.get_screen_height(), env.game.get_screen_width()]
        screen_format = env.game.get_screen_format().name
    finally:
        env.close()

    # Medians over blocks: a burst of load from other processes spoils a few blocks, not the result.
    raw_steps_per_s, env_steps_per_s = statistics.median(raw_rates), statistics.median(env_rates)
    pair_overheads = [1.0 - e / r for e, r in zip(env_rates, raw_rates, strict=True)]
    result = {
        "env_steps_per_s": round(env_steps_per_s, 1),
        "raw_steps_per_s": round(raw_steps_per_s, 1),
        "overhead_fraction": round(1.0 - env_steps_per_s / raw_steps_per_s, 4),
        "overhead_fraction_median_of_block_pairs": round(statistics.median(pair_overheads), 4),
        "settings": {
            "scenario": args.scenario,
            "steps": args.steps,
            "block_steps": args.block,
            "frame_skip": args.frame_skip,
            "action_set": args.action_set,
            "screen_observation": list(screen) if screen else None,
            "game_resolution": game_resolution,
            "screen_format": screen_format,
            "seed": args.seed,
        },
        "machine": {
            "python": platform.python_version(),
            "vizdoom": vizdoom.__version__,
            "processor": platform.processor() or platform.machine(),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n")
    return 0
