"""A short real training run with the live view on, kept sampling in the background (live view tests).

Nothing is mocked: a simulated culture, the real env runner process with its
HTTP server, and `algo.train()` looping on a thread until the test is done.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spikeloop.experiments.schema import experiment_from_dict

TINY_RUN = {
    "name": "live-view-test",
    "devices": [{"device_id": "sim", "backend": "sim", "artifact_wait_ms": 10, "collect_window_ms": 20}],
    "env": {"scenario": "basic", "frame_skip": 4},
    "model": {"encoder_hiddens": [32], "value_hiddens": [32]},
    # Small batches: short learner updates, so the game keeps moving while a test watches.
    "ppo": {"train_batch_size_per_learner": 64, "minibatch_size": 64, "num_epochs": 1},
    "resources": {"num_env_runners": 1},
}


@contextlib.contextmanager
def training_with_view(
    trial_dir: Path | None = None, stop_at: dict[str, Any] | None = None, **view: Any
) -> Iterator[Any]:
    """Build the tiny run with `view` settings, train on a thread while the caller watches, then stop.

    `trial_dir`: write each iteration's episodes to its episodes.jsonl as the driver does (RunLog);
    `stop_at`: the experiment's `stop` section (the dashboard's budget; the training here goes on regardless).
    """
    from spikeloop.experiments.run_log import RunLog
    from spikeloop.experiments.runner import _pull_episode_records
    from spikeloop.models.closed_loop.ppo import finish

    extra = {"stop": stop_at} if stop_at else {}
    experiment = experiment_from_dict(TINY_RUN | extra | {"view": {"enabled": True} | view})
    algo = experiment.algorithm_config().build_algo()
    stop = threading.Event()
    errors: list[BaseException] = []

    def train() -> None:
        log = RunLog(trial_dir) if trial_dir is not None else None
        try:
            while not stop.is_set():
                result = algo.train()
                if log is not None:
                    log.log_iteration(result, _pull_episode_records(algo))
        except BaseException as exc:  # reported by the caller's thread below
            errors.append(exc)
        finally:
            if log is not None:
                log.close()

    thread = threading.Thread(target=train, name="live-view-test-train", daemon=True)
    thread.start()
    try:
        yield algo
    finally:
        stop.set()
        thread.join(timeout=120)
        try:
            finish(algo, reason="test done")
        finally:
            algo.stop()
    if errors:
        raise errors[0]
