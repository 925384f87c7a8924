"""Independent Beta distributions mapped affinely onto physical stimulation ranges.

RLlib has no Beta distribution, so this is a `TorchDistribution` subclass: each of the
16 stimulation dimensions (8 frequencies in Hz, then 8 amplitudes in uA) is
`x = low + (high - low) * u` with `u ~ Beta(alpha, beta)`, and log-probabilities and
entropies are in x-space: `log p_x(x) = log p_u(u) - log(high - low)` per dimension.

Two ways to read the encoder's raw outputs (`PARAMETRIZATIONS`):
- "mode_concentration" (default): `m = sigmoid(raw_m)` is the mode of u, `k = softplus(raw_k)` its
  concentration, `alpha = 1 + m k`, `beta = 1 + (1 - m) k`. Where the stimulation sits and how
  noisy it is are separate outputs, so the encoder can start with an observation-dependent
  stimulation and little noise (docs/architecture.md, "The learner").
- "alpha_beta": `alpha = softplus(raw_a) + 1`, `beta = softplus(raw_b) + 1`.
Both keep alpha, beta >= 1: unimodal, finite density at the range edges.
"""

from __future__ import annotations

import torch
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic, TorchDistribution
from ray.rllib.utils.typing import TensorType
from torch.nn import functional as F

BETA_CONCENTRATION_OFFSET = 1.0
"""alpha, beta >= 1 (the offset both parametrizations add): unimodal, finite density at the range edges."""

PARAMETRIZATIONS = ("mode_concentration", "alpha_beta")
"""How the encoder's raw head outputs become (alpha, beta); see the module docstring."""

_EDGE_EPS = 1e-6
"""u is clamped into [eps, 1 - eps] before log_prob: float32 Beta samples can land exactly on 0 or 1."""


class TorchRangedBeta(TorchDistribution):
    """Product of independent Betas, each scaled onto [low, high] (physical units)."""

    def __init__(self, alpha: torch.Tensor, beta: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
        self.alpha = alpha
        self.beta = beta
        self.low = low.to(alpha)
        self.high = high.to(alpha)
        self.width = self.high - self.low
        super().__init__(alpha=alpha, beta=beta)

    def _get_torch_distribution(self, alpha: torch.Tensor, beta: torch.Tensor) -> torch.distributions.Beta:
        # validate_args off: the support check would reject the clamped edge values we pass.
        return torch.distributions.Beta(alpha, beta, validate_args=False)

    @classmethod
    def from_logits(  # type: ignore[override]  # the Beta needs its physical range: required keywords here
        cls, logits: torch.Tensor, *, low: torch.Tensor, high: torch.Tensor, parametrization: str = "mode_concentration"
    ) -> TorchRangedBeta:
        """Build from raw head outputs [..., 2 * D]: first D the modes (or alphas), last D the concentrations (or betas)."""
        first, second = logits.chunk(2, dim=-1)
        if parametrization == "mode_concentration":
            mode, concentration = torch.sigmoid(first), F.softplus(second)
            alpha = BETA_CONCENTRATION_OFFSET + mode * concentration
            beta = BETA_CONCENTRATION_OFFSET + (1.0 - mode) * concentration
        elif parametrization == "alpha_beta":
            alpha = F.softplus(first) + BETA_CONCENTRATION_OFFSET
            beta = F.softplus(second) + BETA_CONCENTRATION_OFFSET
        else:
            raise ValueError(f"parametrization must be one of {PARAMETRIZATIONS}, got {parametrization!r}")
        return cls(alpha, beta, low, high)

    @staticmethod
    def required_input_dim(space, **kwargs) -> int:
        """Two raw inputs (alpha, beta) per dimension of a Box space."""
        return 2 * int(space.shape[-1])

    def to_unit(self, value: torch.Tensor) -> torch.Tensor:
        """Physical units -> u in [0, 1]."""
        return (value - self.low) / self.width

    def from_unit(self, unit: torch.Tensor) -> torch.Tensor:
        """u in [0, 1] -> physical units."""
        return self.low + self.width * unit

    def logp(self, value: TensorType, **kwargs) -> torch.Tensor:
        """Joint log-density of a stimulation [..., D] in physical units, summed over D."""
        unit = self.to_unit(torch.as_tensor(value)).clamp(_EDGE_EPS, 1.0 - _EDGE_EPS)
        return (self._dist.log_prob(unit) - torch.log(self.width)).sum(-1)

    def entropy(self, **kwargs) -> torch.Tensor:
        """Differential entropy in physical units, summed over D (includes log(high - low))."""
        return (self._dist.entropy() + torch.log(self.width)).sum(-1)

    def kl(self, other: Distribution, **kwargs) -> torch.Tensor:
        """KL(self || other), summed over D; an affine map shared by both leaves KL unchanged."""
        if not isinstance(other, TorchRangedBeta):
            raise TypeError(f"KL of a TorchRangedBeta needs another TorchRangedBeta, got {type(other).__name__}")
        return torch.distributions.kl.kl_divergence(self._dist, other._dist).sum(-1)

    def sample(self, *, sample_shape=None, **kwargs) -> torch.Tensor:
        """Stimulation sample in physical units."""
        return self.from_unit(self._dist.sample(sample_shape if sample_shape is not None else torch.Size()))

    def rsample(self, *, sample_shape=None, **kwargs) -> torch.Tensor:
        """Reparameterised sample in physical units."""
        return self.from_unit(self._dist.rsample(sample_shape if sample_shape is not None else torch.Size()))

    def deterministic_sample(self) -> torch.Tensor:
        """The distribution's mean in physical units (used when not exploring)."""
        return self.from_unit(self._dist.mean)

    def to_deterministic(self) -> TorchDeterministic:
        """RLlib's deterministic counterpart, centred on the mean."""
        return TorchDeterministic(loc=self.deterministic_sample())


class FixedStimulation:
    """A frozen encoder's stimulation: always the given values, log-probability and entropy 0.

    Not an RLlib Distribution: only the calls the culture connector and the learner make on the encoder's
    distribution (sample, deterministic_sample, logp, entropy).
    """

    def __init__(self, stim: torch.Tensor) -> None:
        self.stim = stim

    def sample(self, *, sample_shape=None) -> torch.Tensor:
        """The fixed stimulation (exploring or not)."""
        return self.stim

    def deterministic_sample(self) -> torch.Tensor:
        """The fixed stimulation."""
        return self.stim

    def logp(self, value: torch.Tensor, **kwargs) -> torch.Tensor:
        """0 for every row: the stimulation is not a choice the policy gradient can credit."""
        return torch.zeros(value.shape[:-1], dtype=self.stim.dtype, device=self.stim.device)

    def entropy(self) -> torch.Tensor:
        """0 for every row."""
        return torch.zeros(self.stim.shape[:-1], dtype=self.stim.dtype, device=self.stim.device)
