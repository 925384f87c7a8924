"""The `design:` section: Williams orders, the schedule from a seed, and the refusals of a design no lab can run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from spikeloop.experiments.design.schedule import schedule, timing
from spikeloop.experiments.design.settings import DesignSection
from spikeloop.experiments.design.williams import (
    carry_over_counts,
    deal,
    deal_count,
    every_deal,
    is_balanced,
    williams_rows,
)
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict


@pytest.mark.parametrize("k", range(1, 13))
def test_williams_rows_are_balanced_for_first_order_carry_over(k):
    rows = williams_rows(k)
    assert len(rows) == (2 * k if k % 2 and k > 1 else k)
    assert is_balanced(rows)
    if k > 1:
        pairs = carry_over_counts(rows)
        assert set(pairs) == {(a, b) for a in range(k) for b in range(k) if a != b}
        assert len(set(pairs.values())) == 1


def test_a_latin_square_that_is_not_williams_is_not_called_balanced():
    cyclic = [[(c + shift) % 4 for c in range(4)] for shift in range(4)]  # 0>1 in every row: never 1>0
    assert not is_balanced(cyclic)


@pytest.mark.parametrize(("k", "cultures"), [(2, 5), (3, 6), (4, 8), (3, 4)])
def test_deal_repeats_for_its_seed_and_is_one_of_every_outcome(k, cultures):
    rows, dealt = deal(k, cultures, seed=11)
    assert deal(k, cultures, seed=11) == (rows, dealt)
    assert all(sorted(order) == list(range(k)) for order in dealt)
    outcomes = list(every_deal(k, cultures))
    assert len(outcomes) == deal_count(k, cultures)
    assert dealt in outcomes
    # A whole number of sets of orders: every order used equally often.
    if cultures % len(rows) == 0:
        assert len(set(Counter(tuple(o) for o in dealt).values())) == 1


def test_the_seed_moves_the_orders():
    assert len({str(deal(4, 8, seed)[1]) for seed in range(20)}) > 10


def _experiment(design: dict, devices: list | None = None, **extra) -> dict:
    return {
        "devices": devices
        or [
            {"device_id": "cl1-a", "backend": "cl1", "host": "10.0.0.5"},
            {"device_id": "cl1-b", "backend": "cl1", "host": "10.0.0.6"},
        ],
        "design": {
            "cultures": [{"culture_id": f"dish-{i}", "device": "cl1-ab"[:4] + "ab"[i % 2]} for i in range(4)],
            "conditions": {"feedback.enabled": [True, False]},
            "block_env_steps": 1024,
            **design,
        },
        **extra,
    }


def test_a_design_schedules_every_culture_through_every_condition():
    experiment = experiment_from_dict(
        _experiment({"conditions": {"feedback.enabled": [True, False], "feedback.surprise.enabled": [True, False]}})
    )
    plan = schedule(experiment.design)
    assert plan.balanced()
    blocks = plan.blocks()
    assert len(blocks) == 16
    for culture in plan.cultures:
        mine = [b for b in blocks if b.culture_id == culture["culture_id"]]
        assert sorted(b.condition for b in mine) == [0, 1, 2, 3]
        assert [b.previous for b in mine] == [None, *[b.condition for b in mine[:-1]]]
        assert culture["culture_seed"] is None  # a real dish has no seed
    # Conditions as the grid lists them; the schedule reads back from its record.
    assert [c.values for c in plan.conditions][1] == {"feedback.enabled": True, "feedback.surprise.enabled": False}
    assert type(plan).from_json(plan.to_json()).blocks() == blocks


def test_timing_counts_rests_and_lets_cultures_on_one_device_take_turns():
    design = DesignSection(
        cultures=[{"culture_id": f"d{i}", "device": "a" if i < 3 else "b"} for i in range(4)],
        conditions={"x": [1, 2]},
        repeats=2,
        block_minutes=10,
        rest_s=60,
    )
    span = timing(design, exchange_s=0.1, rounds=1)
    assert span.per_culture_s == 4 * 600 + 3 * 60
    assert span.per_device_s == {"a": 3 * span.per_culture_s, "b": span.per_culture_s}
    assert span.device_hours == pytest.approx(4 * span.per_culture_s / 3600)
    assert span.wall_s == 3 * span.per_culture_s


@pytest.mark.parametrize(
    ("design", "extra", "message"),
    [
        ({"block_minutes": 5}, {}, "exactly one of block_env_steps or block_minutes"),
        ({"cultures": [{"culture_id": "d", "device": "cl1-z"}]}, {}, "design.cultures.0.device: 'cl1-z' is not a"),
        ({"cultures": [{"culture_id": "d", "device": "cl1-a", "culture_seed": 3}]}, {}, "whose dish is real"),
        (
            {"cultures": [{"culture_id": "d", "device": "cl1-a"}, {"culture_id": "d", "device": "cl1-b"}]},
            {},
            "culture_id 'd' is listed twice",
        ),
        ({"conditions": {"feedback.enabled": [True]}}, {}, "at least 2 conditions"),
        ({"conditions": {"feedback.bogus": [1, 2]}}, {}, "design.conditions.feedback.bogus"),
        ({"conditions": {"ppo.lr": [0.1, -5]}}, {}, "design.conditions.ppo.lr: the value -5"),
        ({}, {"tune": {"seeds": 3}}, "a seed is not a culture"),
        ({}, {"tune": {"search_space": {"ppo.lr": {"grid": [0.1, 0.2]}}}}, "leave tune.search_space empty"),
        ({"cultures": [{"culture_id": "a b", "device": "cl1-a"}]}, {}, "design.cultures.0.culture_id"),
        ({"rest_s": -1}, {}, "design.rest_s"),
        ({}, {"protocol": "rest-play-rest"}, "use one or the other"),
        ({"fresh": "nothing"}, {}, "design.fresh"),
    ],
)
def test_a_design_no_lab_can_run_is_refused_naming_its_key(design, extra, message):
    with pytest.raises(ExperimentError) as info:
        experiment_from_dict(_experiment(design, **extra))
    assert message in str(info.value)


def test_a_simulated_culture_gets_a_culture_seed_of_its_own():
    experiment = experiment_from_dict(
        _experiment(
            {
                "cultures": [
                    {"culture_id": "s0", "device": "sim"},
                    {"culture_id": "s1", "device": "sim", "culture_seed": 40},
                ]
            },
            devices=[{"device_id": "sim", "backend": "sim"}],
        )
    )
    from spikeloop.experiments.design.plan import design_schedule

    seeds = [c["culture_seed"] for c in design_schedule(experiment).cultures]
    assert seeds == [0, 40]


def _check(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "design.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "check", str(path), "--exchanges", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_check_prints_the_schedule_the_device_time_and_what_it_can_show(tmp_path):
    data = _experiment(
        {
            "seed": 5,
            "cultures": [{"culture_id": f"dish-{i}", "device": "cl1-ab"[:4] + "ab"[i % 2]} for i in range(8)],
            "conditions": {"feedback.enabled": [True, False], "feedback.surprise.enabled": [True, False]},
            "block_env_steps": 3000,
            "rest_s": 120,
            "spread": {"within_culture": 10.0, "between_culture": 25.0},
        },
        resources={"num_env_runners": 2},
    )
    done = _check(tmp_path, data)
    out = done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert "design: 8 culture(s) x 4 conditions x 1 pass(es) = 32 blocks" in out
    plan = schedule(experiment_from_dict(data).design)
    for culture in plan.cultures:  # the orders check prints are the ones the schedule deals
        order = " > ".join(f"C{c}" for c in culture["sequence"])
        assert f"{culture['culture_id']} on {culture['device']}: {order}" in out
    assert "balanced for first-order carry-over (8 cultures = 2 x 4 orders)" in out
    # 4 blocks of 300 s and 3 rests of 120 s per culture; 4 cultures per device, taking turns.
    assert "culture time: 26 min per culture; 3.5 device-hours in all; 1.7 h with the devices side by side" in out
    assert "smallest effect it can show with 80% power" in out and "within-culture s.d." in out
    assert "checked on 400 made-up runs of this design: with nothing planted" in out
    assert "(the model takes it out)" in out


def test_check_shows_what_a_fixed_order_cannot_do():
    from spikeloop.experiments.design import plan as design_plan

    data = _experiment(
        {
            "order": "fixed",
            "conditions": {"feedback.enabled": [True, False], "feedback.surprise.enabled": [True, False]},
            "spread": {"within_culture": 10.0},
        },
        resources={"num_env_runners": 2},
    )
    text = "\n".join(design_plan.lines(experiment_from_dict(data)))
    assert "order: fixed, every culture the same order" in text
    assert "nothing can come out significant (no randomisation to test by)" in text
    assert re.search(r"moves an estimate by (0.9\d|1.0\d) s.d. at most \(the order confounds it\)", text), text


def test_check_says_when_too_few_cultures_can_show_nothing(tmp_path):
    data = _experiment(
        {
            "conditions": {"feedback.enabled": [True, False], "feedback.surprise.enabled": [True, False]},
            "spread": {"within_culture": 10.0},
        },
        resources={"num_env_runners": 2},
    )
    out = _check(tmp_path, data).stdout
    assert "smallest effect it can show: none: 4 culture(s) give too few orderings" in out
    assert "(8 cultures can)" in out


def test_a_sweep_on_one_real_dish_is_read_at_the_dish_level_with_no_per_trial_tests(tmp_path):
    """A hardware sweep's seeds are trials on one dish, one after another: never counted as cultures."""
    import numpy as np

    from tests.support.spikeloop_cli import run_spikeloop
    from tests.support.sweep_runs import BASE, write_sweep

    end = "env.reward_settings.end_health_per_hp"

    def episodes(point: dict, seed: int) -> list[tuple[float, bool]]:
        rng = np.random.default_rng(seed)
        return [(-480 + (40 if point[end] == -4.0 else 0) + rng.normal(0, 5), True) for _ in range(120)]

    base = BASE | {
        "devices": [{"device_id": "cl1-a", "backend": "cl1", "host": "10.0.0.5"}],
        "resources": {"num_env_runners": 1},
    }
    run = write_sweep(tmp_path / "run", {end: {"grid": [-5.0, -4.0]}}, 6, episodes, base=base)
    done = run_spikeloop(["analyze", str(run)], timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # The seed-paired table would call a 40-point effect over six "seeds" significant; none of it is printed.
    assert "| configuration | seeds |" not in out and "signed-rank over cultures" not in out
    assert "cultures: 1 (the unit); blocks: 12" in out
    assert "every trial ran on the same dish(es) (cl1-a)" in out
    assert "one culture: no test across cultures" in out and "no randomisation test" in out
    written = json.loads((run / "analysis.json").read_text())
    assert written["unit"] == "culture"
