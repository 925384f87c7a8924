"""`spikeloop bench learning`: statistics, targets, figure and resume on synthetic runs (no Ray, no VizDoom)."""

from __future__ import annotations

import json

import pytest

from experiments import bench_learning as bl

EPISODES = 600
EPISODES_PER_ITERATION = 10
STEPS_PER_ITERATION = 1000
SEEDS = 5
# Episode index at which a learning condition switches from its untrained to its trained return.
SWITCH = {"direct": 200, "transparent": 250, "sim": 300}
LOW, HIGH, CHANCE = -540.0, -420.0, -530.0


def _steps(i: int) -> float:
    """The env-step stamp of episode i: the end of its iteration."""
    return float((i // EPISODES_PER_ITERATION + 1) * STEPS_PER_ITERATION)


def _learner(switch: int, seed: int, high: float = HIGH) -> list[bl.Episode]:
    offset = 0.001 * seed  # distinct per-seed finals: no ties, so the Mann-Whitney test is exact
    return [(_steps(i), (high if i >= switch else LOW) + offset, i >= switch) for i in range(EPISODES)]


def _chance(seed: int) -> list[bl.Episode]:
    return [(_steps(i), CHANCE + 0.001 * seed, i % 4 == 0) for i in range(EPISODES)]


def _runs(seeds: int = SEEDS, conditions=bl.CONDITIONS, switch=None, high=None) -> bl.Runs:
    switch = SWITCH | (switch or {})
    runs: bl.Runs = {}
    for condition in conditions:
        runs[condition] = {}
        for seed in range(seeds):
            if condition in ("zero", "random"):
                runs[condition][str(seed)] = _chance(seed)
            else:
                s = switch[condition]
                runs[condition][str(seed)] = _learner(
                    s(seed) if callable(s) else s + 10 * seed, seed, (high or {}).get((condition, seed), HIGH)
                )
    return runs


def _crossing(switch: int) -> float:
    """Where the rolling-100 mean reaches the mark: the 91st trained episode (-540 + 1.2 k >= -431 at k = 91)."""
    return _steps(switch + 90)


def test_summary_of_learning_and_chance_conditions():
    out = bl.summarize(_runs())
    s = out["summary"]
    assert list(s) == list(bl.CONDITIONS)
    assert out["chance_return"] == pytest.approx(CHANCE + 0.002)
    assert out["chance_from"].startswith("zero condition")
    assert out["mark_90pct_return"] == pytest.approx(out["chance_return"] + 0.9 * (HIGH + 0.002 - out["chance_return"]))
    assert s["direct"]["final_return_mean"]["per_seed"]["3"] == pytest.approx(HIGH + 0.003)
    assert s["direct"]["final_return_mean"]["pooled"] == pytest.approx(HIGH + 0.002)
    assert s["sim"]["final_kill_rate"]["pooled"] == 1.0
    assert s["zero"]["final_kill_rate"]["pooled"] == 0.25
    # Complete separation, 5 vs 5 seeds: the smallest one-sided exact p, 1 / C(10, 5).
    for condition in ("direct", "transparent", "sim"):
        assert s[condition]["p_value_vs_zero"] == pytest.approx(1 / 252)
        assert s[condition]["p_value_vs_zero"] < 0.01
        assert s[condition]["cliffs_delta_vs_zero"] == 1.0
        assert s[condition]["kill_p_value_vs_zero"] < 0.01
    assert s["zero"]["p_value_vs_zero"] is None and s["zero"]["kill_p_value_vs_zero"] is None
    # random is zero shifted by nothing: same per-seed values, no evidence.
    assert s["random"]["p_value_vs_zero"] > 0.4
    assert out["min_seeds_per_group"] == 5
    assert "sim scores higher than zero" in out["verdicts"]["sim"]
    assert "no evidence" in out["verdicts"]["random"]
    assert "zero" not in out["verdicts"]


def test_steps_to_90pct_are_where_the_curves_cross():
    s = bl.summarize(_runs())["summary"]
    for condition, switch in SWITCH.items():
        steps = s[condition]["steps_to_90pct_direct"]
        assert steps["per_seed"] == {str(k): _crossing(switch + 10 * k) for k in range(SEEDS)}
        assert steps["median"] == _crossing(switch + 20)
        assert steps["reached"] == SEEDS and steps["short_window_seeds"] == []
    assert s["direct"]["steps_to_90pct_direct"]["median"] == 32000.0
    assert s["zero"]["steps_to_90pct_direct"]["per_seed"] == {str(k): None for k in range(SEEDS)}
    assert s["zero"]["steps_to_90pct_direct"]["median"] is None


def test_targets_met_as_constructed():
    t = bl.summarize(_runs())["targets"]
    assert t["a_direct_transparent_solve"]["met"] is True
    assert t["b_transparent_speed"]["met"] is True
    assert t["b_transparent_speed"]["ratio"] == pytest.approx(37000 / 32000)
    assert t["c_sim_beats_zero"]["met"] is True
    assert t["c_sim_beats_zero"]["p_value"] == pytest.approx(1 / 252)


def test_targets_that_fail():
    # transparent seed 2 ends at -430 (< -425); transparent learns late (ratio > 1.5).
    runs = _runs(high={("transparent", 2): -430.0}, switch={"transparent": 450})
    t = bl.summarize(runs)["targets"]
    a = t["a_direct_transparent_solve"]
    assert a["met"] is False
    assert a["conditions"]["direct"]["met"] is True
    assert a["conditions"]["transparent"]["per_seed"]["2"]["met"] is False
    assert a["conditions"]["transparent"]["per_seed"]["1"]["met"] is True
    assert t["b_transparent_speed"]["met"] is False
    assert t["b_transparent_speed"]["ratio"] > 1.5
    # Four seeds: even complete separation (p = 1/70) cannot reach 0.01.
    c = bl.summarize(_runs(seeds=4))["targets"]["c_sim_beats_zero"]
    assert c["met"] is False and c["p_value"] == pytest.approx(1 / 70) and "fewer than 5" in c["reason"]


def test_targets_belong_to_basic_only():
    out = bl.summarize(_runs(), scenario="defend_the_center")
    assert out["targets"] == {}
    assert any("targets are defined on basic" in note for note in out["notes"])
    assert out["summary"]["sim"]["p_value_vs_zero"] == pytest.approx(1 / 252)  # the statistics stay


def test_sim_that_does_not_learn_fails_c():
    runs = _runs()
    runs["sim"] = {seed: [(st, r - 5.0 + 0.0005, k) for st, r, k in eps] for seed, eps in runs["zero"].items()}
    out = bl.summarize(runs)
    assert out["summary"]["sim"]["p_value_vs_zero"] > 0.01
    assert out["targets"]["c_sim_beats_zero"]["met"] is False


def test_missing_conditions_give_null_targets_and_notes():
    out = bl.summarize(_runs(conditions=("sim", "random")))
    assert out["chance_from"].startswith("no zero condition") and "first 100" in out["chance_from"]
    assert out["chance_return"] == pytest.approx((LOW + CHANCE) / 2 + 0.002)
    assert out["summary"]["sim"]["steps_to_90pct_direct"]["median"] is None
    assert out["summary"]["sim"]["p_value_vs_zero"] is None
    assert out["verdicts"] == {}
    assert any("direct was not run" in n for n in out["notes"])
    assert any("zero was not run" in n for n in out["notes"])
    for target in out["targets"].values():
        assert target["met"] is None and "not run" in target["reason"]


def test_short_runs_use_all_their_episodes_and_are_marked():
    runs = _runs(conditions=("direct", "zero"))
    runs["direct"]["0"] = [(1000.0, -530.0, False)] * 20 + [(2000.0, -420.0, True)] * 60  # 80 episodes
    s = bl.summarize(runs)["summary"]["direct"]["steps_to_90pct_direct"]
    assert s["short_window_seeds"] == ["0"]
    assert s["per_seed"]["0"] is None  # mean of all 80 is -447.5: below the mark
    runs["direct"]["0"] = [(1000.0, -530.0, False)] * 5 + [(2000.0, -420.0, True)] * 75
    s = bl.summarize(runs)["summary"]["direct"]["steps_to_90pct_direct"]
    assert s["per_seed"]["0"] == 2000.0 and s["short_window_seeds"] == ["0"]


def test_direct_not_above_chance_gives_no_mark():
    runs = _runs(conditions=("direct", "zero"))
    runs["direct"] = runs["zero"]  # equal up to rounding: no mark either
    out = bl.summarize(runs)
    assert out["mark_90pct_return"] is None
    runs["direct"] = {seed: [(st, r - 1.0, k) for st, r, k in eps] for seed, eps in runs["zero"].items()}
    out = bl.summarize(runs)
    assert out["mark_90pct_return"] is None
    assert out["summary"]["direct"]["steps_to_90pct_direct"]["median"] is None
    assert any("not above chance" in n for n in out["notes"])


def _result(runs: bl.Runs) -> dict:
    settings = {
        "scenario": "basic",
        "conditions": list(runs),
        "seeds": SEEDS,
        "env_steps_per_run": 60000,
        "base_experiment": {"env": {"scenario": "basic"}},
    }
    # Round trip through JSON, as from the file.
    return json.loads(json.dumps(bl._json_safe(bl.build_result(settings, runs, {}, 12.0))))


def test_result_layout_and_curves_round_trip():
    runs = _runs()
    result = _result(runs)
    assert {
        "settings",
        "runs",
        "summary",
        "chance_return",
        "chance_from",
        "targets",
        "verdicts",
        "min_seeds_per_group",
        "wall_s",
    } <= set(result)
    assert set(result["runs"]["sim"]["0"]) >= {"env_steps", "return", "kill"}
    assert bl.runs_from_result(result) == runs
    assert result["summary"]["zero"]["p_value_vs_zero"] is None
    assert "NaN" not in json.dumps(result)


def test_draw_figure_from_the_json_alone(tmp_path):
    result = _result(_runs())
    path = tmp_path / "fig" / "learning.png"
    bl.draw_figure(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    assert not list(path.parent.glob("*.tmp*"))


def test_grid_curve_is_nan_before_its_first_point():
    import numpy as np

    grid = np.linspace(0, 60000, 200)
    eps = _learner(200, 0)
    curve = bl._grid_curve([e[0] for e in eps], [e[1] for e in eps], grid)
    first = _steps(99)
    assert np.isnan(curve[grid < first]).all() and np.isfinite(curve[grid >= first]).all()
    assert curve[-1] == pytest.approx(HIGH)


def test_resume_accepts_same_settings_and_refuses_others():
    result = _result(_runs(conditions=("direct", "zero"), seeds=2))
    same = dict(result["settings"])
    assert bl.check_resume(result, same) == _runs(conditions=("direct", "zero"), seeds=2)
    with pytest.raises(ValueError, match="env-step budget"):
        bl.check_resume(result, same | {"env_steps_per_run": 20000})
    with pytest.raises(ValueError, match="scenario"):
        bl.check_resume(result, same | {"scenario": "defend_the_center"})
    with pytest.raises(ValueError, match="base experiment"):
        bl.check_resume(result, same | {"base_experiment": {"ppo": {"lr": 1e-3}}})
    with pytest.raises(ValueError, match="not a `bench learning` result"):
        bl.check_resume({"curves": {}}, same)


def test_experiment_dicts():
    base = {
        "env": {"scenario": "x", "frame_skip": 4},
        "resources": {"num_env_runners": 1},
        "sim_device": {"artifact_wait_ms": 10.0},
    }
    direct = bl.experiment_dict("direct", 3, "basic", base)
    assert direct["policy"] == "direct" and direct["name"] == "learning-direct-3" and direct["seed"] == 3
    assert direct["env"] == {"scenario": "basic", "frame_skip": 4} and "sim_device" not in direct
    zero = bl.experiment_dict("zero", 2, "basic", base)
    assert zero["ablation"] == "zero"
    assert zero["devices"] == [
        {"device_id": "sim", "backend": "sim", "realtime": False, "seed": 2, "artifact_wait_ms": 10.0}
    ]
    transparent = bl.experiment_dict("transparent", 1, "basic", base)
    assert transparent["devices"] == [{"device_id": "transparent", "backend": "transparent", "seed": 1}]
    sim, reference = bl.experiment_dict("sim", 4, "basic", base), bl.experiment_dict("sim_reference", 4, "basic", base)
    assert (
        reference["devices"] == [sim["devices"][0] | {"stim_mode": "reference"}]
        and "stim_mode" not in sim["devices"][0]
    )
    assert "sim_reference" not in bl.CONDITIONS  # run only when asked for
    assert "sim_device" in base  # the caller's dict is left alone
    with pytest.raises(ValueError, match="unknown condition"):
        bl.experiment_dict("none", 0)


def test_cli_validation(capsys):
    with pytest.raises(SystemExit):
        bl.main(["--seeds", "0"])
    assert "--seeds must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bl.main(["--env-steps", "999"])
    assert "--env-steps must be >= 1000" in capsys.readouterr().err


def test_registered_in_the_cli():
    from experiments.cli import BENCHMARKS

    assert BENCHMARKS["learning"][0] == "experiments.bench_learning"


def test_sim_reference_is_compared_with_sim_both_ways():
    runs = _runs(conditions=("sim", "zero"))
    # the reference stimulation's seeds learn less: their trained return is 30 lower in every seed
    runs["sim_reference"] = {
        str(seed): [(steps, ret - 30.0, killed) for steps, ret, killed in eps] for seed, eps in runs["sim"].items()
    }
    out = bl.summarize(runs)
    assert list(out["summary"]) == ["sim", "zero", "sim_reference"]
    vs_sim = out["summary"]["sim_reference"]["vs_sim"]
    assert vs_sim["difference_return"] == pytest.approx(-30.0)
    assert vs_sim["cliffs_delta"] == -1.0 and vs_sim["p_value"] == pytest.approx(2 / 252)  # 5 vs 5, two-sided
    assert "vs_sim" not in out["summary"]["sim"]
    assert "sim_reference - sim: return -30.0" in bl.table(out | {"settings": {}})
    assert "vs_sim" not in bl.summarize(_runs(conditions=("sim",)))["summary"]["sim"]
