"""The env runner's side of the live view: keep the latest tick, nothing more.

`publish` runs inside the closed loop, once per tick, so it only stores
references (the game frame is the engine's own fresh array, never copied) and
does a few float additions. A newer tick simply replaces the older one: frames
are dropped, never queued, and nothing is encoded here. The HTTP server reads
`latest` from its own threads and does the JSON and JPEG work there, only when
a client asks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spikeloop.experiments.live_view.progress import LearningLog

RECENT_EPISODES = 20
"""How many finished episodes' returns the dashboard shows."""


@dataclass(frozen=True, slots=True)
class Tick:
    """One loop tick as the env runner saw it (arrays are references, not copies)."""

    seq: int
    wall_time: float
    frame: np.ndarray | None
    stim: np.ndarray
    """[16]: 8 frequencies (Hz) then 8 amplitudes (uA), entry i on ENCODING_ELECTRODES[i]."""
    raw_spikes: np.ndarray
    """[8]: the culture's counts per group, before any ablation."""
    decoder_spikes: np.ndarray
    """[8]: what the decoder saw (after ablation)."""
    action: int
    reward: float
    exchange_ok: bool
    stim_timestamp_us: int
    episode: int
    episode_step: int
    episode_return: float
    tick_s: float
    """Wall time since the previous tick (the loop's period)."""


@dataclass
class Publisher:
    """Latest tick plus running episode bookkeeping for one env runner."""

    runner_index: int
    device_id: str = ""
    action_names: tuple[str, ...] = ()
    reply_check: Callable[[], dict[str, Any]] | None = None
    """Which stimulation the culture's replies follow, and unsolicited datagrams (the culture link's
    `reply_check`); called by the server when it builds a state, never by the loop."""
    latest: Tick | None = None
    episodes_done: int = 0
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))
    _episode_key: Any = None
    _episode_return: float = 0.0
    _episode_step: int = 0
    _last_tick: float = 0.0
    _seq: int = 0
    feedback_source: Callable[[], Mapping[str, Mapping[str, float]]] | None = None
    """Per feedback name, what was sent this iteration (`SentFeedback.shown`); None: the panel stays empty."""
    meter: Callable[[], dict[str, Any]] | None = None
    """The live information meter's latest figures (`CultureMeter.shown`), read by the server; None: meter off."""
    learning: LearningLog = field(default_factory=LearningLog)
    """Finished episodes and env steps for the learning curve and the run's progress."""

    def publish(
        self,
        *,
        episode_key: Any,
        frame: np.ndarray | None,
        stim: np.ndarray,
        raw_spikes: np.ndarray,
        decoder_spikes: np.ndarray,
        action: int,
        reward: float,
        exchange_ok: bool,
        stim_timestamp_us: int,
    ) -> None:
        """Replace the latest tick (called by the env runner after each env step)."""
        now = time.perf_counter()
        if episode_key != self._episode_key:  # a new episode (RLlib's episode id, or a chunk of it)
            self._episode_key, self._episode_return, self._episode_step = episode_key, 0.0, 0
        self._episode_return += reward
        self._episode_step += 1
        self._seq += 1
        tick_s = now - self._last_tick if self._last_tick else 0.0
        self._last_tick = now
        # One attribute store: readers in other threads see either the old or the new tick, whole.
        self.latest = Tick(
            self._seq,
            time.time(),
            frame,
            stim,
            raw_spikes,
            decoder_spikes,
            action,
            reward,
            exchange_ok,
            stim_timestamp_us,
            self.episodes_done + 1,
            self._episode_step,
            self._episode_return,
            tick_s,
        )

    def end_episode(self, episode_return: float) -> None:
        """Record a finished episode's return (shown as the recent returns)."""
        self.episodes_done += 1
        self.recent_returns.append(float(episode_return))
        self._episode_key = None

    def action_name(self, action: int) -> str:
        """A readable name of an action index (its buttons), or the index itself."""
        if 0 <= action < len(self.action_names):
            return self.action_names[action]
        return str(action)
