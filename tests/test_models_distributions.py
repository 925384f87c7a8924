"""The ranged Beta stimulation distribution: log-prob, support, entropy, KL."""

from __future__ import annotations

import math

import torch

from spikeloop.bridge.wire.channels import N_ENCODING, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.models.distributions import TorchRangedBeta

D = 2 * N_ENCODING
LOW = torch.tensor([STIM_FREQUENCY_RANGE_HZ[0]] * N_ENCODING + [STIM_AMPLITUDE_RANGE_UA[0]] * N_ENCODING)
HIGH = torch.tensor([STIM_FREQUENCY_RANGE_HZ[1]] * N_ENCODING + [STIM_AMPLITUDE_RANGE_UA[1]] * N_ENCODING)


def _dist(batch: int = 32, seed: int = 0) -> TorchRangedBeta:
    g = torch.Generator().manual_seed(seed)
    return TorchRangedBeta.from_logits(torch.randn(batch, 2 * D, generator=g) * 2.0, low=LOW, high=HIGH)


def test_concentrations_are_above_one() -> None:
    dist = _dist()
    assert (dist.alpha > 1.0).all() and (dist.beta > 1.0).all()


def test_mode_concentration_parametrization() -> None:
    g = torch.Generator().manual_seed(0)
    raw_mode, raw_concentration = torch.randn(8, D, generator=g), torch.randn(8, D, generator=g) * 2 + 2
    dist = TorchRangedBeta.from_logits(torch.cat([raw_mode, raw_concentration], -1), low=LOW, high=HIGH)
    concentration = torch.nn.functional.softplus(raw_concentration)
    # The mode of u is sigmoid(raw_mode) and alpha + beta - 2 the concentration, whatever the concentration.
    torch.testing.assert_close((dist.alpha - 1) / (dist.alpha + dist.beta - 2), torch.sigmoid(raw_mode))
    torch.testing.assert_close(dist.alpha + dist.beta - 2, concentration)
    # Zero concentration is the uniform distribution over the range, whatever the mode.
    flat = TorchRangedBeta.from_logits(torch.cat([raw_mode, torch.full((8, D), -30.0)], -1), low=LOW, high=HIGH)
    torch.testing.assert_close(flat.alpha, torch.ones(8, D), atol=1e-6, rtol=0)
    torch.testing.assert_close(flat.beta, torch.ones(8, D), atol=1e-6, rtol=0)


def test_alpha_beta_parametrization() -> None:
    raw = torch.randn(8, 2 * D, generator=torch.Generator().manual_seed(1))
    dist = TorchRangedBeta.from_logits(raw, low=LOW, high=HIGH, parametrization="alpha_beta")
    torch.testing.assert_close(dist.alpha, torch.nn.functional.softplus(raw[:, :D]) + 1)
    torch.testing.assert_close(dist.beta, torch.nn.functional.softplus(raw[:, D:]) + 1)


def test_logp_is_torch_beta_with_range_correction() -> None:
    dist = _dist()
    stim = dist.sample()
    unit = (stim - LOW) / (HIGH - LOW)
    expected = (torch.distributions.Beta(dist.alpha, dist.beta).log_prob(unit) - torch.log(HIGH - LOW)).sum(-1)
    torch.testing.assert_close(dist.logp(stim), expected, rtol=1e-5, atol=1e-4)


def test_logp_integrates_to_one_in_physical_units() -> None:
    # One dimension, numerically: the density in Hz must integrate to 1 over 4-40 Hz.
    lo, hi = STIM_FREQUENCY_RANGE_HZ
    dist = TorchRangedBeta(torch.tensor([[2.5]]), torch.tensor([[1.7]]), torch.tensor([lo]), torch.tensor([hi]))
    xs = torch.linspace(lo, hi, 20001)[1:-1, None, None]
    density = dist.logp(xs).exp().squeeze()
    integral = torch.trapezoid(density, xs.squeeze()).item()
    assert math.isclose(integral, 1.0, rel_tol=1e-3)


def test_samples_lie_in_range() -> None:
    dist = _dist(batch=256)
    for stim in (dist.sample(), dist.sample(sample_shape=(4,)), dist.deterministic_sample()):
        assert stim.shape[-1] == D
        assert (stim >= LOW).all() and (stim <= HIGH).all()
        assert torch.isfinite(dist.logp(stim)).all()


def test_logp_finite_at_range_edges() -> None:
    dist = _dist(batch=2)
    assert torch.isfinite(dist.logp(LOW.expand(2, D))).all()
    assert torch.isfinite(dist.logp(HIGH.expand(2, D))).all()


def test_entropy_includes_log_range() -> None:
    dist = _dist()
    unit_entropy = torch.distributions.Beta(dist.alpha, dist.beta).entropy()
    torch.testing.assert_close(dist.entropy(), (unit_entropy + torch.log(HIGH - LOW)).sum(-1))


def test_entropy_matches_monte_carlo() -> None:
    dist = _dist(batch=2)
    stims = dist.sample(sample_shape=(20000,))
    mc_entropy = -dist.logp(stims).mean(0)
    torch.testing.assert_close(mc_entropy, dist.entropy(), rtol=0.02, atol=0.2)


def test_kl_zero_to_self_and_positive_otherwise() -> None:
    a, b = _dist(seed=0), _dist(seed=1)
    torch.testing.assert_close(a.kl(a), torch.zeros(32), atol=1e-5, rtol=0)
    assert (a.kl(b) > 0).all()


def test_deterministic_sample_is_mean() -> None:
    dist = _dist()
    mean = LOW + (HIGH - LOW) * dist.alpha / (dist.alpha + dist.beta)
    torch.testing.assert_close(dist.deterministic_sample(), mean)
    torch.testing.assert_close(dist.to_deterministic().sample(), mean)
