"""A learner connector piece that counts the env steps the learner received: the one true "trained on" figure.

RLlib's own counters are no answer to "did this iteration train on anything?": the env runners count what they
sampled, also when the driver stopped waiting for it, and the learner's `num_env_steps_trained` counts every epoch
and minibatch pass plus the artificial bootstrap step of each episode chunk. This piece sees the episodes the
learner was handed, once per update, before any of that, and counts their steps.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import ALL_MODULES

ENV_STEPS_RECEIVED = "num_env_steps_received"
"""Learner result key (under `__all_modules__`): env steps handed to the learner in this iteration."""
ENV_STEPS_RECEIVED_LIFETIME = "num_env_steps_received_lifetime"
"""The same, summed over the learner's life (restored with a checkpoint)."""


class CountEnvStepsReceived(ConnectorV2):
    """Log how many env steps the learner received; passes the batch through untouched."""

    def __call__(
        self, *, rl_module, batch: dict[str, Any], episodes, explore=None, shared_data=None, metrics=None, **kwargs
    ) -> Any:
        """Count the steps of the episode chunks of this update."""
        if metrics is not None:
            steps = sum(len(episode) for episode in episodes or ())
            metrics.log_value((ALL_MODULES, ENV_STEPS_RECEIVED), steps, reduce="sum")
            metrics.log_value((ALL_MODULES, ENV_STEPS_RECEIVED_LIFETIME), steps, reduce="lifetime_sum")
        return batch
