"""A rest phase: record-only exchanges with each env runner's culture, no stimulation.

A rest tick is an ordinary exchange whose stimulation has every frequency and amplitude 0. The safety
envelope passes a 0 Hz / 0 uA pair as an explicit "off" for that electrode (bridge/wire/safety.py), and every
device backend stimulates nothing on it (`sim` ends any burst in progress on the encoding electrodes, `cl`
skips the electrode, `transparent`, `random` and `zero` ignore it), yet the device still answers with the
spike counts of its collection window: the culture's spontaneous activity, in the windows play uses.

Rest runs through the env runner's own `CultureLink` (the one the game uses), between training iterations, on
every env runner at once (`foreach_env_runner`). Each tick's counts, whether it was answered, and its
stimulation timestamp (what a device recording logs, to line the phases up) are kept in `rest_before.npz` /
`rest_after.npz` in the trial directory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.wire.channels import N_ENCODING, N_SPIKE_GROUPS, SPIKE_GROUP_NAMES

PHASE_FILES = {"rest_before": "rest_before.npz", "rest_after": "rest_after.npz"}
"""Where each rest phase is recorded in the trial directory."""


@dataclass(frozen=True)
class RestRecord:
    """One rest phase of every culture of a trial (cultures side by side, one row per env runner)."""

    phase: str
    tick_s: float
    """Culture time of one tick (the device's artifact wait + collection window)."""
    counts: np.ndarray
    """[cultures, ticks, 8] spike counts per group (spikeloop.bridge.wire.channels.SPIKE_GROUP_NAMES), per tick."""
    answered: np.ndarray
    """[cultures, ticks] True where the device answered in time (a missed tick's counts are 0 and not used)."""
    stim_timestamp_us: np.ndarray
    """[cultures, ticks] the rest stimulation's wire timestamp (device recordings log it)."""
    device_ids: tuple[str, ...]
    runners: tuple[int, ...]
    wall_start: float
    wall_end: float

    @property
    def ticks(self) -> int:
        """Ticks per culture."""
        return int(self.counts.shape[1])

    def save(self, path: Path) -> None:
        """Write the record as .npz (arrays plus the phase's metadata)."""
        np.savez_compressed(
            path,
            phase=np.array(self.phase),
            tick_s=np.array(self.tick_s),
            counts=self.counts.astype(np.float32),
            answered=self.answered,
            stim_timestamp_us=self.stim_timestamp_us.astype(np.uint64),
            device_ids=np.array(self.device_ids),
            runners=np.array(self.runners, dtype=np.int64),
            wall_start=np.array(self.wall_start),
            wall_end=np.array(self.wall_end),
            group_names=np.array(SPIKE_GROUP_NAMES),
        )

    @classmethod
    def load(cls, path: Path) -> RestRecord:
        """Read a record written by `save`."""
        with np.load(path) as f:
            return cls(
                phase=str(f["phase"]),
                tick_s=float(f["tick_s"]),
                counts=f["counts"],
                answered=f["answered"],
                stim_timestamp_us=f["stim_timestamp_us"],
                device_ids=tuple(str(d) for d in f["device_ids"]),
                runners=tuple(int(r) for r in f["runners"]),
                wall_start=float(f["wall_start"]),
                wall_end=float(f["wall_end"]),
            )

    def summary(self) -> dict[str, Any]:
        """The phase's boundaries and size, for protocol.json."""
        return {
            "phase": self.phase,
            "ticks": self.ticks,
            "culture_s": round(self.ticks * self.tick_s, 6),
            "answered": int(self.answered.sum()),
            "missed": int((~self.answered).sum()),
            "wall_start": self.wall_start,
            "wall_end": self.wall_end,
            "wall_s": round(self.wall_end - self.wall_start, 3),
            "device_ids": list(self.device_ids),
        }


def rest_here(ticks: int) -> dict[str, Any] | None:
    """On an env runner: `ticks` record-only exchanges with its culture (None where it drives none)."""
    from spikeloop.models.closed_loop.link import current_link

    try:
        link = current_link()
    except RuntimeError:
        return None  # the local env runner of a run with remote ones drives no culture
    off = np.zeros(2 * N_ENCODING, dtype=np.float32)  # every frequency and amplitude 0: off on every electrode
    counts = np.zeros((ticks, N_SPIKE_GROUPS), dtype=np.float32)
    answered = np.zeros(ticks, dtype=bool)
    stamps = np.zeros(ticks, dtype=np.uint64)
    start = time.time()
    for i in range(ticks):
        link.send_stim(off)
        reply = link.receive_spikes()  # raises DeviceLost as in play when the device stops answering
        counts[i], answered[i], stamps[i] = reply.counts, reply.ok, reply.stim_timestamp_us
    return {
        "device_id": link.device.device_id,
        "runner": link.runner_index,
        "counts": counts,
        "answered": answered,
        "stim_timestamp_us": stamps,
        "wall_start": start,
        "wall_end": time.time(),
    }


def rest(algo, phase: str, ticks: int, tick_s: float) -> RestRecord:
    """Run a rest phase of `ticks` on every env runner's culture at once and return what each recorded."""
    from spikeloop.models.closed_loop.link import DeviceLost, device_loss_report

    started = time.time()
    try:
        results = algo.env_runner_group.foreach_env_runner(lambda _runner: rest_here(ticks), local_env_runner=True)
    except Exception as exc:
        report = device_loss_report(since_wall=started - 1.0)
        if report is not None:
            raise DeviceLost(report) from exc
        raise
    rows = sorted((r for r in results if r is not None), key=lambda r: r["runner"])
    if not rows:
        raise RuntimeError(f"{phase}: no env runner drives a culture, so there is nothing to record")
    return RestRecord(
        phase=phase,
        tick_s=tick_s,
        counts=np.stack([r["counts"] for r in rows]),
        answered=np.stack([r["answered"] for r in rows]),
        stim_timestamp_us=np.stack([r["stim_timestamp_us"] for r in rows]),
        device_ids=tuple(r["device_id"] for r in rows),
        runners=tuple(int(r["runner"]) for r in rows),
        wall_start=min(r["wall_start"] for r in rows),
        wall_end=max(r["wall_end"] for r in rows),
    )
