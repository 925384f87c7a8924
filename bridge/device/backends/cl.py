"""The `cl` backend: a CL1 (or the cl-sdk simulator) through the Cortical Labs `cl` API.

`cl` is imported lazily: it exists only on CL1 devices and, as the optional
cl-sdk simulator, under Python 3.12. The hardware loop runs at 1 kHz whatever
`--tick-frequency` says, so that artifact and collection windows are honoured to
the millisecond. What one stimulation command does is `stim_mode`'s choice
(spikeloop.bridge.device.backends.base.STIM_MODES): `burst`, spikeloop's default, sends each
encoding electrode a burst lasting one `--tick-frequency` tick (frequency / tick
rate pulses, at least one: 4 at 40 Hz and 10 Hz) and stops nothing; the
reference device does not do that. `reference` does what the reference device
does: `neurons.interrupt` on every stimulable electrode, then one single-pulse
`neurons.stim` per encoding electrode (`BurstDesign(1, int(frequency))`). Spikes
are counted by their sample timestamps, not by the tick they arrived in.

Under the cl-sdk simulator, `close` also stops the simulator's worker processes
(leaving `cl.open()` alone does not), and a watcher (`spikeloop.bridge.device.backends.cl_reaper`)
ends them if this process dies without closing.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.device.backends.base import Backend, stim_pulses
from spikeloop.bridge.device.backends.cl_reaper import SimulatorReaper
from spikeloop.bridge.wire.channels import (
    ENCODING_ELECTRODES,
    FORBIDDEN_ELECTRODES,
    N_SPIKE_GROUPS,
    PHASE_WIDTH_US,
    STIMULABLE_ELECTRODES,
    electrode_to_group,
)
from spikeloop.bridge.wire.protocol import EventMessage, FeedbackCommand, FeedbackType
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.bridge.wire.settings import STIM_MODE

log = logging.getLogger(__name__)

LOOP_TICKS_PER_SECOND = 1000
STALL_MESSAGE = "Requested read from past timestamp"
"""What `cl` says when the loop fell behind the device's frame buffer (cl-sdk 0.x; a bare Exception)."""
MAX_CURRENT_UA = 3.0
"""The cl API refuses larger currents; the trainer's envelope keeps far below."""
MAX_BURST_HZ = 200.0
"""The cl API refuses faster bursts."""
SPIKE_MEMORY = 200_000


class ClBackend(Backend):
    """Stimulates and records a CL1 culture through `cl.open()` and `neurons.loop`."""

    name = "cl"
    queues_bursts = True  # `neurons.stim` on a channel still bursting starts after the running burst

    def __init__(
        self,
        tick_frequency_hz: float,
        sim_culture_seed: int | None = None,
        max_pulses: int | None = None,
        stim_mode: str = STIM_MODE.default,
    ) -> None:
        super().__init__(tick_frequency_hz)
        stim_pulses(1.0, tick_frequency_hz, stim_mode)  # refuses an unknown mode before the device is opened
        self.stim_mode = stim_mode
        """`burst` or `reference` (module docstring)."""
        self.max_pulses = SafetyEnvelope().max_pulses if max_pulses is None else int(max_pulses)
        """Longest burst sent to the hardware (the device's envelope; the default envelope's when not given)."""
        import cl  # noqa: F401  (fail early, with the real ImportError, when cl is absent)

        self.sim_culture_seed = sim_culture_seed
        """Under cl-sdk only: feed the simulator `spikeloop.bridge.device.simulated_culture` (this seed) instead of its random data."""

        self._cl = cl
        self._stack = contextlib.ExitStack()
        self._reaper: SimulatorReaper | None = None
        self.neurons: Any = None
        self._recording: Any = None
        self._events_stream: Any = None
        self._exchanges_stream: Any = None
        self._fps = 25_000
        self.stalls = 0
        """Times the loop fell behind the device's frame buffer and went on from the present (spikes lost)."""
        self._spikes: collections.deque[tuple[int, int]] = collections.deque(maxlen=SPIKE_MEMORY)
        self._available_frames = 0
        self._group_of = electrode_to_group()
        self.clamped = 0
        self.skipped_forbidden = 0
        self.recording_path: Path | None = None

    def open(self, recording_dir: Path | None) -> None:
        """Open the device, start the HDF5 recording and the data streams."""
        simulator = bool(self._cl.is_simulator())
        if self.sim_culture_seed is not None:
            if not simulator:
                raise RuntimeError("--cl-sim-culture only applies to the cl-sdk simulator, not to a CL1")
            from spikeloop.bridge.device.backends.cl_culture_source import FACTORY

            self._cl.sim.set_simulator_data_source(FACTORY, config={"seed": self.sim_culture_seed})
        if simulator:
            self._reaper = SimulatorReaper()
        self.neurons = self._stack.enter_context(self._cl.open())
        self._watch_workers()
        self._fps = int(self.neurons.get_frames_per_second())
        self._available_frames = int(self.neurons.timestamp())
        if recording_dir is not None:
            recording_dir.mkdir(parents=True, exist_ok=True)
            self._recording = self.neurons.record(file_location=str(recording_dir.resolve()), file_suffix="spikeloop")
            self._events_stream = self.neurons.create_data_stream("spikeloop_events")
            self._exchanges_stream = self.neurons.create_data_stream("spikeloop_exchanges")
            self._watch_workers()  # the recording writer is a worker of its own

    def _watch_workers(self) -> None:
        if self._reaper is not None:
            self._reaper.watch_new_workers()

    def ticks(self) -> Iterator[None]:
        """One item per 1 ms tick of `neurons.loop`, after taking in its spikes; a stall restarts the loop."""
        while True:
            try:
                for tick in self.neurons.loop(ticks_per_second=LOOP_TICKS_PER_SECOND, ignore_jitter=True):
                    for spike in tick.analysis.spikes:
                        self._spikes.append((int(spike.timestamp), int(spike.channel)))
                    self._available_frames = int(tick.analysis.stop_timestamp)
                    yield None
                return
            except Exception as exc:  # cl raises a bare Exception when the loop fell behind its frame buffer
                if STALL_MESSAGE not in str(exc):
                    raise
                self._restart_after_stall()

    def _restart_after_stall(self) -> None:
        # A process that falls further behind than the device's frame buffer (about 5 s) cannot read those
        # frames any more, and the loop ends. The device program goes on from now instead of dying with the
        # session: the spikes of the gap are lost (replies whose windows fall in it count only what was read),
        # which the log says, and the trainer's own timeouts cover the stimulations waiting meanwhile.
        now = int(self.neurons.timestamp())
        gap_s = (now - self._available_frames) / self._fps
        self.stalls += 1
        log.warning(
            "cl loop fell %.1f s behind the device's frame buffer (stall %d): the spikes of that gap are lost; "
            "the loop goes on from now",
            gap_s,
            self.stalls,
        )
        self._available_frames = now

    @property
    def blocking(self) -> bool:
        """The cl loop paces the device; select must not block."""
        return False

    def now_s(self) -> float:
        """Device sample clock in seconds."""
        return int(self.neurons.timestamp()) / self._fps

    def _design(self, amplitude_ua: float) -> Any:
        # Callers pass only amplitudes > 0 (a negative one is refused upstream, never mirrored).
        amp = min(float(amplitude_ua), MAX_CURRENT_UA)
        if amp != float(amplitude_ua):
            self.clamped += 1
        # Charge-balanced biphasic, cathodic first.
        return self._cl.StimDesign(int(PHASE_WIDTH_US), -amp, int(PHASE_WIDTH_US), amp)

    def _burst(self, pulses: int, frequency_hz: float) -> Any:
        freq = min(float(frequency_hz), MAX_BURST_HZ)
        count = min(int(pulses), self.max_pulses)
        self.clamped += int(freq != float(frequency_hz)) + int(count != int(pulses))
        return self._cl.BurstDesign(count, freq)

    def stimulate(self, at_s: float, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """One `neurons.stim` per encoding electrode (skipping zero amplitude or frequency), as `stim_mode` says."""
        reference = self.stim_mode == "reference"
        if reference:
            self.neurons.interrupt(self._cl.ChannelSet(*STIMULABLE_ELECTRODES))
        for electrode, freq, amp in zip(ENCODING_ELECTRODES, frequencies_hz, amplitudes_ua, strict=True):
            pulses = stim_pulses(freq, self.tick_frequency_hz, self.stim_mode)
            if not amp > 0 or pulses == 0:
                continue
            # The reference device gives its one pulse a whole-Hz burst frequency (at least 1 Hz: the cl API's
            # smallest); a single pulse is the same pulse whatever the frequency says.
            burst_hz = max(1, int(freq)) if reference else freq
            self.neurons.stim(self._cl.ChannelSet(electrode), self._design(amp), self._burst(pulses, burst_hz))

    def feedback(self, at_s: float, command: FeedbackCommand) -> None:
        """`neurons.interrupt` or a `neurons.stim` burst on the allowed listed channels."""
        channels = [c for c in command.channels if c not in FORBIDDEN_ELECTRODES]
        self.skipped_forbidden += len(command.channels) - len(channels)
        if not channels:
            return
        channel_set = self._cl.ChannelSet(*channels)
        if command.feedback_type == FeedbackType.INTERRUPT:
            self.neurons.interrupt(channel_set)
        elif command.amplitude_ua > 0 and command.pulses >= 1 and command.frequency_hz > 0:
            self.neurons.stim(
                channel_set, self._design(command.amplitude_ua), self._burst(int(command.pulses), command.frequency_hz)
            )

    def available_until_s(self) -> float:
        """End of the data the loop has delivered."""
        return self._available_frames / self._fps

    def spike_counts(self, start_s: float, end_s: float) -> np.ndarray:
        """Count grouped spikes by sample timestamp in [start_s, end_s)."""
        first, last = int(round(start_s * self._fps)), int(round(end_s * self._fps))
        counts = np.zeros(N_SPIKE_GROUPS)
        for ts, channel in reversed(self._spikes):
            if ts < first:
                break
            if ts < last and channel in self._group_of:
                counts[self._group_of[channel]] += 1
        return counts

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Exchanges go to the recording's `spikeloop_exchanges` data stream."""
        if self._exchanges_stream is not None:
            self._append(self._exchanges_stream, {"kind": kind, **payload})

    def record_event(self, event: EventMessage) -> None:
        """Events (episode_end, ...) go to the recording's `spikeloop_events` data stream."""
        if self._events_stream is not None:
            self._append(
                self._events_stream,
                {"event_type": event.event_type, "timestamp_us": event.timestamp_us, "data": event.data},
            )

    def _append(self, stream: Any, value: dict[str, Any]) -> None:
        # Data stream timestamps must be unique and ascending.
        ts = max(int(self.neurons.timestamp()), getattr(stream, "_spikeloop_last", -1) + 1)
        stream._spikeloop_last = ts
        stream.append(ts, value)

    def recording_files(self) -> list[Path]:
        """The HDF5 file, once the recording has stopped."""
        return [self.recording_path] if self.recording_path is not None else []

    def close(self) -> None:
        """Stop the recording (writes the file), close the device connection and, under cl-sdk, its workers."""
        try:
            if self._recording is not None:
                recording, self._recording = self._recording, None
                recording.stop()
                info = getattr(recording, "file", None)
                if isinstance(info, dict) and "path" in info:
                    self.recording_path = Path(info["path"])
        finally:
            try:
                self._stack.close()
            finally:
                self._stop_simulator()

    def _stop_simulator(self) -> None:
        """Under cl-sdk: stop the simulator's workers now, not when this process exits."""
        if self._reaper is None:
            return
        reaper, self._reaper = self._reaper, None
        try:
            # Leaving cl.open() leaves cl-sdk's workers running (its Neurons is a process-wide singleton);
            # clearing the simulator stops them and waits for them. It also drops a data source set in this
            # process (ours, under --cl-sim-culture): later opens get cl-sdk's own data. cl-sdk refuses
            # while still inside cl.open() (leaving it failed); the watcher then ends the workers.
            with contextlib.suppress(RuntimeError):
                self._cl.sim.clear_simulator_data_source()
        finally:
            reaper.close()
