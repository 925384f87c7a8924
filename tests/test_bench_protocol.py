"""`spikeloop bench protocol --collect`: sessions paired by seed across conditions, and the exact sign-flip test."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from spikeloop.experiments.benchmarks.protocol import main, sign_flip_p
from spikeloop.experiments.protocol.session import OUTCOME_TAGS


def test_sign_flip_p_is_the_share_of_sign_patterns_at_least_as_extreme() -> None:
    d = [3.0, 1.0, -0.5, 2.0]
    means = [np.mean([s * x for s, x in zip(signs, d, strict=True)]) for signs in itertools.product((1, -1), repeat=4)]
    assert sign_flip_p(d) == pytest.approx(np.mean(np.array(means) >= np.mean(d) - 1e-12))
    assert sign_flip_p([1.0] * 5) == pytest.approx(1 / 32)  # the floor with five seeds
    assert sign_flip_p([]) is None
    # Two-sided: a large effect of either sign; five seeds of one sign give 2/32 whichever sign it is.
    assert sign_flip_p([-1.0] * 5) == pytest.approx(1.0) and sign_flip_p([-1.0] * 5, two_sided=True) == pytest.approx(
        2 / 32
    )
    assert sign_flip_p([1.0, -1.0], two_sided=True) == pytest.approx(1.0)


def write_session(run_dir: Path, condition: str, seed: int, effect: float) -> None:
    trial = run_dir / f"train_trial_{condition}_{seed}"
    trial.mkdir(parents=True)
    outcome = {tag: 0.5 for tag in OUTCOME_TAGS} | {"protocol/return_late_minus_early": effect}
    result = {
        "condition": condition,
        "seed": seed,
        "outcome": outcome,
        "early_late": {k: {"early_mean": 0.0, "late_mean": effect} for k in ("return", "kill_rate")},
        "rest": {"groups": {"total": {"before_mean": 7.0, "after_mean": 7.5}}},
        "phases": [],
    }
    (trial / "protocol.json").write_text(json.dumps(result))
    (trial / "experiment.yaml").write_text(yaml.safe_dump({"devices": [{"backend": "sim", "seed": seed}]}))


def test_collect_pairs_the_sessions_by_seed(tmp_path: Path) -> None:
    run_dirs = []
    for seed in range(3):
        run_dir = tmp_path / f"run-{seed}"
        write_session(run_dir, "feedback", seed, effect=10.0 + seed)
        write_session(run_dir, "no_feedback", seed, effect=2.0 * seed)
        run_dirs.append(run_dir)
    write_session(tmp_path / "run-extra", "no_feedback", 7, effect=-100.0)  # no feedback session of seed 7
    output = tmp_path / "protocol.json"
    assert main(["--collect", *map(str, run_dirs), str(tmp_path / "run-extra"), "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    tag = "protocol/return_late_minus_early"
    assert result["conditions"]["feedback"][tag]["per_seed"] == {"0": 10.0, "1": 11.0, "2": 12.0}
    assert result["conditions"]["no_feedback"]["seeds"] == [0, 1, 2, 7]
    paired = result["feedback_against"]["no_feedback"]
    assert paired["seeds"] == [0, 1, 2]  # seed 7 has nothing to pair with
    assert paired[tag]["feedback_minus_control"] == [10.0, 9.0, 8.0]
    assert paired[tag]["p_one_sided_sign_flip"] == pytest.approx(1 / 8)
    assert paired[tag]["p_two_sided_sign_flip"] == pytest.approx(2 / 8)
    assert result["command"].startswith("spikeloop bench protocol --collect")
    assert len(result["sessions"]) == 7 and result["sessions"][0]["device"]["backend"] == "sim"


def test_collect_without_sessions_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no protocol.json"):
        main(["--collect", str(tmp_path / "empty"), "--output", str(tmp_path / "out.json")])
