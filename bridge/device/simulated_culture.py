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
- Plasticity (`plasticity`), on excitatory-to-excitatory synapses, event driven
  (traces decay every step; synapses are touched only at their neurons' spikes):
  `stdp`, pair-based STDP with soft bounds, so stimulation history and feedback
  change later responses; `dopamine_stdp`, the same STDP pairs fill a decaying
  eligibility trace per synapse that dopamine turns into weight changes
  (Izhikevich 2007, Cerebral Cortex 17:2443), where dopamine is released by
  feedback pulses on the reward electrodes and lowered by pulses on the
  punishment electrodes, so only feedback that arrives within about a second of
  a spike pairing changes that synapse; `none`, fixed weights. Every culture
  matures under STDP (`maturation_ms`); the rule applies from hand-over on.

Everything is deterministic for a seed: the kernel carries its own xorshift
generator instead of numba's process-global one, so two cultures in one
process do not disturb each other.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numba
import numpy as np

from spikeloop.bridge.wire.channels import (
    BAD_NEWS_ELECTRODES,
    ENCODING_ELECTRODES,
    GOOD_NEWS_ELECTRODES,
    GRID_SIDE,
    N_ELECTRODES,
    SPIKE_GROUPS,
)
from spikeloop.bridge.wire.protocol import U32_MAX

DT_MS = 1.0
"""Simulation timestep. Stimulation and recording are resolved to this."""

MAX_DELAY_MS = 8
RING_ROWS = 16
"""Rows of the input ring, one per coming step: more than MAX_DELAY_MS, and a power of two, so the kernel wraps with a
mask, not a division per synaptic event (docs/architecture.md, "One millisecond of the kernel": 23x -> 38x real
time for a heavily spiking culture with fixed weights)."""
EPOCH_TAUS = 8.0
"""dopamine_stdp: the eligibility scale is renormalised every this many eligibility time constants (e^-8 stays
far from underflow and loses under 4 of float64's 16 digits)."""

Plasticity = Literal["stdp", "dopamine_stdp", "none"]
PLASTICITY_RULES: tuple[Plasticity, ...] = ("stdp", "dopamine_stdp", "none")
"""`stdp`: pair-based STDP changes the weights at once; `dopamine_stdp`: STDP fills an eligibility trace that
dopamine turns into weight changes (Izhikevich 2007); `none`: fixed weights."""
_RULE_CODE = {"none": 0, "stdp": 1, "dopamine_stdp": 2}


def _knob(default: Any, low: float | None, high: float | None, meaning: str) -> Any:
    """A culture setting: its default, its allowed range (inclusive; electrodes: each entry) and what it means."""
    return field(default=default, metadata={"low": low, "high": high, "meaning": meaning})


@dataclass(frozen=True)
class SimulatedCultureConfig:
    """Every knob of the simulated culture: default, range and meaning in one place.

    The experiment schema (a device's `culture:` section), `spikeloop device --culture KEY=VALUE`
    and the table in docs/architecture.md (`knob_table`) all read these fields; the defaults give
    a few Hz per electrode. Bounds are checked here, so every way in refuses the same values.
    """

    n_neurons: int = _knob(1000, 2, 4000, "neurons scattered over the 8x8 array")
    excitatory_fraction: float = _knob(
        0.8, 0.0, 1.0, "share of regular-spiking excitatory neurons (the rest inhibitory)"
    )
    synapses_per_neuron: int = _knob(60, 1, 500, "outgoing synapses of each neuron (at most n_neurons - 1)")
    connection_length: float = _knob(1.0, 0.05, 8.0, "spatial scale of local connection probability (pitches)")
    long_range_fraction: float = _knob(0.5, 0.0, 1.0, "share of synapses on a distant patch")
    axon_length: float = _knob(3.0, 0.0, 8.0, "typical distance from a neuron to its distant patch (pitches)")
    patch_radius: float = _knob(0.5, 0.05, 8.0, "radius of a distant patch (pitches)")
    motor_projection: float = _knob(
        0.3,
        0.0,
        1.0,
        "share of the neurons near encoding electrode i whose distant patch lies on motor group 1 + i mod 7",
    )
    conduction_pitch_per_ms: float = _knob(
        1.0, 0.01, 100.0, "conduction speed: delay 1 ms + distance / speed, at most 8 ms"
    )
    excitatory_weight_mv: float = _knob(4.0, 0.0, 30.0, "mean initial excitatory weight (mV; each drawn x0.5-1.5)")
    inhibitory_weight_mv: float = _knob(-16.0, -100.0, 0.0, "mean inhibitory weight (mV; fixed)")
    max_weight_mv: float = _knob(6.0, 0.0, 30.0, "upper bound of plastic excitatory weights (mV)")
    stim_radius: float = _knob(
        1.2, 0.05, 8.0, "neurons within this distance of a pulsed electrode are kicked (pitches)"
    )
    stim_gain_mv_per_ua: float = _knob(
        30.0, 0.0, 500.0, "membrane kick per uA at the electrode, falling to 0 at stim_radius"
    )
    record_radius: float = _knob(0.5, 0.0, 8.0, "an electrode records the neurons within this distance (pitches)")
    noise_probability_per_ms: float = _knob(0.0003, 0.0, 1.0, "chance per neuron and ms of a spontaneous kick")
    noise_kick_mv: float = _knob(18.0, 0.0, 200.0, "size of a spontaneous kick (mV)")
    plasticity: Plasticity | bool = _knob(
        "stdp", None, None, "the rule from hand-over on (true / false still mean stdp / none)"
    )
    stdp_potentiation: float = _knob(0.01, 0.0, 1.0, "weight gain per causal pair, times (max_weight_mv - w)")
    stdp_depression: float = _knob(0.012, 0.0, 1.0, "weight loss per anti-causal pair, times w")
    stdp_tau_ms: float = _knob(20.0, 1.0, 1000.0, "time constant of the STDP pair window (ms)")
    maturation_ms: float = _knob(
        30_000.0,
        0.0,
        600_000.0,
        "spontaneous activity simulated before use, under STDP whatever the rule, so the weights have settled",
    )
    eligibility_potentiation_mv: float = _knob(
        0.01, 0.0, 10.0, "dopamine_stdp: c gain per causal pair, x e^(-dt / stdp_tau_ms) (mV; Izhikevich 2007: 0.1)"
    )
    eligibility_depression_mv: float = _knob(
        0.01,
        0.0,
        10.0,
        "dopamine_stdp: c loss per anti-causal pair, x e^(-dt / stdp_tau_ms) (mV; Izhikevich 2007: 0.15)",
    )
    eligibility_tau_ms: float = _knob(
        1000.0, 1.0, 60_000.0, "dopamine_stdp: decay of each synapse's eligibility trace c (ms; Izhikevich 2007: 1 s)"
    )
    dopamine_tau_ms: float = _knob(
        200.0, 1.0, 60_000.0, "dopamine_stdp: decay of the phasic dopamine level d (ms; Izhikevich 2007: 200 ms)"
    )
    dopamine_tonic_per_ms: float = _knob(
        0.0,
        0.0,
        1.0,
        "dopamine_stdp: baseline level; weights change by c x (tonic + d) per ms (Izhikevich 2007: 0.0002)",
    )
    dopamine_per_reward_pulse: float = _knob(
        0.002, 0.0, 10.0, "dopamine_stdp: d rises by this per feedback pulse on a reward electrode (per ms units)"
    )
    dopamine_per_punishment_pulse: float = _knob(
        0.0, -10.0, 0.0, "dopamine_stdp: d changes by this per pulse on a punishment electrode (< 0: a dip; 0: none)"
    )
    reward_electrodes: tuple[int, ...] = _knob(
        GOOD_NEWS_ELECTRODES, 0, N_ELECTRODES - 1, "dopamine_stdp: pulses here release dopamine (good-news feedback)"
    )
    punishment_electrodes: tuple[int, ...] = _knob(
        BAD_NEWS_ELECTRODES, 0, N_ELECTRODES - 1, "dopamine_stdp: pulses here lower dopamine (bad-news feedback)"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name), f.default, f.metadata))
        if self.plasticity is True or self.plasticity is False:  # the old boolean switch
            object.__setattr__(self, "plasticity", "stdp" if self.plasticity else "none")
        overlap = set(self.reward_electrodes) & set(self.punishment_electrodes)
        if overlap:
            raise ValueError(
                f"punishment_electrodes={list(self.punishment_electrodes)}: {sorted(overlap)} also release dopamine "
                "(reward_electrodes); an electrode is one or the other"
            )
        for name in ("reward_electrodes", "punishment_electrodes"):
            encoding = set(getattr(self, name)) & set(ENCODING_ELECTRODES)
            if encoding:
                raise ValueError(
                    f"{name}={list(getattr(self, name))}: {sorted(encoding)} are encoding electrodes; every "
                    "stimulation would then be feedback to the culture"
                )

    @property
    def rule(self) -> Plasticity:
        """The plasticity rule by name (the boolean form already normalised)."""
        assert isinstance(self.plasticity, str)
        return self.plasticity

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SimulatedCultureConfig:
        """Build from plain data (a YAML mapping, `--culture` pairs); ValueError names an unknown knob."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown culture knob(s) {', '.join(unknown)}; knobs: {', '.join(sorted(known))}")
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**kwargs)


DOPAMINE_KNOBS = frozenset(
    {
        "eligibility_potentiation_mv",
        "eligibility_depression_mv",
        "eligibility_tau_ms",
        "dopamine_tau_ms",
        "dopamine_tonic_per_ms",
        "dopamine_per_reward_pulse",
        "dopamine_per_punishment_pulse",
        "reward_electrodes",
        "punishment_electrodes",
    }
)
"""The knobs only the dopamine_stdp rule reads."""


def _checked(name: str, value: Any, default: Any, meta: Mapping[str, Any]) -> Any:
    """`value` if it has the default's kind and lies in the knob's range, else ValueError naming the knob."""
    low, high = meta["low"], meta["high"]
    if name == "plasticity":
        if isinstance(value, bool) or value in PLASTICITY_RULES:
            return value
        raise ValueError(f"plasticity={value!r}: choose from {', '.join(PLASTICITY_RULES)} (or true/false)")
    if isinstance(default, tuple):
        if not isinstance(value, (tuple, list)) or any(
            isinstance(e, bool) or not isinstance(e, (int, np.integer)) or not low <= e <= high for e in value
        ):
            raise ValueError(f"{name}={value!r}: must be a list of electrode numbers {low}-{high}")
        if len(set(value)) != len(value):
            raise ValueError(f"{name}={list(value)!r}: an electrode is listed twice")
        return tuple(int(e) for e in value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name}={value!r}: must be a whole number {low}-{high}")
    elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}={value!r}: must be a number in [{low:g}, {high:g}]")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name}={value!r}: must be in [{low:g}, {high:g}] ({meta['meaning']})")
    return type(default)(value)


def knob_table() -> str:
    """The culture's knobs as a Markdown table (docs/architecture.md carries it verbatim; a test keeps it so)."""
    rows = ["| knob | default | range | meaning |", "|---|---|---|---|"]
    for f in fields(SimulatedCultureConfig):
        low, high = f.metadata["low"], f.metadata["high"]
        if isinstance(f.default, tuple):
            default, allowed = ", ".join(map(str, f.default)), f"electrodes {low}-{high}"
        elif f.name == "plasticity":
            default, allowed = str(f.default), " / ".join(PLASTICITY_RULES)
        else:
            default, allowed = f"{f.default:g}", f"{low:g} .. {high:g}"
        rows.append(f"| `{f.name}` | {default} | {allowed} | {f.metadata['meaning']} |")
    return "\n".join(rows)


def _noise_threshold(probability: float) -> np.uint64:
    """ceil(probability * 2**53): a 53-bit draw k is below it exactly when k / 2**53 < probability."""
    return np.uint64(math.ceil(probability * 9007199254740992.0))


SMALLEST_NORMAL = 2.0**-1022
"""Below this a float64 is subnormal: arithmetic with it costs the processor about a hundred times more (`_decay`)."""
_ONE = np.uint64(1)
NOISE_LANES = 4
"""The step's noise draws run as this many interleaved stretches of the one xorshift sequence (`_draw_kicks` spells
out its four lanes)."""

_WORD = (1 << 64) - 1


def _xorshift_state_step(x: int) -> int:
    """One xorshift64* state update (not the scrambled output), on a Python int."""
    x ^= x >> 12
    x ^= (x << 25) & _WORD
    x ^= x >> 27
    return x


def _bit_matrix_times(columns: list[int], x: int) -> int:
    """A 64x64 matrix over GF(2), given by its columns, times the bit vector x."""
    out = 0
    for bit in range(64):
        if x >> bit & 1:
            out ^= columns[bit]
    return out


@functools.cache
def xorshift_jump_table(draws: int) -> np.ndarray:
    """(8, 256) table: the XOR of row k at byte k of a state is the state `draws` updates later.

    The state update is linear over GF(2): `draws` updates are one 64x64 bit matrix (built by squaring), and a
    matrix times a state is the XOR of what it does to each of the state's eight bytes.
    """
    power = [1 << bit for bit in range(64)]  # the identity
    square = [_xorshift_state_step(1 << bit) for bit in range(64)]
    while draws:
        if draws & 1:
            power = [_bit_matrix_times(square, col) for col in power]
        square = [_bit_matrix_times(square, col) for col in square]
        draws >>= 1
    table = np.zeros((8, 256), dtype=np.uint64)
    for k in range(8):
        for byte in range(256):
            table[k, byte] = _bit_matrix_times(power, byte << (8 * k))
    return table


@numba.njit(cache=True, inline="always")
def _jump(x, table):  # pragma: no cover - compiled
    out = np.uint64(0)
    for k in range(8):
        out ^= table[k, (x >> np.uint64(8 * k)) & np.uint64(255)]
    return out


@numba.njit(cache=True, inline="always")
def _next(x):  # pragma: no cover - compiled
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    return x


@numba.njit(cache=True, inline="always")
def _kicked(x, threshold):  # pragma: no cover - compiled
    # xorshift64*'s output, its top 53 bits compared as an integer: k / 2**53 < p exactly when k < ceil(p * 2**53).
    return (x * np.uint64(2685821657736338717)) >> np.uint64(11) < threshold


@numba.njit(cache=True)
def _draw_kicks(x, jump, threshold, kicked):  # pragma: no cover - compiled
    """Who gets a spontaneous kick this step: one xorshift64* draw per neuron, in index order; the state after.

    Each draw needs the state the last one left, so one sequence runs at the speed of that chain. Lane l starts
    where the sequence stands after l * chunk draws (a jump ahead), and the four lanes advance together: the same
    numbers, drawn about twice as fast (docs/architecture.md, "One millisecond of the kernel").
    """
    n = kicked.shape[0]
    chunk = n // NOISE_LANES
    if chunk > 0:
        x1 = _jump(x, jump)
        x2 = _jump(x1, jump)
        x3 = _jump(x2, jump)
        for j in range(chunk):
            x = _next(x)
            x1 = _next(x1)
            x2 = _next(x2)
            x3 = _next(x3)
            kicked[j] = _kicked(x, threshold)
            kicked[chunk + j] = _kicked(x1, threshold)
            kicked[2 * chunk + j] = _kicked(x2, threshold)
            kicked[3 * chunk + j] = _kicked(x3, threshold)
        x = x3
    for i in range(NOISE_LANES * chunk, n):
        x = _next(x)
        kicked[i] = _kicked(x, threshold)
    return x


@numba.njit(cache=True)
def _membranes(v, u, a, b, c, d, current, kicked, spiked, noise_kick):  # pragma: no cover - compiled
    """Every neuron's membrane one step on; who spiked, and whether anyone did.

    A function of its own, with the loop over the arrays' length: the compiler vectorises it so.
    """
    spiked_any = False
    for i in range(v.shape[0]):
        drive = current[i] + noise_kick if kicked[i] else current[i]
        current[i] = 0.0
        # Two half steps keep the quadratic term stable at 1 ms (Izhikevich 2003).
        vi = v[i] + drive
        ui = u[i]
        vi += 0.5 * (0.04 * vi * vi + 5.0 * vi + 140.0 - ui)
        vi += 0.5 * (0.04 * vi * vi + 5.0 * vi + 140.0 - ui)
        ui += a[i] * (b[i] * vi - ui)
        fired = vi >= 30.0
        spiked[i] = fired
        spiked_any |= fired
        v[i] = c[i] if fired else vi
        u[i] = ui + d[i] if fired else ui
    return spiked_any


@numba.njit(cache=True, inline="always")
def _split(a):  # pragma: no cover - compiled
    # Veltkamp: a = high + low with at most 26 significant bits each, so products of the halves are exact.
    c = 134217729.0 * a
    high = c - (c - a)
    return high, a - high


@numba.njit(cache=True)
def _subnormal_product_bits(bits, factor):  # pragma: no cover - compiled
    """The bit pattern of x * factor, for 0 <= x (given by its bits) and a product below about 2**-1022.

    The processor rounds such a product to the nearest multiple of 2**-1074 (ties to even), and a number below
    2**-1021 is stored as that multiple. Here in whole numbers and error-free float products: the processor takes
    about a hundred times longer for a multiplication that takes or gives a subnormal number.
    """
    exponent = np.int64(bits >> np.uint64(52))
    fraction = np.int64(bits & np.uint64(4503599627370495))
    multiple = fraction if exponent == 0 else (fraction | 4503599627370496) << (exponent - 1)  # x / 2**-1074
    m = float(multiple)  # exact: at most 53 significant bits
    p = m * factor
    m_high, m_low = _split(m)
    f_high, f_low = _split(factor)
    error = ((m_high * f_high - p) + m_high * f_low + m_low * f_high) + m_low * f_low  # m * factor = p + error
    whole = np.int64(p)  # p >= 0: truncation is the floor
    rest = p - float(whole)
    if rest > 0.5 or (rest == 0.5 and (error > 0.0 or (error == 0.0 and whole & 1 == 1))):
        whole += 1
    return np.uint64(whole)


@numba.njit(cache=True)
def _decay(
    spike_trace, trace_bits, trace_decay, small, small_bits, small_list, small_saved
):  # pragma: no cover - compiled
    """spike_trace *= trace_decay, bit for bit, without subnormal arithmetic.

    A neuron silent for about 14 s has a trace in the subnormal range for about 700 steps, and the processor takes
    about a hundred times longer for a multiplication that takes or gives a subnormal number: with about 15 such
    neurons in a spontaneous culture, that was a fifth of the kernel's time. The traces below `small_bits` (whose
    product would be subnormal) are listed in `small_list` (its last entry: how many); each step they are set
    aside, the array is multiplied in one vectorised pass, and they are multiplied exactly in whole numbers.
    """
    last = small_list.shape[0] - 1
    listed = 0
    for j in range(small_list[last]):  # set aside the listed traces still small (a spike since lifted some)
        t = small_list[j]
        b = trace_bits[t]
        if b - _ONE < small_bits - _ONE:  # 0 < trace < small
            small_list[listed] = t
            small_saved[listed] = b
            trace_bits[t] = 0
            listed += 1
    crossed = 0
    for t in range(spike_trace.shape[0]):
        y = spike_trace[t] * trace_decay
        spike_trace[t] = y
        crossed += (y > 0.0) & (y < small)
    for j in range(listed):
        trace_bits[small_list[j]] = _subnormal_product_bits(small_saved[j], trace_decay)
    small_list[last] = listed
    if crossed:  # a trace fell below: list them all again
        listed = 0
        for t in range(spike_trace.shape[0]):
            if trace_bits[t] - _ONE < small_bits - _ONE:
                small_list[listed] = t
                listed += 1
        small_list[last] = listed


@numba.njit(cache=True, inline="always")
def _consolidate(s, weight, trace, total, w_max):  # pragma: no cover - compiled
    # Dopamine-STDP, lazily: bring one synapse's weight up to now (see _simulate's `da`).
    # trace[s] = (scaled eligibility, running total at its last consolidation): one cache line per synapse.
    change = trace[s, 0] * (total - trace[s, 1])
    trace[s, 1] = total
    if change != 0.0:
        w = weight[s] + change
        weight[s] = 0.0 if w < 0.0 else (w_max if w > w_max else w)


@numba.njit(cache=True)
def _consolidate_all(weight, plastic, trace, da, w_max):  # pragma: no cover - compiled
    """Bring every plastic weight up to now and start a new epoch of the eligibility scale."""
    for s in range(weight.shape[0]):
        if plastic[s]:
            _consolidate(s, weight, trace, da[1], w_max)
            trace[s, 0] *= da[2]
        trace[s, 1] = 0.0
    da[1] = 0.0
    da[2] = 1.0
    da[3] = 0.0


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
    out_ptr,
    out_target,
    out_delay,
    weight,
    plastic,
    in_ptr,
    in_synapse,
    synapse_source,
    input_ring,
    spike_trace,
    trace_before,
    small_list,
    pulse_next_step,
    pulse_interval_steps,
    pulse_remaining,
    pulse_amplitude_ua,
    stim_ptr,
    stim_neuron,
    stim_falloff,
    stim_gain,
    recorded_by,
    noise_threshold,
    noise_kick,
    rule,
    a_plus,
    a_minus,
    trace_decay,
    w_max,
    c_plus,
    c_minus,
    dopamine_per_pulse,
    dopamine_decay,
    dopamine_tonic,
    eligibility_decay,
    epoch_steps,
    trace,
    da,
    rng_state,
    noise_jump,
    electrode_counts,
    kicked,
    spiked,
):  # pragma: no cover - compiled
    # rule: 0 fixed weights, 1 STDP (weights change at once), 2 dopamine-modulated STDP.
    # Rule 2 keeps, per synapse, its eligibility c on a moving scale: c(k) = trace[s, 0] * scale(k), with
    # scale = eligibility_decay^(k - epoch start) (da[2]); the weight grows by c(k) (tonic + d_k) each step,
    # so over any stretch without spikes of its own a synapse gains trace[s, 0] * (total_now - total_then),
    # total = sum of scale(k) (tonic + d_k) (da[1]). A synapse is brought up to date only when one of its
    # neurons spikes: the cost stays per spike, as for STDP. da = [d, total, scale, steps into the epoch].
    n = v.shape[0]
    mask = input_ring.shape[0] - 1  # rows: a power of two, so the ring wraps with a mask, not a division
    x = rng_state[0]  # the noise generator's state, kept in a register for the step's draws
    trace_bits = spike_trace.view(np.uint64)
    small = SMALLEST_NORMAL / trace_decay * (1.0 + 2.0**-40)  # a trace below this has a subnormal product
    small_bits = np.array([small]).view(np.uint64)[0]  # positive numbers order as their bit patterns do
    small_saved = np.empty(small_list.shape[0], dtype=np.uint64)
    for k in range(n_steps):
        step = step0 + k
        current = input_ring[step & mask]
        if rule == 2:
            if da[3] >= epoch_steps:  # renormalise before the scale underflows
                _consolidate_all(weight, plastic, trace, da, w_max)
            da[0] *= dopamine_decay
        # Stimulation pulses due this step (bursts scheduled by electrode).
        for e in range(pulse_next_step.shape[0]):
            if pulse_remaining[e] > 0 and pulse_next_step[e] <= step:
                kick = stim_gain * pulse_amplitude_ua[e]
                for j in range(stim_ptr[e], stim_ptr[e + 1]):
                    current[stim_neuron[j]] += kick * stim_falloff[j]
                pulse_remaining[e] -= 1
                pulse_next_step[e] += pulse_interval_steps[e]
                da[0] += dopamine_per_pulse[e]  # reward or punishment sites (0 elsewhere)
        inv_scale = 1.0
        if rule == 2:
            da[2] *= eligibility_decay
            da[3] += 1.0
            da[1] += da[2] * (dopamine_tonic + da[0])
            inv_scale = 1.0 / da[2]
        total = da[1]
        x = _draw_kicks(x, noise_jump, noise_threshold, kicked)
        spiked_any = _membranes(v, u, a, b, c, d, current, kicked, spiked, noise_kick)
        if spiked_any:
            trace_before[:] = spike_trace
        _decay(spike_trace, trace_bits, trace_decay, small, small_bits, small_list, small_saved)
        if not spiked_any:
            continue
        # As when one loop did the membranes, the decay and the spikes: a spike of neuron i pairs with the neurons
        # before it (index order) as they are after this step's decay and their own spikes, with those from i on as
        # they were before the step.
        for i in range(n):
            if not spiked[i]:
                continue
            el = recorded_by[i]
            if el >= 0:
                electrode_counts[k, el] += 1
            if rule == 0:
                for s in range(out_ptr[i], out_ptr[i + 1]):
                    input_ring[(step + out_delay[s]) & mask, out_target[s]] += weight[s]
            else:
                # STDP (rule 1) or dopamine-STDP (rule 2): deliver, then pair with both sides.
                for s in range(out_ptr[i], out_ptr[i + 1]):
                    t = out_target[s]
                    post_t = spike_trace[t] if t < i else trace_before[t]
                    if rule == 2 and plastic[s]:
                        _consolidate(s, weight, trace, total, w_max)
                    input_ring[(step + out_delay[s]) & mask, t] += weight[s]
                    if rule == 1 and plastic[s]:
                        # Pre after post: depress, proportional to the weight.
                        weight[s] -= a_minus * post_t * weight[s]
                    elif rule == 2 and plastic[s]:
                        trace[s, 0] -= c_minus * post_t * inv_scale  # additive, as Izhikevich 2007
                for q in range(in_ptr[i], in_ptr[i + 1]):
                    s = in_synapse[q]
                    if plastic[s]:
                        src = synapse_source[s]
                        pre_src = spike_trace[src] if src < i else trace_before[src]
                        if rule == 2:
                            _consolidate(s, weight, trace, total, w_max)
                        if rule == 1:  # post after pre: potentiate towards w_max
                            weight[s] += a_plus * pre_src * (w_max - weight[s])
                        else:
                            trace[s, 0] += c_plus * pre_src * inv_scale
            spike_trace[i] += 1.0
    rng_state[0] = x


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
        self.culture_seed: int | None = None
        """Which dish this is, when drawn by culture_variation.varied_culture (None: knobs as given)."""
        self._rule: Plasticity = "stdp"  # maturation: every culture develops under STDP, whatever rule it is used with
        self.plasticity_enabled = True
        """Runtime switch: tests freeze weights while probing, so that measuring does not train (dopamine_stdp:
        eligibility and consolidation pause too; the dopamine level keeps moving)."""
        n_syn = len(self.weight)
        self._trace = np.zeros((n_syn, 2))  # dopamine_stdp: scaled eligibility, total at last consolidation
        self._dopamine = np.array([0.0, 0.0, 1.0, 0.0])  # d, consolidation total, eligibility scale, epoch steps
        self._dopamine_per_pulse = np.zeros(N_ELECTRODES)
        if cfg.rule == "dopamine_stdp":
            self._dopamine_per_pulse[list(cfg.reward_electrodes)] = cfg.dopamine_per_reward_pulse
            self._dopamine_per_pulse[list(cfg.punishment_electrodes)] = cfg.dopamine_per_punishment_pulse
        self._input_ring = np.zeros((RING_ROWS, n), dtype=np.float64)
        # STDP's trace of each neuron's recent spikes: +1 per spike, decaying with stdp_tau_ms. One trace serves
        # both sides of a pair (as the presynaptic and the postsynaptic trace they were always equal).
        self._spike_trace = np.zeros(n)
        self._trace_before = np.zeros(n)  # the trace before a step's decay, kept when someone spiked
        self._small_traces = np.zeros(n + 1, dtype=np.int64)  # `_decay`'s list of traces near the subnormals
        # Kernel scratch, per step: who was kicked, who spiked.
        self._kicked = np.zeros(n, dtype=np.bool_)
        self._spiked = np.zeros(n, dtype=np.bool_)
        self._noise_jump = xorshift_jump_table(n // NOISE_LANES)
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
        # From hand-over on, the configured rule: for one seed the three rules start from the same network.
        self._rule = cfg.rule
        self.plasticity_enabled = cfg.rule != "none"

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
    def dopamine(self) -> float:
        """The phasic dopamine level d now (dopamine_stdp; 0 for the other rules)."""
        return float(self._dopamine[0])

    def eligibility(self) -> np.ndarray:
        """Each synapse's eligibility trace c now (dopamine_stdp; zeros for the other rules), a copy."""
        return self._trace[:, 0] * self._dopamine[2]

    def synaptic_weights(self) -> np.ndarray:
        """Every synapse's weight now (mV), a copy; dopamine_stdp weights are brought up to date first."""
        if self._rule == "dopamine_stdp":
            _consolidate_all(
                self.weight,
                self.plastic,
                self._trace,
                self._dopamine,
                self.config.max_weight_mv,
            )
        return self.weight.copy()

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
            self.out_ptr,
            self.out_target,
            self.out_delay,
            self.weight,
            self.plastic,
            self.in_ptr,
            self.in_synapse,
            self.synapse_source,
            self._input_ring,
            self._spike_trace,
            self._trace_before,
            self._small_traces,
            self._pulse_next_step,
            self._pulse_interval_steps,
            self._pulse_remaining,
            self._pulse_amplitude_ua,
            self.stim_ptr,
            self.stim_neuron,
            self.stim_falloff,
            cfg.stim_gain_mv_per_ua,
            self.recorded_by,
            _noise_threshold(cfg.noise_probability_per_ms),
            cfg.noise_kick_mv,
            _RULE_CODE[self._rule] if self.plasticity_enabled else 0,
            cfg.stdp_potentiation,
            cfg.stdp_depression,
            math.exp(-DT_MS / cfg.stdp_tau_ms),
            cfg.max_weight_mv,
            cfg.eligibility_potentiation_mv,
            cfg.eligibility_depression_mv,
            self._dopamine_per_pulse,
            math.exp(-DT_MS / cfg.dopamine_tau_ms),
            cfg.dopamine_tonic_per_ms,
            math.exp(-DT_MS / cfg.eligibility_tau_ms),
            max(1, round(EPOCH_TAUS * cfg.eligibility_tau_ms / DT_MS)),
            self._trace,
            self._dopamine,
            self._rng_state,
            self._noise_jump,
            counts,
            self._kicked,
            self._spiked,
        )
        self.step += n_steps
        return counts


def _check_electrode(electrode: int) -> None:
    if isinstance(electrode, bool) or not isinstance(electrode, (int, np.integer)) or not 0 <= electrode < N_ELECTRODES:
        raise ValueError(f"electrode {electrode!r} is not an electrode number 0-{N_ELECTRODES - 1}")
