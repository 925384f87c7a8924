"""The simulated culture as a cl-sdk data source: `cl` code runs unchanged on `spikeloop.bridge.device.simulated_culture`.

cl-sdk (the Cortical Labs simulator, Python 3.12) lets a package replace its
random data with a `cl.sim.SimulatorDataSource`. This one answers the SDK's
`read(from_timestamp, frame_count)` by advancing a seeded `SimulatedCulture` and
returning its spikes (flat frames: the culture models spikes, not voltages),
and turns every committed stim pulse (`on_stim`) into a pulse on that
electrode. Register it before `cl.open()`:

    cl.sim.set_simulator_data_source(FACTORY, config={"seed": 3})

Only importable where `cl` is (it subclasses cl-sdk's base class).
"""

from __future__ import annotations

import numpy as np
from cl.sim import DataSourceBatch, DataSourceSpike, DataSourceStim, SimulatorDataSource, SimulatorDataSourceMetadata

from spikeloop.bridge.device.simulated_culture import DT_MS, SimulatedCulture, SimulatedCultureConfig
from spikeloop.bridge.wire.channels import N_ELECTRODES

FACTORY = "spikeloop.bridge.device.backends.cl_culture_source:make_source"
FRAMES_PER_SECOND = 25_000
FRAMES_PER_STEP = int(FRAMES_PER_SECOND * DT_MS / 1000)  # 25 frames per 1 ms culture step
SPIKE_SAMPLES = 75


class CultureDataSource(SimulatorDataSource):
    """Pull source: sequential reads advance the culture; stims become culture pulses."""

    def __init__(self, seed: int = 0, n_neurons: int = 1000) -> None:
        self._seed = seed
        self._n_neurons = n_neurons
        self._culture: SimulatedCulture | None = None
        self._pending = np.zeros((0, N_ELECTRODES), dtype=np.int32)
        self._pending_first_step = 0

    @property
    def metadata(self) -> SimulatorDataSourceMetadata:
        """64 channels at 25 kHz, unbounded, sequential, faster than real time allowed."""
        return SimulatorDataSourceMetadata(
            channel_count=N_ELECTRODES,
            frames_per_second=FRAMES_PER_SECOND,
            duration_frames=None,
            seekable=False,
            supports_accelerated=True,
        )

    def open(self) -> None:
        """Build the culture in the simulator subprocess (compiles the kernel once)."""
        self._culture = SimulatedCulture(SimulatedCultureConfig(n_neurons=self._n_neurons), seed=self._seed)

    def on_stim(self, stim: DataSourceStim) -> None:
        """One pulse on the stim's electrode at its time, amplitude = its largest phase current."""
        if self._culture is None:
            return
        amplitude_ua = max((abs(c) for c in stim.phase_currents_uA), default=1.0)
        start_ms = stim.timestamp / FRAMES_PER_STEP * DT_MS
        self._culture.stimulate(stim.channel, amplitude_ua, 1, 1.0, start_ms=start_ms)

    def read(self, from_timestamp: int, frame_count: int) -> DataSourceBatch:
        """Advance the culture over the frames asked for and return its spikes in them."""
        assert self._culture is not None, "read before open"
        end = from_timestamp + frame_count
        last_step = -(-end // FRAMES_PER_STEP)  # ceil: simulate every step the range touches
        if last_step > self._culture.step:
            counts = self._culture.advance((last_step - self._culture.step) * DT_MS)
            if self._pending.shape[0] == 0:
                self._pending_first_step = last_step - counts.shape[0]
            self._pending = np.concatenate([self._pending, counts])
        spikes = []
        # Each step's spikes go out once, in the read that holds the step's first frame.
        first_step = max(-(-from_timestamp // FRAMES_PER_STEP), self._pending_first_step)
        for step in range(first_step, -(-end // FRAMES_PER_STEP)):
            row = self._pending[step - self._pending_first_step]
            for channel in np.flatnonzero(row):
                # A channel reports at most one detected spike per millisecond bin.
                spikes.append(
                    DataSourceSpike(
                        timestamp=step * FRAMES_PER_STEP,
                        channel=int(channel),
                        samples=np.zeros(SPIKE_SAMPLES, dtype=np.float32),
                    )
                )
        # Forget the steps whose first frame has been served.
        done = -(-end // FRAMES_PER_STEP) - self._pending_first_step
        if done > 0:
            self._pending = self._pending[done:]
            self._pending_first_step += done
        return DataSourceBatch(frames=np.zeros((frame_count, N_ELECTRODES), dtype=np.int16), spikes=spikes)


def make_source(seed: int = 0, n_neurons: int = 1000) -> CultureDataSource:
    """Factory named in `FACTORY` for `cl.sim.set_simulator_data_source`."""
    return CultureDataSource(seed=seed, n_neurons=n_neurons)
