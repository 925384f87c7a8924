"""The value net with value-target normalisation (PopArt-style: outputs preserved when the scale moves).

The reference reward is large (the episode ends with -5 x remaining HP, about -500 in
`basic`), so raw value targets are in the hundreds. Fitting them directly needs huge
value gradients, which swamp whatever shares their gradient clip (see
docs/architecture.md, "The learner"). Here the network predicts targets in normalised
units, `(target - mean) / std`, with `mean` and `std` running statistics of the value
targets; `forward` returns values in reward units, so GAE, the surprise of feedback
and every log keep reward units. When the statistics move, the last layer is rescaled
so that the values it returns stay the same (van Hasselt et al. 2016, "PopArt").

The statistics are persistent buffers: saved in checkpoints and synced to env runners.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from spikeloop.models.encoder import mlp

MIN_VALUE_STD = 1e-2
"""Floor of the running target std (reward units): a constant target must not blow the scale up."""


class NormalizedValueNet(nn.Module):
    """MLP on the observation features (and the screen's pixels) -> V(s) in reward units, trained in normalised units."""

    # Buffers registered in __init__, declared here for the type checker.
    target_mean: torch.Tensor
    target_std: torch.Tensor
    target_count: torch.Tensor

    def __init__(
        self,
        in_size: int,
        hiddens: Sequence[int],
        *,
        normalize: bool,
        momentum: float,
        screen_size: int = 0,
        screen_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.screen_size = screen_size
        """Pixels of the screen appended to the features (0: the value net does not see the screen)."""
        self.screen_scale = screen_scale
        """Factor on the pixels (1 / 255 for uint8 screens: the features' unit scale)."""
        self.net = mlp(in_size + screen_size, hiddens, 1)
        self.normalize = normalize
        self.momentum = momentum
        # float32 like the weights: RLlib syncs module state to env runners as float32, and the acting
        # module must hold exactly the learner's values.
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_std", torch.ones(()))
        self.register_buffer("target_count", torch.zeros(()))

    @property
    def head(self) -> nn.Linear:
        """The last layer, the one PopArt rescales."""
        head = self.net[-1]
        assert isinstance(head, nn.Linear)  # mlp(..., out_size=1) ends in a Linear
        return head

    def normalized(self, features: torch.Tensor, screen: torch.Tensor | None = None) -> torch.Tensor:
        """The network's own output [B]: the value in normalised units."""
        x = features.float().flatten(1)
        if self.screen_size:
            if screen is None:
                raise ValueError(f"this value net reads the screen ({self.screen_size} pixels), got none")
            x = torch.cat([x, screen.float().flatten(1) * self.screen_scale], dim=-1)
        return self.net(x).squeeze(-1)

    def forward(self, features: torch.Tensor, screen: torch.Tensor | None = None) -> torch.Tensor:
        """V(s) [B] in reward units."""
        out = self.normalized(features, screen)
        if not self.normalize:
            return out
        return out * self.target_std + self.target_mean

    def normalize_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Value targets in the units the network is trained in."""
        if not self.normalize:
            return targets
        return (targets - self.target_mean) / self.target_std

    @torch.no_grad()
    def update_target_stats(self, targets: torch.Tensor) -> None:
        """Fold a train batch's value targets into the running statistics, keeping outputs unchanged."""
        targets = torch.as_tensor(targets, dtype=torch.float64, device=self.target_mean.device).reshape(-1)
        if not self.normalize or targets.numel() == 0:
            return
        old_mean, old_std = self.target_mean.double(), self.target_std.double()
        batch_mean, batch_sq = targets.mean(), targets.pow(2).mean()
        if self.target_count.item() == 0:
            mean, sq = batch_mean, batch_sq  # the first batch sets the scale outright
        else:
            m = self.momentum
            old_sq = old_std.pow(2) + old_mean.pow(2)
            mean, sq = (1 - m) * old_mean + m * batch_mean, (1 - m) * old_sq + m * batch_sq
        std = (sq - mean.pow(2)).clamp_min(0).sqrt().clamp_min(MIN_VALUE_STD)
        mean, std = mean.float().double(), std.float().double()  # the values the buffers will hold
        # PopArt: w' = w * old_std / std, b' = (old_std * b + old_mean - mean) / std leaves
        # std * (w'x + b') + mean == old_std * (w x + b) + old_mean for every input x.
        head = self.head
        head.weight.mul_((old_std / std).to(head.weight.dtype))
        head.bias.copy_(((old_std * head.bias.double() + old_mean - mean) / std).to(head.bias.dtype))
        self.target_mean.copy_(mean.float())
        self.target_std.copy_(std.float())
        self.target_count.add_(float(targets.numel()))
