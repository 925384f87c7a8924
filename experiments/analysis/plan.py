"""What `spikeloop check` says about a sweep before it runs: trials, wall time, what its seeds can detect.

- **Trials**: grid points (the product of the `grid` lists: the configurations) x `tune.seeds`
  x `tune.num_samples`.
- **Wall time**, from measurements, not guesses: the env steps per second of training (sampling
  and learning, one run at a time on the 2-core reference machine) of the matching condition of
  the learning benchmark (docs/benchmarks/learning.json, or learning-<scenario>.json for another
  scenario): `direct`, `transparent`, `sim`, or the `zero` / `random` ablation. A real-time device
  (a CL1, or `realtime: true`) steps at most as fast as the paced loop (docs/benchmarks/loop.json).
  A trial's budget is its first stop condition: env steps, iterations x the train batch, episodes x
  the condition's mean episode length, or `time_s`. Trials run side by side as far as this machine's
  cores hold the CPUs each asks for (`cpus_per_trial`); hardware devices serve one trial at a time. Ray's start and each trial's own start
  (tens of seconds on 2 cores) are not included.
- **Power**: the smallest difference in final return (and kill rate) that `tune.seeds` paired seeds
  detect with 80% power at alpha 0.05 divided by the comparisons against the baseline (Holm's first
  step), simulated with the spread the learning benchmark measured (power.py).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from spikeloop.experiments.analysis import power, power_table

BENCHMARKS = power_table.REPO / "docs" / "benchmarks"
ALPHA = 0.05


@dataclass
class SweepPlan:
    """A sweep's size, its estimated wall time with the basis, and what its seeds can detect."""

    configurations: int
    seeds: int
    samples: int
    trials: int
    seconds: float | None
    basis: str
    power_lines: list[str] = field(default_factory=list)
    repeats: list = field(default_factory=list)
    """Grid points not run because they repeat another (`sweep_repeats.Repeat`): in `configurations`, not `trials`."""


def grid_points(experiment) -> int:
    """Configurations: the product of the grid lists' lengths (1 without a grid)."""
    return math.prod(len(spec["grid"]) for spec in experiment.tune.search_space.values() if "grid" in spec)


def repeats(experiment) -> list:
    """The grid points `spikeloop tune` does not run because they repeat another exactly (sweep_repeats.py)."""
    from spikeloop.experiments.sweep_repeats import thin_grid

    return thin_grid(experiment.plain(), experiment.tune.search_space)[1]


def configurations_run(experiment) -> int:
    """Grid points `spikeloop tune` runs: all of them, less those that repeat another."""
    return grid_points(experiment) - len(repeats(experiment))


def benchmark_condition(experiment) -> str | None:
    """The learning benchmark's condition that runs like this experiment (None: no benchmark does)."""
    if experiment.policy == "direct":
        return "direct"
    if experiment.ablation in ("zero", "random"):
        return experiment.ablation
    return {"sim": "sim", "transparent": "transparent"}.get(experiment.devices[0].backend)


def learning_file(scenario: str) -> tuple[Path | None, str]:
    """The learning benchmark file measured on `scenario` (else basic's), and a note when it is not that one."""
    own = BENCHMARKS / f"learning-{scenario}.json"
    if own.is_file():
        return own, ""
    default = BENCHMARKS / "learning.json"
    if not default.is_file():
        return None, "no learning benchmark file (docs/benchmarks/learning.json)"
    measured_on = json.loads(default.read_text()).get("settings", {}).get("scenario")
    return default, "" if measured_on == scenario else f"measured on {measured_on}, not {scenario}"


def _rate(path: Path, condition: str) -> tuple[float, float, int]:
    """(median env steps/s, mean episode length, machine cores) of a condition in a learning benchmark file."""
    data = json.loads(path.read_text())
    runs = data["runs"][condition].values()
    rate = statistics.median(r["env_steps_total"] / r["wall_s"] for r in runs if r.get("wall_s"))
    episode_length = sum(r["env_steps_total"] for r in runs) / max(1, sum(len(r["return"]) for r in runs))
    return rate, episode_length, int(data.get("machine", {}).get("cpus", 2))


def _short(path: Path) -> str:
    return path.relative_to(power_table.REPO).as_posix() if power_table.REPO in path.parents else str(path)


def plan(experiment, cpus: float | None = None) -> SweepPlan:
    """The sweep `spikeloop tune` would run for this experiment."""
    t = experiment.tune
    configurations, seeds, samples = grid_points(experiment), t.seeds, t.num_samples
    repeated = repeats(experiment)
    trials = (configurations - len(repeated)) * seeds * samples
    seconds, basis = _wall_time(experiment, trials, cpus)
    power_lines = _power_lines(experiment, configurations - len(repeated))
    return SweepPlan(configurations, seeds, samples, trials, seconds, basis, power_lines, repeated)


def _wall_time(experiment, trials: int, cpus: float | None) -> tuple[float | None, str]:
    scenario = experiment.env.get("scenario") or _default_scenario()
    condition = benchmark_condition(experiment)
    hardware = any(not d.simulated for d in experiment.devices)
    realtime = hardware or any(d.simulated and d.realtime for d in experiment.devices)
    path, note = learning_file(scenario)
    rate = episode_length = None
    bench_cpus = 2
    if path is not None and condition is not None:
        rate, episode_length, bench_cpus = _rate(path, condition)
        source = f"`{condition}` trains at {rate:.0f} env steps/s in {_short(path)}" + (f" ({note})" if note else "")
    if realtime:
        loop = BENCHMARKS / "loop.json"
        if not loop.is_file():
            return None, "a real-time device, and no loop benchmark (docs/benchmarks/loop.json) to pace it"
        rate = float(json.loads(loop.read_text())["paced_steps_per_s"])
        source = (
            f"a real-time device steps at most {rate:.2f} env steps/s (paced loop, {_short(loop)}; learning adds to it)"
        )
    if rate is None:
        why = note or f"no learning benchmark condition runs a {experiment.devices[0].backend!r} device"
        return None, f"no estimate: {why}"
    stop = experiment.stop
    batch = (experiment.algorithm_config().train_batch_size_per_learner or 0) * max(
        1, experiment.resources.num_learners
    )
    budgets = []
    if stop.env_steps is not None:
        steps = math.ceil(stop.env_steps / batch) * batch if batch else stop.env_steps
        budgets.append((steps / rate, f"{steps:,} env steps"))
    if stop.iterations is not None and batch:
        budgets.append((stop.iterations * batch / rate, f"{stop.iterations} iterations x {batch} env steps"))
    if stop.episodes is not None and episode_length:
        budgets.append(
            (stop.episodes * episode_length / rate, f"{stop.episodes} episodes x {episode_length:.0f} env steps")
        )
    if stop.time_s is not None:
        budgets.append((stop.time_s, f"time_s {stop.time_s:g}"))
    if not budgets:
        return None, "no estimate: no stop condition that can be turned into env steps"
    per_trial, budget = min(budgets)
    here = cpus if cpus is not None else float(os.cpu_count() or 1)
    trial_cpus = cpus_per_trial(experiment)
    side_by_side = 1 if hardware else max(1, int(here // trial_cpus))
    side_by_side = min(side_by_side, experiment.tune.max_concurrent_trials or trials, trials)
    seconds = trials * per_trial / side_by_side
    return seconds, (
        f"{trials} trial(s) x {budget} (first stop reached) at that rate, {side_by_side} at a time on "
        f"{here:g} cores ({trial_cpus:g} per trial; the benchmark ran one at a time on {bench_cpus}); {source}; "
        "Ray's and each trial's start not included"
    )


def cpus_per_trial(experiment) -> float:
    """CPUs one trial holds: its own process (which samples when it has no env runners), one per env runner and learner.

    PPO samples and learns in turn, so a trial keeps about one core busy however its work is spread: the benchmark's
    rate (one env runner beside the trial, alone on the machine) holds for each of the trials that fit side by side.
    Measured: `sweep_feedback.yaml`'s trials (no env runners) took about 340 s each for 20,480 env steps, two at a time
    on a quiet 2-core machine (docs/benchmarks.md, "feedback sweep"), the benchmark's rate about 400 s alone."""
    r = experiment.resources
    return float(1 + r.num_env_runners + r.num_learners)


def _default_scenario() -> str:
    from spikeloop.envs.scenarios import DEFAULT_SCENARIO

    return DEFAULT_SCENARIO


def _power_lines(experiment, configurations: int) -> list[str]:
    """Power of the comparisons `analyze` makes: each configuration run against the baseline, then main effects.

    `configurations`: the distinct experiments (grid points less repeats: a repeat's comparison is its twin's
    and not a second member of the Holm family).
    """
    if configurations < 2:
        return ["one configuration: nothing to compare (a grid in tune.search_space makes configurations)"]
    scenario = experiment.env.get("scenario") or _default_scenario()
    path, note = learning_file(scenario)
    condition = benchmark_condition(experiment) or "sim"
    if path is None:
        return [f"power: not estimated ({note})"]
    spread = power_table.benchmark_spread(path, condition)
    where = f"{_short(path)}, `{condition}`" + (f", {note}" if note else "")
    lines = _family_power(experiment, configurations - 1, "comparison(s) against the baseline", spread, where)
    factors = [spec["grid"] for spec in experiment.tune.search_space.values() if len(spec.get("grid") or []) > 1]
    if len(factors) >= 2:  # a factorial grid: analyze tests each factor's levels, averaged over the others
        effects = sum(len(levels) - 1 for levels in factors)
        what = f"main effect(s) of {len(factors)} factors (SD of one configuration's differences: conservative)"
        lines += _family_power(experiment, effects, what, spread, where)
    return lines


def _family_power(experiment, comparisons: int, what: str, spread: dict, where: str) -> list[str]:
    n = experiment.tune.seeds
    alpha = ALPHA / comparisons
    floor = power.smallest_p(n, paired=True)
    enough = power.min_seeds(alpha, paired=True)
    head = (
        f"{n} paired seed(s) per configuration, {comparisons} {what}: alpha "
        f"{ALPHA:g}/{comparisons} = {alpha:.3g} at Holm's first step"
    )
    if n < enough:
        return [
            f"{head}; the exact signed-rank test's smallest p with {n} seed(s) is {floor:.3g}, not below it: "
            f"no difference of any size is detectable; {enough} seeds can reach it"
        ]
    lines = [f"{head}; smallest difference detected with {power.POWER:.0%} power ({where}):"]
    for metric, name, spec in (("final_return", "final return", ".1f"), ("final_kill_rate", "kill rate", ".3f")):
        s = spread[metric]
        parts = []
        if s["sd_paired"]:
            d = power.detectable_difference(n, s["sd_paired"], paired=True, alpha=alpha)
            parts.append(
                f"{d:{spec}} at the measured pairing (SD of per-seed differences to "
                f"{'/'.join(s['partners'])} {s['sd_paired']:{spec}})"
            )
        if s["sd"]:
            worst = power.detectable_difference(n, math.sqrt(2) * s["sd"], paired=True, alpha=alpha)
            parts.append(f"{worst:{spec}} if pairing narrows nothing (SD over seeds {s['sd']:{spec}})")
        lines.append(f"  {name}: " + ("; ".join(parts) if parts else "no spread measured"))
    return lines


def lines(experiment, cpus: float | None = None) -> list[str]:
    """What `spikeloop check` prints about the sweep (nothing without a search space or seeds)."""
    if not experiment.tune.search_space and experiment.tune.seeds == 1:
        return []
    from spikeloop.experiments.sweep_repeats import reasons

    p = plan(experiment, cpus)
    repeated = p.repeats
    run = p.configurations - len(repeated)
    size = (
        f"[info] sweep: {p.configurations} configuration(s) (grid points)"
        + (
            f", {len(repeated)} of them the same experiment as another and not run ({reasons(repeated)}; "
            f"analyze reads each as the one it repeats): {run}"
            if repeated
            else ""
        )
        + f" x {p.seeds} seed(s)"
        + (f" x {p.samples} samples" if p.samples > 1 else "")
        + f" = {p.trials} trial(s)"
    )
    time_line = (
        f"[info] sweep wall time: about {_duration(p.seconds)} ({p.basis})"
        if p.seconds is not None
        else f"[info] sweep wall time: {p.basis}"
    )
    # A line of its own per Holm family; the indented lines under one are its figures.
    return [size, time_line] + [line if line.startswith(" ") else f"[info] power: {line}" for line in p.power_lines]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
