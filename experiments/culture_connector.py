"""The module-to-env connector piece where the culture sits: stim -> spikes -> action.

It runs first in RLlib's module-to-env pipeline on each env runner, on the
module's batched output for this tick:

1. sample `stim_t` from the encoder's Beta distributions (or take their mode);
2. send it through the bridge (after the previous step's feedback) and wait
   for the reply that answers *this* stimulation;
3. apply the decoder-input ablation, centre with the module's spike mean, and
   sample `action_t` from the decoder;
4. write the action, the joint log-probability and the columns the learner
   replays (`stim`, `spikes`, `spike_mean`) into the batch.

RLlib's own GetActions piece then sees an action already there and passes it
through, so nothing of RLlib is forked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns

from bridge.channels import N_SPIKE_GROUPS
from bridge.core import SpikeReply
from experiments.culture_link import CultureLink, close_link, current_link
from models.closed_loop_module import SPIKE_MEAN, SPIKES, STIM, STIM_DIST_INPUTS

EXCHANGE_OK = "exchange_ok"
"""Extra column: 1.0 when the culture answered this tick's stimulation, 0.0 on a timeout."""
RAW_SPIKES = "raw_spikes"
"""Extra column: the culture's counts before ablation (for analysis; the decoder saw `spikes`)."""
STIM_TIMESTAMP = "stim_timestamp_us"
"""Extra column: the wire timestamp of this tick's stimulation."""


_NO_EXCHANGE = SpikeReply(np.zeros(N_SPIKE_GROUPS, dtype=np.float32), "timeout", 0.0, 0, None, 0)
"""Stands in for the reply of a step the env discards (an autoreset step): no stimulation was sent."""


def queue_step_feedback(link: CultureLink, episode, value_next: float, metrics=None) -> None:
    """Queue the feedback for the episode's last step, scaled by r_t + gamma V(s_{t+1}) - V(s_t).

    It leaves with the next exchange, so feedback for step t always precedes stim_{t+1}.
    """
    reward = float(episode.get_rewards(-1))
    info = episode.get_infos(-1) or {}
    value_s = float(episode.get_extra_model_outputs(Columns.VF_PREDS, -1))
    terminated = episode.is_terminated
    commands, scales = link.feedback_policy.for_step(
        reward, info.get("events", {}), value_s, 0.0 if terminated else value_next, terminated
    )
    link.queue_feedback(commands)
    if metrics is not None:
        metrics.log_value("culture/surprise_td_error", scales.td_error, window=100)
        metrics.log_value("culture/surprise_ratio", scales.ratio, window=100)
        metrics.log_value("culture/feedback_frequency_scale", scales.frequency, window=100)
        metrics.log_value("culture/feedback_commands_per_step", len(commands), window=100)
        metrics.log_value("culture/exchange_ok_fraction", float(episode.get_extra_model_outputs(EXCHANGE_OK, -1)),
                          window=100)


class CultureExchange(ConnectorV2):
    """Stimulate the culture and decode its answer into the game action."""

    def __init__(self, input_observation_space=None, input_action_space=None, *, seed: int | None = None, **kwargs):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)

    @torch.no_grad()
    def __call__(self, *, rl_module, batch: dict[str, Any], episodes, explore=None, shared_data=None, **kwargs) -> Any:
        """Replace the module's encoder output with action, joint logp and replay columns."""
        if Columns.ACTIONS in batch:
            return batch  # random actions or a module that acts itself: not ours to touch
        link = current_link()
        encoder = rl_module.encoder_distribution(batch[STIM_DIST_INPUTS])
        stim = encoder.sample() if explore else encoder.deterministic_sample()
        stim_logp = encoder.logp(stim)

        # An episode that just ended is reset by RLlib's vector env on the *next* step(), which ignores
        # the action it is given ("next_step" autoreset): that call must not stimulate the culture.
        acting = [episode.is_reset for episode in episodes] if episodes else [True] * len(stim)
        # Feedback for the previous step needs V(s_{t+1}): this forward pass just computed it.
        for row, live in enumerate(acting):
            if live and len(episodes[row]) > 0:
                queue_step_feedback(link, episodes[row], float(batch[Columns.VF_PREDS][row]), kwargs.get("metrics"))
        try:
            replies = [link.exchange(row.numpy().astype(np.float32)) if live else _NO_EXCHANGE
                       for row, live in zip(stim, acting, strict=True)]
        except BaseException:
            # Close the link before the error leaves (DeviceLost, a bridge failure): its compiled graph
            # keeps a task in flight on the bridge actor, and a Ray worker that still owns one cannot
            # exit, so the failing env runner would hang for ever and keep the device claimed.
            close_link()
            raise
        raw = torch.as_tensor(np.stack([r.counts for r in replies]), dtype=torch.float32)
        spikes = rl_module.ablate(raw, generator=self._generator)
        spike_mean = rl_module.spike_mean.detach().float().expand_as(spikes).clone()
        decoder = rl_module.decoder_distribution(rl_module.decode(spikes, spike_mean))
        action = decoder.sample() if explore else decoder.to_deterministic().sample()

        batch[Columns.ACTIONS] = action
        batch[Columns.ACTION_LOGP] = stim_logp + decoder.logp(action)
        batch[STIM] = stim.float()
        batch[SPIKES] = spikes
        batch[SPIKE_MEAN] = spike_mean
        batch[RAW_SPIKES] = raw
        batch[EXCHANGE_OK] = torch.tensor([1.0 if r.ok else 0.0 for r in replies])
        # uint64: RLlib's TensorToNumpy reduces int64 to int32, which wraps microsecond timestamps.
        batch[STIM_TIMESTAMP] = torch.tensor([r.stim_timestamp_us for r in replies], dtype=torch.uint64)
        del batch[STIM_DIST_INPUTS]  # large and recomputed in training: keep episodes lean
        return batch


def make_culture_connector(env=None, spaces=None) -> ConnectorV2:
    """Factory for `ClosedLoopPPOConfig.closed_loop(culture_connector=...)`."""
    return CultureExchange()
