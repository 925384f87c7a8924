"""Tune's own logging, minus its TensorBoard copy; a sweep's progress in one line per finished trial.

Tune adds a TensorBoardX logger to every trial unless one is already in the run's callbacks; it writes each
reported metric again as `ray/tune/*` into the trial directory, beside the tags the trial writes itself
(`spikeloop.experiments.run_log`), so TensorBoard showed most metrics twice. This stand-in is such a logger and writes
nothing; Tune's JSON and CSV logs (`result.json`, `progress.csv`), which its experiment analysis reads, stay.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.logger import TBXLoggerCallback

from spikeloop.experiments.trial_files import DESIGN_CULTURE, ENDED_SHORT, SEED_INDEX


class NoTuneTensorBoard(TBXLoggerCallback):
    """Takes the place of Tune's TensorBoard logger and writes nothing."""

    def __init__(self) -> None:  # no tensorboardX writer to set up
        self._trial_writer = {}
        self._trial_result = {}

    def log_trial_start(self, trial) -> None:
        pass

    def log_trial_result(self, iteration: int, trial, result) -> None:
        pass

    def log_trial_end(self, trial, failed: bool = False) -> None:
        pass


def trial_label(config: dict[str, Any]) -> str:
    """A sweep trial's swept settings and seed, short key names (`use_reward_feedback=true, ..., seed 3`)."""
    from spikeloop.experiments.analysis.sweep import format_value, short_names

    culture = config.get(DESIGN_CULTURE)
    if culture:  # a design's trial is one culture's sequence (experiments/design/sequence.py)
        return f"culture {culture['culture_id']} on {culture['device']}"
    swept = config.get("sweep") or {}
    names = short_names(list(swept))
    parts = [f"{names[key]}={format_value(value)}" for key, value in swept.items()]
    seed_index = config.get(SEED_INDEX)
    if seed_index is not None:
        parts.append(f"seed {seed_index}")
    return ", ".join(parts) or "the experiment as written"


def trial_number(trial_id: str) -> int | None:
    """Tune's trial id (`e08a4_00005`, or a trial name ending in it) -> its number in the sweep (5)."""
    tail = trial_id.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


class SweepProgress(Callback):
    """Prints, as each trial of a sweep ends, how far the sweep is, that trial's result and the time left.

    The time left: the trials not yet ended, each taking as long as the trials that ended in this driver took
    from their start on average, run as many side by side as this driver has seen at once. Trials a `--resume`
    found finished do not count towards it.
    """

    def __init__(self, total_trials: int) -> None:
        self.total = total_trials
        self.setup()

    def setup(self, **info) -> None:
        """The sweep (re)starts in this driver: the pace counts from now."""
        self._started_at: dict[str, float] = {}
        self._reported: set[str] = set()
        self._durations: list[float] = []
        self._side_by_side = 1
        self._failed = 0

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        """A trial started (or restarted): its duration counts from now."""
        self._started_at[trial.trial_id] = time.monotonic()
        running = {t.trial_id for t in trials if t.status == "RUNNING"} | {trial.trial_id}
        self._side_by_side = max(self._side_by_side, len(running))

    def on_trial_result(self, iteration: int, trials: list, trial, result, **info) -> None:
        """A trial reported an iteration in this driver (one a `--resume` found finished reports none)."""
        self._reported.add(trial.trial_id)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        """A trial reached its end (stop condition, or ended by a lost device or a setup error)."""
        self._ended(trials, trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        """A trial failed for good (its retries spent)."""
        self._ended(trials, trial, failed=True)

    def _ended(self, trials: list, trial, failed: bool) -> None:
        started = self._started_at.pop(trial.trial_id, None)
        trained_here = trial.trial_id in self._reported or failed
        if started is not None and trained_here:  # a trial found finished ends at once: no measure of the pace
            self._durations.append(time.monotonic() - started)
        self._failed += failed
        # Tune calls back before it marks the trial itself as ended.
        done = len({t.trial_id for t in trials if t.status in ("TERMINATED", "ERROR")} | {trial.trial_id})
        running = sum(t.status == "RUNNING" and t.trial_id != trial.trial_id for t in trials)
        line = f"[sweep] {done}/{self.total} trials ended"
        line += f" ({self._failed} failed here)" if self._failed else ""
        number = trial_number(trial.trial_id)
        line += f", {running} running; trial {number if number is not None else trial.trial_id} "
        line += f"({trial_label(trial.config)}): {self._outcome(trial, failed)}"
        line += "" if trained_here else " (it had ended before this resume)"
        left = self.total - done
        if left > 0 and self._durations:
            mean = sum(self._durations) / len(self._durations)
            line += f"; about {_duration(mean * left / self._side_by_side)} left at this pace"
        print(line, flush=True)

    @staticmethod
    def _outcome(trial, failed: bool) -> str:
        if failed:
            return "FAILED (its error is in the trial directory's error.txt)"
        result = trial.last_result or {}
        for key in ENDED_SHORT:
            if result.get(key):
                return f"ended early: {key.replace('_', ' ')}"
        from spikeloop.experiments.analysis.sweep import FINAL_EPISODES
        from spikeloop.experiments.hparams_log import final_figures

        try:
            figures = final_figures(Path(trial.path))
        except (OSError, ValueError):
            figures = {}  # the trial directory is not readable from here: its figures are in its TensorBoard files
        if "final/return_mean" not in figures:
            return "finished"
        kills = figures.get("final/kill_rate")
        episodes = int(result.get("episodes_logged") or 0)
        window = f"last {FINAL_EPISODES} episodes" if episodes >= FINAL_EPISODES else f"all {episodes} episodes"
        return f"final return {figures['final/return_mean']:.1f}" + (
            f", kill rate {kills:.2f} ({window})" if kills is not None else f" ({window})"
        )
