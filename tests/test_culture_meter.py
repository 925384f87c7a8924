"""The live information meter (models/closed_loop/meter.py) on ticks whose answer is known.

Synthetic ticks fed one at a time, as the culture connector feeds them: counts that follow the stimulation's
strongest electrode, the observation's most varying feature or the action must show up in that variable's
figure and in no other (within the estimator's noise); the window rolls (old ticks leave it) and the meter
recomputes every `every_ticks` ticks only. The estimator itself is tested in test_information_meter.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spikeloop.bridge.wire.channels import N_ENCODING, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict
from spikeloop.models.closed_loop.meter import CultureMeter, MeterSettings, feature_classes

GROUPS = 8
N_FEATURES = 5
SETTINGS = MeterSettings(window_ticks=300, every_ticks=100)


def _stim(rng: np.random.Generator, strongest: int) -> np.ndarray:
    """A stimulation ([16]: Hz then uA) whose strongest encoding electrode is `strongest`."""
    f = rng.uniform(*STIM_FREQUENCY_RANGE_HZ, N_ENCODING) * 0.5
    a = np.full(N_ENCODING, STIM_AMPLITUDE_RANGE_UA[0])
    f[strongest] = STIM_FREQUENCY_RANGE_HZ[1]
    return np.concatenate([f, a]).astype(np.float32)


def _feed(meter: CultureMeter, ticks: int, follows: str, seed: int = 0) -> None:
    """Feed `ticks` ticks whose counts follow one variable (`stim`, `features`, `action` or `nothing`)."""
    rng = np.random.default_rng(seed)
    for _ in range(ticks):
        strongest, action = int(rng.integers(N_ENCODING)), int(rng.integers(3))
        features = rng.normal(0, 0.05, N_FEATURES)
        features[2] = rng.uniform(-1, 1)  # the feature that varies most: the meter's observation classes
        counts = rng.poisson(2.0, GROUPS).astype(np.float32)
        if follows == "stim":
            counts[strongest] += 10
        elif follows == "features":
            counts[0] += 10 * (features[2] + 1)
        elif follows == "action":
            counts[action] += 10
        meter.observe(_stim(rng, strongest), counts, features, action)
        meter.update_if_due()


@pytest.mark.parametrize("follows", ["stim", "features", "action"])
def test_the_meter_finds_what_the_counts_follow_and_nothing_else(follows: str) -> None:
    meter = CultureMeter(SETTINGS, feature_names=[f"f{i}" for i in range(N_FEATURES)])
    _feed(meter, 300, follows)
    assert meter.updates == 3 and meter.feature_index == 2
    for variable, estimate in meter.estimates.items():
        assert estimate is not None and estimate.ticks == 300
        if variable == follows:
            assert estimate.bits > 0.6 * estimate.ceiling_bits, (variable, estimate)
        else:
            assert abs(estimate.bits) < max(4 * estimate.shuffle_bits_sd, 0.05), (variable, estimate)
    figures = meter.metrics()
    assert set(figures) == {f"info_{v}{p}" for v in ("stim", "features", "action") for p in ("", "_sd")}
    shown = meter.shown()
    assert shown["feature"] == "f2" and shown["ticks"] == 300 and shown["updated_at_tick"] == 300
    assert shown[follows]["bits"] == pytest.approx(meter.estimates[follows].bits, abs=1e-4)
    assert shown["stim"]["ceiling"] == pytest.approx(math.log2(N_ENCODING), abs=1e-4)
    assert shown["features"]["ceiling"] == pytest.approx(math.log2(3), abs=1e-4)


def test_the_window_rolls_and_the_meter_recomputes_every_every_ticks() -> None:
    meter = CultureMeter(SETTINGS)
    _feed(meter, 99, "stim")
    assert meter.updates == 0 and meter.metrics() == {} and meter.shown()["ticks"] == 0
    _feed(meter, 1, "stim", seed=1)
    assert meter.updates == 1 and meter.estimates["stim"].ticks == 100
    _feed(meter, 300, "nothing", seed=2)  # the window (300) now holds only ticks that carry nothing
    assert meter.updates == 4 and meter.estimates["stim"].ticks == 300
    assert abs(meter.estimates["stim"].bits) < max(4 * meter.estimates["stim"].shuffle_bits_sd, 0.05)
    window = meter.window()
    assert len(window["stim"]) == 300 and meter.ticks == 400
    cost = meter.cost()
    assert cost["meter_ticks"] == 400 and cost["meter_updates"] == 4 and cost["meter_cpu_s"] > 0


def test_a_zero_culture_carries_exactly_nothing_and_one_class_gives_no_estimate() -> None:
    meter = CultureMeter(MeterSettings(window_ticks=100, every_ticks=100))
    rng = np.random.default_rng(3)
    for tick in range(100):
        meter.observe(_stim(rng, tick % N_ENCODING), np.zeros(GROUPS), rng.uniform(-1, 1, N_FEATURES), 1)
    meter.update()
    assert meter.estimates["stim"].bits == 0.0 and meter.estimates["features"].bits == 0.0
    assert meter.estimates["action"] is None  # one action only: nothing to carry
    assert "info_action" not in meter.metrics() and meter.shown()["action"] is None


def test_feature_classes_are_quantiles_of_the_most_varying_feature() -> None:
    features = np.column_stack([np.linspace(0, 0.1, 90), np.tile([-1.0, 0.0, 1.0], 30)])
    labels, index = feature_classes(features, 3)
    assert index == 1 and sorted(np.bincount(labels).tolist()) == [30, 30, 30]
    for mostly_one_value in (np.r_[np.zeros(80), np.ones(10)], np.r_[np.ones(80), np.zeros(10)]):
        labels, _ = feature_classes(mostly_one_value[:, None], 3)  # ties share a class, and two classes remain
        assert sorted(np.bincount(labels)[np.bincount(labels) > 0].tolist()) == [10, 80]


def test_meter_settings_are_checked_naming_the_key() -> None:
    assert experiment_from_dict({}, source="t").meter == MeterSettings()
    assert experiment_from_dict({"meter": {"enabled": False}}, source="t").culture_settings().meter.enabled is False
    for bad, says in (
        ({"window_ticks": 10}, "window_ticks=10: must be a whole number 50-100000"),
        ({"every_ticks": 0}, "every_ticks=0"),
        ({"feature_classes": 1}, "feature_classes=1"),
        ({"window": 500}, "meter.window: unknown key"),
    ):
        with pytest.raises(ExperimentError, match=says):
            experiment_from_dict({"meter": bad}, source="t")
