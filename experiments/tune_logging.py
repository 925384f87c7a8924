"""Tune's own logging, minus its TensorBoard copy.

Tune adds a TensorBoardX logger to every trial unless one is already in the run's callbacks; it writes each
reported metric again as `ray/tune/*` into the trial directory, beside the tags the trial writes itself
(`spikeloop.experiments.run_log`), so TensorBoard showed most metrics twice. This stand-in is such a logger and writes
nothing; Tune's JSON and CSV logs (`result.json`, `progress.csv`), which its experiment analysis reads, stay.
"""

from __future__ import annotations

from ray.tune.logger import TBXLoggerCallback


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
