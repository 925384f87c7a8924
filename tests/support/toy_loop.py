"""A toy env and a toy culture for the learner's tests: the real tick, without VizDoom or a device.

`ToyCulture` answers `tick`'s send / receive calls with Poisson counts that grow
with the stimulation; `closed_loop_step` and `synthetic_episodes` run the same
`spikeloop.models.closed_loop.tick.tick` an env runner runs, and `ToyCultureConnector`
puts it in an RLlib pipeline the way `CultureExchange` does.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.bridge.wire.channels import N_ENCODING, N_SPIKE_GROUPS
from spikeloop.models.closed_loop.tick import tick
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import STIM_DIST_INPUTS, STIM_TIMESTAMP


class ToyClosedLoopEnv(gym.Env):
    """Box(n_features) observations, Discrete(n_actions); reward 1 when the action matches a hidden rule."""

    def __init__(self, config: dict | None = None) -> None:
        config = config or {}
        self.n_features = int(config.get("n_features", 59))
        self.n_actions = int(config.get("n_actions", 54))
        self.episode_len = int(config.get("episode_len", 16))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (self.n_features,), np.float32)
        self.action_space = gym.spaces.Discrete(self.n_actions)
        self._t = 0
        self._obs = np.zeros(self.n_features, np.float32)

    def _new_obs(self) -> np.ndarray:
        self._obs = self.np_random.uniform(-1.0, 1.0, self.n_features).astype(np.float32)
        return self._obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode."""
        super().reset(seed=seed)
        self._t = 0
        return self._new_obs(), {}

    def step(self, action):
        """Reward 1 if the action equals the index of the largest of the first n_actions features."""
        target = int(np.argmax(self._obs[: self.n_actions]))
        reward = float(int(action) == target)
        self._t += 1
        return self._new_obs(), reward, False, self._t >= self.episode_len, {}


class ToyCulture:
    """A `tick.Culture`: Poisson counts whose rate grows with frequency x amplitude, the same on every group."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self._stim: np.ndarray | None = None
        self._sent = 0

    def send_stim(self, stim: np.ndarray) -> None:
        """Keep the stimulation for the answer."""
        self._stim = np.asarray(stim, dtype=np.float32)
        self._sent += 1

    def receive_spikes(self) -> SpikeReply:
        """Counts with a rate of mean(Hz x uA) / 40 per group (~0.1-2.5)."""
        assert self._stim is not None, "receive_spikes before send_stim"
        drive = float(np.mean(self._stim[:N_ENCODING] * self._stim[N_ENCODING:])) / 40.0
        rates = torch.full((N_SPIKE_GROUPS,), drive)
        counts = torch.poisson(rates, generator=self.generator).numpy().astype(np.float32)
        self._stim = None
        return SpikeReply(counts, "ok", 0.0, self._sent, self._sent, 0)


@torch.no_grad()
def closed_loop_step(
    module: ClosedLoopRLModule, batch: dict, generator: torch.Generator, explore: bool = True
) -> dict[str, torch.Tensor]:
    """Forward pass plus one tick through a toy culture: the columns an env runner's episode gets, as tensors."""
    fwd_out = module.forward_exploration(batch) if explore else module.forward_inference(batch)
    result = tick(module, fwd_out[STIM_DIST_INPUTS], ToyCulture(generator), explore=explore, generator=generator)
    columns = {
        name: torch.as_tensor(value)
        for name, value in result.columns().items()
        if name != STIM_TIMESTAMP  # uint64: no torch dtype
    }
    return columns | {Columns.VF_PREDS: fwd_out[Columns.VF_PREDS]}


class ToyCultureConnector(ConnectorV2):
    """Module-to-env piece closing the loop through `ToyCulture` with the real tick (before RLlib's GetActions)."""

    def __init__(self, input_observation_space=None, input_action_space=None, *, seed: int = 0, **kwargs) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, *, rl_module, batch: dict, episodes, explore: bool | None = None, **kwargs) -> dict:
        """Replace the module's stim-distribution output by the columns of one tick."""
        result = tick(
            rl_module,
            batch.pop(STIM_DIST_INPUTS),
            ToyCulture(self.generator),
            explore=bool(explore),
            generator=self.generator,
        )
        batch.update(result.columns())
        return batch


def synthetic_episodes(
    module: ClosedLoopRLModule, env: gym.Env, n_steps: int, seed: int = 0, wire_timestamps: bool = False
) -> list[SingleAgentEpisode]:
    """Roll the module + toy culture in env for n_steps, into finalized episodes like an env runner's.

    `wire_timestamps`: also record each step's uint64 stimulation timestamp, as a real env runner's episodes do.
    """
    generator = torch.Generator().manual_seed(seed)
    episodes: list[SingleAgentEpisode] = []
    obs, _ = env.reset(seed=seed)
    episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
    episode.add_env_reset(observation=obs)
    for step in range(n_steps):
        columns = closed_loop_step(module, {Columns.OBS: torch.as_tensor(obs)[None]}, generator)
        action = int(columns.pop(Columns.ACTIONS)[0])
        extra = {k: v[0].numpy() for k, v in columns.items()}
        if wire_timestamps:
            extra[STIM_TIMESTAMP] = np.uint64(1_000_000 + 100_000 * step)
        obs, reward, terminated, truncated, _ = env.step(action)
        episode.add_env_step(obs, action, reward, terminated=terminated, truncated=truncated, extra_model_outputs=extra)
        if terminated or truncated or step == n_steps - 1:
            episodes.append(episode.to_numpy())
            if step < n_steps - 1:
                obs, _ = env.reset()
                episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
                episode.add_env_reset(observation=obs)
    return episodes
