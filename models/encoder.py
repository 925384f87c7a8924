"""The stimulation encoder: observation -> raw Beta parameters for 8 frequencies and 8 amplitudes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.models.distributions import BETA_CONCENTRATION_OFFSET
from spikeloop.models.module_config import ClosedLoopModelConfig

N_STIM = 2 * N_ENCODING
"""Stimulation vector size: N_ENCODING frequencies (Hz), then N_ENCODING amplitudes (uA)."""


HIDDEN_INIT_GAIN = math.sqrt(2.0)
"""Orthogonal init gain of hidden layers: keeps the activations' scale through the layers. PyTorch's default
init shrinks it layer by layer (the trunk's output varied by 0.005 across observations of `basic`)."""


def mlp(in_size: int, hiddens: Sequence[int], out_size: int | None = None, out_gain: float = 1.0) -> nn.Sequential:
    """SiLU MLP, orthogonal init (hidden gain sqrt 2, output gain `out_gain`, zero biases); without out_size the
    last hidden layer is the output."""
    layers: list[nn.Module] = []
    for hidden in hiddens:
        layers += [_orthogonal(nn.Linear(in_size, hidden), HIDDEN_INIT_GAIN), nn.SiLU()]
        in_size = hidden
    if out_size is not None:
        layers.append(_orthogonal(nn.Linear(in_size, out_size), out_gain))
    return nn.Sequential(*layers)


def _orthogonal(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def n_discrete_actions(space: gym.Space | None) -> int:
    """The number of game actions of a Discrete action space (the decoder's outputs)."""
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(f"the action space must be Discrete, got {space}")
    return int(space.n)


def split_observation_space(space: gym.Space | None) -> tuple[gym.spaces.Box, gym.spaces.Box | None]:
    """(features space, screen space or None) of a Box or a Dict {"features", "screen"} observation."""
    if isinstance(space, gym.spaces.Dict):
        features, screen = space["features"], space.spaces.get("screen")
        if not isinstance(features, gym.spaces.Box) or not isinstance(screen, gym.spaces.Box | None):
            raise ValueError(f"observation space's 'features' (and 'screen') must be Box spaces, got {space}")
        return features, screen
    if isinstance(space, gym.spaces.Box):
        return space, None
    raise ValueError(f"observation space must be a Box or a Dict with 'features' (and 'screen'), got {space}")


def features_and_screen(obs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(features, screen or None) of a batch of Box or Dict {"features", "screen"} observations."""
    if isinstance(obs, dict):
        return obs["features"], obs.get("screen")
    return obs, None


_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def screen_view(screen: torch.Tensor, view: str) -> torch.Tensor:
    """A screen batch [B, C, H, W] in [0, 1] as one same-frame round sees it: raw, edge or contrast (in [0, 1])."""
    if view == "raw":
        return screen
    if view == "edge":  # Sobel gradient magnitude per channel, as the reference trainer's
        channels = screen.shape[1]
        kx = _SOBEL_X.to(screen).expand(channels, 1, 3, 3)
        gx = F.conv2d(screen, kx, padding=1, groups=channels)
        gy = F.conv2d(screen, kx.transpose(-1, -2), padding=1, groups=channels)
        return torch.sqrt(gx.pow(2) + gy.pow(2) + 1e-8).clamp(0.0, 1.0)
    if view == "contrast":  # brightness pushed away from the frame's mean
        return (torch.tanh(3.0 * (screen - screen.mean(dim=(-2, -1), keepdim=True))) + 1.0) / 2.0
    raise ValueError(f"unknown screen view {view!r}")


class ScreenCNN(nn.Module):
    """Conv stack on the game screen -> `out_size` features ("strided" or "pooled": ClosedLoopModelConfig.screen_cnn)."""

    def __init__(self, screen_space: gym.spaces.Box, settings: ClosedLoopModelConfig) -> None:
        super().__init__()
        shape = screen_space.shape
        if len(shape) == 2:
            self.channels_last, channels = False, 1
        else:
            layout = settings.screen_layout
            self.channels_last = layout == "hwc" or (layout == "auto" and shape[-1] <= 4)
            channels = shape[-1] if self.channels_last else shape[0]
        # uint8 screens arrive as 0-255; scale to [0, 1] so the conv init sees unit-scale inputs.
        self.scale = 1.0 / 255.0 if screen_space.dtype == np.uint8 else 1.0
        if settings.screen_cnn == "pooled":
            # The reference trainer's: padded 3x3 convs keep the size, pools halve it, the last pool averages
            # over the whole screen, so the output size does not depend on the screen's.
            c = settings.screen_cnn_channels
            self.convs = nn.Sequential(
                nn.Conv2d(channels, c, 3, padding=1),
                nn.SiLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(c, 2 * c, 3, padding=1),
                nn.SiLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(2 * c, 4 * c, 3, padding=1),
                nn.SiLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            self.project: nn.Module = nn.Identity()
            self.out_size = 4 * c
            return
        convs: list[nn.Module] = []
        for out_channels, kernel, stride in settings.screen_cnn_filters:
            convs += [nn.Conv2d(channels, out_channels, kernel, stride), nn.SiLU()]
            channels = out_channels
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat_size = self.convs(self._to_nchw(torch.zeros(1, *shape))).shape[-1]
        self.project = nn.Sequential(nn.Linear(flat_size, settings.screen_embedding_dim), nn.SiLU())
        self.out_size = settings.screen_embedding_dim

    def _to_nchw(self, screen: torch.Tensor) -> torch.Tensor:
        screen = screen.float() * self.scale
        if screen.dim() == 3:  # [B, H, W] grey
            return screen.unsqueeze(1)
        return screen.permute(0, 3, 1, 2) if self.channels_last else screen

    def forward(self, screen: torch.Tensor, view: str = "raw") -> torch.Tensor:
        """Features [B, out_size] of a batch of screens, seen through `view` (screen_view)."""
        return self.project(self.convs(screen_view(self._to_nchw(screen), view)))


def _inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


@torch.no_grad()
def _init_head(head: nn.Linear, settings: ClosedLoopModelConfig) -> None:
    """Beta head init: observation-dependent modes (or alphas and betas), alpha + beta = encoder_init_concentration."""
    concentration = settings.encoder_init_concentration
    n_stim = head.out_features // 2  # the modes (or alphas) of every round come first
    if settings.encoder_parametrization == "mode_concentration":
        # Modes 0.5 + what the observation says; the same concentration for every observation at first.
        nn.init.normal_(head.weight[:n_stim], std=settings.encoder_head_init_std)
        nn.init.zeros_(head.bias[:n_stim])
        nn.init.zeros_(head.weight[n_stim:])
        nn.init.constant_(head.bias[n_stim:], _inverse_softplus(concentration - 2.0 * BETA_CONCENTRATION_OFFSET))
    else:
        # alpha = beta = softplus(bias) + 1 = concentration / 2 for a zero input.
        nn.init.normal_(head.weight, std=settings.encoder_head_init_std)
        nn.init.constant_(head.bias, _inverse_softplus(concentration / 2.0 - BETA_CONCENTRATION_OFFSET))


class StimEncoder(nn.Module):
    """Features (+ screen) -> raw Beta head outputs [B, 2 * N_STIM * rounds] (every mode first, then every
    concentration; round-major within each half)."""

    def __init__(self, observation_space: gym.Space | None, settings: ClosedLoopModelConfig) -> None:
        super().__init__()
        features_space, screen_space = split_observation_space(observation_space)
        in_size = int(np.prod(features_space.shape))
        self.screen_cnn = ScreenCNN(screen_space, settings) if screen_space is not None else None
        if self.screen_cnn is not None:
            in_size += self.screen_cnn.out_size
        self.trunk = mlp(in_size, settings.encoder_hiddens)
        trunk_size = settings.encoder_hiddens[-1] if settings.encoder_hiddens else in_size
        self.rounds = settings.same_frame_rounds
        # One wide head is a head per round on the shared trunk; rounds past the list of views see the screen raw.
        self.head = nn.Linear(trunk_size, 2 * N_STIM * self.rounds)
        _init_head(self.head, settings)
        views = settings.same_frame_views
        self.views = tuple(views[r] if r < len(views) else "raw" for r in range(self.rounds))

    def forward(self, features: torch.Tensor, screen: torch.Tensor | None = None) -> torch.Tensor:
        """Raw Beta parameters for a batch of observations."""
        x = features.float().flatten(1)
        if self.screen_cnn is None:
            return self.head(self.trunk(x))
        if self.rounds == 1 or set(self.views) == {"raw"}:
            return self.head(self.trunk(torch.cat([x, self.screen_cnn(screen)], dim=-1)))
        # Each round sees the screen through its own view: its block of the head's outputs comes from that view.
        by_view = {
            view: self.head(self.trunk(torch.cat([x, self.screen_cnn(screen, view)], dim=-1)))
            for view in dict.fromkeys(self.views)
        }
        n_modes = N_STIM * self.rounds
        blocks = [
            by_view[view][:, half * n_modes + r * N_STIM : half * n_modes + (r + 1) * N_STIM]
            for half in (0, 1)
            for r, view in enumerate(self.views)
        ]
        return torch.cat(blocks, dim=-1)
