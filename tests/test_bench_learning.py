"""`spikeloop bench learning`: statistics, targets, figure and resume on synthetic runs (no Ray, no VizDoom)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spikeloop.experiments.benchmarks import learning as bl
from spikeloop.experiments.strict_json import json_safe

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


def test_with_another_reward_only_the_kill_rate_of_target_a_is_read():
    """-425 is in the default reward's units: runs with the end-of-episode term off return 500 more on basic."""
    changed = bl.reward_changes({"reward_settings": {"end_health_per_hp": 0, "kill": 100.0}})
    assert changed == ["reward_settings.end_health_per_hp=0"]  # a setting at its default changes nothing
    assert bl.reward_changes({"reward_mode": "both"}) == ["reward_mode=both"]
    assert bl.reward_changes({"reward_mode": "shaped", "feature_settings": {"kills_scale": 20.0}}) == []
    assert bl.reward_changes(None) == []
    # transparent seed 2 returns -430: below -425 in the default reward, not readable in another.
    runs = _runs(high={("transparent", 2): -430.0})
    a = bl.summarize(runs, reward_changed=changed)["targets"]["a_direct_transparent_solve"]
    assert a["met"] is None and "reward_settings.end_health_per_hp=0" in a["reason"]
    seed2 = a["conditions"]["transparent"]["per_seed"]["2"]
    assert seed2["final_return"] == pytest.approx(-430.0, abs=0.05) and seed2["kill_rate"] == 1.0
    assert seed2["met"] is None
    assert bl.summarize(runs)["targets"]["a_direct_transparent_solve"]["met"] is False
    # A kill rate below 0.95 fails the target in any reward: transparent seed 1 kills in 1 episode of 4.
    runs["transparent"]["1"] = _chance(1)
    a = bl.summarize(runs, reward_changed=changed)["targets"]["a_direct_transparent_solve"]
    assert a["met"] is False and a["conditions"]["transparent"]["per_seed"]["1"]["met"] is False
    assert a["conditions"]["direct"]["met"] is None
    # The other targets are relative (to direct, to zero) and read as usual.
    t = bl.summarize(_runs(), reward_changed=changed)["targets"]
    assert t["b_transparent_speed"]["met"] is True and t["c_sim_beats_zero"]["met"] is True


def test_off_basic_the_target_is_beating_random_within_the_budget():
    out = bl.summarize(_runs(), scenario="defend_the_center", budget=100_000)
    assert list(out["targets"]) == ["d_beat_random"]  # basic's targets are not read here
    assert any("not read on defend_the_center" in note for note in out["notes"])
    assert out["summary"]["sim"]["p_value_vs_zero"] == pytest.approx(1 / 252)  # the statistics stay
    d = out["targets"]["d_beat_random"]
    assert d["met"] is True and d["reason"] is None
    assert d["conditions"]["transparent"]["p_value"] == pytest.approx(1 / 252)
    assert d["holm"] == {"transparent": pytest.approx(2 / 252), "sim": pytest.approx(2 / 252)}
    # Over the budget the same runs do not meet it.
    over = bl.summarize(_runs(), scenario="defend_the_center", budget=100_001)["targets"]["d_beat_random"]
    assert over["met"] is False and "100,001 env steps, is over 100,000" in over["reason"]
    unknown = bl.summarize(_runs(), scenario="defend_the_center")["targets"]["d_beat_random"]
    assert unknown["met"] is None and "not recorded" in unknown["reason"]


def test_a_condition_no_better_than_random_fails_the_target_off_basic():
    runs = _runs()
    # sim: the random runs shifted by less than the seeds' spread, so the ranks interleave.
    runs["sim"] = {seed: [(st, r + 0.0015, k) for st, r, k in eps] for seed, eps in runs["random"].items()}
    out = bl.summarize(runs, scenario="defend_the_center", budget=20_000)
    assert out["summary"]["sim"]["vs_random"]["p_value"] > 0.01
    d = out["targets"]["d_beat_random"]
    assert d["met"] is False
    assert d["conditions"]["sim"]["met"] is False and d["conditions"]["transparent"]["met"] is True
    # Without random there is nothing to read.
    none = bl.summarize(_runs(conditions=("direct", "transparent", "sim")), scenario="defend_the_center", budget=1)
    assert none["targets"]["d_beat_random"]["met"] is None
    assert "random not run" in none["targets"]["d_beat_random"]["reason"]


def _long_runs(drop: str | None = None, budget_steps: int = 100_000) -> bl.Runs:
    """direct, transparent and sim trained by the default budget; `drop` ends worse than it was there."""
    per_iteration = 10
    n = budget_steps // STEPS_PER_ITERATION * per_iteration
    runs: bl.Runs = {}
    for condition in ("direct", "transparent", "sim"):
        runs[condition] = {}
        for seed in range(SEEDS):
            episodes = []
            for i in range(n):
                steps = float((i // per_iteration + 1) * STEPS_PER_ITERATION)
                trained = 100 <= i < n - 100 or condition != drop and i >= 100
                episodes.append((steps, (HIGH if trained else LOW) + 0.001 * seed + 0.01 * (i % 7), trained))
            runs[condition][str(seed)] = episodes
    return runs


def test_a_longer_run_is_read_against_its_own_default_budget():
    runs = _long_runs()
    out = bl.summarize(runs, budget=100_000)
    d = out["drift"]["direct"]["per_seed"]["0"]
    assert d["cut_env_steps"] == bl.DEFAULT_ENV_STEPS  # the iteration at which a 20,000-step run stops
    default_run = [e for e in runs["direct"]["0"] if e[0] <= bl.DEFAULT_ENV_STEPS]
    assert d["return_at_default"] == pytest.approx(bl._final_return(default_run))
    assert d["kill_rate_at_default"] == pytest.approx(bl._final_kill_rate(default_run))
    assert d["return_at_end"] == pytest.approx(bl._final_return(runs["direct"]["0"]))
    target = out["targets"]["e_no_drift"]
    assert target["met"] is True and target["reason"] is None
    assert set(target["conditions"]) == {"direct", "transparent", "sim"}


def test_a_condition_that_ends_worse_fails_no_drift():
    out = bl.summarize(_long_runs(drop="sim"), budget=100_000)
    target = out["targets"]["e_no_drift"]
    assert target["met"] is False
    assert target["conditions"]["sim"]["met"] is False and target["conditions"]["direct"]["met"] is True
    sim = out["drift"]["sim"]
    assert sim["return"]["mean_difference"] == pytest.approx(LOW - HIGH, abs=0.1)
    assert sim["kill_rate"]["mean_difference"] == pytest.approx(-1.0)
    assert sim["return"]["signed_rank_p_worse"] == pytest.approx(1 / 32)  # every seed worse: 5 seeds' floor
    low, high = sim["return"]["ci95_paired"]
    assert low <= sim["return"]["mean_difference"] <= high < 0
    assert "sim at the end - at 20,000: return -120.0" in bl.table(out)


def test_no_drift_is_read_only_at_five_times_the_default_budget():
    assert "drift" not in bl.summarize(_long_runs(budget_steps=20_000), budget=20_000)
    assert "e_no_drift" not in bl.summarize(_long_runs(budget_steps=20_000), budget=20_000)["targets"]
    out = bl.summarize(_long_runs(budget_steps=40_000), budget=40_000)
    assert out["targets"]["e_no_drift"]["met"] is None
    assert "under 100,000" in out["targets"]["e_no_drift"]["reason"]
    few = bl.summarize({c: dict(list(r.items())[:4]) for c, r in _long_runs().items()}, budget=100_000)
    assert (
        few["targets"]["e_no_drift"]["met"] is None and "fewer than 5 seeds" in few["targets"]["e_no_drift"]["reason"]
    )


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
    return json.loads(json.dumps(json_safe(bl.build_result(settings, runs, {}, 12.0))))


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


def test_the_figure_names_settings_changed_from_the_defaults():
    """A reader of the figure alone must see that its returns are another reward's, or its learner another's."""
    settings = _result(_runs())["settings"]
    assert "\n" not in bl.figure_title(settings)
    changed = settings | {"env": {"reward_settings": {"end_health_per_hp": 0}}, "ppo": {"lr": [[0, 0.01], [10, 0.001]]}}
    second = bl.figure_title(changed).split("\n")[1]
    assert second == (
        "--env reward_settings.end_health_per_hp=0 --ppo lr=[[0, 0.01], [10, 0.001]] "
        "(returns in another reward than the default)"
    )
    features = settings | {"env": {"feature_settings": {"kills_scale": 20.0}}}
    assert bl.figure_title(features).split("\n")[1] == "--env feature_settings.kills_scale=20.0"


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
    # The learner's thread count changes every episode after the first weights: runs of two counts are not pooled;
    # a file from before the count was recorded has none to compare.
    threads = bl.learner_torch_threads()
    now = same | {"learner_torch_threads": threads}
    assert bl.check_resume(result, now) == _runs(conditions=("direct", "zero"), seeds=2)
    counted = dict(result, settings=same | {"learner_torch_threads": threads + 1})
    with pytest.raises(ValueError, match="learner thread count"):
        bl.check_resume(counted, now)


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
    assert zero["devices"] == [{"device_id": "zero", "backend": "zero", "realtime": False}]  # no culture to knob
    assert bl.experiment_dict("sim", 2, "basic", base)["devices"] == [
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
    from spikeloop.experiments.cli import BENCHMARKS

    assert BENCHMARKS["learning"][0] == "spikeloop.experiments.benchmarks.learning"


def test_feedback_control_experiments_validate_and_differ_only_where_they_should():
    from spikeloop.experiments.schema import experiment_from_dict

    base = bl.BASE_EXPERIMENT | {"sim_device": {"culture": {"dopamine_tau_ms": 300.0}}}
    built = {c: experiment_from_dict(bl.experiment_dict(c, 4, base=base)) for c in bl.FEEDBACK_CONDITIONS}
    for condition, (rule, feedback_on, settle) in bl.FEEDBACK_CONDITIONS.items():
        e = built[condition]
        device = e.devices[0]
        assert device.culture is not None and device.culture.rule == rule and device.seed == 4
        assert device.culture.dopamine_tau_ms == 300.0  # --culture reaches every condition's culture
        assert device.feedback_settle_ms == (bl.FEEDBACK_SETTLE_MS if settle else 0.0)
        assert e.feedback.enabled == feedback_on
        if feedback_on:  # good and bad news on basic: the event table at its base values, no episode feedback
            assert not e.feedback.use_reward_feedback and not e.feedback.use_episode_feedback
            assert not e.feedback.surprise.enabled
    on, off = built["dopamine_on_settle"].plain(), built["dopamine_off"].plain()
    assert {k for k in on if on[k] != off[k]} == {"name", "devices", "feedback"}


def test_control_cultures_reach_the_device_and_culture_flag_wins():
    from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig
    from spikeloop.experiments.schema import experiment_from_dict

    default = SimulatedCultureConfig()
    for condition, (rule, _, _) in bl.FEEDBACK_CONDITIONS.items():
        culture = experiment_from_dict(bl.experiment_dict(condition, 0)).devices[0].culture
        control = bl.control_culture(condition)
        assert culture.rule == rule
        assert culture.excitatory_weight_mv == control.get("excitatory_weight_mv", default.excitatory_weight_mv)
        assert culture.maturation_ms == control.get("maturation_ms", default.maturation_ms)
        assert bl._culture(condition)["excitatory_weight_mv"] == culture.excitatory_weight_mv  # what is recorded
    assert bl.CONTROL_CULTURES["dopamine_stdp"]  # the positive control's culture is not today's
    # The frozen control is the positive control's culture with fixed weights: only the rule differs.
    frozen, plastic = (
        experiment_from_dict(bl.experiment_dict(c, 0)) for c in ("dopamine_frozen_on_settle", "dopamine_on_settle")
    )
    assert frozen.devices[0].culture.rule == "none" and plastic.devices[0].culture.rule == "dopamine_stdp"
    assert frozen.devices[0].culture.excitatory_weight_mv == plastic.devices[0].culture.excitatory_weight_mv == 6.0
    assert frozen.devices[0].feedback_settle_ms == plastic.devices[0].feedback_settle_ms == bl.FEEDBACK_SETTLE_MS
    assert frozen.feedback == plastic.feedback
    base = bl.BASE_EXPERIMENT | {"sim_device": {"culture": {"excitatory_weight_mv": 5.0}}}
    culture = experiment_from_dict(bl.experiment_dict("dopamine_off", 0, base=base)).devices[0].culture
    assert culture.excitatory_weight_mv == 5.0 and culture.rule == "dopamine_stdp"  # --culture goes on top
    assert bl._culture("dopamine_off", {"excitatory_weight_mv": 5.0})["excitatory_weight_mv"] == 5.0


def test_feedback_effects_pair_on_with_off_by_seed():
    runs = {
        "stdp_on": _runs(conditions=("sim",))["sim"],  # a learner in every seed
        "stdp_off": {str(s): _chance(s) for s in range(SEEDS)},
    }
    effects = bl.summarize(runs)["feedback_effects"]
    assert set(effects) == {"stdp_on - stdp_off"}
    r = effects["stdp_on - stdp_off"]["final_return"]
    assert r["mean_difference"] == pytest.approx(HIGH - CHANCE)
    low, high = r["ci95_paired"]
    assert low <= r["mean_difference"] <= high
    assert r["mann_whitney_p_greater"] == pytest.approx(1 / 252)  # every on seed above every off seed
    assert r["wilcoxon_p_greater"] == pytest.approx(1 / 32)  # five pairs, all positive: the paired test's floor
    assert r["cliffs_delta"] == 1.0


def test_feedback_effects_paired_test_is_exact_with_zero_and_tied_differences():
    """Kill rates often tie (1.00) and pairs often differ by nothing: the signed-rank p counts them exactly."""
    from spikeloop.experiments.analysis.stats import signed_rank_test

    kill_on, kill_off = [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]  # per seed, episode "killed" flags at the end
    runs = {
        "stdp_on": {str(s): [(1000.0, -450.0 + s, bool(kill_on[s]))] * 100 for s in range(SEEDS)},
        "stdp_off": {str(s): [(1000.0, -470.0 + 2 * s, bool(kill_off[s]))] * 100 for s in range(SEEDS)},
    }
    effects = bl.summarize(runs)["feedback_effects"]["stdp_on - stdp_off"]
    kill = effects["kill_rate"]
    assert list(kill["per_seed_difference"].values()) == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert kill["wilcoxon_p_greater"] == pytest.approx(1 / 4)  # two non-zero differences, tied: 1 of 4 signings
    ret = effects["final_return"]  # differences 20, 19, 18, 17, 16: all positive
    assert ret["wilcoxon_p_two_sided"] == pytest.approx(signed_rank_test([20, 19, 18, 17, 16]).p) == 2 / 32


def _refused_before_any_run(capsys, option: str, *cases: tuple[str, str]) -> None:
    """Each `option VALUE` stops the benchmark at its argument check with an error that says `says`."""
    for bad, says in cases:
        with pytest.raises(SystemExit):
            bl.main([option, bad])
        assert says in capsys.readouterr().err, bad


def _recorded_and_resumed_only_alike(key: str, section: dict, refusal: str, **given) -> None:
    """The section is in the settings under `key` (absent without it); a file with it resumes only with it."""
    settings = bl._settings("basic", ["direct"], 1, 1000, **given)
    assert settings[key] == section and key not in bl._settings("basic", ["direct"], 1, 1000)
    result = _result(_runs(conditions=("direct",), seeds=1)) | {"settings": settings}
    assert bl.check_resume(result, dict(settings))
    with pytest.raises(ValueError, match=refusal):
        bl.check_resume(result, bl._settings("basic", ["direct"], 1, 1000))


def test_bench_ppo_flag_is_checked_recorded_and_reaches_every_run(capsys):
    """--ppo sets the learner of every condition: refused before a run starts if the schema refuses it, recorded in
    the settings, and a file measured with other learner settings is not resumed or merged."""
    from spikeloop.experiments.benchmarks.one_run import run_experiment

    _refused_before_any_run(
        capsys,
        "--ppo",
        ("lr=2", "every learning rate must lie in (0, 1)"),
        ("lr=[[5, 0.01]]", "a schedule is [[0, rate]"),
        ("bogus=1", "ppo.bogus: unknown key"),
        ("lr", "write KEY=VALUE with a key of the ppo section"),
        ("env.scenario=arena", "write KEY=VALUE with a key of the ppo section"),
        ("lr=[[0, 0.01]", "the value is not valid YAML"),
    )
    schedule = [[0, 0.01], [20480, 0.01], [40960, 0.001]]
    ppo = bl._section_overrides([f"lr={schedule}", "num_epochs=2"], "basic", "ppo")
    assert ppo == {"lr": schedule, "num_epochs": 2}
    for condition in ("direct", "transparent", "sim"):
        config = run_experiment(condition, 100, "basic", ppo=ppo).algorithm_config()
        assert config.lr == schedule and config.num_epochs == 2, condition
    assert run_experiment("sim", 100, "basic").algorithm_config().lr == 0.01  # the default without --ppo
    _recorded_and_resumed_only_alike("ppo", ppo, r"learner settings \(--ppo\)", ppo=ppo)


def test_bench_model_flag_is_checked_recorded_and_reaches_every_run(capsys):
    """--model sets the module of every condition (encoder, decoder, value net), as --ppo the learner."""
    from spikeloop.experiments.benchmarks.one_run import run_experiment

    _refused_before_any_run(
        capsys,
        "--model",
        ("bogus=1", "model.bogus: unknown key"),
        ("encoder_init_concentration=-3", "model.encoder_init_concentration must be > 2"),
        ("ablation=zero", "set the ablation with the top-level `ablation:` key"),
        ("encoder_hiddens", "write KEY=VALUE with a key of the model section"),
        ("encoder.hiddens=[64]", "write KEY=VALUE with a key of the model section"),
        ("encoder_hiddens=[64", "the value is not valid YAML"),
    )
    model = bl._section_overrides(["encoder_init_concentration=22", "encoder_hiddens=[64, 64]"], "basic", "model")
    assert model == {"encoder_init_concentration": 22, "encoder_hiddens": [64, 64]}
    for condition in ("direct", "transparent", "sim"):
        built = run_experiment(condition, 100, "basic", model=model).model
        assert built.encoder_init_concentration == 22 and tuple(built.encoder_hiddens) == (64, 64), condition
    assert run_experiment("sim", 100, "basic").model.encoder_init_concentration == 42.0  # the default
    _recorded_and_resumed_only_alike("model", model, r"model settings \(--model\)", model=model)
    second = bl.figure_title(bl._settings("basic", ["direct"], 1, 1000, model=model)).split("\n")[1]
    assert second == "--model encoder_init_concentration=22 --model encoder_hiddens=[64, 64]"


def test_bench_culture_flag_is_checked(capsys):
    with pytest.raises(SystemExit):
        bl.main(["--culture", "dopamine_tau_ms=-5"])
    assert "dopamine_tau_ms=-5" in capsys.readouterr().err


def test_feedback_bench_registered_in_the_cli():
    from spikeloop.experiments.cli import BENCHMARKS

    assert BENCHMARKS["feedback"][0] == "spikeloop.experiments.benchmarks.feedback"


def test_feedback_runs_measured_apart_merge_into_one_result_without_running(tmp_path, capsys):
    """The documented split: one file per rule, then --merge writes the union (every run held: no Ray starts)."""
    from spikeloop.experiments.benchmarks import feedback as bench_feedback

    seeds, budget = 2, bl.MIN_ENV_STEPS
    parts = {"dopamine": ("dopamine_on", "dopamine_off"), "none": ("none_on", "none_off")}
    files = []
    for rule, conditions in parts.items():
        runs = {
            c: {str(s): (_learner(100, s) if c.endswith("_on") else _chance(s)) for s in range(seeds)}
            for c in conditions
        }
        settings = bl._settings(bl.SCENARIO, conditions, seeds, budget)
        path = tmp_path / f"fb-{rule}.json"
        measured = {"command": f"spikeloop bench feedback --conditions {' '.join(conditions)}", "git": {"commit": rule}}
        path.write_text(json.dumps(bl.build_result(settings, runs, {}, 1.0) | measured))
        files.append(path)
    out = tmp_path / "feedback.json"
    conditions = [c for cs in parts.values() for c in cs]
    argv = ["--seeds", str(seeds), "--first-seed", "0", "--env-steps", str(budget), "--conditions", *conditions]
    argv += ["--output", str(out)]
    assert bench_feedback.main([*argv, "--merge", str(files[0]), "--merge", str(files[1])]) == 0
    result = json.loads(out.read_text())
    assert set(result["runs"]) == set(conditions) and all(len(result["runs"][c]) == seeds for c in conditions)
    assert set(result["feedback_effects"]) == {"dopamine_on - dopamine_off", "none_on - none_off"}
    assert result["settings"]["culture"]["dopamine_on"]["excitatory_weight_mv"] == 6.0  # the control's culture
    # The merged file keeps where each part was measured: the merge's own commit is not the runs' commit.
    sources = {entry["file"]: entry for entry in result["sources"]}
    assert sources[str(files[0])]["git"] == {"commit": "dopamine"} and sources[str(files[1])]["git"]["commit"] == "none"
    assert sources[str(files[1])]["command"].endswith("none_on none_off") and "git" in result
    # A file measured with another culture for a condition is refused, naming it.
    other = json.loads(files[0].read_text())
    other["settings"]["culture"]["dopamine_off"]["excitatory_weight_mv"] = 4.0
    files[0].write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        bench_feedback.main([*argv, "--output", str(tmp_path / "again.json"), "--merge", str(files[0])])
    assert "culture for dopamine_off" in capsys.readouterr().err


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


def _fresh_file(path, conditions, seeds):
    """A result file of synthetic runs on the given seeds (learners and chance alternating by condition)."""
    runs = {
        c: {str(s): (_learner(100, s) if i % 2 == 0 else _chance(s)) for s in seeds} for i, c in enumerate(conditions)
    }
    settings = bl._settings(bl.SCENARIO, conditions, len(seeds), bl.MIN_ENV_STEPS, first_seed=min(seeds))
    path.write_text(json.dumps(bl.build_result(settings, runs, {}, 1.0)))
    return path


def test_benchmark_seeds_are_held_apart_from_the_tuning_seeds(tmp_path, capsys):
    """Fresh seeds by default; a result never pools tuning and fresh seeds; a tuning-seed result says what it is."""
    assert bl.FRESH_FIRST_SEED not in bl.TUNING_SEEDS and 0 in bl.TUNING_SEEDS
    conditions = ("direct", "zero")
    base = ["--env-steps", str(bl.MIN_ENV_STEPS), "--conditions", *conditions]
    # Fresh seeds 100-102, measured in two files by seed, merge into one result without running anything.
    fresh = range(bl.FRESH_FIRST_SEED, bl.FRESH_FIRST_SEED + 3)
    a = _fresh_file(tmp_path / "a.json", conditions, list(fresh)[:2])
    b = _fresh_file(tmp_path / "b.json", conditions, list(fresh)[2:])
    out = tmp_path / "fresh.json"
    assert bl.main([*base, "--seeds", "3", "--output", str(out), "--merge", str(a), "--merge", str(b)]) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["first_seed"] == bl.FRESH_FIRST_SEED and result["settings"]["seeds"] == 3
    assert result["settings"]["tuning_seeds"] == list(bl.TUNING_SEEDS)
    assert sorted(result["runs"]["direct"]) == [str(s) for s in fresh]
    assert not any("tuning seeds" in note for note in result["notes"])
    # The committed kind: tuning seeds, resumed with --first-seed 0, and the result says so.
    tuned = _fresh_file(tmp_path / "tuned.json", conditions, [0, 1])
    assert bl.main([*base, "--seeds", "2", "--first-seed", "0", "--output", str(tuned), "--resume"]) == 0
    notes = json.loads(tuned.read_text())["notes"]
    assert any("seeds 0, 1 are tuning seeds" in note and "--first-seed 100" in note for note in notes)
    capsys.readouterr()
    # Resuming the tuning-seed file with the default (fresh) seeds is refused, naming both kinds and the fix.
    with pytest.raises(SystemExit):
        bl.main([*base, "--seeds", "2", "--output", str(tuned), "--resume"])
    err = capsys.readouterr().err
    assert "tuning seeds (0, 1" in err and "fresh seeds (100, 101)" in err and "--first-seed 0" in err
    # So is a range that spans both kinds, before anything runs.
    with pytest.raises(SystemExit):
        bl.main([*base, "--seeds", "3", "--first-seed", "4", "--output", str(tmp_path / "span.json")])
    assert "tuning seeds (4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bl.main(["--first-seed", "-1"])
    assert "--first-seed must be >= 0" in capsys.readouterr().err


def test_progress_shows_the_curriculum_level_being_played():
    import time

    from spikeloop.experiments.benchmarks.one_run import _progress

    curriculum_line = _progress(
        "direct", 100, [(512.0, -600.0, True, 0), (1024.0, -400.0, False, 2)], 1024, 0.0, "feedback"
    )
    assert curriculum_line.startswith("[feedback]      direct seed 100:")  # the bench that runs it, not always learning
    assert "return(last 2)   -500.0, kill rate 0.50, level 3," in curriculum_line
    assert "level" not in _progress("direct", 100, [(512.0, -600.0, True)], 512, time.monotonic(), "learning")


def test_bench_env_flag_is_checked_recorded_and_reaches_every_run(capsys):
    """--env sets the env section of every condition (dotted inside reward_settings): refused before a run starts if
    the env refuses it, recorded in the settings, and a file measured with other env settings is not resumed."""
    from spikeloop.experiments.benchmarks.one_run import run_experiment

    _refused_before_any_run(
        capsys,
        "--env",
        ("reward_settings.end_health_per_hp=x", "end_health_per_hp"),
        ("reward_settings.bogus=1", "bogus"),
        ("frame_skip=0", "frame_skip"),
        ("frame_skip", "write KEY=VALUE with a key of the env section"),
        ("scenario=arena", "the level is --scenario's or --curriculum's to set"),
        ("curriculum.scenarios=[basic]", "the level is --scenario's or --curriculum's to set"),
    )
    # With a curriculum, whose threshold is a return in its file's reward, a reward change is refused.
    corridor = str(Path(__file__).resolve().parents[1] / "experiments" / "deadly_corridor.yaml")
    for given in (["--env", "reward_settings.end_health_per_hp=0"], ["--env", "reward_mode=both"]):
        with pytest.raises(SystemExit):
            bl.main(["--curriculum", corridor, *given])
        assert "changes the reward, and the curriculum's threshold is a return" in capsys.readouterr().err, given
    from spikeloop.experiments.benchmarks import curriculum

    file_env = curriculum.load_curriculum_env(Path(corridor))  # settings that leave the reward alone are taken
    for kept in ({"feature_settings": {"kills_scale": 20.0}}, {"reward_mode": "shaped"}, {"frame_skip": 2}):
        assert bl.reward_changes(bl.deep_merge(file_env, kept)) == bl.reward_changes(file_env), kept
    env = bl._section_overrides(["reward_settings.end_health_per_hp=0", "reward_settings.kill=50"], "basic", "env")
    assert env == {"reward_settings": {"end_health_per_hp": 0, "kill": 50}}
    for condition in ("direct", "transparent", "sim"):
        env_config = run_experiment(condition, 100, "basic", env=env).algorithm_config().env_config
        assert env_config["reward_settings"] == env["reward_settings"] and env_config["scenario"] == "basic"
    _recorded_and_resumed_only_alike("env", env, r"env settings \(--env\)", env_overrides=env)
