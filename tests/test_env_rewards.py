"""Reward terms and game events on scripted action sequences in real vizdoom games."""

from __future__ import annotations

import pytest

from spikeloop.envs.doom_env import DoomEnv
from spikeloop.envs.rewards import EVENTS

# "single" action indices
FORWARD, BACKWARD, LEFT, RIGHT, TURN_LEFT, TURN_RIGHT, ATTACK, NOOP = range(8)


@pytest.fixture(scope="module")
def basic():
    env = DoomEnv("basic", action_set="single", reward_mode="both")
    yield env
    env.close()


def _play(env: DoomEnv, actions: list[int]) -> list[tuple[float, bool, bool, dict]]:
    """Step through `actions`, stopping at the episode's end; returns (reward, term, trunc, info) per step."""
    steps = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        steps.append((reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def test_reward_terms_sum_to_reward_and_events_are_reported(basic):
    _, info = basic.reset(seed=1)
    assert info["events"] == dict.fromkeys(EVENTS, 0)
    for reward, _, _, info in _play(basic, [RIGHT, LEFT, ATTACK, NOOP] * 5):
        assert set(info["events"]) == set(EVENTS)
        assert set(info["reward_terms"]) == {"kill", "health_lost", "ammo_spent", "end_health", "scenario"}
        assert reward == pytest.approx(sum(info["reward_terms"].values()))
        assert {"kills", "health", "ammo"} <= set(info)


def test_shooting_at_nothing_is_ammo_waste_and_costs_10(basic):
    basic.reset(seed=1)
    _play(basic, [RIGHT] * 6)  # the monster spawns ahead-left: step well away from its line
    steps = _play(basic, [ATTACK] + [NOOP] * 4)
    wasted = [info for _, _, _, info in steps if info["events"]["ammo_waste"]]
    assert len(wasted) == 1
    info = wasted[0]
    assert info["events"] == {"enemy_kill": 0, "took_damage": 0, "ammo_waste": 1, "armor_pickup": 0}
    assert info["reward_terms"]["ammo_spent"] == -10.0
    assert info["reward_terms"]["kill"] == 0.0


def test_aiming_and_shooting_in_basic_kills_for_100(basic):
    observation, _ = basic.reset(seed=1)
    for _ in range(40):
        bearing_sin = observation[9 + 1]  # enemy slot 0: sin of the bearing, > 0 to the left
        action = LEFT if bearing_sin > 0.02 else RIGHT if bearing_sin < -0.02 else ATTACK
        observation, reward, terminated, truncated, info = basic.step(action)
        if info["events"]["enemy_kill"]:
            break
    else:
        pytest.fail("the scripted aim never killed the monster")
    assert info["events"]["enemy_kill"] == 1
    assert info["events"]["ammo_waste"] == 0  # the round that killed was not wasted
    assert info["reward_terms"]["kill"] == 100.0
    assert info["kills"] == 1
    assert terminated and not truncated  # basic ends when its monster dies
    # the reference design's end term: -5 per HP left at the end of the episode
    assert info["reward_terms"]["end_health"] == -5.0 * info["health"]


def test_timeout_truncates_and_charges_remaining_health(basic):
    basic.reset(seed=2)
    steps = _play(basic, [NOOP] * 200)
    reward, terminated, truncated, info = steps[-1]
    assert truncated and not terminated
    assert info["health"] == 100
    assert info["reward_terms"]["end_health"] == -500.0
    assert all(s[3]["reward_terms"]["end_health"] == 0.0 for s in steps[:-1])


def test_taking_damage_in_arena_is_an_event_and_costs_5_per_hp():
    env = DoomEnv("arena", action_set="single", reward_mode="shaped")
    try:
        _, info = env.reset(seed=3)
        health = info["health"]
        for _ in range(400):  # stand still until a demon bites
            _, reward, terminated, truncated, info = env.step(NOOP)
            if info["events"]["took_damage"] or terminated or truncated:
                break
        assert info["events"]["took_damage"] == 1
        lost = health - info["health"]
        assert lost > 0
        assert info["reward_terms"]["health_lost"] == -5.0 * lost
        assert set(info["reward_terms"]) == set(("kill", "health_lost", "ammo_spent", "end_health"))
    finally:
        env.close()


def test_scenario_reward_mode_passes_the_game_reward_through(basic):
    env = DoomEnv("basic", action_set="single", reward_mode="scenario")
    try:
        env.reset(seed=1)
        _, reward, _, _, info = env.step(NOOP)
        assert info["reward_terms"] == {"scenario": reward}
        assert reward == -4.0  # basic's living reward, -1 per tic, 4 tics per step
    finally:
        env.close()


def test_custom_coefficients_change_the_terms():
    env = DoomEnv("basic", action_set="single", reward_settings={"ammo_spent_per_round": -1.0})
    try:
        env.reset(seed=1)
        _play(env, [RIGHT] * 6)
        steps = _play(env, [ATTACK] + [NOOP] * 4)
        assert [s[3]["reward_terms"]["ammo_spent"] for s in steps if s[3]["events"]["ammo_waste"]] == [-1.0]
    finally:
        env.close()


def test_running_onto_the_armor_in_deadly_corridor_is_an_armor_pickup(tmp_path):
    # deadly_corridor's map at the easiest skill: running straight ahead reaches the green armor.
    cfg = tmp_path / "corridor_easy.cfg"
    cfg.write_text(
        "doom_scenario_path = deadly_corridor.wad\ndoom_skill = 1\nepisode_timeout = 2100\n"
        "available_buttons = { MOVE_FORWARD MOVE_BACKWARD MOVE_LEFT MOVE_RIGHT TURN_LEFT TURN_RIGHT ATTACK }\n"
    )
    env = DoomEnv(cfg, action_set="single")
    try:
        env.reset(seed=1)
        pickups = [s[3]["events"]["armor_pickup"] for s in _play(env, [FORWARD] * 300)]
        assert sum(pickups) == 1
    finally:
        env.close()
