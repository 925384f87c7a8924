"""`CultureExchange`: the RLlib glue around the tick, first in each env runner's module-to-env pipeline.

RLlib hands it the module's batched output for this step. It

1. sends the previous step's feedback (its surprise needs this pass's V(s_t)),
   ahead of this step's stimulation, also when that step ended the previous
   sample (the episode chunk RLlib continues with holds it as lookback);
2. runs `tick` (tick.py) against this env runner's culture link: stimulation
   out, spikes in, action out, logging the feedback's metrics while the culture
   answers;
3. writes the tick's batch columns (models/columns.py) for the learner and the logs, and hands the tick to
   the live information meter (meter.py), which recomputes while the culture answers a later tick.

RLlib's own GetActions piece then sees an action already there and passes it
through, so nothing of RLlib is forked. A step on which the env only resets
(RLlib's "next_step" autoreset ignores the action) stimulates nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns

from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS
from spikeloop.models.closed_loop.link import CultureLink, close_link, current_link
from spikeloop.models.closed_loop.shuffled_answers import ShuffledAnswers
from spikeloop.models.closed_loop.step_feedback import log_step_feedback, step_feedback
from spikeloop.models.closed_loop.tick import Tick, tick
from spikeloop.models.columns import (
    EXCHANGE_OK,
    RAW_SPIKES,
    SPIKE_MEAN,
    SPIKE_STD,
    SPIKES,
    STIM,
    STIM_DIST_INPUTS,
    STIM_LOGP,
    STIM_TIMESTAMP,
)
from spikeloop.models.encoder import N_STIM

log = logging.getLogger(__name__)


class CultureExchange(ConnectorV2):
    """Stimulate the culture and decode its answer into the game action."""

    def __init__(self, input_observation_space=None, input_action_space=None, *, seed: int | None = None, **kwargs):
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)
        self._answers: ShuffledAnswers | None = None  # `ablation: shuffled`: this runner's culture's answers

    def __call__(self, *, rl_module, batch: dict[str, Any], episodes, explore=None, shared_data=None, **kwargs) -> Any:
        """Replace the module's encoder output with the tick's action, joint logp and replay columns."""
        if Columns.ACTIONS in batch:
            return batch  # random actions or a module that acts itself: not ours to touch
        n_rounds = getattr(rl_module, "n_rounds", 1)  # same-frame rounds: stimulations per step
        if episodes and not all(episode.is_reset for episode in episodes):
            # An episode that just ended is reset by RLlib's vector env on the *next* step(), which ignores the
            # action it is given: that step must not stimulate the culture. (One env per env runner: all or none.)
            return _autoreset_columns(batch, len(episodes), n_rounds)
        link = current_link()
        # Feedback for the previous step needs V(s_{t+1}): this forward pass just computed it.
        values = batch[Columns.VF_PREDS]
        sent = []
        for row, episode in enumerate(episodes or ()):
            # A step before this one: in this chunk, or, at the start of a chunk RLlib cut at a sample boundary,
            # the previous chunk's last step (kept in the chunk's lookback). A new episode has none.
            if len(episode) > 0 or episode.t_started > 0:
                feedback = step_feedback(link.feedback_policy, episode, float(values[row]))
                link.send_feedback(feedback.commands)
                sent.append((feedback, episode))

        def while_waiting() -> None:
            for feedback, episode in sent:
                log_step_feedback(kwargs.get("metrics"), feedback, episode)
            if link.meter is not None:
                update_meter(link)  # the live information meter recomputes while the culture answers

        if self._answers is None:
            settings = getattr(rl_module, "settings", None)
            if settings is not None and settings.ablation == "shuffled":
                self._answers = ShuffledAnswers(settings.ablation_shuffle_pool)
        try:
            result = tick(
                rl_module,
                batch[STIM_DIST_INPUTS],
                link,
                explore=bool(explore),
                generator=self._generator,
                while_waiting=while_waiting,
                answers=self._answers,
            )
        except BaseException:
            # Close the link before the error leaves (DeviceLost, a bridge failure): it releases the
            # device, so the failing env runner never keeps its culture claimed.
            close_link()
            raise
        del batch[STIM_DIST_INPUTS]  # large and recomputed in training: keep episodes lean
        batch.update(result.columns())
        if link.meter is not None:
            observe_meter(link, result, episodes)
        return batch


def observe_meter(link: CultureLink, result: Tick, episodes: list[Any] | None) -> None:
    """Hand the tick to the live information meter: stimulation, the culture's counts, observed features, action."""
    meter = link.meter
    if meter is None:
        return
    started = time.thread_time()
    try:
        for row, episode in enumerate(episodes or ()):
            observation = episode.get_observations(-1)  # the observation this tick encoded
            features = observation["features"] if isinstance(observation, dict) else observation
            meter.observe(result.stim[row, :N_STIM], result.raw_spikes[row], features, int(result.action[row]))
        meter.cpu_s += time.thread_time() - started  # the meter's cost: fetching and keeping the tick
    except Exception:  # a meter problem must not stop an experiment on a living culture
        link.meter = None
        log.exception("the live information meter failed and is off for the rest of this run")


def update_meter(link: CultureLink) -> None:
    """Let the meter recompute if its `every_ticks` are up; a failure turns it off, never the loop."""
    try:
        if link.meter is not None:
            link.meter.update_if_due()
    except Exception:
        link.meter = None
        log.exception("the live information meter failed and is off for the rest of this run")


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


def make_culture_connector(env=None, spaces=None, *, seed: int | None = None) -> ConnectorV2:
    """Factory for `ClosedLoopPPOConfig.closed_loop(culture_connector=...)`; `seed` seeds its generator."""
    return CultureExchange(seed=seed)
