"""A simulated neural culture on the 8x8 electrode array (the `sim` backend's tissue).

About 1,000 Izhikevich neurons (80 % regular-spiking excitatory, 20 % fast-spiking
inhibitory) are scattered over the array. Distances are in electrode pitches:
electrode e sits at (col + 0.5, row + 0.5). Each neuron projects to ~60 others,
chosen with a probability that falls off with distance, with a conduction delay
that grows with distance: activity evoked at the encoding electrodes really has
to travel through the network to reach the other spike groups.

- Stimulation: each pulse of a burst kicks the membrane of neurons within
  `stim_radius` of its electrode by `stim_gain_mv_per_ua * amplitude * falloff`,
  so the evoked response grows with amplitude (more neurons recruited) and with
  frequency (more pulses per burst).
- Recording: an electrode sees the spikes of neurons within `record_radius`.
- Spontaneous activity: each neuron gets a random excitatory kick with a small
  probability per millisecond (a few Hz per electrode, as in cultures).
- Plasticity: pair-based STDP with soft bounds on excitatory synapses, event
  driven (traces decay every step; weights change only at spikes), so
  stimulation history and feedback change later responses.

Everything is deterministic for a seed: the kernel carries its own xorshift
generator instead of numba's process-global one, so two cultures in one
process do not disturb each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from bridge.channels import ENCODING_ELECTRODES, GRID_SIDE, N_ELECTRODES, SPIKE_GROUPS
from bridge.protocol import U32_MAX

DT_MS = 1.0
"""Simulation timestep. Stimulation and recording are resolved to this."""

MAX_DELAY_MS = 8


@dataclass(frozen=True)
class SimulatedCultureConfig:
    """Knobs of the simulated culture (defaults give a few Hz per electrode)."""

    n_neurons: int = 1000
    excitatory_fraction: float = 0.8
    synapses_per_neuron: int = 60
    connection_length: float = 1.0
    """Spatial scale of local connection probability, in electrode pitches."""
    long_range_fraction: float = 0.5
    """Share of synapses on a distant patch (axons of neighbours run together)."""
    axon_length: float = 3.0
    """Typical distance from a neuron to its distant patch, in pitches."""
    patch_radius: float = 0.5
    motor_projection: float = 0.3
    """Share of the neurons near each encoding electrode whose distant patch lies on one motor group
    (encoding electrode i -> motor group 1 + i mod 7) instead of where the random axon field points."""
    conduction_pitch_per_ms: float = 1.0
    excitatory_weight_mv: float = 4.0
    inhibitory_weight_mv: float = -16.0
    max_weight_mv: float = 6.0
    stim_radius: float = 1.2
    stim_gain_mv_per_ua: float = 30.0
    record_radius: float = 0.5
    noise_probability_per_ms: float = 0.0003
    noise_kick_mv: float = 18.0
    plasticity: bool = True
    stdp_potentiation: float = 0.01
    """Relative weight gain per causal pair (soft bound: times (w_max - w))."""
    stdp_depression: float = 0.012
    stdp_tau_ms: float = 20.0
    maturation_ms: float = 30_000.0
    """Spontaneous activity simulated at construction, so STDP has settled the weights
    before use and later changes come from what the culture is given, not from drift."""


@numba.njit(cache=True)
def _uniform(rng_state: np.ndarray) -> float:
    # xorshift64*: fast, good enough for noise, state owned by this culture.
    x = rng_state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    rng_state[0] = x
    return float((x * np.uint64(2685821657736338717)) >> np.uint64(11)) / 9007199254740992.0


@numba.njit(cache=True)
def _simulate(
    n_steps,
    step0,
    v,
    u,
    a,
    b,
    c,
    d,
    excitatory,
    out_ptr,
    out_target,
    out_delay,
    weight,
    plastic,
    in_ptr,
    in_synapse,
    synapse_source,
    input_ring,
    pre_trace,
    post_trace,
    pulse_next_step,
    pulse_interval_steps,
    pulse_remaining,
    pulse_amplitude_ua,
    stim_ptr,
    stim_neuron,
    stim_falloff,
    stim_gain,
    recorded_by,
    noise_p,
    noise_kick,
    plasticity,
    a_plus,
    a_minus,
    trace_decay,
    w_max,
    rng_state,
    electrode_counts,
):  # pragma: no cover - compiled
    n = v.shape[0]
    ring = input_ring.shape[0]
    for k in range(n_steps):
        step = step0 + k
        slot = step % ring
        current = input_ring[slot]
        # Stimulation pulses due this step (bursts scheduled by electrode).
        for e in range(pulse_next_step.shape[0]):
            if pulse_remaining[e] > 0 and pulse_next_step[e] <= step:
                kick = stim_gain * pulse_amplitude_ua[e]
                for j in range(stim_ptr[e], stim_ptr[e + 1]):
                    current[stim_neuron[j]] += kick * stim_falloff[j]
                pulse_remaining[e] -= 1
                pulse_next_step[e] += pulse_interval_steps[e]
        for i in range(n):
            drive = current[i]
            current[i] = 0.0
            if _uniform(rng_state) < noise_p:
                drive += noise_kick
            # Two half steps keep the quadratic term stable at 1 ms (Izhikevich 2003).
            vi = v[i] + drive
            ui = u[i]
            vi += 0.5 * (0.04 * vi * vi + 5.0 * vi + 140.0 - ui)
            vi += 0.5 * (0.04 * vi * vi + 5.0 * vi + 140.0 - ui)
            ui += a[i] * (b[i] * vi - ui)
            pre_trace[i] *= trace_decay
            post_trace[i] *= trace_decay
            if vi >= 30.0:
                vi = c[i]
                ui += d[i]
                el = recorded_by[i]
                if el >= 0:
                    electrode_counts[k, el] += 1
                for s in range(out_ptr[i], out_ptr[i + 1]):
                    t = out_target[s]
                    input_ring[(step + out_delay[s]) % ring, t] += weight[s]
                    if plasticity and plastic[s]:
                        # Pre after post: depress, proportional to the weight.
                        weight[s] -= a_minus * post_trace[t] * weight[s]
                if plasticity:
                    for q in range(in_ptr[i], in_ptr[i + 1]):
                        s = in_synapse[q]
                        if plastic[s]:
                            # Post after pre: potentiate towards w_max.
                            weight[s] += a_plus * pre_trace[synapse_source[s]] * (w_max - weight[s])
                pre_trace[i] += 1.0
                post_trace[i] += 1.0
            v[i] = vi
            u[i] = ui


def electrode_positions() -> np.ndarray:
    """(64, 2) electrode centres in pitches, row-major like the channel numbers."""
    idx = np.arange(N_ELECTRODES)
    return np.stack([idx % GRID_SIDE + 0.5, idx // GRID_SIDE + 0.5], axis=1)


class SimulatedCulture:
    """A seeded spiking network you can stimulate and advance millisecond by millisecond."""

    def __init__(self, config: SimulatedCultureConfig | None = None, seed: int = 0) -> None:
        self.config = cfg = config or SimulatedCultureConfig()
        rng = np.random.default_rng(seed)
        n = cfg.n_neurons
        self.positions = rng.uniform(0.0, GRID_SIDE, size=(n, 2))
        n_exc = int(round(n * cfg.excitatory_fraction))
        self.excitatory = np.zeros(n, dtype=np.bool_)
        self.excitatory[rng.permutation(n)[:n_exc]] = True
        self._init_neurons(rng)
        self._init_synapses(rng)
        self._init_electrodes()
        self.step = 0
        self.plasticity_enabled = cfg.plasticity
        """Runtime switch: tests freeze weights while probing, so that measuring does not train."""
        self._input_ring = np.zeros((MAX_DELAY_MS + 1, n), dtype=np.float64)
        self._pre_trace = np.zeros(n)
        self._post_trace = np.zeros(n)
        self._pulse_next_step = np.zeros(N_ELECTRODES, dtype=np.int64)
        self._pulse_interval_steps = np.ones(N_ELECTRODES, dtype=np.int64)
        self._pulse_remaining = np.zeros(N_ELECTRODES, dtype=np.int64)
        self._pulse_amplitude_ua = np.zeros(N_ELECTRODES)
        # Any non-zero 64-bit state works for xorshift; derive it from the seed.
        self._rng_state = np.array([rng.integers(1, 2**63, dtype=np.uint64)], dtype=np.uint64)
        if cfg.maturation_ms > 0:
            self.advance(cfg.maturation_ms)
            self.step = 0  # culture time starts when the culture is handed over
            self._input_ring[:] = 0.0

    # --- construction ------------------------------------------------------------

    def _init_neurons(self, rng: np.random.Generator) -> None:
        n = self.config.n_neurons
        r = rng.uniform(size=n)
        exc = self.excitatory
        # Izhikevich 2003 population parameters, heterogeneous through r.
        self.a = np.where(exc, 0.02, 0.02 + 0.08 * r)
        self.b = np.where(exc, 0.2, 0.25 - 0.05 * r)
        self.c = np.where(exc, -65.0 + 15.0 * r**2, -65.0)
        self.d = np.where(exc, 8.0 - 6.0 * r**2, 2.0)
        self.v = np.full(n, -65.0)
        self.u = self.b * self.v

    def _init_synapses(self, rng: np.random.Generator) -> None:
        cfg = self.config
        n = cfg.n_neurons
        k = min(cfg.synapses_per_neuron, n - 1)
        diff = self.positions[:, None, :] - self.positions[None, :, :]
        dist = np.sqrt((diff**2).sum(-1))
        local = np.exp(-((dist / cfg.connection_length) ** 2))
        # Distant patch: a smooth random field moves each neuron's axon end, so
        # neighbours project to the same distant patch and their input converges.
        end = self.positions + self._axon_field(rng, self.positions)
        self._project_to_motor_groups(rng, end)
        patch = np.exp(
            -((np.sqrt(((end[:, None, :] - self.positions[None, :, :]) ** 2).sum(-1)) / cfg.patch_radius) ** 2)
        )
        for m in (local, patch):
            np.fill_diagonal(m, 0.0)
            m /= m.sum(axis=1, keepdims=True) + 1e-300
        prob = (1.0 - cfg.long_range_fraction) * local + cfg.long_range_fraction * patch
        targets = np.empty((n, k), dtype=np.int64)
        for i in range(n):
            targets[i] = np.sort(rng.choice(n, size=k, replace=False, p=prob[i] / prob[i].sum()))
        del diff
        source = np.repeat(np.arange(n), k)
        target = targets.ravel()
        self.out_ptr = np.arange(0, n * k + 1, k, dtype=np.int64)
        self.out_target = target
        self.synapse_source = source.astype(np.int64)
        d = dist[source, target]
        self.out_delay = np.clip(1 + np.floor(d / cfg.conduction_pitch_per_ms), 1, MAX_DELAY_MS).astype(np.int64)
        exc_source = self.excitatory[source]
        self.weight = np.where(exc_source, cfg.excitatory_weight_mv, cfg.inhibitory_weight_mv)
        self.weight = self.weight * rng.uniform(0.5, 1.5, size=self.weight.shape)
        self.plastic = exc_source & self.excitatory[target]
        # Incoming synapses per neuron (CSC view) for event-driven potentiation.
        order = np.argsort(target, kind="stable")
        self.in_synapse = order.astype(np.int64)
        self.in_ptr = np.searchsorted(target[order], np.arange(n + 1)).astype(np.int64)

    def _project_to_motor_groups(self, rng: np.random.Generator, end: np.ndarray) -> None:
        """Point the distant patch of a share of each encoding electrode's neurons at one motor group."""
        share = self.config.motor_projection
        if share <= 0:
            return
        el = electrode_positions()
        motor = list(SPIKE_GROUPS.values())[1:]  # group 0 is the encoding electrodes themselves
        for i, electrode in enumerate(ENCODING_ELECTRODES):
            near = np.flatnonzero(np.sqrt(((self.positions - el[electrode]) ** 2).sum(1)) <= self.config.stim_radius)
            chosen = near[rng.uniform(size=len(near)) < share]
            target = el[list(motor[i % len(motor)])].mean(axis=0)
            end[chosen] = target + rng.normal(scale=0.25, size=(len(chosen), 2))

    def _axon_field(self, rng: np.random.Generator, xy: np.ndarray) -> np.ndarray:
        # A few random Fourier modes: smooth over about two pitches.
        out = np.zeros_like(xy)
        for _ in range(4):
            k = rng.normal(scale=0.6, size=2)
            phase = rng.uniform(0, 2 * np.pi)
            amp = rng.normal(size=2)
            out += np.cos(xy @ k + phase)[:, None] * amp[None, :]
        norm = np.sqrt((out**2).sum(1, keepdims=True)) + 1e-9
        return out / norm * self.config.axon_length

    def _init_electrodes(self) -> None:
        cfg = self.config
        el = electrode_positions()
        dist = np.sqrt(((self.positions[:, None, :] - el[None, :, :]) ** 2).sum(-1))  # (n, 64)
        nearest = dist.argmin(axis=1)
        near_dist = dist[np.arange(len(nearest)), nearest]
        self.recorded_by = np.where(near_dist <= cfg.record_radius, nearest, -1).astype(np.int64)
        ptr = [0]
        neurons: list[np.ndarray] = []
        falloff: list[np.ndarray] = []
        for e in range(N_ELECTRODES):
            hit = np.flatnonzero(dist[:, e] <= cfg.stim_radius)
            neurons.append(hit)
            falloff.append(1.0 - dist[hit, e] / cfg.stim_radius)
            ptr.append(ptr[-1] + len(hit))
        self.stim_ptr = np.array(ptr, dtype=np.int64)
        self.stim_neuron = np.concatenate(neurons).astype(np.int64)
        self.stim_falloff = np.concatenate(falloff)

    # --- use ---------------------------------------------------------------------

    @property
    def time_ms(self) -> float:
        """Culture time simulated so far."""
        return self.step * DT_MS

    def stimulate(
        self, electrode: int, amplitude_ua: float, pulses: int, frequency_hz: float, start_ms: float | None = None
    ) -> None:
        """Schedule a burst on one electrode, replacing any burst in progress there.

        Zero amplitude, frequency or pulses schedules nothing (and ends the burst in progress).
        Values that are not finite, negative, or more pulses than the wire can carry raise ValueError.
        """
        _check_electrode(electrode)
        for name, value in (("amplitude_ua", amplitude_ua), ("frequency_hz", frequency_hz), ("pulses", pulses)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"stimulation {name}={value!r} on electrode {electrode}: must be finite and >= 0")
        if pulses > U32_MAX:
            raise ValueError(f"stimulation of {pulses!r} pulses on electrode {electrode}: at most {U32_MAX}")
        if start_ms is not None and not math.isfinite(start_ms):
            raise ValueError(f"stimulation start_ms={start_ms!r}: must be finite")
        off = amplitude_ua == 0 or frequency_hz == 0 or pulses < 1
        start_step = self.step if start_ms is None else max(self.step, int(math.ceil(start_ms / DT_MS)))
        # Faster than one pulse per step is one pulse per step: the simulation cannot resolve more.
        interval = 1 if off else max(1, int(round(1000.0 / frequency_hz / DT_MS)))
        self._pulse_next_step[electrode] = start_step
        self._pulse_interval_steps[electrode] = interval
        self._pulse_remaining[electrode] = 0 if off else int(pulses)
        self._pulse_amplitude_ua[electrode] = float(amplitude_ua)

    def interrupt(self, electrode: int) -> None:
        """Cancel the remaining pulses of a burst on one electrode."""
        _check_electrode(electrode)
        self._pulse_remaining[electrode] = 0

    def advance(self, duration_ms: float) -> np.ndarray:
        """Simulate `duration_ms` and return spike counts per step and electrode, shape (steps, 64)."""
        n_steps = max(0, int(round(duration_ms / DT_MS)))
        counts = np.zeros((n_steps, N_ELECTRODES), dtype=np.int32)
        if n_steps == 0:
            return counts
        cfg = self.config
        _simulate(
            n_steps,
            self.step,
            self.v,
            self.u,
            self.a,
            self.b,
            self.c,
            self.d,
            self.excitatory,
            self.out_ptr,
            self.out_target,
            self.out_delay,
            self.weight,
            self.plastic,
            self.in_ptr,
            self.in_synapse,
            self.synapse_source,
            self._input_ring,
            self._pre_trace,
            self._post_trace,
            self._pulse_next_step,
            self._pulse_interval_steps,
            self._pulse_remaining,
            self._pulse_amplitude_ua,
            self.stim_ptr,
            self.stim_neuron,
            self.stim_falloff,
            cfg.stim_gain_mv_per_ua,
            self.recorded_by,
            cfg.noise_probability_per_ms,
            cfg.noise_kick_mv,
            self.plasticity_enabled,
            cfg.stdp_potentiation,
            cfg.stdp_depression,
            math.exp(-DT_MS / cfg.stdp_tau_ms),
            cfg.max_weight_mv,
            self._rng_state,
            counts,
        )
        self.step += n_steps
        return counts


def _check_electrode(electrode: int) -> None:
    if isinstance(electrode, bool) or not isinstance(electrode, (int, np.integer)) or not 0 <= electrode < N_ELECTRODES:
        raise ValueError(f"electrode {electrode!r} is not an electrode number 0-{N_ELECTRODES - 1}")
