"""A toy env, a fake culture and one closed-loop step written the way the culture connector must.

For tests and smoke runs without VizDoom or a culture. `closed_loop_step` is the
reference for what the module-to-env connector writes into the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from bridge.channels import N_ENCODING, N_SPIKE_GROUPS
from models.closed_loop_module import (
    SPIKE_MEAN,
    SPIKE_STD,
    SPIKES,
    STIM,
    STIM_DIST_INPUTS,
    STIM_LOGP,
    ClosedLoopRLModule,
)
from models.encoder import N_STIM

Culture = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""stim [B, 16] (Hz, uA) -> spike counts [B, N_SPIKE_GROUPS]."""


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


def fake_culture(stim_hz_ua: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Poisson spike counts whose rates grow with the stimulated frequency x amplitude (a reply per round)."""
    rounds = stim_hz_ua.reshape(*stim_hz_ua.shape[:-1], -1, N_STIM)
    drive = rounds[..., :N_ENCODING] * rounds[..., N_ENCODING:] / 40.0  # ~0.1-2.5 per electrode
    rates = drive.mean(-1, keepdim=True).expand(*drive.shape[:-1], N_SPIKE_GROUPS)
    return torch.poisson(rates.contiguous(), generator=generator).flatten(-2)


@torch.no_grad()
def act_through_culture(
    module: ClosedLoopRLModule,
    fwd_out: dict,
    culture: Culture,
    generator: torch.Generator,
    explore: bool = True,
) -> dict[str, torch.Tensor]:
    """From the module's acting output, one culture exchange; returns the columns the connector must write."""
    stim_dist = module.encoder_distribution(fwd_out[STIM_DIST_INPUTS])
    stim = stim_dist.sample() if explore else stim_dist.deterministic_sample()
    spikes = module.ablate(culture(stim, generator), generator)  # what the decoder actually sees
    spike_mean = module.spike_mean.expand_as(spikes).clone()
    spike_std = module.spike_std().expand_as(spikes).clone()
    action_dist = module.decoder_distribution(module.decode(spikes, spike_mean, spike_std))
    action = action_dist.sample() if explore else action_dist.to_deterministic().sample()
    stim_logp = stim_dist.logp(stim)
    return {
        Columns.ACTIONS: action,
        # The joint log-probability: the PPO ratio is taken over stim and action together.
        Columns.ACTION_LOGP: stim_logp + action_dist.logp(action),
        STIM_LOGP: stim_logp,
        STIM: stim.float(),
        SPIKES: spikes.float(),
        SPIKE_MEAN: spike_mean.float(),
        SPIKE_STD: spike_std.float(),
        Columns.VF_PREDS: fwd_out[Columns.VF_PREDS],
    }


@torch.no_grad()
def closed_loop_step(
    module: ClosedLoopRLModule,
    batch: dict,
    culture: Culture,
    generator: torch.Generator,
    explore: bool = True,
) -> dict[str, torch.Tensor]:
    """Module forward pass plus culture exchange, as env runner + connector perform one tick."""
    fwd_out = module.forward_exploration(batch) if explore else module.forward_inference(batch)
    return act_through_culture(module, fwd_out, culture, generator, explore)


class SyntheticCultureConnector(ConnectorV2):
    """Module-to-env piece closing the loop through `fake_culture` (must run before RLlib's GetActions)."""

    def __init__(self, input_observation_space=None, input_action_space=None, *, seed: int = 0, **kwargs) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, *, rl_module, batch: dict, episodes, explore: bool | None = None, **kwargs) -> dict:
        """Replace the module's stim-distribution output by the columns of one culture exchange."""
        columns = act_through_culture(rl_module, batch, fake_culture, self.generator, explore=bool(explore))
        batch.pop(STIM_DIST_INPUTS)
        batch.update(columns)
        return batch


def synthetic_episodes(
    module: ClosedLoopRLModule,
    env: gym.Env,
    n_steps: int,
    seed: int = 0,
    culture: Culture = fake_culture,
) -> list[SingleAgentEpisode]:
    """Roll the module + culture in env for n_steps, into finalized episodes like an env runner's."""
    generator = torch.Generator().manual_seed(seed)
    episodes: list[SingleAgentEpisode] = []
    obs, _ = env.reset(seed=seed)
    episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
    episode.add_env_reset(observation=obs)
    for step in range(n_steps):
        columns = closed_loop_step(module, {Columns.OBS: torch.as_tensor(obs)[None]}, culture, generator)
        action = int(columns.pop(Columns.ACTIONS)[0])
        extra = {k: v[0].numpy() for k, v in columns.items()}
        obs, reward, terminated, truncated, _ = env.step(action)
        episode.add_env_step(obs, action, reward, terminated=terminated, truncated=truncated, extra_model_outputs=extra)
        if terminated or truncated or step == n_steps - 1:
            episodes.append(episode.to_numpy())
            if step < n_steps - 1:
                obs, _ = env.reset()
                episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
                episode.add_env_reset(observation=obs)
    return episodes
