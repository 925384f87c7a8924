"""Analysis of spikeloop runs: reading them, honest statistics, sweep reports and power.

- `runs`: find trials, read episodes.jsonl, TensorBoard scalars and the step log, curves.
- `stats`: exact tests (Mann-Whitney, signed-rank), Holm, bootstrap intervals, verdicts.
- `culture`: how the culture answers its stimulation (step-log maps).
- `sweep`: a run directory (train, tune) or a learning benchmark as configurations x seeds,
  each configuration against a baseline, main effects of factorial grids.
- `report`: analysis.json, analysis.md and analysis.png of `spikeloop analyze`.
- `power`: seeds needed / smallest detectable difference, by simulating the exact tests.
- `power_table`: a benchmark's measured seed spread, and the power table in docs/benchmarks.md.
- `plan`: what `spikeloop check` says about a sweep before it runs (trials, time, power).

The notebooks import from here (`from spikeloop.experiments.analysis import ...`): the names of
`runs`, `stats` and `culture` are re-exported.
"""

from spikeloop.experiments.analysis.culture import (
    N_STIM_CHANNELS,
    SPIKE_GROUPS,
    binned_response,
    correlation_map,
    regression_map,
    split_stim,
)
from spikeloop.experiments.analysis.runs import (
    ENV_STEPS_AT_END,
    EVENT_GLOB,
    RESOLVED_FILE,
    RUNS_ENV,
    Band,
    Trial,
    compare_ablations,
    default_window,
    episode_arrays,
    episode_curve,
    final_return,
    find_trials,
    group_trials,
    latencies_ms,
    load_trial,
    read_episodes,
    read_scalars,
    read_steps,
    run_dirs_from_env,
    seed_band,
    smooth,
    step_files,
)
from spikeloop.experiments.analysis.stats import (
    ALTERNATIVES,
    MIN_SEEDS_FOR_A_CLAIM,
    Comparison,
    cliffs_delta,
    compare,
    min_seeds_per_group,
    smallest_p,
    verdict,
)

__all__ = [
    "ALTERNATIVES",
    "ENV_STEPS_AT_END",
    "EVENT_GLOB",
    "MIN_SEEDS_FOR_A_CLAIM",
    "N_STIM_CHANNELS",
    "RESOLVED_FILE",
    "RUNS_ENV",
    "SPIKE_GROUPS",
    "Band",
    "Comparison",
    "Trial",
    "binned_response",
    "cliffs_delta",
    "compare",
    "compare_ablations",
    "correlation_map",
    "default_window",
    "episode_arrays",
    "episode_curve",
    "final_return",
    "find_trials",
    "group_trials",
    "latencies_ms",
    "load_trial",
    "min_seeds_per_group",
    "read_episodes",
    "read_scalars",
    "read_steps",
    "regression_map",
    "run_dirs_from_env",
    "seed_band",
    "smallest_p",
    "smooth",
    "split_stim",
    "step_files",
    "verdict",
]
