"""`DoomEnv`: a Gymnasium environment over a headless vizdoom game.

Observation: the feature vector of `spikeloop.envs.features` (Box of 59 values in [-1, 1]); with
`screen=True` a Dict of that vector ("features") and a grayscale, downsampled screen
("screen", uint8, height x width x 1). Action: `spikeloop.envs.actions` ("joint", 54 actions, or
"single", 8). Reward: `spikeloop.envs.rewards` shaped terms, the scenario's own reward, or both.
Every step's info holds "events", "reward_terms" (summing to the reward), "kills", "health",
"ammo", "scenario" and "game_reward" (the scenario's own reward this step, whatever the reward mode;
0 after a reset).

Game variables: the features and rewards need KILLCOUNT, HITCOUNT, HEALTH, the ammo variable,
ARMOR, POSITION_X/Y, ANGLE and VELOCITY_X/Y. A scenario cfg that does not list them gets them
added (`add_missing_game_variables=True`, the default: they are read-only engine counters and
change nothing in the game); with False, a missing one is an error at construction.

Screen buffer format: RGB24 with `render_mode="rgb_array"` (a live view), so that `render()` /
`last_rgb_frame()` return the engine's buffer as is; GRAY8 otherwise, the cheapest buffer to copy
and already what the screen observation needs. Without a live view `last_rgb_frame()` still
works but returns the gray frame on three channels, converted only when called. With neither a
screen observation nor a live view the game renders at 160x120 instead of 320x240.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import vizdoom

from spikeloop.bridge.wire.settings import RESET_DELAY_S
from spikeloop.envs.actions import action_buttons, action_table
from spikeloop.envs.curriculum import Curriculum
from spikeloop.envs.features import FeatureExtractor, FeatureSettings, feature_size
from spikeloop.envs.rewards import EVENTS, REWARD_MODES, RewardSettings, RewardShaper
from spikeloop.envs.scenarios import DEFAULT_SCENARIO, Scenario, resolve_scenario

GAME_RESOLUTION = vizdoom.ScreenResolution.RES_320X240
GAME_RESOLUTION_HEIGHT, GAME_RESOLUTION_WIDTH = 240, 320
HEADLESS_RESOLUTION = vizdoom.ScreenResolution.RES_160X120
"""When no one looks at the frame (no screen observation, no live view): the game is the same, and
rendering a quarter of the pixels saves time on every step, on the closed loop's critical path
(measured: docs/benchmarks.md, loop)."""
# ITU-R BT.601 luma weights, as float32 so the matrix product stays float32.
RGB_TO_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float32)
NO_EVENTS = dict.fromkeys(EVENTS, 0)


def _settings(cls: type, value: Any) -> Any:
    """A settings dataclass from None (defaults), a dict of overrides (e.g. from a Ray config) or itself."""
    if value is None:
        return cls()
    if isinstance(value, dict):
        return cls(**value)
    if isinstance(value, cls):
        return value
    raise TypeError(f"expected {cls.__name__}, a dict or None, got {type(value).__name__}")


def _game_variable(name: str) -> vizdoom.GameVariable:
    """The vizdoom game variable called `name`, or a ValueError listing valid names."""
    try:
        return vizdoom.GameVariable.__members__[name]
    except KeyError:
        valid = ", ".join(vizdoom.GameVariable.__members__)
        raise ValueError(f"unknown vizdoom game variable {name!r}; valid names: {valid}") from None


def _whole(value: Any, name: str, low: int, high: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < low
        or (high is not None and value > high)
    ):
        allowed = f"{low}-{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be a whole number {allowed}, got {value!r}")


def _finite_fields(settings: Any, name: str) -> None:
    # Every field is a number: a dataclass checks no types, and a string would fail only mid-episode.
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"{name}.{field.name}: must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name}.{field.name}: must be a finite number, got {value!r}")


def check_env_settings(
    *,
    scenario: Any,
    frame_skip: Any,
    action_set: Any,
    screen: Any,
    screen_height: Any,
    screen_width: Any,
    reward_mode: Any,
    reward_settings: Any,
    feature_settings: Any,
    enemy_names: Any,
    ammo_variable: Any,
    add_missing_game_variables: Any,
    reset_delay_s: Any,
    render_mode: Any,
    curriculum: Any,
) -> None:
    """Check DoomEnv's settings without starting a game; the error starts with the setting's name."""
    _whole(frame_skip, "frame_skip", 1)
    try:
        action_buttons(action_set)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"action_set: {exc}") from None
    for name, value in (("screen", screen), ("add_missing_game_variables", add_missing_game_variables)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: must be true or false, got {value!r}")
    _whole(screen_height, "screen_height", 1, GAME_RESOLUTION_HEIGHT)
    _whole(screen_width, "screen_width", 1, GAME_RESOLUTION_WIDTH)
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode: unknown reward_mode {reward_mode!r}; choose from {', '.join(REWARD_MODES)}")
    for name, cls, value in (
        ("reward_settings", RewardSettings, reward_settings),
        ("feature_settings", FeatureSettings, feature_settings),
    ):
        try:
            built = _settings(cls, value)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from None
        _finite_fields(built, name)
    features = _settings(FeatureSettings, feature_settings)
    _whole(features.enemy_slots, "feature_settings.enemy_slots", 0)
    for field in dataclasses.fields(features):
        if "scale" in field.name and not getattr(features, field.name) > 0:
            raise ValueError(f"feature_settings.{field.name}: must be > 0 (values are divided by it)")
    if enemy_names is not None and (
        isinstance(enemy_names, (str, bytes)) or not all(isinstance(n, str) and n for n in enemy_names)
    ):
        raise ValueError(f"enemy_names: must be a list of object names, got {enemy_names!r}")
    if not isinstance(ammo_variable, str):
        raise ValueError(f"ammo_variable: must be a game variable name, got {ammo_variable!r}")
    try:
        _game_variable(ammo_variable)
    except ValueError as exc:
        raise ValueError(f"ammo_variable: {exc}") from None
    problem = RESET_DELAY_S.problem(reset_delay_s)
    if problem is not None:
        raise ValueError(f"reset_delay_s: {problem}, got {reset_delay_s!r}")
    if render_mode not in (None, *DoomEnv.metadata["render_modes"]):
        raise ValueError(f"render_mode: unknown render_mode {render_mode!r}; choose from None, 'rgb_array'")
    scenarios = [scenario]
    if curriculum is not None:
        try:
            built_curriculum = Curriculum(**curriculum) if isinstance(curriculum, dict) else curriculum
        except (TypeError, ValueError) as exc:
            named = str(exc).split(": ", 1)[0] in ("scenarios", "threshold", "window_episodes")
            raise ValueError(f"curriculum.{exc}" if named else f"curriculum: {exc}") from None
        if not isinstance(built_curriculum, Curriculum):
            raise ValueError(f"curriculum: must be a mapping of Curriculum settings, got {curriculum!r}")
        if not all(math.isfinite(t) for t in built_curriculum.thresholds):
            raise ValueError("curriculum.threshold: must be finite")
        scenarios = list(built_curriculum.scenarios)
    for name in scenarios:
        if not isinstance(name, (str, os.PathLike)):
            raise ValueError(f"scenario: must be a scenario name or a .cfg path, got {name!r}")
        try:
            resolve_scenario(name)
        except (ValueError, FileNotFoundError) as exc:
            raise type(exc)(f"{'curriculum.scenarios' if curriculum is not None else 'scenario'}: {exc}") from None


class DoomEnv(gym.Env):
    """Gymnasium env over vizdoom with feature (and optional screen) observations; see module docstring.

    Args:
        scenario: a scenario name (`spikeloop.envs.scenarios.available_scenarios()`) or a path to a .cfg.
        frame_skip: tics the chosen action is held for per step (35 tics = 1 s of game time).
        action_set: "joint" (54 actions) or "single" (8); see `spikeloop.envs.actions`.
        screen: add a grayscale screen of screen_height x screen_width to the observation.
        reward_mode: "shaped" (`spikeloop.envs.rewards` terms), "scenario" (the cfg's own reward) or "both".
        reward_settings, feature_settings: the settings dataclass, a dict of overrides, or None.
        enemy_names: object names that fill enemy slots, overriding the scenario's list.
        ammo_variable: the game variable read as ammo (e.g. "AMMO2" for pistol/chaingun bullets).
        add_missing_game_variables: add the variables the features need when the cfg lacks them
            (True) or fail at construction naming them (False).
        reset_delay_s: seconds `reset()` waits before starting an episode (e.g. ~1 s to let a
            living culture settle).
        render_mode: None, or "rgb_array" for a live view (`render()` returns RGB frames).
        curriculum: a `Curriculum` or its keyword arguments; its current scenario replaces
            `scenario`, and `reset()` switches scenario when it advances.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 35}

    def __init__(
        self,
        scenario: str | os.PathLike = DEFAULT_SCENARIO,
        *,
        frame_skip: int = 4,
        action_set: str = "joint",
        screen: bool = False,
        screen_height: int = 60,
        screen_width: int = 80,
        reward_mode: str = "shaped",
        reward_settings: RewardSettings | dict | None = None,
        feature_settings: FeatureSettings | dict | None = None,
        enemy_names: Sequence[str] | None = None,
        ammo_variable: str = "SELECTED_WEAPON_AMMO",
        add_missing_game_variables: bool = True,
        reset_delay_s: float = RESET_DELAY_S.default,
        render_mode: str | None = None,
        curriculum: Curriculum | dict | None = None,
    ):
        # Everything that can be checked without a game, before one starts (also what `spikeloop check` and the
        # experiment schema run, so a bad setting is refused before Ray starts).
        check_env_settings(
            scenario=scenario,
            frame_skip=frame_skip,
            action_set=action_set,
            screen=screen,
            screen_height=screen_height,
            screen_width=screen_width,
            reward_mode=reward_mode,
            reward_settings=reward_settings,
            feature_settings=feature_settings,
            enemy_names=enemy_names,
            ammo_variable=ammo_variable,
            add_missing_game_variables=add_missing_game_variables,
            reset_delay_s=reset_delay_s,
            render_mode=render_mode,
            curriculum=curriculum,
        )
        self.frame_skip = frame_skip
        self.action_set = action_set
        self.screen = screen
        self.screen_shape = (screen_height, screen_width)
        self.render_mode = render_mode
        self.reset_delay_s = reset_delay_s
        self.add_missing_game_variables = add_missing_game_variables
        self.feature_settings = _settings(FeatureSettings, feature_settings)
        self.reward_settings = _settings(RewardSettings, reward_settings)
        self._rewards = RewardShaper(self.reward_settings, reward_mode)
        self.reward_mode = reward_mode
        self._user_enemy_names = None if enemy_names is None else tuple(enemy_names)
        self._ammo_variable = _game_variable(ammo_variable)
        if isinstance(curriculum, dict):
            curriculum = Curriculum(**curriculum)
        self.curriculum = curriculum
        if curriculum is not None:
            scenario = curriculum.current
        # kills, hits, health, ammo, armor, x, y, angle, vx, vy: the order `_read` returns them in
        self._tracked = (
            vizdoom.GameVariable.KILLCOUNT,
            vizdoom.GameVariable.HITCOUNT,
            vizdoom.GameVariable.HEALTH,
            self._ammo_variable,
            vizdoom.GameVariable.ARMOR,
            vizdoom.GameVariable.POSITION_X,
            vizdoom.GameVariable.POSITION_Y,
            vizdoom.GameVariable.ANGLE,
            vizdoom.GameVariable.VELOCITY_X,
            vizdoom.GameVariable.VELOCITY_Y,
        )
        # RGB only for a live view (render_mode "rgb_array"); otherwise the engine's GRAY8 buffer,
        # a third of the bytes to copy per step and already what the screen observation needs.
        self._gray_buffer = render_mode is None
        self.game: vizdoom.DoomGame | None = None
        self._start_game(resolve_scenario(scenario))

        features = gym.spaces.Box(-1.0, 1.0, (feature_size(self.feature_settings),), np.float32)
        if screen:
            screen_space = gym.spaces.Box(0, 255, (screen_height, screen_width, 1), np.uint8)
            self.observation_space = gym.spaces.Dict({"features": features, "screen": screen_space})
        else:
            self.observation_space = features
        self.action_space = gym.spaces.Discrete(len(self._actions))

        self._episode_over = True
        self._episode_reward = 0.0
        self._observation: Any = None
        self._screen_buffer: np.ndarray | None = None

    # -- game lifecycle -------------------------------------------------------------------

    def _start_game(self, scenario: Scenario) -> None:
        """Configure and start a headless game for `scenario`, checking its game variables."""
        game = vizdoom.DoomGame()
        game.load_config(str(scenario.cfg_path))
        if scenario.wad_path is not None:
            game.set_doom_scenario_path(str(scenario.wad_path))
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_mode(vizdoom.Mode.PLAYER)
        game.set_screen_resolution(GAME_RESOLUTION if self.screen or self.render_mode else HEADLESS_RESOLUTION)
        game.set_screen_format(vizdoom.ScreenFormat.GRAY8 if self._gray_buffer else vizdoom.ScreenFormat.RGB24)
        game.set_objects_info_enabled(True)

        available = list(game.get_available_game_variables())
        missing = [v for v in dict.fromkeys(self._tracked) if v not in available]
        if missing and not self.add_missing_game_variables:
            names = ", ".join(v.name for v in missing)
            raise ValueError(
                f"scenario {scenario.name!r} ({scenario.cfg_path}) lacks game variable(s) {names} that the "
                "features/rewards need; list them in its available_game_variables or pass "
                "add_missing_game_variables=True"
            )
        for variable in missing:
            game.add_available_game_variable(variable)
        available = list(game.get_available_game_variables())
        self._pick_variables = operator.itemgetter(*[available.index(v) for v in self._tracked])

        game.init()
        self.game = game
        self.scenario = scenario
        self._actions = action_table(self.action_set, game.get_available_buttons())
        enemy_names = self._user_enemy_names if self._user_enemy_names is not None else scenario.enemy_names
        self._features = FeatureExtractor(self.feature_settings, enemy_names)
        self._screen_index = self._downsample_index()

    @property
    def enemy_slot_ids(self) -> tuple[int | None, ...]:
        """The vizdoom object id held by each enemy slot of the features (None: empty slot)."""
        return self._features.slot_ids

    def set_scenario(self, scenario: str | os.PathLike) -> None:
        """Switch to another scenario (spaces stay the same); the next `reset()` starts it."""
        resolved = resolve_scenario(scenario)  # fail before closing the running game
        self.close()
        self._start_game(resolved)
        self._episode_over = True

    def close(self) -> None:
        """Stop the game; safe to call twice."""
        if self.game is not None:
            self.game.close()
            self.game = None

    # -- observation pieces -----------------------------------------------------------------

    def _downsample_index(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Row/column indices for nearest downsampling, or None when area-averaging blocks fit exactly."""
        height, width = self.screen_shape
        if GAME_RESOLUTION_HEIGHT % height == 0 and GAME_RESOLUTION_WIDTH % width == 0:
            return None
        rows = (np.arange(height) * GAME_RESOLUTION_HEIGHT) // height
        cols = (np.arange(width) * GAME_RESOLUTION_WIDTH) // width
        return rows[:, None], cols[None, :]

    def _screen_observation(self, buffer: np.ndarray) -> np.ndarray:
        """Grayscale, downsampled (area average when the sizes divide) screen, H x W x 1 uint8."""
        height, width = self.screen_shape
        if self._screen_index is not None:
            small = buffer[self._screen_index].astype(np.float32)
            gray = small @ RGB_TO_GRAY if small.ndim == 3 else small
        else:
            fy, fx = GAME_RESOLUTION_HEIGHT // height, GAME_RESOLUTION_WIDTH // width
            if buffer.ndim == 3:
                blocks = buffer.reshape(height, fy, width, fx, 3).sum(axis=(1, 3), dtype=np.float32)
                gray = (blocks @ RGB_TO_GRAY) / (fy * fx)
            else:
                gray = buffer.reshape(height, fy, width, fx).sum(axis=(1, 3), dtype=np.float32) / (fy * fx)
        return gray.astype(np.uint8)[:, :, None]

    def _read(self, state: vizdoom.GameState | None) -> tuple[float, ...]:
        """The tracked game variables, from the state or (episode over, no state) from the game."""
        if state is not None:
            return self._pick_variables(state.game_variables.tolist())
        return tuple(self.game.get_game_variable(v) for v in self._tracked)

    def _observe(self, values: tuple[float, ...], state: vizdoom.GameState | None) -> Any:
        """The observation for these variable readings and state (None: keep enemies and screen)."""
        kills, _hits, health, ammo, _armor, x, y, angle, vx, vy = values
        objects = None if state is None else state.objects
        features = self._features.update([kills, health, ammo, x, y, angle, vx, vy], objects)
        if state is not None:
            self._screen_buffer = state.screen_buffer  # a reference; converted only on demand
        if not self.screen:
            return features
        if state is None:
            return {"features": features, "screen": self._observation["screen"]}
        return {"features": features, "screen": self._screen_observation(self._screen_buffer)}

    def _info(
        self, values: tuple[float, ...], terms: dict[str, float], events: dict[str, int], game_reward: float = 0.0
    ) -> dict[str, Any]:
        """The info dict of a step or reset."""
        return {
            "events": events,
            "reward_terms": terms,
            "kills": values[0],
            "health": values[2],
            "ammo": values[3],
            "scenario": self.scenario.name,
            "game_reward": float(game_reward),
        }

    # -- Gymnasium API ----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode (after `reset_delay_s`); a seed makes the episode reproducible."""
        super().reset(seed=seed)
        if self.curriculum is not None and self.curriculum.current != self.scenario.name:
            self.set_scenario(self.curriculum.current)
        if self.reset_delay_s > 0:
            time.sleep(self.reset_delay_s)  # lets a living culture settle between episodes
        if seed is not None:
            self.game.set_seed(seed % 2**32)
        self.game.new_episode()
        state = self.game.get_state()
        values = self._read(state)
        kills, hits, health, ammo, armor, x, y = values[:7]
        self._features.reset(x, y)
        self._rewards.reset(kills, hits, health, ammo, armor)
        self._episode_over = False
        self._episode_reward = 0.0
        self._observation = self._observe(values, state)
        return self._observation, self._info(values, {}, dict(NO_EVENTS))

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Play one action for `frame_skip` tics; returns (obs, reward, terminated, truncated, info)."""
        if self._episode_over:
            raise RuntimeError("the episode is over: call reset() before step()")
        game = self.game
        scenario_reward = game.make_action(self._actions[action], self.frame_skip)
        finished = game.is_episode_finished()
        state = None if finished else game.get_state()
        values = self._read(state)
        truncated = finished and self._timed_out()
        terminated = finished and not truncated
        kills, hits, health, ammo, armor = values[:5]
        reward, terms, events = self._rewards.step(kills, hits, health, ammo, armor, scenario_reward, finished)
        self._observation = self._observe(values, state)
        self._episode_reward += reward
        if finished:
            self._episode_over = True
            if self.curriculum is not None:
                self.curriculum.record(self._episode_reward)
        return self._observation, reward, terminated, truncated, self._info(values, terms, events, scenario_reward)

    def _timed_out(self) -> bool:
        """Whether the finished episode ended by the scenario's time limit (not death or map exit)."""
        timeout = self.game.get_episode_timeout()
        return timeout > 0 and not self.game.is_player_dead() and self.game.get_episode_time() >= timeout

    def render(self) -> np.ndarray | None:
        """The last RGB frame when render_mode is "rgb_array", else None."""
        return self.last_rgb_frame() if self.render_mode == "rgb_array" else None

    def last_rgb_frame(self) -> np.ndarray | None:
        """The last frame as H x W x 3 uint8 RGB (the engine's buffer itself unless it is grayscale)."""
        buffer = self._screen_buffer
        if buffer is None or buffer.ndim == 3:
            return buffer
        return np.repeat(buffer[:, :, None], 3, axis=2)  # gray buffer: converted only when asked
