"""The dashboard's learning curve and run progress: finished episodes, env steps against the stop budget.

The loop side is as cheap as the rest of the view: `LearningLog.end_episode` appends one tuple per
episode, `LearningLog.count_step` compares two ints per env step (and stores a time once per iteration,
when the driver's env step count arrives). Everything else (JSON, rates, the time left) is computed in
the server's threads when a viewer asks.

Env steps are the trial's, as RLlib tells every env runner after each iteration (the count `stop.env_steps`
is checked against), plus the steps this env runner took since; the other runners' steps of the iteration
in progress show up when it ends.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from spikeloop.experiments.run_log import curve_window

CURVE_POINTS = 10_000
"""Finished episodes an env runner keeps for its curve (the latest; older ones fall off a long run's curve)."""
RATE_ITERATIONS = 10
"""Iterations the env step rate (and so the time left) is measured over."""


@dataclass(frozen=True)
class RunBudget:
    """The experiment's stop conditions (`stop:`), as the dashboard measures progress against them."""

    env_steps: int | None = None
    episodes: int | None = None
    iterations: int | None = None
    time_s: float | None = None
    env_steps_per_iteration: int = 0
    """The train batch: an iteration budget is shown as about iterations x this many env steps."""


@dataclass
class LearningLog:
    """One env runner's finished episodes and env step count, for the curve and the progress bar."""

    budget: RunBudget | None = None
    episodes: deque = field(default_factory=lambda: deque(maxlen=CURVE_POINTS))
    """(trial episode number, return, kills, wall time) per finished episode of this env runner."""
    started: float = field(default_factory=time.monotonic)
    _trial_steps: int = -1
    _taken_at_sync: int = 0
    _taken: int = 0
    _syncs: deque = field(default_factory=lambda: deque(maxlen=RATE_ITERATIONS + 1))

    def end_episode(self, episode: int, episode_return: float, kills: int) -> None:
        """Keep a finished episode (called by the env runner at each episode end)."""
        self.episodes.append((episode, episode_return, kills, time.time()))

    def count_step(self, trial_env_steps: int, env_steps_taken: int) -> None:
        """Note an env step: the trial's count as of the last iteration, and this runner's steps so far."""
        if trial_env_steps != self._trial_steps:  # a new iteration's count arrived (or the first step)
            if self._trial_steps >= 0:
                self._syncs.append((time.monotonic(), trial_env_steps))
            # This step came after the count, so it is not in it.
            self._trial_steps, self._taken_at_sync = trial_env_steps, env_steps_taken - 1
        self._taken = env_steps_taken

    @property
    def env_steps(self) -> int:
        """The trial's env steps as far as this runner knows (last iteration's count + its own since)."""
        return max(0, self._trial_steps) + self._taken - self._taken_at_sync

    def env_steps_per_s(self) -> float | None:
        """Env steps per second over the last iterations (learner updates included); None before two."""
        if len(self._syncs) < 2:
            return None
        (t0, s0), (t1, s1) = self._syncs[0], self._syncs[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def episodes_per_s(self) -> float | None:
        """Finished episodes (of the trial, by their numbers) per second over this runner's last 50."""
        recent = list(self.episodes)[-50:]
        if len(recent) < 2 or recent[-1][3] <= recent[0][3]:
            return None
        return (recent[-1][0] - recent[0][0]) / (recent[-1][3] - recent[0][3])

    def curve(self, since: int = 0) -> dict:
        """The finished episodes numbered above `since`, as JSON-ready columns, and the rolling mean's window."""
        kept = list(self.episodes)
        rows = [e for e in kept if e[0] > since]
        return {
            "window": curve_window(len(kept)),  # over all kept episodes, as learning_curve.png over the JSONL
            "keep": CURVE_POINTS,
            "episode": [e[0] for e in rows],
            "return": [round(e[1], 4) for e in rows],
            "kills": [e[2] for e in rows],
        }

    def progress(self) -> dict:
        """Env steps against each stop condition the experiment sets, and an estimate of the time left."""
        steps, budget = self.env_steps, self.budget or RunBudget()
        elapsed_s = time.monotonic() - self.started
        episodes = self.episodes[-1][0] if self.episodes else 0
        step_rate, episode_rate = self.env_steps_per_s(), self.episodes_per_s()
        limits: list[dict] = []

        def limit(name: str, done: float, total: float, rate: float | None, approximate: bool = False) -> None:
            left = max(0.0, total - done)
            limits.append(
                {
                    "name": name,
                    "done": round(done, 1),
                    "budget": total,
                    "fraction": round(min(1.0, done / total), 4) if total else 1.0,
                    "time_left_s": round(left / rate, 1) if rate else None,
                    "approximate": approximate,
                }
            )

        if budget.env_steps is not None:
            limit("env_steps", steps, budget.env_steps, step_rate)
        if budget.iterations is not None and budget.env_steps_per_iteration:
            limit("iterations", steps, budget.iterations * budget.env_steps_per_iteration, step_rate, True)
        if budget.episodes is not None:
            limit("episodes", episodes, budget.episodes, episode_rate)
        if budget.time_s is not None:
            limit("time_s", elapsed_s, budget.time_s, 1.0)  # since this env runner started, a little before the trial
        # The run stops at the first condition reached: the one furthest along, or the soonest.
        known = [x for x in limits if x["time_left_s"] is not None]
        first = (
            min(known, key=lambda x: x["time_left_s"])
            if known
            else max(limits, key=lambda x: x["fraction"], default=None)
        )
        return {
            "env_steps": steps,
            "env_steps_per_s": None if step_rate is None else round(step_rate, 1),
            "elapsed_s": round(elapsed_s, 1),
            "limits": limits,
            "first": first,
        }
