"""Learner connector piece that folds each train batch's spikes into the module's running mean.

It runs once per `Learner.update(episodes=...)`, on the whole train batch (before it is
split into minibatches), so every real timestep counts exactly once; the artificial
bootstrap timestep PPO appends to each episode is excluded through the loss mask. The
loss never reads the buffer (it replays the stored `"spike_mean"` column), so updating it
before the gradient steps of the same update changes nothing there; what matters is that
the weights synced to the env runners after the update carry the new mean.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns

from models.closed_loop_module import SPIKES


class UpdateSpikeMean(ConnectorV2):
    """Calls `update_spike_mean` of every module that has one with its batch's stored spikes."""

    def __call__(self, *, rl_module, batch: dict[str, Any], episodes, **kwargs) -> dict[str, Any]:
        """Update the running spike means; the batch passes through unchanged."""
        for module_id, module_batch in batch.items():
            module = rl_module[module_id].unwrapped() if module_id in rl_module else None
            if module is None or not hasattr(module, "update_spike_mean") or SPIKES not in module_batch:
                continue
            spikes = module_batch[SPIKES]
            if Columns.LOSS_MASK in module_batch:
                spikes = spikes[module_batch[Columns.LOSS_MASK]]
            module.update_spike_mean(spikes)
        return batch
