"""`ablation: shuffled`: the decoder reads the culture's answer to another stimulation.

A decoder that learns on `zero` or `random` input is told apart from one that reads the culture, but neither
control keeps what the culture's answers look like (their rates, which groups fire together, how they vary).
Shuffled does: each step the decoder gets one of the culture's own recent answers, drawn at random from the
last `size` it gave, in place of the answer to this step's stimulation. Everything about the counts is the
culture's; only the mapping from stimulation to answer is broken. A decoder that still learns under it learns
from the answers' statistics, not from the culture's response to the game.

One pool per env runner (the culture it talks to), drawn with the runner's seeded generator, so a run repeats.
Before the culture has answered once there is nothing to draw: the first step sees zeros.
"""

from __future__ import annotations

import numpy as np
import torch


class ShuffledAnswers:
    """The culture's last `size` answers (one row of counts each), and a draw from them for each new row."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the shuffled answers' pool holds at least 1 answer, not {size}")
        self.size = size
        self._answers: np.ndarray | None = None
        self._count = 0
        self._next = 0

    def swap(self, raw_spikes: np.ndarray, generator: torch.Generator | None = None) -> np.ndarray:
        """Per row: an earlier answer in place of this one (zeros while the pool is empty); then keep this one."""
        out = np.zeros_like(raw_spikes)
        for row in range(raw_spikes.shape[0]):
            if self._count:
                pick = int(torch.randint(self._count, (1,), generator=generator).item())
                assert self._answers is not None
                out[row] = self._answers[pick]
            self._keep(raw_spikes[row])
        return out

    def _keep(self, answer: np.ndarray) -> None:
        if self._answers is None:
            self._answers = np.zeros((self.size, *answer.shape), dtype=answer.dtype)
        self._answers[self._next] = answer
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)
