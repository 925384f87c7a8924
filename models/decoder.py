"""The spike decoder: centred spike counts of the 8 groups -> game action logits."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS
from spikeloop.models.module_config import ClosedLoopModelConfig


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


def motor_map(n_actions: int, n_spike_groups: int) -> torch.Tensor:
    """The fixed readout [n_actions, n_spike_groups]: 1 where the action presses the button of that motor group.

    The action set is the one with `n_actions` actions (envs/actions.py: "single" 8, "joint" 54). With same-frame
    rounds (`n_spike_groups` a multiple of the 8 groups) every round's counts of those groups are read.
    """
    from spikeloop.envs.actions import ACTION_SETS, action_buttons, motor_groups_pressed

    by_size = {len(action_buttons(name)): name for name in ACTION_SETS}
    if n_actions not in by_size or n_spike_groups % N_SPIKE_GROUPS:
        raise ValueError(
            f"decoder_init motor_map needs an action set of {sorted(by_size)} actions ({', '.join(ACTION_SETS)}) and "
            f"a multiple of {N_SPIKE_GROUPS} spike inputs, got {n_actions} actions and {n_spike_groups} inputs"
        )
    one_round = torch.zeros(n_actions, N_SPIKE_GROUPS)
    for action, groups in enumerate(motor_groups_pressed(by_size[n_actions])):
        one_round[action, list(groups)] = 1.0
    return one_round.repeat(1, n_spike_groups // N_SPIKE_GROUPS)


class SpikeDecoder(nn.Module):
    """Linear readout (optionally non-negative, biased, frozen) or a small MLP."""

    def __init__(self, n_spike_groups: int, n_actions: int, settings: ClosedLoopModelConfig) -> None:
        super().__init__()
        self.kind = settings.decoder_type
        self.nonnegative = settings.decoder_nonnegative
        if self.kind == "linear":
            init = torch.randn(n_actions, n_spike_groups) * settings.decoder_init_std
            if settings.decoder_init == "motor_map":
                init = motor_map(n_actions, n_spike_groups) * settings.decoder_map_gain
            elif self.nonnegative:
                # Store raw weights whose softplus has the same half-normal scale as the plain init.
                init = _inverse_softplus(init.abs() + 1e-3)
            self.weight = nn.Parameter(init)
            # No bias parameter at all by default: a bias would let the decoder act without the culture.
            self.bias = nn.Parameter(torch.zeros(n_actions)) if settings.decoder_bias else None
        else:
            layers: list[nn.Module] = []
            size = n_spike_groups
            for hidden in settings.decoder_hiddens:
                layers += [nn.Linear(size, hidden, bias=settings.decoder_bias), nn.SiLU()]
                size = hidden
            out = nn.Linear(size, n_actions, bias=settings.decoder_bias)
            nn.init.normal_(out.weight, std=settings.decoder_init_std / math.sqrt(size))
            layers.append(out)
            self.mlp = nn.Sequential(*layers)
        if settings.decoder_frozen:
            self.requires_grad_(False)

    def effective_weight(self) -> torch.Tensor:
        """The linear readout matrix [n_actions, n_spike_groups] as applied (after softplus if non-negative)."""
        if self.kind != "linear":
            raise ValueError("only the linear decoder has a single readout matrix")
        return F.softplus(self.weight) if self.nonnegative else self.weight

    def weight_l2(self) -> torch.Tensor:
        """Sum of squared (effective) weights, biases excluded."""
        if self.kind == "linear":
            return self.effective_weight().pow(2).sum()
        return torch.stack([m.weight.pow(2).sum() for m in self.mlp if isinstance(m, nn.Linear)]).sum()

    def forward(self, centred_spikes: torch.Tensor) -> torch.Tensor:
        """Action logits from centred spike counts [..., n_spike_groups]."""
        if self.kind == "linear":
            return F.linear(centred_spikes, self.effective_weight(), self.bias)
        return self.mlp(centred_spikes)
