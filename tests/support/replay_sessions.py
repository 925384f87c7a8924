"""A made-up culture session for `spikeloop replay`, written through the real writers: session record or step log.

The same seeded session either way: episodes of LENGTH ticks, three actions, and counts in which the action's
group fires 4 spikes more than the rest (so a decoder can read the action from them, and chance is far below).
Run as a module, it writes that session into a session record and then, with episode EPISODES + 1 under way,
writes that episode's steps one at a time and waits to be killed (`kill -9`: the record is left as a crash leaves it):

    python -m tests.support.replay_sessions RECORD_PATH FLUSH_S
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

from spikeloop.experiments.run_log import write_step_log
from spikeloop.models.closed_loop.session_record import SessionRecord

EPISODES = 6
LENGTH = 40
ACTIONS = 3
WRITTEN = "episodes written and flushed"
"""What the writer prints once the finished episodes are on disk."""


def ticks(episode: int) -> dict[str, np.ndarray]:
    """Episode `episode`'s ticks (1-based): stimulation, the culture's counts, the action taken."""
    rng = np.random.default_rng(episode)
    action = rng.integers(0, ACTIONS, LENGTH)
    counts = rng.poisson(1.0, (LENGTH, 8)).astype(np.float32)
    counts[np.arange(LENGTH), action] += 4
    return {
        "frequency_hz": rng.uniform(4.0, 40.0, (LENGTH, 8)).astype(np.float32),
        "amplitude_ua": rng.uniform(1.0, 2.5, (LENGTH, 8)).astype(np.float32),
        "counts": counts,
        "action": action,
    }


def write_step_logs(trial_dir: Path) -> None:
    """The session as `output.step_log` keeps it: one steps/episode_<n>.npz per episode."""
    for episode in range(1, EPISODES + 1):
        t = ticks(episode)
        stim = np.concatenate([t["frequency_hz"], t["amplitude_ua"]], axis=1)
        write_step_log(
            trial_dir, episode, {"stim": stim, "raw_spikes": t["counts"], "spikes": t["counts"], "action": t["action"]}
        )


def _record_rows(record: SessionRecord, episode: int) -> Iterator[None]:
    """Append episode `episode`'s ticks one at a time (a stimulation, its reply, the step), yielding after each."""
    t = ticks(episode)
    for i in range(LENGTH):
        stamp = episode * 1000 + i
        record.append(
            "stim",
            wall_time_s=time.time(),
            stim_timestamp_us=stamp,
            frequency_hz=t["frequency_hz"][i],
            amplitude_ua=t["amplitude_ua"][i],
            pulses=np.ones(8),
            clamped=0,
        )
        record.append(
            "spikes",
            wall_time_s=time.time(),
            stim_timestamp_us=stamp,
            reply_timestamp_us=stamp,
            counts=t["counts"][i],
            ok=1,
            latency_ms=1.0,
        )
        record.append(
            "steps",
            wall_time_s=time.time(),
            step=(episode - 1) * LENGTH + i + 1,
            episode_step=i + 1,
            action=int(t["action"][i]),
            reward=0.0,
            stim_rows=record.rows("stim"),
        )
        yield


def write_record(path: Path, flush_s: float, ablation: str = "none") -> SessionRecord:
    """The finished episodes, appended to a new session record (flushed on its timer; the caller closes it)."""
    experiment = {"ablation": ablation, "model": {"same_frame_rounds": 1}}
    record = SessionRecord(path, {"device_id": "made-up", "experiment_yaml": yaml.safe_dump(experiment)}, flush_s)
    for episode in range(1, EPISODES + 1):
        for _ in _record_rows(record, episode):
            pass
        record.append(
            "episodes",
            wall_time_s=time.time(),
            episode=episode,
            last_step=episode * LENGTH,
            length=LENGTH,
            kills=0,
            terminated=1,
            **{"return": 0.0},
        )
    return record


def main(path: Path, flush_s: float) -> None:
    """Write the finished episodes, say so once they are flushed, then the next one slowly, and wait."""
    record = write_record(path, flush_s)
    time.sleep(3 * flush_s)  # the timer has flushed them
    print(WRITTEN, flush=True)
    for _ in _record_rows(record, EPISODES + 1):  # the episode under way when the kill comes
        time.sleep(flush_s / 4)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
