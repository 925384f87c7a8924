"""The deadly corridor curriculum on vizdoom's own map: five stages at skill 1 to 5, played by the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from spikeloop.envs.doom_env import DoomEnv
from spikeloop.envs.scenarios import VIZDOOM_SCENARIOS_DIR, resolve_scenario
from spikeloop.experiments.schema import load_experiment

REPO = Path(__file__).resolve().parents[1]
STAGES = [f"deadly_corridor_{n}" for n in range(1, 6)]


@pytest.mark.parametrize("skill", range(1, 6))
def test_each_stage_is_vizdooms_map_at_its_skill(skill: int) -> None:
    scenario = resolve_scenario(f"deadly_corridor_{skill}")
    assert scenario.wad_path == (VIZDOOM_SCENARIOS_DIR / "deadly_corridor.wad").resolve()  # no WAD of our own
    assert scenario.enemy_names == resolve_scenario("deadly_corridor").enemy_names
    env = DoomEnv(scenario=f"deadly_corridor_{skill}")
    try:
        assert env.game.get_doom_skill() == skill
        assert env.game.get_episode_timeout() == 1500  # the reference's stages, not vizdoom's 2100
        env.reset(seed=0)
        # The README's "6 monsters": two each of zombieman, shotgun guy and chaingunner at every skill,
        # all of them names the enemy features track.
        monsters = [o.name for o in env.game.get_state().objects if o.name not in ("DoomPlayer", "GreenArmor")]
        assert sorted(monsters) == sorted(["Zombieman", "ShotgunGuy", "ChaingunGuy"] * 2)
        assert set(monsters) <= set(scenario.enemy_names or ())
        _, _, terminated, truncated, info = env.step(0)
        assert info["scenario"] == f"deadly_corridor_{skill}"
    finally:
        env.close()


def test_the_curriculum_experiment_walks_the_five_stages() -> None:
    experiment = load_experiment(REPO / "experiments" / "deadly_corridor.yaml")
    curriculum = dict(experiment.env["curriculum"])
    assert curriculum["scenarios"] == STAGES
    # Its env, with a threshold every episode passes: each reset after an episode is the next stage, harder.
    env = DoomEnv(**(experiment.env | {"curriculum": curriculum | {"threshold": -1e9, "window_episodes": 1}}))
    try:
        skills = []
        for _ in STAGES:
            env.reset(seed=0)
            skills.append(env.game.get_doom_skill())
            env.curriculum.record(0.0)  # an episode of this stage ended
        assert skills == [1, 2, 3, 4, 5]
    finally:
        env.close()
