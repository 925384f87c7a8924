"""The culture information meter (bridge/trainer/information.py) against channels whose answer is known.

The estimator must find what is there and nothing where nothing is: the perfect `transparent` channel carries
most of the 3 bits the stimulation's class holds, the `zero` and `random` controls carry none (within the
estimator's own noise, the spread of its label-shuffled estimates), and the simulated culture lies between.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spikeloop.bridge.device.backends import make_backend
from spikeloop.bridge.device.backends.sim import SimBackend
from spikeloop.bridge.trainer.information import confusion_information_bits, decoded_information
from spikeloop.bridge.wire.channels import N_ENCODING, TICK_FREQUENCY_HZ
from spikeloop.experiments.benchmarks.culture import information_about_stimulation

TICKS = 1000
SIM_TICKS = 500  # the simulated culture costs about 5 ms of CPU per tick; the channels nothing


def _bits_of(source: str, seed: int = 0):
    if source == "sim":
        backend = SimBackend(TICK_FREQUENCY_HZ, seed, realtime=False)
    else:
        backend = make_backend(source, tick_frequency_hz=TICK_FREQUENCY_HZ, seed=seed, realtime=False)
    backend.open(None)
    return information_about_stimulation(backend, SIM_TICKS if source == "sim" else TICKS, np.random.default_rng(seed))


def test_confusion_information_is_log2_k_on_the_diagonal_and_zero_when_independent() -> None:
    labels = np.repeat(np.arange(4), 48)
    assert confusion_information_bits(labels, labels, 4) == pytest.approx(2.0)
    independent = np.tile(np.arange(4), 48)  # each true class predicted as every class equally often
    assert confusion_information_bits(labels, independent, 4) == pytest.approx(0.0, abs=1e-12)


def test_planted_information_is_found_and_shuffled_labels_carry_none() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 800)
    spikes = rng.poisson(2.0, (800, 8)).astype(float)
    spikes[np.arange(800), labels] += 12.0  # group k fires for class k: the class is plain in the spikes
    planted = decoded_information(spikes, labels)
    assert planted.bits > 0.9 * planted.ceiling_bits == pytest.approx(0.9 * 2.0)
    unrelated = decoded_information(spikes, rng.permutation(labels))
    assert abs(unrelated.bits) < max(3 * unrelated.shuffle_bits_sd, 0.03)


def test_transparent_carries_most_of_the_stimulation_and_the_controls_none() -> None:
    transparent, zero, random, sim = (_bits_of(s) for s in ("transparent", "zero", "random", "sim"))
    assert transparent.ceiling_bits == pytest.approx(math.log2(N_ENCODING))
    assert transparent.bits > 0.6 * transparent.ceiling_bits, transparent
    for control in (zero, random):
        assert abs(control.bits) < max(3 * control.shuffle_bits_sd, 0.03), control
    assert 3 * sim.shuffle_bits_sd < sim.bits < transparent.bits, sim


def test_counts_that_never_vary_carry_exactly_nothing_whatever_the_folds_hold() -> None:
    # Periodic labels: every fold holds every class, so each fold's training majority (the fallback of a decoder
    # that has nothing to read) differs, and the shuffled labels' folds would earn a spurious information.
    silent = decoded_information(np.zeros((96, 8)), np.arange(96) % 8)
    assert (silent.bits, silent.raw_bits, silent.shuffle_bits_sd) == (0.0, 0.0, 0.0) and silent.ceiling_bits == 3.0


def test_too_few_ticks_or_mismatched_shapes_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least 10"):
        decoded_information(np.zeros((6, 8)), np.zeros(6))
    with pytest.raises(ValueError, match=r"\[ticks, groups\]"):
        decoded_information(np.zeros((20, 8)), np.zeros(19))
