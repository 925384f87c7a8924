"""The live view of one env runner process: its publisher, its server, where its game frames come from.

`ClosedLoopCallbacks` calls `start_view` when the env runner creates its
environment (only when the experiment turned the view on), then
`RunnerView.publish_step` after every env step and `RunnerView.end_episode` at
each episode end. With the view off `current_view()` is None and the callbacks
do nothing else.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spikeloop.experiments.live_view.progress import LearningLog
from spikeloop.experiments.live_view.publisher import Publisher
from spikeloop.experiments.live_view.server import LiveViewServer
from spikeloop.experiments.live_view.settings import ViewSettings

log = logging.getLogger(__name__)

# Extra-output columns the culture connector writes (its module imports torch and RLlib; these names are the contract).
STIM, SPIKES, RAW_SPIKES, EXCHANGE_OK, STIM_TIMESTAMP = (
    "stim",
    "spikes",
    "raw_spikes",
    "exchange_ok",
    "stim_timestamp_us",
)
ANY_HOST = ("0.0.0.0", "", "::")


def view_settings(config: Any) -> ViewSettings | None:
    """The enabled view settings of an algorithm config, or None when the view is off."""
    settings = config.live_view
    return settings if settings is not None and settings.enabled else None


def _frame_source(vector_env: Any) -> Callable[[], np.ndarray | None] | None:
    """`last_rgb_frame` of the first game in a gymnasium vector env, if it lives in this process."""
    envs = getattr(vector_env, "envs", None)  # SyncVectorEnv; an AsyncVectorEnv's games are in subprocesses
    if not envs:
        return None
    return getattr(envs[0].unwrapped, "last_rgb_frame", None)


def _action_names(vector_env: Any) -> tuple[str, ...]:
    envs = getattr(vector_env, "envs", None)
    action_set = getattr(envs[0].unwrapped, "action_set", None) if envs else None
    if action_set is None:
        return ()
    from spikeloop.envs.actions import action_buttons

    return tuple("+".join(b.name.lower() for b in buttons) or "no-op" for buttons in action_buttons(action_set))


@dataclass
class RunnerView:
    """This process's live view."""

    settings: ViewSettings
    publisher: Publisher
    server: LiveViewServer
    frame_source: Callable[[], np.ndarray | None] | None
    node_ip: str
    _failed: bool = False

    @property
    def url(self) -> str:
        """The dashboard's address as seen from other machines (or this one, for 127.0.0.1)."""
        host = self.node_ip if self.settings.host in ANY_HOST else self.settings.host
        return f"http://{host}:{self.server.port}/"

    def address(self) -> dict[str, Any]:
        """Where this view is served (what `live_view.json` lists)."""
        return {
            "env_runner": self.publisher.runner_index,
            "device": self.publisher.device_id,
            "url": self.url,
            "mjpeg": self.url + "doom.mjpeg",
            "node_ip": self.node_ip,
            "bind_host": self.settings.host,
            "port": self.server.port,
        }

    def publish_step(self, episode: Any, env_index: int = 0) -> None:
        """Publish the tick just taken (first game of the runner only); never raises into the loop."""
        if env_index != 0 or self._failed:
            return
        try:
            extra = episode.get_extra_model_outputs
            self.publisher.publish(
                episode_key=episode.id_,
                frame=self.frame_source() if self.frame_source is not None else None,
                stim=np.asarray(extra(STIM, -1)),
                raw_spikes=np.asarray(extra(RAW_SPIKES, -1)),
                decoder_spikes=np.asarray(extra(SPIKES, -1)),
                action=int(episode.get_actions(-1)),
                reward=float(episode.get_rewards(-1)),
                exchange_ok=bool(extra(EXCHANGE_OK, -1)),
                stim_timestamp_us=int(extra(STIM_TIMESTAMP, -1)),
            )
        except Exception:  # a view problem must not stop an experiment on a living culture
            self._failed = True
            log.exception("live view of env runner %d stopped publishing", self.publisher.runner_index)

    def end_episode(self, episode_return: float, episode: int = 0, kills: int = 0) -> None:
        """Record a finished episode (its trial episode number, return and kills) for the dashboard."""
        self.publisher.end_episode(episode_return)
        self.publisher.learning.end_episode(episode, episode_return, kills)

    def count_step(self, trial_env_steps: int, env_steps_taken: int) -> None:
        """Note an env step of any of the runner's games, for the run's progress (two ints compared)."""
        self.publisher.learning.count_step(trial_env_steps, env_steps_taken)

    def close(self) -> None:
        """Stop the server."""
        self.server.close()


_VIEW: RunnerView | None = None


def _bind(publisher: Publisher, settings: ViewSettings, port: int) -> LiveViewServer:
    try:
        return LiveViewServer(publisher, settings, port)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        # Another run (or another runner on this node) has it: serve anyway; live_view.json tells where.
        log.warning("live view port %d is in use on this node; serving on a free port instead", port)
        return LiveViewServer(publisher, settings, 0)


def start_view(
    settings: ViewSettings,
    runner_index: int,
    vector_env: Any,
    device_id: str = "",
    reply_check: Callable[[], dict[str, Any]] | None = None,
    feedback: Callable[[], Any] | None = None,
    meter: Callable[[], dict[str, Any]] | None = None,
) -> RunnerView:
    """Start this process's view (once); a re-created env only changes where frames come from.

    `reply_check` (the culture link's) is read by the server, when a viewer asks, never by the loop;
    `feedback`: what the feedback panel shows (the link's `SentFeedback.shown`); `meter`: what the information
    panel shows (the link's `CultureMeter.shown`; None: the meter is off).
    """
    global _VIEW
    source = _frame_source(vector_env)
    if _VIEW is not None:
        _VIEW.frame_source = source
        return _VIEW
    if source is None:
        log.warning("live view: the games run in subprocesses (async vector env); serving state without frames")
    import ray

    publisher = Publisher(
        runner_index,
        device_id,
        _action_names(vector_env),
        reply_check=reply_check,
        feedback_source=feedback,
        meter=meter,
        learning=LearningLog(settings.budget),
    )
    server = _bind(publisher, settings, settings.port_for(runner_index)).start()
    _VIEW = RunnerView(settings, publisher, server, source, ray.util.get_node_ip_address())
    print(f"live view of env runner {runner_index} ({device_id}): {_VIEW.url}", flush=True)
    return _VIEW


def current_view() -> RunnerView | None:
    """This process's view, or None when the view is off."""
    return _VIEW


def stop_view() -> None:
    """Stop and forget this process's view."""
    global _VIEW
    if _VIEW is not None:
        _VIEW.close()
        _VIEW = None
