"""The feedback for an episode's last step, read from the RLlib episode, and its metrics.

Step feedback (the reward and the game events of step t) is scaled by the surprise
r_t + gamma V(s_{t+1}) - V(s_t), so it can only be built once V(s_{t+1}) is known:
by the connector on the next tick (whose forward pass just computed it), or at the
episode's end by the callbacks. Either way it leaves before stim_{t+1}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.rllib.core.columns import Columns

from spikeloop.bridge.wire.protocol import FeedbackCommand
from spikeloop.models.closed_loop.feedback import FeedbackPolicy, SurpriseScales
from spikeloop.models.columns import EXCHANGE_OK


@dataclass(frozen=True)
class StepFeedback:
    """The commands for one step and the surprise scaling that shaped them."""

    commands: list[FeedbackCommand]
    scales: SurpriseScales


def step_feedback(policy: FeedbackPolicy, episode: Any, value_next: float) -> StepFeedback:
    """The feedback for the episode's last step, scaled by r_t + gamma V(s_{t+1}) - V(s_t)."""
    info = episode.get_infos(-1) or {}
    value_s = float(episode.get_extra_model_outputs(Columns.VF_PREDS, -1))
    terminated = episode.is_terminated
    commands, scales = policy.for_step(
        float(episode.get_rewards(-1)), info.get("events", {}), value_s, 0.0 if terminated else value_next, terminated
    )
    return StepFeedback(commands, scales)


def log_step_feedback(metrics: Any, step: StepFeedback, episode: Any) -> None:
    """Log one step's surprise scaling, feedback and exchange outcome to RLlib's metrics (if a logger)."""
    if metrics is None:
        return
    metrics.log_value("culture/surprise_td_error", step.scales.td_error, window=100)
    metrics.log_value("culture/surprise_ratio", step.scales.ratio, window=100)
    metrics.log_value("culture/feedback_frequency_scale", step.scales.frequency, window=100)
    metrics.log_value("culture/feedback_commands_per_step", len(step.commands), window=100)
    metrics.log_value(
        "culture/exchange_ok_fraction", float(episode.get_extra_model_outputs(EXCHANGE_OK, -1)), window=100
    )
