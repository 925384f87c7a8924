"""Learner connector piece that drops the columns the loss never reads before the batch becomes tensors.

The wire timestamp of each stimulation (`stim_timestamp_us`, uint64 microseconds) is kept for analysis on the env
runner (episode callbacks, the live view); the learner has no use for it. Left in, it would become a uint64 tensor on
the learner's device, and torch on CUDA cannot index one: the minibatch shuffle fails with
`"index_cuda" not implemented for 'UInt64'`. So it is dropped before RLlib's `NumpyToTensor`.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.connector_v2 import ConnectorV2

from spikeloop.models.columns import STIM_TIMESTAMP

UNUSED_BY_LEARNER = (STIM_TIMESTAMP,)
"""Episode columns recorded for analysis only: never part of the learner's batch."""


class DropUnusedColumns(ConnectorV2):
    """Remove `UNUSED_BY_LEARNER` from every module's batch; everything else passes through untouched."""

    def __call__(self, *, rl_module, batch: dict[str, Any], episodes, **kwargs) -> Any:
        """Drop the analysis-only columns (per module, and at top level before the module mapping)."""
        for part in (batch, *(v for v in batch.values() if isinstance(v, dict))):
            for column in UNUSED_BY_LEARNER:
                part.pop(column, None)
        return batch
