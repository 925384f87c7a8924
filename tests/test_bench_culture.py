"""`spikeloop bench culture`: the classifier it reads the culture with, and a tiny run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from spikeloop.experiments.benchmarks import culture as bench_culture


def test_holdout_accuracy_tells_signal_from_noise() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 600).astype(float)
    signal = np.c_[labels * 3.0 + rng.normal(size=600), rng.normal(size=(600, 7))]
    noise = rng.normal(size=(600, 8))
    assert bench_culture.holdout_accuracy(signal, labels) > 0.9
    assert abs(bench_culture.holdout_accuracy(noise, labels) - 0.5) < 0.1


def test_pattern_pairs_are_what_they_say() -> None:
    rng = np.random.default_rng(1)
    for a, b in bench_culture.pattern_pairs("one_electrode", 3, rng):
        assert (a > 0.9).sum() == 2 and (b > 0.9).sum() == 2 and not np.array_equal(a, b)
    for a, b in bench_culture.pattern_pairs("random_mid", 3, rng):
        assert a.min() >= 0.3 and b.max() <= 0.7


def test_a_tiny_run_writes_its_result(tmp_path: Path) -> None:
    out = tmp_path / "culture.json"
    assert (
        bench_culture.main(["--seeds", "1", "--pairs", "1", "--ticks", "60", "--pulses", "2", "--output", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["settings"]["stim_modes"] == ["burst", "reference"]  # both device stimulation modes by default
    for mode in ("burst", "reference"):
        assert set(result["separability_mean"][mode]) == {"one_electrode", "random_full", "random_mid"}
        assert all(0.0 <= v <= 1.0 for v in result["separability_mean"][mode].values())
    response = result["per_seed"]["0"]["response_after_one_pulse"]
    assert len(response["5-10 ms"]) == 8 and result["command"].startswith("spikeloop bench culture")
