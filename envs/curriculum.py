"""Curriculum: a list of scenarios, advanced when the recent mean episode reward passes a threshold."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class Curriculum:
    """Walks through `scenarios`; moves on once the mean reward of the last `window_episodes` passes.

    `threshold` is one number for every stage or one per stage (the last stage's threshold is
    never used: there is nothing after it). The window restarts at each new stage, so a stage
    is judged only on episodes played in it.
    """

    def __init__(self, scenarios: Sequence[str], threshold: float | Sequence[float], window_episodes: int = 20):
        if isinstance(scenarios, (str, bytes)) or not isinstance(scenarios, Sequence) or not scenarios:
            raise ValueError(f"scenarios: a list of at least one scenario, got {scenarios!r}")
        if isinstance(window_episodes, bool) or not isinstance(window_episodes, int) or window_episodes < 1:
            raise ValueError(f"window_episodes: must be a whole number >= 1, got {window_episodes!r}")
        # Numbers only: `float("1")` would take text, and true would be read as 1.
        numbers = [threshold] if not isinstance(threshold, Sequence) or isinstance(threshold, str) else threshold
        if any(isinstance(t, bool) or not isinstance(t, int | float) for t in numbers):
            raise ValueError(f"threshold: must be a number or a list of numbers, got {threshold!r}")
        thresholds = [float(threshold)] * len(scenarios) if isinstance(threshold, int | float) else list(threshold)
        if len(thresholds) != len(scenarios):
            raise ValueError(f"got {len(thresholds)} thresholds for {len(scenarios)} scenarios")
        self.scenarios = list(scenarios)
        self.thresholds = thresholds
        self.window_episodes = window_episodes
        self.stage = 0
        self._rewards: deque[float] = deque(maxlen=window_episodes)

    @property
    def current(self) -> str:
        """The scenario of the current stage."""
        return self.scenarios[self.stage]

    @property
    def finished(self) -> bool:
        """Whether the last stage has been reached."""
        return self.stage == len(self.scenarios) - 1

    def mean_reward(self) -> float | None:
        """Mean episode reward over the current window, None before any episode of this stage."""
        return sum(self._rewards) / len(self._rewards) if self._rewards else None

    def record(self, episode_reward: float) -> bool:
        """Add one finished episode's reward; return True if this advanced to the next stage."""
        self._rewards.append(float(episode_reward))
        window_full = len(self._rewards) == self.window_episodes
        if self.finished or not window_full or self.mean_reward() < self.thresholds[self.stage]:
            return False
        self.stage += 1
        self._rewards.clear()
        return True
