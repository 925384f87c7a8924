"""Learner connector piece that folds each train batch into the module's running statistics.

Three statistics, all module buffers (in checkpoints and in the weights synced to env runners):
- the running spike mean and std that centre and scale the decoder input (`update_spike_mean`,
  from the stored `"spikes"` column);
- the running mean/std of the value targets that the value net is trained against
  (`value_net.update_target_stats`, from GAE's value targets; models/value.py);
- the running mean/std of the observation features (`feature_norm.stage`, folded in by the
  learner after the gradient steps: models/feature_norm.py).

It runs once per `Learner.update(episodes=...)`, after GAE, on the whole train batch
(before it is split into minibatches), so every real timestep counts exactly once; the
artificial bootstrap timestep PPO appends to each episode is excluded through the loss
mask. The loss never reads the spike-mean buffer (it replays the stored `"spike_mean"`
column), so updating it before the gradient steps of the same update changes nothing
there; the value statistics move before the gradient steps, with the value net's output
layer rescaled so that its values stay the same (GAE already used them).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing

from spikeloop.models.closed_loop_module import SPIKES
from spikeloop.models.encoder import features_and_screen
from spikeloop.models.value import NormalizedValueNet


class UpdateRunningStats(ConnectorV2):
    """Update the spike mean and the value-target statistics of every module that has them."""

    def __call__(self, *, rl_module, batch: dict[str, Any], episodes, **kwargs) -> dict[str, Any]:
        """Update the running statistics; the batch passes through unchanged."""
        for module_id, module_batch in batch.items():
            module = rl_module[module_id].unwrapped() if module_id in rl_module else None
            if module is None:
                continue
            mask = module_batch.get(Columns.LOSS_MASK)

            def real(column, mask=mask):
                return column if mask is None else column[mask]

            if hasattr(module, "update_spike_mean") and SPIKES in module_batch:
                module.update_spike_mean(real(module_batch[SPIKES]))
            value_net = getattr(module, "value_net", None)
            if isinstance(value_net, NormalizedValueNet) and Postprocessing.VALUE_TARGETS in module_batch:
                value_net.update_target_stats(real(module_batch[Postprocessing.VALUE_TARGETS]))
            feature_norm = getattr(module, "feature_norm", None)
            if feature_norm is not None and Columns.OBS in module_batch:
                features, _ = features_and_screen(module_batch[Columns.OBS])
                feature_norm.stage(real(features))
        return batch
