"""The interface every device backend implements, and what they share.

A backend owns the culture (real, simulated or an ablation source) and its
clock. The device (`spikeloop.bridge.device`) owns the sockets and the timing of replies;
it talks to the backend only through `Backend`, in seconds on the backend's
own clock, so the same reply logic serves a CL1, the simulated culture in real
time or as fast as possible, and the ablation sources.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.wire.channels import N_ELECTRODES, N_SPIKE_GROUPS, PHASE_WIDTH_US, electrode_to_group
from spikeloop.bridge.wire.protocol import EventMessage, FeedbackCommand
from spikeloop.bridge.wire.settings import STIM_MODE


def group_matrix() -> np.ndarray:
    """(64, 8) 0/1 matrix: electrode counts @ matrix = spike-group counts."""
    m = np.zeros((N_ELECTRODES, N_SPIKE_GROUPS), dtype=np.float64)
    for electrode, group in electrode_to_group().items():
        m[electrode, group] = 1.0
    return m


STIM_MODES = STIM_MODE.choices
"""How a device turns one stimulation command into pulses on the encoding electrodes.

`burst` (spikeloop's default): each electrode gets a burst lasting one hardware tick at its frequency
(`burst_pulses`: frequency / tick rate pulses, at least one), and nothing else is stopped.
`reference`: what the reference trainer's device program does: every stimulable electrode is interrupted
first (which also cuts feedback bursts still running), then each encoding electrode gets one pulse; the
frequency then only names the burst, it changes no pulse. docs/architecture.md compares the two."""


def burst_pulses(frequency_hz: float, tick_frequency_hz: float) -> int:
    """Pulses in the burst one stimulation command asks for: one hardware tick at `frequency_hz`, at least one."""
    if not 0 < frequency_hz < math.inf:
        return 0
    return max(1, int(round(frequency_hz / tick_frequency_hz)))


def stim_pulses(frequency_hz: float, tick_frequency_hz: float, stim_mode: str) -> int:
    """Pulses one stimulation command gives an encoding electrode in `stim_mode` (0: that electrode is off)."""
    if stim_mode not in STIM_MODES:
        raise ValueError(f"stim_mode={stim_mode!r}: choose from {', '.join(STIM_MODES)}")
    if not 0 < frequency_hz < math.inf:
        return 0
    return 1 if stim_mode == "reference" else burst_pulses(frequency_hz, tick_frequency_hz)


def burst_charge_nc(amplitude_ua: float, pulses: int) -> float:
    """Charge a burst of `pulses` pulses at `amplitude_ua` gives one electrode in one phase polarity (nC)."""
    # pulses x amplitude x phase width; pulses are biphasic and charge-balanced: both phases carry twice this
    return pulses * amplitude_ua * PHASE_WIDTH_US / 1000.0


def stim_charge_nc(amplitude_ua: float, frequency_hz: float, tick_frequency_hz: float, stim_mode: str) -> float:
    """Charge one stimulation command gives an encoding electrode in one phase polarity (nC)."""
    return burst_charge_nc(amplitude_ua, stim_pulses(frequency_hz, tick_frequency_hz, stim_mode))


class Backend(abc.ABC):
    """A culture the device can stimulate, feed back to and count spikes from."""

    name: str = "backend"
    paced: bool = True
    """True: the backend clock is the wall clock and the device waits for windows in real time.
    False: simulated time; the device advances it and replies as fast as possible."""
    queues_bursts: bool = False
    """How a burst meets one still running on its electrode: False, it replaces it; True, it waits behind it (the
    CL1 SDK). The device's pulse-rate book (bridge/device/pulse_rate.py) follows the same rule."""

    def __init__(self, tick_frequency_hz: float) -> None:
        self.tick_frequency_hz = tick_frequency_hz
        self.recorder: JsonlRecorder | None = None

    def open(self, recording_dir: Path | None) -> None:
        """Acquire the culture and start recording into `recording_dir` (None: no recording)."""
        if recording_dir is not None:
            self.recorder = JsonlRecorder(recording_dir, self.name)

    def ticks(self) -> Iterator[None]:
        """One item per hardware tick; the device services its sockets once per item.

        The default never ends and leaves the waiting to the device (select with
        timeouts); `cl` yields once per tick of `neurons.loop`.
        """
        while True:
            yield None

    @property
    def blocking(self) -> bool:
        """Whether the device may block in select between ticks (False when `ticks` paces itself)."""
        return True

    @abc.abstractmethod
    def now_s(self) -> float:
        """Current time on the backend's clock."""

    @abc.abstractmethod
    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Start the burst of one stimulation command on the encoding electrodes."""

    @abc.abstractmethod
    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """Apply a feedback command (burst or interrupt) on its channels."""

    def burst_timing(self, at_s: float, frequency_hz: float) -> tuple[float, float]:
        """When a burst started at `at_s` gives its first pulse, and the interval between its pulses (s)."""
        return at_s, 1.0 / frequency_hz

    def last_pulse_s(self, at_s: float, frequency_hz: float, pulses: int) -> float:
        """When the last pulse of a burst started at `at_s` is delivered (the device's feedback_settle_ms)."""
        start_s, interval_s = self.burst_timing(at_s, frequency_hz)
        return start_s + max(0, pulses - 1) * interval_s

    def advance_to(self, t_s: float) -> None:
        """Make spikes up to `t_s` available (simulate, or wait for hardware data)."""
        _ = t_s  # the default computes counts on demand: nothing to prepare

    def available_until_s(self) -> float:
        """Spikes are known up to this time."""
        return math.inf

    @abc.abstractmethod
    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """Spike counts per group (8 floats) in [start_s, end_s)."""

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Append one stim/spikes/feedback entry to the recording, if recording."""
        if self.recorder is not None:
            self.recorder.write(kind, payload)

    def record_event(self, event: EventMessage) -> None:
        """Append a trainer event (e.g. episode_end) to the recording's event stream."""
        if self.recorder is not None:
            self.recorder.write_event(event)

    def recording_files(self) -> list[Path]:
        """Files this backend's recording has written to."""
        return self.recorder.files() if self.recorder is not None else []

    def close(self) -> None:
        """Stop the recording cleanly and release the culture."""
        if self.recorder is not None:
            self.recorder.close()


class JsonlRecorder:
    """Recording of sim/random/zero runs: one JSON object per line.

    `<dir>/device-<backend>-<UTC>.jsonl` holds {"kind": "stim"|"spikes"|"feedback", ...}
    per datagram handled; `<same stem>.events.jsonl` beside it holds the trainer's
    events (episode_end, ...) as received. Lines are flushed as written so a crash
    loses at most the line in flight.
    """

    def __init__(self, directory: Path, backend_name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        stem = f"device-{backend_name}-{stamp}-{time.time_ns() % 1_000_000:06d}"
        self.path = directory / f"{stem}.jsonl"
        self.events_path = directory / f"{stem}.events.jsonl"
        self._main = self.path.open("w", encoding="utf-8")
        self._events = self.events_path.open("w", encoding="utf-8")

    def write(self, kind: str, payload: dict[str, Any]) -> None:
        """Append one entry."""
        if not self._main.closed:
            # allow_nan=False: a recording stays valid JSON (a non-finite value fails the write, not the file)
            self._main.write(json.dumps({"kind": kind, **payload}, allow_nan=False) + "\n")
            self._main.flush()

    def write_event(self, event: EventMessage) -> None:
        """Append one trainer event."""
        if not self._events.closed:
            line = {"timestamp_us": event.timestamp_us, "event_type": event.event_type, "data": event.data}
            self._events.write(json.dumps(line, allow_nan=False) + "\n")
            self._events.flush()

    def files(self) -> list[Path]:
        """The two files of this recording."""
        return [self.path, self.events_path]

    def close(self) -> None:
        """Flush and close both files (idempotent)."""
        self._main.close()
        self._events.close()
