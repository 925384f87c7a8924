"""One tick of the closed loop, as one plain function: the game frame's encoding in, the game action out.

    encode -> send stimulation -> work that needs no spikes -> receive spikes -> ablate -> decode -> act

`tick` is all of it, in that order (docs/architecture.md, "One tick"). The module
has already run its forward pass (features -> encoder head, value); the culture
sits behind `Culture`, two calls: send one stimulation, receive its answer. On
an env runner the culture is its `CultureLink` (a device through its bridge); in
tests it is a toy culture. `CultureExchange` (connector.py) is the RLlib glue
around this function: feedback for the previous step, autoreset rows, columns.

Everything between the culture's answer and the action is the loop's critical
path, so the work that needs no spikes (the stimulation's log-probability, the
spike statistics the decoder centres with, the caller's `while_waiting`) runs
while the culture answers, after the first stimulation left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from ray.rllib.core.columns import Columns

from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.models.closed_loop.shuffled_answers import ShuffledAnswers
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import (
    EXCHANGE_OK,
    RAW_SPIKES,
    SPIKE_MEAN,
    SPIKE_STD,
    SPIKES,
    STIM,
    STIM_LOGP,
    STIM_TIMESTAMP,
)
from spikeloop.models.encoder import N_STIM


class Culture(Protocol):
    """What a tick needs of a culture: one stimulation out, then its answer back."""

    def send_stim(self, stim: np.ndarray) -> None:
        """Send one stimulation [2 * N_ENCODING] (Hz, then uA) and return at once."""

    def receive_spikes(self) -> SpikeReply:
        """The culture's answer to the stimulation just sent."""


@dataclass(frozen=True)
class Tick:
    """What one tick did, one row per env (same-frame rounds side by side in each row)."""

    action: torch.Tensor
    action_logp: torch.Tensor
    """log p(stim | obs) + log p(action | spikes): PPO's ratio is taken over both."""
    stim_logp: torch.Tensor
    stim: np.ndarray
    raw_spikes: np.ndarray
    """The culture's counts; `spikes` is what the decoder saw (after the ablation)."""
    spikes: torch.Tensor
    spike_mean: torch.Tensor
    spike_std: torch.Tensor
    replies: list[list[SpikeReply]]
    """Per row, one reply per round."""

    def columns(self) -> dict[str, Any]:
        """The batch columns of this tick (models/columns.py), as the connector writes them."""
        return {
            Columns.ACTIONS: self.action,
            Columns.ACTION_LOGP: self.action_logp,
            STIM_LOGP: self.stim_logp,
            STIM: self.stim,
            SPIKES: self.spikes.numpy(),
            RAW_SPIKES: self.raw_spikes,
            SPIKE_MEAN: self.spike_mean.numpy().copy(),
            SPIKE_STD: self.spike_std.numpy().copy(),
            EXCHANGE_OK: np.array([float(all(r.ok for r in row)) for row in self.replies], dtype=np.float32),
            # uint64: microsecond wire timestamps (RLlib's TensorToNumpy would narrow a torch int64 to int32).
            STIM_TIMESTAMP: np.array([row[0].stim_timestamp_us for row in self.replies], dtype=np.uint64),
        }


@torch.no_grad()
def tick(
    module: ClosedLoopRLModule,
    stim_dist_inputs: torch.Tensor,
    culture: Culture,
    *,
    explore: bool,
    generator: torch.Generator | None = None,
    while_waiting: Callable[[], None] | None = None,
    answers: ShuffledAnswers | None = None,
) -> Tick:
    """Stimulate the culture with this frame's encoding and decode its answer into the action."""
    # Encode: sample the stimulation (or take its mode) from the encoder's distribution.
    encoder = module.encoder_distribution(stim_dist_inputs)
    stim = encoder.sample() if explore else encoder.deterministic_sample()
    stim_np = stim.float().numpy()
    rows, rounds = stim_np.shape[0], module.n_rounds

    replies: list[list[SpikeReply]] = [[] for _ in range(rows)]
    spike_stats: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    for row in range(rows):
        for r in range(rounds):
            # Send the stimulation: it leaves now; the culture answers after its windows (~100 ms on a device).
            culture.send_stim(stim_np[row, r * N_STIM : (r + 1) * N_STIM].astype(np.float32, copy=False))
            if spike_stats is None:
                # Work that needs no spikes, done while the culture answers the first stimulation.
                spike_stats = (
                    encoder.logp(stim),
                    module.spike_mean.detach().float().expand(rows, -1),
                    module.spike_std().float().expand(rows, -1),
                )
                if while_waiting is not None:
                    while_waiting()
            # Receive the answer to this stimulation (zeros and "timeout" when none came in time).
            replies[row].append(culture.receive_spikes())
    assert spike_stats is not None  # at least one row and one round
    stim_logp, spike_mean, spike_std = spike_stats

    raw_spikes = np.stack([np.concatenate([reply.counts for reply in row]) for row in replies])
    # What the decoder is allowed to see (`answers`: the pool `ablation: shuffled` draws from).
    spikes = module.ablate(torch.from_numpy(raw_spikes), generator=generator, answers=answers)
    action_logits = module.decode(spikes, spike_mean, spike_std)  # centred and scaled by the act-time statistics
    action, action_logp = module.act(action_logits, explore=explore)
    return Tick(
        action=action,
        action_logp=stim_logp + action_logp,
        stim_logp=stim_logp,
        stim=stim_np,
        raw_spikes=raw_spikes,
        spikes=spikes,
        spike_mean=spike_mean,
        spike_std=spike_std,
        replies=replies,
    )
