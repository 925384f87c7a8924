"""DoomEnv on real vizdoom games: scenarios, bad input, spaces, determinism, screen, registration."""

from __future__ import annotations

import time

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from spikeloop.envs import GYM_ID, RAY_ENV_NAME, register
from spikeloop.envs.actions import action_buttons
from spikeloop.envs.doom_env import DoomEnv
from spikeloop.envs.features import FeatureSettings, feature_names
from spikeloop.envs.scenarios import DEFAULT_SCENARIO, available_scenarios, resolve_scenario


@pytest.fixture(scope="module")
def arena():
    env = DoomEnv()
    yield env
    env.close()


@pytest.mark.parametrize("scenario", available_scenarios())
def test_every_named_scenario_runs_100_random_steps(scenario):
    env = DoomEnv(scenario)
    try:
        env.action_space.seed(0)
        observation, _ = env.reset(seed=0)
        for _ in range(100):
            observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert env.observation_space.contains(observation)
            assert np.isfinite(reward)
            if terminated or truncated:
                observation, _ = env.reset()
    finally:
        env.close()
    assert env.game is None  # closed


def test_default_scenario_is_the_arena(arena):
    assert DEFAULT_SCENARIO == "arena"
    assert arena.scenario.name == "arena"
    assert arena.scenario.cfg_path.parent.name == "scenarios"
    assert arena.scenario.wad_path.name == "defend_the_center.wad"  # a map shipped with vizdoom


def test_unknown_scenario_name_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown scenario 'no_such_map'.*arena.*deadly_corridor"):
        DoomEnv("no_such_map")


def test_missing_cfg_path_fails_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.cfg"):
        DoomEnv(tmp_path / "nowhere.cfg")


def test_missing_wad_fails_naming_it(tmp_path):
    cfg = tmp_path / "broken.cfg"
    cfg.write_text("doom_scenario_path = does_not_exist.wad\navailable_buttons = { ATTACK }\n")
    with pytest.raises(FileNotFoundError, match="does_not_exist.wad"):
        DoomEnv(cfg)


def test_game_variable_the_scenario_lacks_fails_when_not_added():
    # basic.cfg exposes only AMMO2
    with pytest.raises(ValueError, match="'basic'.*lacks game variable.*KILLCOUNT.*HEALTH"):
        DoomEnv("basic", add_missing_game_variables=False)


def test_other_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="unknown vizdoom game variable 'AMMO_X'"):
        DoomEnv("basic", ammo_variable="AMMO_X")
    with pytest.raises(ValueError, match="unknown action_set 'triple'"):
        DoomEnv("basic", action_set="triple")
    with pytest.raises(ValueError, match="unknown reward_mode 'dense'"):
        DoomEnv("basic", reward_mode="dense")


def test_user_cfg_path_reuses_vizdoom_wads(tmp_path):
    cfg = tmp_path / "mine.cfg"
    cfg.write_text("doom_scenario_path = basic.wad\navailable_buttons = { MOVE_LEFT MOVE_RIGHT ATTACK }\n")
    scenario = resolve_scenario(cfg)
    assert scenario.name == "mine" and scenario.wad_path.name == "basic.wad"
    assert scenario.enemy_names is None  # a user cfg: every "Monster" object is an enemy


def test_spaces_and_action_orderings(arena):
    assert arena.observation_space == gymnasium.spaces.Box(-1.0, 1.0, (59,), np.float32)
    assert len(feature_names(FeatureSettings())) == 59
    assert arena.action_space == gymnasium.spaces.Discrete(54)
    joint = action_buttons("joint")
    assert [b.name for b in joint[0]] == ["MOVE_FORWARD", "MOVE_LEFT", "TURN_LEFT", "ATTACK"]
    assert joint[53] == ()  # no-op last
    single = [tuple(b.name for b in buttons) for buttons in action_buttons("single")]
    assert single == [
        ("MOVE_FORWARD",),
        ("MOVE_BACKWARD",),
        ("MOVE_LEFT",),
        ("MOVE_RIGHT",),
        ("TURN_LEFT",),
        ("TURN_RIGHT",),
        ("ATTACK",),
        (),
    ]


def test_buttons_the_scenario_lacks_are_not_pressed():
    env = DoomEnv("basic")  # MOVE_LEFT, MOVE_RIGHT, ATTACK only
    try:
        assert env.action_space.n == 54
        forward_only = 2 * (3 * (3 * 0 + 2) + 2) + 1  # forward, no strafe, no turn, idle
        assert env._actions[forward_only] == [0.0, 0.0, 0.0]
    finally:
        env.close()


def _rollout(env: DoomEnv, seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations and rewards of a seeded episode under a fixed random action sequence."""
    actions = np.random.default_rng(1234).integers(env.action_space.n, size=steps)
    observation, _ = env.reset(seed=seed)
    observations, rewards = [observation], []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(int(action))
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            break
    return np.array(observations), np.array(rewards)


def test_same_seed_and_actions_give_identical_episodes(arena):
    first = _rollout(arena, seed=7, steps=200)
    second = _rollout(arena, seed=7, steps=200)
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    other = _rollout(arena, seed=8, steps=200)
    assert len(other[0]) != len(first[0]) or not np.array_equal(other[0], first[0])


def test_features_are_bounded_and_enemy_slots_are_stable(arena):
    observation, _ = arena.reset(seed=11)
    previous = {enemy_id: slot for slot, enemy_id in enumerate(arena.enemy_slot_ids) if enemy_id is not None}
    seen_enemies = bool(previous)
    for _ in range(300):
        observation, _, terminated, truncated, _ = arena.step(arena.action_space.sample())
        if terminated or truncated:
            break
        slot_ids = arena.enemy_slot_ids
        for slot, enemy_id in enumerate(slot_ids):
            if enemy_id is not None and enemy_id in previous:
                assert previous[enemy_id] == slot  # an enemy keeps its slot while present
        previous = {enemy_id: slot for slot, enemy_id in enumerate(slot_ids) if enemy_id is not None}
        seen_enemies = seen_enemies or bool(previous)
        slots = observation[9:].reshape(5, 10)
        active = np.array([enemy_id is not None for enemy_id in slot_ids], dtype=np.float32)
        np.testing.assert_array_equal(slots[:, 9], active)
        assert np.all(slots[active == 0] == 0.0)
        assert np.all(np.abs(observation) <= 1.0)
        # sin^2 + cos^2 = 1 for the player's angle and each active enemy's bearing and facing
        assert observation[5] ** 2 + observation[6] ** 2 == pytest.approx(1.0, abs=1e-5)
        for row in slots[active == 1]:
            assert row[1] ** 2 + row[2] ** 2 == pytest.approx(1.0, abs=1e-5)
            assert row[3] ** 2 + row[4] ** 2 == pytest.approx(1.0, abs=1e-5)
    assert seen_enemies  # the arena does have enemies


def test_check_env_screen_off(arena):
    check_env(arena.unwrapped, skip_render_check=True)


def test_no_screen_and_no_view_renders_small_and_plays_the_same_game(arena):
    # Nobody looks at the frame: the engine renders 160x120, and the game itself is unchanged.
    assert (arena.game.get_screen_width(), arena.game.get_screen_height()) == (160, 120)
    assert arena.last_rgb_frame().shape == (120, 160, 3)
    viewed = DoomEnv(render_mode="rgb_array")
    try:
        assert (viewed.game.get_screen_width(), viewed.game.get_screen_height()) == (320, 240)
        for env in (arena, viewed):
            env.reset(seed=7)
        for step in range(40):
            a = arena.step(step % arena.action_space.n)
            b = viewed.step(step % viewed.action_space.n)
            np.testing.assert_array_equal(a[0], b[0])
            assert a[1:4] == b[1:4]
            if a[2] or a[3]:
                break
    finally:
        viewed.close()


def test_check_env_screen_on_with_rgb_render():
    env = DoomEnv(screen=True, render_mode="rgb_array")
    try:
        check_env(env.unwrapped)
        observation, _ = env.reset(seed=0)
        assert observation["screen"].shape == (60, 80, 1) and observation["screen"].dtype == np.uint8
        assert observation["features"].shape == (59,)
        frame = env.render()
        assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8
    finally:
        env.close()


def test_screen_observation_without_live_view_uses_the_gray_buffer():
    env = DoomEnv("basic", screen=True, screen_height=48, screen_width=64)
    try:
        assert env.game.get_screen_format().name == "GRAY8"
        check_env(env.unwrapped, skip_render_check=True)
        observation, _ = env.reset(seed=0)
        assert observation["screen"].shape == (48, 64, 1)
        assert observation["screen"].max() > 0
        assert env.render() is None  # render_mode None
        assert env.last_rgb_frame().shape == (240, 320, 3)  # still available, converted on request
    finally:
        env.close()


def test_reset_delay_waits(tmp_path):
    env = DoomEnv("basic", reset_delay_s=0.3)
    try:
        start = time.perf_counter()
        env.reset(seed=0)
        assert time.perf_counter() - start >= 0.3
    finally:
        env.close()


def test_step_after_episode_end_needs_reset():
    env = DoomEnv("basic", action_set="single")
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
    finally:
        env.close()


def test_register_is_idempotent_and_makes_the_env():
    register()
    register()
    env = gymnasium.make(GYM_ID, scenario="basic")
    try:
        assert isinstance(env.unwrapped, DoomEnv)
        env.reset(seed=0)
    finally:
        env.close()
    from ray.tune.registry import ENV_CREATOR, _global_registry

    assert _global_registry.contains(ENV_CREATOR, RAY_ENV_NAME)
    creator = _global_registry.get(ENV_CREATOR, RAY_ENV_NAME)
    env = creator({"scenario": "basic", "action_set": "single"})
    try:
        assert env.action_space.n == 8
    finally:
        env.close()


def test_vizdoom_object_state_layout_matches_what_features_read(arena):
    from spikeloop.envs import features

    arena.reset(seed=0)
    objects = arena.game.get_state().objects
    assert objects
    for obj in objects:
        f = features.object_state(obj)
        assert f[features.ID] == obj.id
        assert (f[features.X], f[features.Y], f[features.ANGLE]) == (obj.position_x, obj.position_y, obj.angle)
        assert (f[features.VELOCITY_X], f[features.VELOCITY_Y]) == (obj.velocity_x, obj.velocity_y)
        assert (f[features.NAME], f[features.CATEGORY]) == (obj.name, obj.category)
