"""Running normalisation of the observation features that the encoder and the value net read.

The feature vector's entries vary on very different scales (in `basic` the enemy's
bearing varies with std 0.4, most other entries by less than 0.1), so an untrained
encoder's stimulation hardly depended on what it saw: its mean moved by 0.001-0.01 of
the range across observations while the Beta noise was 0.24 (docs/architecture.md,
"The learner"). Each feature is therefore centred and divided by its running std
(floored, so a nearly constant feature is not blown up into noise, and clipped).

The statistics are module buffers (in checkpoints, synced to env runners with the
weights). A train batch's moments are staged when the batch arrives and folded in only
after the gradient steps (`commit`), so the loss of a batch sees exactly the
normalisation the env runners acted with, and the new statistics reach the env runners
together with the weights trained on them.
"""

from __future__ import annotations

import torch
from torch import nn


class FeatureNormalizer(nn.Module):
    """(features - running mean) / max(running std, std_floor), clipped to +-clip; identity when disabled."""

    # Buffers registered in __init__, declared here for the type checker.
    mean: torch.Tensor
    sq_mean: torch.Tensor
    count: torch.Tensor
    _staged: torch.Tensor

    def __init__(self, size: int, *, enabled: bool, momentum: float, std_floor: float, clip: float) -> None:
        super().__init__()
        self.enabled = enabled
        self.momentum = momentum
        self.std_floor = std_floor
        self.clip = clip
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("sq_mean", torch.ones(size))
        self.register_buffer("count", torch.zeros(()))
        # The staged batch: not state, it lives only between a batch's arrival and the end of its update.
        self.register_buffer("_staged", torch.zeros(0), persistent=False)

    def std(self) -> torch.Tensor:
        """The per-feature std divided by (floored)."""
        return (self.sq_mean - self.mean.pow(2)).clamp_min(0.0).sqrt().clamp_min(self.std_floor)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Normalised features [B, size] (float32)."""
        features = features.float().flatten(1)
        if not self.enabled:
            return features
        return ((features - self.mean) / self.std()).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def stage(self, features: torch.Tensor) -> None:
        """Remember a train batch's moments [N, size]; `commit` folds them in."""
        features = torch.as_tensor(features, dtype=torch.float64, device=self.mean.device).flatten(1)
        if not self.enabled or features.shape[0] == 0:
            return
        n = torch.tensor([float(features.shape[0])], dtype=torch.float64, device=self.mean.device)
        self._staged = torch.cat([features.mean(0), features.pow(2).mean(0), n])

    @torch.no_grad()
    def commit(self) -> None:
        """Fold the staged batch into the running statistics (the first batch sets them outright)."""
        if self._staged.numel() == 0:
            return
        size = self.mean.numel()
        batch_mean, batch_sq, n = self._staged[:size], self._staged[size : 2 * size], self._staged[-1]
        if self.count.item() == 0:
            mean, sq = batch_mean, batch_sq
        else:
            m = self.momentum
            mean = (1 - m) * self.mean.double() + m * batch_mean
            sq = (1 - m) * self.sq_mean.double() + m * batch_sq
        self.mean.copy_(mean.float())
        self.sq_mean.copy_(sq.float())
        self.count.add_(n.float())
        self._staged = torch.zeros(0, device=self.mean.device)
