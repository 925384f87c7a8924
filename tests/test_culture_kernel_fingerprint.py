"""The simulated culture's output, pinned bit for bit: a faster kernel must not change a single spike.

Speed work on the kernel (`spikeloop.bridge.device.simulated_culture._simulate`) keeps every seeded run
repeatable against the runs already measured (docs/benchmarks.md): the same culture, stimulated the same
way, must give the same spike counts, membranes and weights, byte for byte. The fingerprints below were
taken with the kernel before the speed work (commit 9f9a807); a change of the culture's model (not of its
speed) updates them, and says so in its commit.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from spikeloop.bridge.device.simulated_culture import SimulatedCulture, SimulatedCultureConfig
from spikeloop.bridge.wire.channels import BAD_NEWS_ELECTRODES, ENCODING_ELECTRODES, GOOD_NEWS_ELECTRODES

FINGERPRINTS = {
    "none": "b94d0f9bb4d72465",
    "stdp": "0a1a984d02bd4a68",
    "dopamine_stdp": "ff757ae2a41279ac",
}
"""sha256 (first 16 hex digits) of `_fingerprint(rule)`, from the kernel before the speed work."""


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
        for electrode in ENCODING_ELECTRODES:
            if rng.uniform() < 0.5:
                culture.stimulate(
                    electrode, float(rng.uniform(1, 3)), int(rng.integers(1, 6)), float(rng.uniform(5, 40))
                )
        for every, electrodes in ((7, GOOD_NEWS_ELECTRODES), (11, BAD_NEWS_ELECTRODES)):
            if tick % every == 0:
                for electrode in electrodes:
                    culture.stimulate(electrode, 2.0, 5, 100.0)
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
