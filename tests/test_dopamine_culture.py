"""The simulated culture's plasticity rules: dopamine-modulated STDP and its eligibility window, shared maturation."""

from __future__ import annotations

import numpy as np
import pytest

import spikeloop.bridge.device.simulated_culture as sc
from spikeloop.bridge.device.simulated_culture import SimulatedCulture, SimulatedCultureConfig
from spikeloop.bridge.wire.channels import BAD_NEWS_ELECTRODES, ENCODING_ELECTRODES, GOOD_NEWS_ELECTRODES

# No spontaneous activity and no tonic dopamine: the only spike pairs are the conditioning burst's, and weights
# can move only when feedback pulses release (or withdraw) dopamine.
QUIET = SimulatedCultureConfig(
    plasticity="dopamine_stdp",
    noise_probability_per_ms=0.0,
    maturation_ms=0.0,
    dopamine_tonic_per_ms=0.0,
    dopamine_per_punishment_pulse=-0.001,
)


def condition_then_feed_back(
    delay_ms: float, site: int | None, config: SimulatedCultureConfig = QUIET
) -> tuple[np.ndarray, np.ndarray]:
    """Pair spikes once (a burst on one encoding electrode), wait, then feedback pulses on `site` (None: none).

    The feedback pulses are far too weak to fire a neuron (0.001 uA): they only release dopamine, so every weight
    change comes from the conditioning burst's eligibility. Returns (weight change, eligibility after the burst).
    """
    culture = SimulatedCulture(config, seed=2)
    before = culture.synaptic_weights()
    culture.stimulate(ENCODING_ELECTRODES[3], 2.5, 5, 40.0)
    culture.advance(200)
    eligibility = culture.eligibility()
    culture.advance(delay_ms)
    if site is not None:
        culture.stimulate(site, 0.001, 20, 100.0)
    culture.advance(3000)
    return culture.synaptic_weights() - before, eligibility


def test_weights_follow_the_eligibility_only_when_dopamine_comes_within_the_window() -> None:
    reward_site, punishment_site = GOOD_NEWS_ELECTRODES[0], BAD_NEWS_ELECTRODES[0]
    none, eligibility = condition_then_feed_back(100, None)
    soon, _ = condition_then_feed_back(100, reward_site)
    late, _ = condition_then_feed_back(5000, reward_site)  # five eligibility time constants later
    punished, _ = condition_then_feed_back(100, punishment_site)
    paired = eligibility != 0
    assert paired.sum() > 1000, "the conditioning burst must pair spikes"
    # Without dopamine the pairs change nothing: STDP only marks the synapses.
    assert not none.any()
    # Reward moves each marked synapse in the direction of its own pairing (potentiate causal, depress the rest).
    assert np.corrcoef(soon[paired], eligibility[paired])[0, 1] > 0.99
    assert not soon[~paired].any()
    # Punishment (a dopamine dip) moves them the other way.
    moved = paired & (punished != 0)
    assert (np.sign(punished[moved]) == -np.sign(eligibility[moved])).mean() > 0.99
    # The trace fades with tau_c = 1 s: dopamine 5 s later finds almost nothing to consolidate.
    assert np.abs(late).sum() < 0.03 * np.abs(soon).sum()
    print(f"sum |dw| reward after 0.1 s {np.abs(soon).sum():.1f} mV, after 5 s {np.abs(late).sum():.2f} mV")


def test_renormalising_the_eligibility_scale_does_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel rescales the traces every EPOCH_TAUS time constants; a much shorter epoch must give the same."""
    config = SimulatedCultureConfig(
        plasticity="dopamine_stdp", maturation_ms=0.0, eligibility_tau_ms=300.0, dopamine_tonic_per_ms=0.0002
    )
    reference, _ = condition_then_feed_back(400, GOOD_NEWS_ELECTRODES[1], config)
    monkeypatch.setattr(sc, "EPOCH_TAUS", 0.05)  # an epoch of 15 steps instead of 2,400
    renormalised, _ = condition_then_feed_back(400, GOOD_NEWS_ELECTRODES[1], config)
    assert np.abs(reference).sum() > 10.0
    np.testing.assert_allclose(renormalised, reference, rtol=0, atol=1e-9)


def test_every_rule_starts_from_the_same_matured_network() -> None:
    cultures = {rule: SimulatedCulture(SimulatedCultureConfig(plasticity=rule), seed=6) for rule in sc.PLASTICITY_RULES}
    weights = {rule: c.synaptic_weights() for rule, c in cultures.items()}
    assert np.array_equal(weights["stdp"], weights["dopamine_stdp"])
    assert np.array_equal(weights["stdp"], weights["none"])
    for c in cultures.values():
        c.stimulate(ENCODING_ELECTRODES[0], 2.5, 20, 40.0)
        c.advance(2000)
    assert np.array_equal(cultures["none"].synaptic_weights(), weights["none"]), "none keeps its weights"
    assert not np.array_equal(cultures["stdp"].synaptic_weights(), weights["stdp"])


def test_the_boolean_plasticity_switch_still_works() -> None:
    assert SimulatedCultureConfig(plasticity=True).rule == "stdp"
    assert SimulatedCultureConfig(plasticity=False).rule == "none"
    with pytest.raises(ValueError, match="plasticity='hebb'"):
        SimulatedCultureConfig(plasticity="hebb")  # type: ignore[arg-type]
