"""Value-target normalisation: the net learns in normalised units, its values stay in reward units."""

from __future__ import annotations

import pytest
import torch

from spikeloop.models.value import MIN_VALUE_STD, NormalizedValueNet


def net(normalize: bool = True, momentum: float = 0.1) -> NormalizedValueNet:
    torch.manual_seed(0)
    return NormalizedValueNet(5, (16,), normalize=normalize, momentum=momentum)


def test_first_batch_sets_the_scale_and_outputs_are_preserved() -> None:
    v = net()
    x = torch.randn(32, 5)
    before = v(x).detach().clone()
    targets = torch.tensor([-500.0, -410.0, -430.0, -520.0])
    v.update_target_stats(targets)
    assert v.target_mean.item() == pytest.approx(targets.double().mean().item())
    assert v.target_std.item() == pytest.approx(targets.double().std(unbiased=False).item())
    torch.testing.assert_close(v(x), before, atol=1e-4, rtol=1e-5)  # PopArt: values unchanged
    # The network's own output is the value in normalised units.
    torch.testing.assert_close(v.normalized(x) * v.target_std.float() + v.target_mean.float(), v(x))


def test_later_batches_move_the_scale_by_the_momentum_and_keep_outputs() -> None:
    v = net(momentum=0.5)
    v.update_target_stats(torch.tensor([0.0, 2.0]))  # mean 1, std 1
    x = torch.randn(8, 5)
    before = v(x).detach().clone()
    v.update_target_stats(torch.tensor([10.0, 10.0]))  # mean 10, second moment 100
    assert v.target_mean.item() == pytest.approx(5.5)
    assert v.target_std.item() == pytest.approx((0.5 * 2.0 + 0.5 * 100.0 - 5.5**2) ** 0.5)
    torch.testing.assert_close(v(x), before, atol=1e-4, rtol=1e-5)


def test_normalised_targets_and_the_std_floor() -> None:
    v = net()
    v.update_target_stats(torch.full((10,), -500.0))  # constant targets: std floored, not zero
    assert v.target_std.item() == pytest.approx(MIN_VALUE_STD)
    torch.testing.assert_close(v.normalize_targets(torch.tensor([-500.0])), torch.tensor([0.0]))


def test_off_is_the_identity() -> None:
    v = net(normalize=False)
    x = torch.randn(4, 5)
    v.update_target_stats(torch.tensor([-500.0, 100.0]))
    assert v.target_count.item() == 0
    torch.testing.assert_close(v(x), v.normalized(x))
    torch.testing.assert_close(v.normalize_targets(torch.tensor([3.0])), torch.tensor([3.0]))
