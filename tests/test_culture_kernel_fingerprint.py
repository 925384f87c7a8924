"""The simulated culture's output, pinned bit for bit: a faster kernel must not change a single spike.

Speed work on the kernel (`spikeloop.bridge.device.simulated_culture._simulate`) keeps every seeded run
repeatable against the runs already measured (docs/benchmarks.md): the same culture, stimulated the same
way, must give the same spike counts, membranes and weights, byte for byte. The fingerprints below were
taken with the kernel before the speed work (commit 9f9a807); a change of the culture's model (not of its
speed) updates them, and says so in its commit.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from spikeloop.bridge.device.simulated_culture import (
    SMALLEST_NORMAL,
    SimulatedCulture,
    SimulatedCultureConfig,
    _subnormal_product_bits,
    xorshift_jump_table,
)
from spikeloop.bridge.wire.channels import BAD_NEWS_ELECTRODES, ENCODING_ELECTRODES, GOOD_NEWS_ELECTRODES

FINGERPRINTS = {
    "none": "b94d0f9bb4d72465",
    "stdp": "0a1a984d02bd4a68",
    "dopamine_stdp": "ff757ae2a41279ac",
}
"""sha256 (first 16 hex digits) of `_fingerprint(rule)`, from the kernel before the speed work."""


def _stimulate(culture: SimulatedCulture, rng: np.random.Generator, tick: int, encode: bool = True) -> None:
    """One 100 ms tick's input: random bursts on about half the encoding electrodes, feedback every 7 and 11 ticks."""
    if encode:
        for electrode in ENCODING_ELECTRODES:
            if rng.uniform() < 0.5:
                culture.stimulate(
                    electrode, float(rng.uniform(1, 3)), int(rng.integers(1, 6)), float(rng.uniform(5, 40))
                )
    for every, electrodes in ((7, GOOD_NEWS_ELECTRODES), (11, BAD_NEWS_ELECTRODES)):
        if tick % every == 0:
            for electrode in electrodes:
                culture.stimulate(electrode, 2.0, 5, 100.0)


def _fingerprint(rule: str) -> str:
    """Two seconds of a small, over-excited culture under random stimulation and both kinds of feedback."""
    config = SimulatedCultureConfig(
        n_neurons=400,
        plasticity=rule,
        excitatory_weight_mv=6.0,
        maturation_ms=500.0,
        dopamine_per_punishment_pulse=-0.001,
    )
    culture = SimulatedCulture(config, seed=3)
    rng = np.random.default_rng(0)
    digest = hashlib.sha256()
    for tick in range(20):
        _stimulate(culture, rng, tick)
        digest.update(culture.advance(100).tobytes())
    for state in (culture.v, culture.u, culture.synaptic_weights(), culture.eligibility(), culture._rng_state):
        digest.update(np.ascontiguousarray(state).tobytes())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("rule", sorted(FINGERPRINTS))
def test_kernel_output_is_bit_for_bit_what_it_was(rule: str) -> None:
    assert _fingerprint(rule) == FINGERPRINTS[rule], (
        f"the {rule} culture's output changed: a speed change must not change it; a model change updates "
        "FINGERPRINTS and says so"
    )


LONG_FINGERPRINTS = {
    "none": "d57e2691c83b3a50",
    "stdp": "62a40617ee5b80c3",
    "dopamine_stdp": "2e5288ea9d3e041b",
}
"""sha256 (first 16 hex digits) of `_long_fingerprint(rule)`, from the kernel before its subnormal-free trace decay
and jump-ahead noise draws (commit 881ee83)."""


def _long_fingerprint(rule: str) -> tuple[str, int]:
    """Twenty seconds of the full-size culture whose spike traces fall into the subnormal numbers within 1.4 s of
    silence (stdp_tau_ms 2): the kernel's exact path for them is exercised. Returns the digest and how many
    subnormal traces were seen at the ends of the 100 ms windows."""
    config = SimulatedCultureConfig(
        plasticity=rule, stdp_tau_ms=2.0, maturation_ms=10_000.0, dopamine_per_punishment_pulse=-0.001
    )
    culture = SimulatedCulture(config, seed=3)
    rng = np.random.default_rng(0)
    digest = hashlib.sha256()
    subnormal_seen = 0
    for tick in range(200):
        _stimulate(culture, rng, tick, encode=tick % 10 == 0)  # sparse input: many neurons fall silent
        digest.update(culture.advance(100).tobytes())
        trace = culture._spike_trace
        subnormal_seen += int(((trace > 0) & (trace < SMALLEST_NORMAL)).sum())
    for state in (culture.v, culture.u, culture.synaptic_weights(), culture.eligibility(), culture._rng_state, trace):
        digest.update(np.ascontiguousarray(state).tobytes())
    return digest.hexdigest()[:16], subnormal_seen


@pytest.mark.parametrize("rule", sorted(LONG_FINGERPRINTS))
def test_traces_in_the_subnormal_numbers_decay_bit_for_bit_as_before(rule: str) -> None:
    digest, subnormal_seen = _long_fingerprint(rule)
    assert subnormal_seen > 100, "the run must hold subnormal traces, or it does not test their decay"
    assert digest == LONG_FINGERPRINTS[rule], f"the {rule} culture's output changed over 20 s with subnormal traces"


def test_the_exact_subnormal_product_is_the_processors() -> None:
    """`_subnormal_product_bits` against the processor's own multiplication, ties included (factor 0.5)."""
    rng = np.random.default_rng(7)
    for factor in (math.exp(-1 / 20), math.exp(-1.0), math.exp(-1 / 1000), 0.5, 0.75, math.exp(-1 / 2)):
        small = SMALLEST_NORMAL / factor * (1.0 + 2.0**-40)
        top = int(np.float64(small).view(np.uint64))
        bits = np.concatenate(
            [
                rng.integers(0, top, 20_000, dtype=np.uint64),
                np.arange(0, 2_000, dtype=np.uint64),
                np.arange(top - 2_000, top, dtype=np.uint64),
                np.array([2**52 - 1, 2**52, 2**52 + 1], dtype=np.uint64),
            ]
        )
        bits = bits[bits.view(np.float64) < small]
        expected = (bits.view(np.float64) * factor).view(np.uint64)
        got = np.array([_subnormal_product_bits(b, factor) for b in bits], dtype=np.uint64)
        assert np.array_equal(got, expected), f"factor {factor}: {int((got != expected).sum())} products differ"


def test_a_jump_ahead_lands_where_stepping_does() -> None:
    state = 0x9E3779B97F4A7C15
    for draws in (1, 2, 3, 250, 1000):
        stepped = state
        for _ in range(draws):
            stepped ^= stepped >> 12
            stepped ^= (stepped << 25) & (2**64 - 1)
            stepped ^= stepped >> 27
        table = xorshift_jump_table(draws)
        jumped = 0
        for k in range(8):
            jumped ^= int(table[k, (state >> (8 * k)) & 255])
        assert jumped == stepped, draws
