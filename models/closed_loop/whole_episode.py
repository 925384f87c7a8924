"""One finished episode read whole, from the chunks RLlib cut it into.

RLlib cuts an ongoing episode at every sample boundary: the part sampled so far
goes to the learner and a continuation chunk carries on. When the episode ends,
`on_episode_end` gets the last chunk as `episode` and the earlier ones as
`prev_episode_chunks`. Everything recorded about an episode (return, length,
action counts, V(s_0), kills, the step log) and everything sent for it (episode
feedback, the `episode_end` event) is read through `WholeEpisode`, never from the
last chunk alone.

A continuation chunk starts with the previous chunk's last observation and info
(RLlib's one-step lookback), so each chunk's own steps are its rewards, actions
and model outputs, and its infos after the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.rllib.core.columns import Columns


@dataclass(frozen=True)
class WholeEpisode:
    """The chunks of one episode, oldest first, read as one."""

    chunks: tuple[Any, ...]

    @classmethod
    def of(cls, episode: Any, prev_episode_chunks: Sequence[Any] | None = None) -> WholeEpisode:
        """The episode whose last chunk is `episode`, after the chunks RLlib already returned."""
        return cls((*(prev_episode_chunks or ()), episode))

    @property
    def last(self) -> Any:
        """The chunk the episode ended in."""
        return self.chunks[-1]

    @property
    def is_terminated(self) -> bool:
        """True when the game ended the episode (not a time limit)."""
        return bool(self.last.is_terminated)

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    def rewards(self) -> np.ndarray:
        """Every step's reward, in order."""
        return self._concat([np.asarray(chunk.get_rewards(), dtype=np.float64) for chunk in self.chunks])

    def actions(self) -> np.ndarray:
        """Every step's action, in order."""
        return self._concat([np.asarray(chunk.get_actions()) for chunk in self.chunks])

    def model_outputs(self, column: str, dtype: Any = None) -> np.ndarray:
        """One extra model output column (e.g. `stim`, `exchange_ok`) for every step, in order."""
        return self._concat(
            [np.asarray(chunk.get_extra_model_outputs(column), dtype=dtype) for chunk in self.chunks if len(chunk)]
        )

    def step_infos(self) -> list[dict[str, Any]]:
        """The info each step returned (the reset's info and the lookback copies left out)."""
        return [info for chunk in self.chunks for info in list(chunk.get_infos())[1:]]

    def last_info(self) -> dict[str, Any]:
        """The info of the last step (or of the reset, for an episode without steps)."""
        infos = self.last.get_infos()
        return infos[-1] if len(infos) else {}

    def value_s0(self) -> float:
        """V(s_0): the value the module predicted for the episode's first observation."""
        first = next((chunk for chunk in self.chunks if len(chunk)), None)
        return float(first.get_extra_model_outputs(Columns.VF_PREDS, 0)) if first is not None else 0.0

    @staticmethod
    def _concat(parts: list[np.ndarray]) -> np.ndarray:
        parts = [p for p in parts if p.size or p.ndim > 1]
        return np.concatenate(parts) if parts else np.zeros(0)
