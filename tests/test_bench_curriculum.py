"""`spikeloop bench learning --curriculum`: levels reached, the last level's figures and the target, on synthetic
runs (no Ray, no VizDoom); the run itself records each episode's level (checked by the learning benchmark's
runs, models/closed_loop/callbacks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spikeloop.experiments.benchmarks import curriculum
from spikeloop.experiments.benchmarks import learning as bl

REPO = Path(__file__).resolve().parents[1]
LEVELS = ["deadly_corridor_1", "deadly_corridor_2", "deadly_corridor_3", "deadly_corridor_4", "deadly_corridor_5"]


def _run(levels_played: list[int], final: float, seed: int, per_level: int = 120) -> list[bl.Episode]:
    """Episodes through the given levels (0-based), `per_level` each; the last level's returns are `final`."""
    episodes: list[bl.Episode] = []
    for level in levels_played:
        for i in range(per_level):
            value = final + 0.01 * seed if level == levels_played[-1] else -500.0 + i
            episodes.append((float(1000 * (len(episodes) // 10 + 1)), value, i % 2 == 0, level))
    return episodes


def _runs(random_reaches_last: bool) -> bl.Runs:
    return {
        "transparent": {str(s): _run([0, 1, 2, 3, 4], -100.0, s) for s in range(5)},
        "random": {
            str(s): _run([0, 1, 2, 3, 4] if random_reaches_last else [0, 1][: 1 + s % 2], -300.0, s) for s in range(5)
        },
    }


def test_levels_reached_and_the_last_level_figures() -> None:
    summary = curriculum.summarize(_runs(random_reaches_last=False), LEVELS, bl.ALPHA)
    mine, floor = summary["conditions"]["transparent"], summary["conditions"]["random"]
    assert mine["level_reached"] == {str(s): 5 for s in range(5)} and mine["reached_last_level"] == 5
    assert mine["episodes_at_last_level"]["0"] == 120
    assert mine["env_steps_to_last_level"]["0"] == 1000 * (480 // 10 + 1)
    # The last 100 episodes at the last level: -100 + 0.01 seed.
    assert mine["final_return_at_last_level"]["3"] == pytest.approx(-99.97)
    assert floor["level_reached"] == {"0": 1, "1": 2, "2": 1, "3": 2, "4": 1} and floor["reached_last_level"] == 0
    assert floor["final_return_at_last_level"] == {str(s): None for s in range(5)}
    versus = summary["vs_random"]["transparent"]
    # 5 at level 5 against 1-2: complete separation, the exact test's floor with ties in both groups.
    assert versus["level_reached"]["p"] == pytest.approx(1 / 252) and versus["level_reached"]["cliffs_delta"] == 1.0
    assert versus["final_return_at_last_level"]["p"] is None  # random never got there
    target = curriculum.target(summary)
    assert target["met"] is True and target["compared_by"] == "level_reached"


def test_the_target_compares_returns_at_the_last_level_when_both_got_there() -> None:
    summary = curriculum.summarize(_runs(random_reaches_last=True), LEVELS, bl.ALPHA)
    target = curriculum.target(summary)
    assert target["compared_by"] == "final_return_at_last_level" and target["p"] == pytest.approx(1 / 252)
    assert target["met"] is True
    # A transparent seed that stops at level 4 fails "every seed", whatever the test says.
    runs = _runs(random_reaches_last=True)
    runs["transparent"]["2"] = _run([0, 1, 2, 3], -100.0, 2)
    assert curriculum.target(curriculum.summarize(runs, LEVELS, bl.ALPHA))["met"] is False
    assert curriculum.target(curriculum.summarize({"random": runs["random"]}, LEVELS, bl.ALPHA))["met"] is None


def test_a_curriculum_result_keeps_each_episodes_level_and_reads_them_back() -> None:
    runs = _runs(random_reaches_last=False)
    env = curriculum.load_curriculum_env(REPO / "experiments" / "deadly_corridor.yaml")
    assert env["scenario"] == "deadly_corridor_1" and env["curriculum"]["scenarios"] == LEVELS
    settings = bl._settings(env["scenario"], ["transparent", "random"], 5, 60_000, env=env)
    result = json.loads(json.dumps(bl.build_result(settings, runs, {}, 1.0)))
    assert result["runs"]["transparent"]["0"]["level"][-1] == 4
    assert bl.runs_from_result(result) == runs
    assert result["curriculum"]["conditions"]["random"]["reached_last_level"] == 0
    assert result["targets"]["curriculum_transparent"]["met"] is True
    assert any("mix its levels" in note for note in result["notes"])
    # A resume with another curriculum is refused.
    other = settings | {"curriculum_env": env | {"curriculum": env["curriculum"] | {"threshold": 0.0}}}
    with pytest.raises(ValueError, match="curriculum"):
        bl.check_resume(result, other)


def test_curriculum_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bl.main(["--curriculum", str(REPO / "experiments" / "quickstart.yaml")])
    assert "has no curriculum with scenarios" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bl.main(["--curriculum", str(tmp_path / "missing.yaml")])
    assert "cannot read it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bl.main(["--curriculum", str(REPO / "experiments" / "deadly_corridor.yaml"), "--scenario", "defend_the_center"])
    assert "not both" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not one of the curriculum"):
        curriculum.stage_index("basic", LEVELS)
