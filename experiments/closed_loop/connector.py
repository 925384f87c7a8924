"""The module-to-env connector piece where the culture sits: stim -> spikes -> action.

It runs first in RLlib's module-to-env pipeline on each env runner, on the
module's batched output for this tick:

1. build the previous step's feedback (its surprise needs this pass's V(s_t))
   and post it to the bridge, which sends it while the next steps run;
2. sample `stim_t` from the encoder's Beta distributions (or take their mode)
   and send it; while the culture answers (~100 ms on a device), do what needs
   no spikes: its log-probability, metrics, the `stim`, `spike_mean` and `spike_std` columns
   (with same-frame rounds, one stimulation and its reply per round, in turn);
3. take the reply that answers *this* stimulation, apply the decoder-input
   ablation, centre and scale with the module's spike mean and std, and sample `action_t`;
4. write the action, the joint log-probability and the other columns the
   learner and the logs replay into the batch.

Everything between the reply and the next stimulation is the tick's critical
path (see docs/benchmarks.md, loop), so it is kept to the few ops that need the
spikes.

RLlib's own GetActions piece then sees an action already there and passes it
through, so nothing of RLlib is forked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns

from bridge.channels import N_SPIKE_GROUPS
from bridge.core import SpikeReply
from experiments.closed_loop.feedback import SurpriseScales
from experiments.closed_loop.link import CultureLink, close_link, current_link
from models.closed_loop_module import SPIKE_MEAN, SPIKE_STD, SPIKES, STIM, STIM_DIST_INPUTS, STIM_LOGP
from models.encoder import N_STIM

EXCHANGE_OK = "exchange_ok"
"""Extra column: 1.0 when the culture answered this tick's stimulation, 0.0 on a timeout."""
RAW_SPIKES = "raw_spikes"
"""Extra column: the culture's counts before ablation (for analysis; the decoder saw `spikes`)."""
STIM_TIMESTAMP = "stim_timestamp_us"
"""Extra column: the wire timestamp of this tick's stimulation."""


_NO_EXCHANGE = SpikeReply(np.zeros(N_SPIKE_GROUPS, dtype=np.float32), "timeout", 0.0, 0, None, 0)
"""Stands in for the reply of a step the env discards (an autoreset step): no stimulation was sent."""


@dataclass(frozen=True)
class StepFeedback:
    """What `queue_step_feedback` queued for one step, for its metrics."""

    scales: SurpriseScales
    commands: int


def queue_step_feedback(link: CultureLink, episode, value_next: float) -> StepFeedback:
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
    return StepFeedback(scales, len(commands))


def log_step_feedback(metrics, step: StepFeedback, episode) -> None:
    """Log one step's surprise scaling, feedback and exchange outcome to RLlib's metrics (if a logger)."""
    if metrics is None:
        return
    metrics.log_value("culture/surprise_td_error", step.scales.td_error, window=100)
    metrics.log_value("culture/surprise_ratio", step.scales.ratio, window=100)
    metrics.log_value("culture/feedback_frequency_scale", step.scales.frequency, window=100)
    metrics.log_value("culture/feedback_commands_per_step", step.commands, window=100)
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
        # An episode that just ended is reset by RLlib's vector env on the *next* step(), which ignores
        # the action it is given ("next_step" autoreset): that call must not stimulate the culture.
        values = batch[Columns.VF_PREDS]
        acting = [episode.is_reset for episode in episodes] if episodes else [True] * len(values)
        n_rounds = getattr(rl_module, "n_rounds", 1)  # same-frame rounds: stimulations per step
        if not any(acting):
            return _autoreset_columns(batch, len(acting), n_rounds)
        # Feedback for the previous step needs V(s_{t+1}): this forward pass just computed it. It leaves
        # at once, so the bridge sends it while the stimulation is sampled, still ahead of it.
        queued = [(queue_step_feedback(link, episodes[row], float(values[row])), episodes[row])
                  for row, live in enumerate(acting) if live and len(episodes[row]) > 0]
        link.post_feedback()

        encoder = rl_module.encoder_distribution(batch[STIM_DIST_INPUTS])
        stim = encoder.sample() if explore else encoder.deterministic_sample()
        stim_np = stim.float().numpy()

        def while_culture_answers() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # Work that needs no spikes runs inside the device's window instead of after it.
            for step, episode in queued:
                log_step_feedback(kwargs.get("metrics"), step, episode)
            spike_mean = rl_module.spike_mean.detach().float().expand(len(acting), -1)
            spike_std = rl_module.spike_std().float().expand(len(acting), -1)
            batch[STIM] = stim_np
            batch[SPIKE_MEAN] = spike_mean.numpy().copy()
            batch[SPIKE_STD] = spike_std.numpy().copy()
            del batch[STIM_DIST_INPUTS]  # large and recomputed in training: keep episodes lean
            return encoder.logp(stim), spike_mean, spike_std

        stim_logp = spike_mean = spike_std = None
        replies: list[list[SpikeReply]] = []  # per row, one reply per round
        try:
            for row, live in enumerate(acting):
                if not live:
                    replies.append([_NO_EXCHANGE] * n_rounds)
                    continue
                answers = []
                for r in range(n_rounds):
                    link.send_stim(stim_np[row, r * N_STIM:(r + 1) * N_STIM].astype(np.float32, copy=False))
                    if stim_logp is None:
                        stim_logp, spike_mean, spike_std = while_culture_answers()
                    answers.append(link.receive_spikes())
                replies.append(answers)
        except BaseException:
            # Close the link before the error leaves (DeviceLost, a bridge failure): it releases the
            # device, so the failing env runner never keeps its culture claimed.
            close_link()
            raise
        raw = np.stack([np.concatenate([r.counts for r in answers]) for answers in replies])
        spikes = rl_module.ablate(torch.from_numpy(raw), generator=self._generator)
        action, action_logp = rl_module.act(rl_module.decode(spikes, spike_mean, spike_std),
                                           explore=bool(explore))

        batch[Columns.ACTIONS] = action
        batch[Columns.ACTION_LOGP] = stim_logp + action_logp
        batch[STIM_LOGP] = stim_logp
        batch[SPIKES] = spikes.numpy()
        batch[RAW_SPIKES] = raw
        batch[EXCHANGE_OK] = np.array([1.0 if all(r.ok for r in answers) else 0.0 for answers in replies],
                                      dtype=np.float32)
        # uint64: microsecond wire timestamps (RLlib's TensorToNumpy would narrow a torch int64 to int32).
        batch[STIM_TIMESTAMP] = np.array([answers[0].stim_timestamp_us for answers in replies], dtype=np.uint64)
        return batch


def _autoreset_columns(batch: dict[str, Any], rows: int, n_rounds: int) -> dict[str, Any]:
    """The columns for a tick on which every env only resets: RLlib discards them, nothing was sent."""
    batch[Columns.ACTIONS] = torch.zeros(rows, dtype=torch.long)
    batch[Columns.ACTION_LOGP] = torch.zeros(rows)
    batch[STIM_LOGP] = torch.zeros(rows)
    batch[STIM] = np.zeros((rows, N_STIM * n_rounds), dtype=np.float32)
    for column in (SPIKES, SPIKE_MEAN, SPIKE_STD, RAW_SPIKES):
        batch[column] = np.zeros((rows, N_SPIKE_GROUPS * n_rounds), dtype=np.float32)
    batch[EXCHANGE_OK] = np.zeros(rows, dtype=np.float32)
    batch[STIM_TIMESTAMP] = np.zeros(rows, dtype=np.uint64)
    del batch[STIM_DIST_INPUTS]
    return batch


def make_culture_connector(env=None, spaces=None) -> ConnectorV2:
    """Factory for `ClosedLoopPPOConfig.closed_loop(culture_connector=...)`."""
    return CultureExchange()
