"""The loader behind the notebooks: synthetic trial dirs written by RunLog, then three real short runs.

The synthetic trials are written with the run's own `RunLog` (TensorBoard, episodes.jsonl,
the step log), so what is read back is what a run writes. The three real short runs (ablation
none/zero/random, step log on, tests/support/analysis_runs.py) are shared with tests/test_notebooks.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from spikeloop.experiments import analysis
from spikeloop.experiments.run_log import RunLog
from tests.support.analysis_runs import ABLATIONS

# --- synthetic trials ---------------------------------------------------------------


def _steps(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    stim = np.concatenate([rng.uniform(4, 40, (n, 8)), rng.uniform(1, 2.5, (n, 8))], axis=1).astype(np.float32)
    raw = rng.poisson(2.0 * stim[:, :8] / 10).astype(np.float32)
    return {
        "stim": stim,
        "raw_spikes": raw,
        "spikes": raw,
        "action": rng.integers(0, 3, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "exchange_ok": np.ones(n, np.float32),
        "stim_timestamp_us": np.arange(n, dtype=np.uint64),
        "latency_ms": rng.uniform(1, 3, n).astype(np.float32),
    }


def write_trial(
    run_dir: Path, name: str, ablation: str, seed: int, rewards: list[float], step_log: bool = True
) -> Path:
    """A trial dir as a run leaves it: experiment.yaml, events, episodes.jsonl and steps/ (via RunLog)."""
    trial_dir = run_dir / name
    trial_dir.mkdir(parents=True)
    (trial_dir / "experiment.yaml").write_text(yaml.safe_dump({"name": "t", "seed": seed, "ablation": ablation}))
    log = RunLog(trial_dir)
    rng = np.random.default_rng(seed)
    for iteration, chunk in enumerate((rewards[: len(rewards) // 2], rewards[len(rewards) // 2 :]), start=1):
        records = []
        for reward in chunk:
            length = 5
            record = {
                "episode_reward": reward,
                "episode_length": length,
                "kill_count": int(reward > 0),
                "timeouts_in_episode": 0,
                "episode_feedback_commands": 2,
            }
            if step_log:
                record["steps"] = _steps(length, rng)
            records.append(record)
        result = {
            "training_iteration": iteration,
            "num_env_steps_sampled_lifetime": 100 * iteration,
            "env_runners": {
                "episode_return_mean": float(np.mean(chunk)),
                "culture": {"latency_p50_ms": 2.0, "latency_p99_ms": 4.0, "latency_max_ms": 9.0},
            },
        }
        log.log_iteration(result, records)
    log.close()
    return trial_dir


@pytest.fixture
def synthetic_root(tmp_path: Path) -> Path:
    """Two run dirs: one with a `none` and a `zero` trial (step log on), one with a `zero` trial without it."""
    write_trial(tmp_path / "run-a", "trial_0", "none", 0, [1.0, 2.0, 3.0, 4.0])
    write_trial(tmp_path / "run-a", "trial_1", "zero", 0, [0.0, 0.0, 1.0, 1.0])
    write_trial(tmp_path / "run-b", "trial_0", "zero", 1, [-1.0, 0.0], step_log=False)
    (tmp_path / "run-a" / "experiment.yaml").write_text("seed: 0\n")  # the run's own: not a trial
    return tmp_path


def test_find_and_group_trials(synthetic_root: Path) -> None:
    trials = analysis.find_trials(synthetic_root)
    assert [(t.ablation, t.seed, t.run) for t in trials] == [
        ("none", 0, "run-a"),
        ("zero", 0, "run-a"),
        ("zero", 1, "run-b"),
    ]
    assert analysis.find_trials([synthetic_root / "run-a" / "trial_1"]) == [trials[1]]
    groups = analysis.group_trials(trials)
    assert {k: len(v) for k, v in groups.items()} == {"none": 1, "zero": 2}
    with pytest.raises(FileNotFoundError, match="SPIKELOOP_RUNS"):
        analysis.find_trials(synthetic_root / "missing")


def test_run_dirs_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(analysis.RUNS_ENV, f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert analysis.run_dirs_from_env("runs") == [tmp_path / "a", tmp_path / "b"]
    monkeypatch.delenv(analysis.RUNS_ENV)
    assert analysis.run_dirs_from_env("runs") == [Path("runs")]


def test_episodes_scalars_and_steps(synthetic_root: Path) -> None:
    trial = analysis.find_trials(synthetic_root)[0]
    episodes = analysis.read_episodes(trial)
    assert [e["episode_index"] for e in episodes] == [1, 2, 3, 4]
    assert all("steps" not in e and e["step_log"].startswith("steps/") for e in episodes)
    arrays = analysis.episode_arrays(trial, ["episode_reward", "env_steps_lifetime", "absent"])
    np.testing.assert_array_equal(arrays["episode_reward"], [1, 2, 3, 4])
    np.testing.assert_array_equal(arrays["env_steps_lifetime"], [100, 100, 200, 200])
    np.testing.assert_array_equal(analysis.episode_arrays(trial)[analysis.ENV_STEPS_AT_END], [5, 10, 15, 20])
    assert np.isnan(arrays["absent"]).all()
    scalars = analysis.read_scalars(trial, ["episode/return_mean", "loop/latency_p50_ms", "not/a_tag"])
    assert set(scalars) == {"episode/return_mean", "loop/latency_p50_ms"}
    steps, values = scalars["episode/return_mean"]
    np.testing.assert_array_equal(steps, [100, 200])
    np.testing.assert_allclose(values, [1.5, 3.5])
    log = analysis.read_steps(trial)
    assert log["stim"].shape == (20, 16) and log["raw_spikes"].shape == (20, 8)
    np.testing.assert_array_equal(np.unique(log["episode_index"]), [1, 2, 3, 4])
    latency, source = analysis.latencies_ms(trial)
    assert len(latency) == 20 and source.startswith("step log")


def test_latency_falls_back_to_tensorboard(synthetic_root: Path) -> None:
    trial = [t for t in analysis.find_trials(synthetic_root) if t.run == "run-b"][0]
    assert analysis.read_steps(trial) == {}
    latency, source = analysis.latencies_ms(trial)
    assert sorted(latency) == [2.0, 2.0, 4.0, 4.0, 9.0, 9.0] and source.startswith("TensorBoard")


def test_smoothing_bands_and_final_return(synthetic_root: Path) -> None:
    np.testing.assert_allclose(analysis.smooth([1, 3, np.nan, 5], 2), [1, 2, 3, 5])
    band = analysis.seed_band(
        [(np.array([0, 10]), np.array([0.0, 10.0])), (np.array([0, 5]), np.array([2.0, 2.0]))], points=3
    )
    np.testing.assert_allclose(band.x, [0, 5, 10])
    np.testing.assert_allclose(band.mean, [1, 3.5, 10])
    np.testing.assert_allclose(band.low, [0, 2, 10])
    np.testing.assert_array_equal(band.n, [2, 2, 1])
    none, zero, _ = analysis.find_trials(synthetic_root)
    assert analysis.final_return(none, 0.5) == 3.5
    assert analysis.final_return(zero, 0.25) == 1.0
    x, y = analysis.episode_curve(none, window=2)
    np.testing.assert_allclose(y, [1, 1.5, 2.5, 3.5])


def test_verdict_is_honest() -> None:
    few = analysis.compare("none", [5.0, 6.0], "zero", [0.0, 1.0])
    assert "no evidence either way" in analysis.verdict(few)
    rng = np.random.default_rng(0)
    clear = analysis.compare("none", list(10 + rng.normal(size=6)), "zero", list(rng.normal(size=6)))
    assert clear.mann_whitney_p == pytest.approx(1 / math.comb(12, 6)) and clear.welch_p < 0.01
    assert "none scores higher than zero" in analysis.verdict(clear)
    same = analysis.compare("none", [1.0, 2.0, 3.0, 2.5], "random", [1.5, 2.0, 2.8, 2.2])
    assert same.mann_whitney_p > 0.05 and "no evidence of a difference" in analysis.verdict(same)
    reversed_ = analysis.compare("none", list(rng.normal(size=5)), "zero", list(10 + rng.normal(size=5)))
    assert reversed_.mann_whitney_p > 0.5 and "no evidence of a difference" in analysis.verdict(reversed_)
    both_ways = analysis.compare("none", [0.0, 1.0, 2.0, 3.0], "zero", [5.0, 6.0, 7.0, 8.0], alternative="two-sided")
    assert both_ways.mann_whitney_p == pytest.approx(2 / 70)
    assert "zero scores higher than none" in analysis.verdict(both_ways)


def test_min_seeds_per_group() -> None:
    assert analysis.min_seeds_per_group(0.05) == 4  # 3 vs 3 gives at best 1/20 = 0.05, not below
    assert analysis.min_seeds_per_group(0.01) == 5  # 1/252
    assert analysis.min_seeds_per_group(0.05, "two-sided") == 4  # 2/70
    assert analysis.min_seeds_per_group(0.01, "two-sided") == 5  # 2/252 = 0.0079
    assert analysis.min_seeds_per_group(0.005, "two-sided") == 6  # 2/252 is not below 0.005, 2/924 is
    assert analysis.min_seeds_per_group(0.2) == 2  # 1/6
    assert analysis.MIN_SEEDS_FOR_A_CLAIM == 4
    with pytest.raises(ValueError, match="alpha"):
        analysis.min_seeds_per_group(0.0)


def test_minimum_seeds_are_really_needed_and_enough() -> None:
    """The minimum from min_seeds_per_group matches what scipy's exact test gives at complete separation."""
    for alternative, alpha in (("greater", 0.05), ("greater", 0.01), ("two-sided", 0.05)):
        n = analysis.min_seeds_per_group(alpha, alternative)
        enough = analysis.compare("a", list(range(n, 2 * n)), "b", list(range(n)), alternative=alternative)
        short = analysis.compare("a", list(range(n - 1, 2 * n - 2)), "b", list(range(n - 1)), alternative=alternative)
        assert enough.mann_whitney_p < alpha <= short.mann_whitney_p, (alternative, alpha)


def test_five_seeds_separated_reach_one_percent() -> None:
    c = analysis.compare("none", [10.0, 11.0, 12.0, 13.0, 14.0], "zero", [0.0, 1.0, 2.0, 3.0, 4.0])
    assert c.alternative == "greater"
    assert c.mann_whitney_p == pytest.approx(1 / 252) and c.mann_whitney_p < 0.01
    assert c.difference == pytest.approx(10.0)
    text = analysis.verdict(c, alpha=0.01)
    assert "none scores higher than zero" in text and "one-sided" in text and "5 vs 5" in text
    backwards = analysis.compare("zero", [0.0, 1.0, 2.0, 3.0, 4.0], "none", [10.0, 11.0, 12.0, 13.0, 14.0])
    assert backwards.mann_whitney_p == pytest.approx(1.0)
    assert "scores higher" not in analysis.verdict(backwards)


def test_three_seeds_claim_nothing_and_say_how_many_are_needed() -> None:
    c = analysis.compare("none", [10.0, 11.0, 12.0], "zero", [0.0, 1.0, 2.0])
    assert c.mann_whitney_p == pytest.approx(1 / 20) and c.cliffs_delta == 1.0
    text = analysis.verdict(c)
    assert "no evidence either way" in text and "scores higher" not in text
    assert "at least 4 per group" in text
    assert "at least 5 per group" in analysis.verdict(c, alpha=0.01)


def test_cliffs_delta() -> None:
    assert analysis.compare("a", [5.0, 6.0, 7.0], "b", [1.0, 2.0, 3.0]).cliffs_delta == 1.0
    assert analysis.compare("a", [1.0, 2.0, 3.0], "b", [5.0, 6.0, 7.0]).cliffs_delta == -1.0
    assert analysis.compare("a", [1.0, 2.0, 3.0], "b", [1.0, 2.0, 3.0]).cliffs_delta == 0.0
    assert analysis.compare("a", [2.0, 2.0], "b", [2.0, 2.0]).cliffs_delta == 0.0
    # a = [1, 3, 4], b = [2, 3, 1]: a > b in 5 pairs (3>2, 3>1, 4>2, 4>3, 4>1), a < b in 2 (1<2, 1<3), 2 ties
    assert analysis.compare("a", [1.0, 3.0, 4.0], "b", [2.0, 3.0, 1.0]).cliffs_delta == pytest.approx(3 / 9)
    # and it equals 2U/(n_a n_b) - 1 with scipy's U of a
    from scipy import stats

    a, b = [0.3, 1.7, 2.2, 5.0], [0.1, 1.9, 0.5]
    u = stats.mannwhitneyu(a, b).statistic
    assert analysis.compare("a", a, "b", b).cliffs_delta == pytest.approx(2 * u / 12 - 1)


def test_invalid_alternative_raises() -> None:
    with pytest.raises(ValueError, match="greater.*two-sided"):
        analysis.compare("a", [1.0, 2.0], "b", [0.0, 1.0], alternative="less")
    with pytest.raises(ValueError, match="greater.*two-sided"):
        analysis.min_seeds_per_group(0.05, "one-sided")
    with pytest.raises(ValueError, match="greater.*two-sided"):
        analysis.compare_ablations([], alternative="bigger")


def test_response_maps_find_a_planted_dependence() -> None:
    rng = np.random.default_rng(1)
    stim = rng.uniform(0, 1, (500, 16))
    spikes = rng.normal(0, 0.1, (500, 8))
    spikes[:, 3] += 5 * stim[:, 2]  # group 3 follows the frequency of stim channel 2
    r = analysis.correlation_map(stim, spikes)
    assert r.shape == (16, 8) and r[2, 3] > 0.95 and np.nanmax(np.abs(np.delete(r[:, 3], 2))) < 0.2
    coef, r2 = analysis.regression_map(stim, spikes)
    assert np.unravel_index(np.argmax(coef), coef.shape) == (2, 3) and r2[3] > 0.95
    frequency, amplitude = analysis.split_stim(stim)
    edges, means = analysis.binned_response(frequency, spikes, bins=4)
    assert edges.shape == (8, 5) and means.shape == (8, 4, 8)
    assert np.all(np.diff(means[2, :, 3]) > 0)


# --- real short runs -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_real_runs_read_back(runs_root: Path) -> None:
    trials = analysis.find_trials(runs_root)
    assert sorted(t.ablation for t in trials) == sorted(ABLATIONS)
    for trial in trials:
        episodes = analysis.read_episodes(trial)
        assert episodes and all("steps" not in e for e in episodes)
        log = analysis.read_steps(trial)
        assert len(log["reward"]) == sum(e["episode_length"] for e in episodes)
        assert log["stim"].shape[1] == 16 and log["raw_spikes"].shape[1] == 8
        np.testing.assert_allclose(
            [log["reward"][log["episode_index"] == e["episode_index"]].sum() for e in episodes],
            [e["episode_reward"] for e in episodes],
            rtol=1e-5,
        )
        assert np.isfinite(log["latency_ms"]).all() and (log["latency_ms"] > 0).all()
        assert log["raw_spikes"].sum() > 0  # the culture answers in every ablation
        if trial.ablation == "zero":
            assert not log["spikes"].any()  # ... but the decoder saw zeros
        scalars = analysis.read_scalars(trial, ["loop/latency_p50_ms", "episode/return_mean"])
        assert set(scalars) == {"loop/latency_p50_ms", "episode/return_mean"}
    comparisons = analysis.compare_ablations(trials)
    assert {c.name_b for c in comparisons} == {"zero", "random"}
    assert all("no evidence" in analysis.verdict(c) for c in comparisons)  # one seed each: no claim


def test_the_learning_curve_is_redrawn_at_most_every_interval_and_at_the_end(tmp_path: Path) -> None:
    """learning_curve.png: drawn after the first iteration, not after each following one (drawing it cost 7% of a
    sweep trial's process), and drawn with every episode when the log closes."""
    from spikeloop.experiments.run_log import CURVE_REDRAW_S

    assert CURVE_REDRAW_S >= 10
    trial_dir = tmp_path / "trial"
    log = RunLog(trial_dir)
    curve = trial_dir / "learning_curve.png"
    record = {"episode_reward": -1.0, "episode_length": 5, "kill_count": 0}
    log.log_iteration({"training_iteration": 1, "num_env_steps_sampled_lifetime": 5}, [dict(record)])
    first = curve.read_bytes()
    log.log_iteration({"training_iteration": 2, "num_env_steps_sampled_lifetime": 10}, [dict(record)])
    assert curve.read_bytes() == first  # within the interval: not redrawn
    log.close()
    assert curve.read_bytes() != first  # at the end: redrawn, two episodes now
