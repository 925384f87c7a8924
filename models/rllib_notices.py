"""Keep Ray's and RLlib's notices that a spikeloop user cannot act on out of the terminal.

Each is logged on every run, in the driver, the trial and every env runner, and says
nothing about the experiment: that PPO runs on RLlib's new API stack (spikeloop chose
it), that RLlib builds its own modules through a deprecated path (RLlib's own call),
that GPUtil is missing (spikeloop monitors no GPU), that the private local Ray turned
token authentication on (it stays on; README, "Running on a Ray cluster", says how
clients pass the token), that it started, that Tune wrote a checkpoint or its
experiment state (spikeloop's own progress lines report the run), that Tune
snapshots a sweep's state often (its checkpoints are spikeloop's choice, the
snapshots cost little) and that a trial's setup took seconds (starting a culture
and a game does; Tune's remedy, reusing actors, would carry one trial's culture
into the next), and Tune's advice on resuming an interrupted run through its
Python API (spikeloop prints its own: the command with `--resume`). Only these exact
messages are dropped, on the loggers that emit them; every other warning still shows.

Tune's banner (an experiment table, Tune's result path and a TensorBoard command for
Ray's driver artifacts, where spikeloop writes no tags) is printed, not logged, even at
`verbose=0`: `quiet_tune_output` selects Tune's other output engine, which prints
nothing at `verbose=0`; spikeloop prints the run directory itself.
"""

from __future__ import annotations

import logging
import os

NOTICES: tuple[tuple[str, str], ...] = (
    ("ray.rllib.algorithms.algorithm_config", "on the new API stack!"),
    ("ray._common.deprecation", "`RLModule(config=[RLModuleConfig object])` has been deprecated"),
    ("ray.tune.utils.util", "Install gputil for GPU system monitoring"),
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray cluster"),
    ("ray._private.worker", "Started a local Ray instance"),
    ("ray.train._internal.storage", "Checkpoint successfully created"),
    ("ray.tune.tune", "Wrote the latest version of all result files and experiment state"),
    ("ray.tune.execution.experiment_state", "Experiment state snapshotting has been triggered multiple times"),
    ("ray.tune.trainable.trainable", "Trainable.setup took"),
    ("ray.tune.tune", "Experiment has been interrupted, but the most recent state was saved"),
)
"""(logger name, a fragment of the message) of each notice dropped."""


class _DropNotice(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def install() -> None:
    """Drop the notices in this process (idempotent)."""
    for logger_name, fragment in NOTICES:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropNotice) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropNotice(fragment))


TUNE_BANNER = (
    "Configuration for experiment",
    "View detailed results here",
    "To visualize your results with TensorBoard",
)
"""Fragments of the banner Tune prints at the start of a run, which `quiet_tune_output` keeps out."""


def quiet_tune_output() -> None:
    """Tune's legacy output engine in this driver (RAY_AIR_NEW_OUTPUT=0), silent at `verbose=0`; a user's setting wins."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
