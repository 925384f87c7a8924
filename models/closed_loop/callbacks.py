"""RLlib callbacks that close the loop: open the culture link, send feedback and events.

* `on_environment_created`: open this env runner's `CultureLink` (it knows the
  runner's index, hence which device it drives).
* step feedback (reward and events, scaled by the TD error
  r_t + gamma V(s_{t+1}) - V(s_t)) is sent by the culture connector on the next
  tick, whose forward pass has just computed V(s_{t+1}), ahead of that tick's
  stimulation, so feedback for step t always precedes stim_{t+1};
* `on_episode_end`: the last step's feedback (no next tick sends it) and the
  episode feedback (scaled by episode return - V(s_0)) in one budget, then the
  `episode_end` event with the payload devices expect.
Loop metrics (latency, timeouts, feedback counts, surprise, duty) are logged
under the `culture/` prefix; `on_sample_end` adds what the feedback policy
built since the last sample, per feedback name (count, mean scales), and the live information meter's latest
figures (meter.py: `culture/info_stim`, `culture/info_features`, `culture/info_action`). With the live view on
(`view.enabled`), they also start this env runner's view and publish each tick to it (`spikeloop.experiments.live_view`).
With `output.record`, each env runner's culture link and these callbacks write its session record
(spikeloop.models.closed_loop.session_record: every stimulation, reply, feedback command, event, step and episode end).
Every finished episode's summary, read from the whole episode (whole_episode.py),
is kept in this process until the driver collects it (`pop_episode_records`),
with where this process's env steps went (`step_accounting`). With the `direct` policy (no culture) there
is no link: only the episode summaries and their metrics.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
import tree
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns

from spikeloop.bridge.device.dose import status_metrics
from spikeloop.bridge.trainer.core import LOOP_COUNTERS
from spikeloop.experiments.live_view.runner_view import current_view, start_view, view_settings
from spikeloop.models.closed_loop.episode_numbers import EpisodeNumbers
from spikeloop.models.closed_loop.experiment_config import ClosedLoopExperimentConfig
from spikeloop.models.closed_loop.link import close_link, current_link, log_reply_check, open_link
from spikeloop.models.closed_loop.recorder import LinkRecorder
from spikeloop.models.closed_loop.sent_feedback import FEEDBACK_BY_NAME, log_sent_feedback
from spikeloop.models.closed_loop.settings import CultureSettings
from spikeloop.models.closed_loop.step_feedback import log_step_feedback, step_feedback
from spikeloop.models.closed_loop.whole_episode import WholeEpisode
from spikeloop.models.columns import EXCHANGE_OK, RAW_SPIKES, SPIKES, STIM, STIM_TIMESTAMP

log = logging.getLogger(__name__)

_EPISODE_RECORDS: list[dict[str, Any]] = []
"""Finished episodes of this env runner process, until the driver collects them."""


_STEPS = {"taken": 0, "in_episode": 0}
"""This process's env steps: all taken so far, and those of the episode still going."""


def pop_episode_records() -> list[dict[str, Any]]:
    """The episode summaries this process finished since the last call (the driver writes them to the JSONL)."""
    records = list(_EPISODE_RECORDS)
    _EPISODE_RECORDS.clear()
    return records


def step_accounting() -> dict[str, int]:
    """Where this process's env steps went: every step taken is in a finished episode or in the one still going."""
    return {"env_steps_taken": _STEPS["taken"], "unfinished_episode_steps": _STEPS["in_episode"]}


def _has_culture(env_runner) -> bool:
    return env_runner.config.culture_settings is not None


def _recorder(env_runner) -> LinkRecorder | None:
    """This env runner's session record, if it drives a culture and records (`output.record`)."""
    if env_runner is None or not _has_culture(env_runner) or env_runner.config.session_record is None:
        return None
    try:
        return current_link().recorder
    except RuntimeError:
        return None  # the local env runner of a run with remote ones drives no culture


def _value_of(module, observation: Any) -> float:
    """V(s) for one raw observation from the env."""
    obs = tree.map_structure(lambda x: torch.as_tensor(np.asarray(x))[None], observation)
    with torch.no_grad():
        return float(module.compute_values({Columns.OBS: obs})[0])


def episode_steps(episode: WholeEpisode, link) -> dict[str, np.ndarray]:
    """The episode's compact per-step log (`output.step_log`): what was sent, what came back, what was done."""
    stamps = episode.model_outputs(STIM_TIMESTAMP, dtype=np.uint64)
    return {
        "stim": episode.model_outputs(STIM, dtype=np.float32),
        "raw_spikes": episode.model_outputs(RAW_SPIKES, dtype=np.float32),
        "spikes": episode.model_outputs(SPIKES, dtype=np.float32),
        "action": episode.actions(),
        "reward": episode.rewards().astype(np.float32),
        "exchange_ok": episode.model_outputs(EXCHANGE_OK, dtype=np.float32),
        "stim_timestamp_us": stamps,
        "latency_ms": link.pop_latencies_ms(stamps),
    }


def episode_end_payload(episode: WholeEpisode, episode_index: int) -> dict[str, Any]:
    """The `episode_end` event data devices record (spec: event metadata), over the whole episode."""
    rewards = episode.rewards()
    kills = int(episode.last_info().get("kills", 0))
    game_reward_sum = float(sum(i.get("game_reward", 0.0) for i in episode.step_infos()))  # the game's own reward
    success, fail = int((rewards > 0).sum()), int((rewards < 0).sum())
    length = len(rewards)
    return {
        "episode": episode_index,
        "episode_length": length,
        "episode_reward": float(rewards.sum()),
        "kill_count": kills,
        "game_reward_sum": game_reward_sum,
        "killcount": kills,
        "episode_actions": {"success": success, "fail": fail, "neutral": length - success - fail},
        "success_rate": success / length if length else 0.0,
    }


class ClosedLoopCallbacks(RLlibCallback):
    """Feedback, events and loop metrics for the culture of each env runner."""

    def __init__(self) -> None:
        super().__init__()
        self.episode_numbers = EpisodeNumbers()  # the trial's count, across env runners and resumes

    def on_environment_created(self, *, env_runner, metrics_logger=None, env, env_context, **kwargs) -> None:
        """Open the culture link of this env runner (none for the direct policy)."""
        if not isinstance(env_runner.config, ClosedLoopExperimentConfig):
            raise ValueError(
                "the algorithm config is not a ClosedLoopExperimentConfig: build it with "
                "spikeloop.models.closed_loop.ppo.closed_loop_config"
            )
        settings: CultureSettings | None = env_runner.config.culture_settings
        if settings is None:
            return  # the direct policy: no culture
        link = open_link(settings, env_runner.worker_index, env_runner.config.gamma)
        record = env_runner.config.session_record
        if record is not None and link.recorder is None:  # output.record: this runner's session record
            link.recorder = LinkRecorder(
                record, env_runner.worker_index, link.device, settings.envelope, settings.envelope_policy, settings
            )
        if link.meter is not None:
            link.meter.feature_names = _feature_names(env)  # says which feature the `features` classes follow
        view = view_settings(env_runner.config)
        if view is not None:
            start_view(
                view,
                env_runner.worker_index,
                env,
                link.device.device_id,
                link.reply_check,
                feedback=link.sent_feedback.shown,
                meter=link.meter.shown if link.meter is not None else None,
            )

    def on_episode_step(self, *, episode, env_runner=None, metrics_logger=None, **kwargs) -> None:
        """Count the step; record it (`output.record`); publish it to the live view, if one runs."""
        _STEPS["taken"] += 1
        _STEPS["in_episode"] = episode.t  # steps since the episode began, across the chunks RLlib cut it into
        recorder = _recorder(env_runner)
        if recorder is not None:
            recorder.step(episode.t, int(np.asarray(episode.get_actions(-1))), float(episode.get_rewards(-1)))
        view = current_view()
        if view is not None:
            # The trial's env steps as of the last iteration (RLlib sets it on every env runner): the run's progress.
            view.count_step(getattr(env_runner, "num_env_steps_sampled_lifetime", 0), _STEPS["taken"])
            view.publish_step(episode, kwargs.get("env_index", 0))

    def on_episode_end(
        self, *, episode, prev_episode_chunks=None, env_runner=None, metrics_logger=None, **kwargs
    ) -> None:
        """Episode feedback and the episode_end event, sent now; the episode's summary kept for the driver.

        Everything is read from the whole episode: RLlib hands over its last chunk as `episode` and the chunks
        it cut off at earlier sample boundaries as `prev_episode_chunks`.
        """
        last_chunk, episode = episode, WholeEpisode.of(episode, prev_episode_chunks)
        _STEPS["in_episode"] = 0
        payload = episode_end_payload(episode, self.episode_numbers.next(env_runner.config))
        # A curriculum's stage, in the run's records only (the device's episode_end event keeps its own fields).
        stage = (
            {"scenario": episode.last_info().get("scenario")} if env_runner.config.env_config.get("curriculum") else {}
        )
        if not _has_culture(env_runner):
            _EPISODE_RECORDS.append(
                {"device_id": None, "env_runner": env_runner.worker_index, **payload, **stage, "wall_time": time.time()}
            )
            _log_episode_metrics(metrics_logger, payload)
            return
        link = current_link()
        if link.recorder is not None:
            link.recorder.episode_end(
                payload["episode"],
                payload["episode_length"],
                payload["episode_reward"],
                payload["kill_count"],
                bool(last_chunk.is_terminated),
            )
        # The last step's feedback (no next tick will send it) and the episode feedback, in one budget.
        value_next = 0.0 if last_chunk.is_terminated else _value_of(env_runner.module, last_chunk.get_observations(-1))
        last_step = step_feedback(link.feedback_policy, last_chunk, value_next)
        log_step_feedback(metrics_logger, last_step, last_chunk)
        value_s0 = episode.value_s0()
        episode_return = float(np.sum(episode.rewards()))
        commands, scales = link.feedback_policy.for_episode(episode_return, value_s0)
        link.send_feedback(last_step.commands, commands)
        # An episode the loop paused in for a lost device (loop.on_device_loss: wait) says so, to the device too.
        outages = link.pop_episode_outages()
        outage = {"device_outages": len(outages), "device_outage_s": round(sum(o["waited_s"] for o in outages), 3)}
        link.send_events([("episode_end", payload | outage if outages else payload)])
        view = current_view()
        if view is not None:
            view.end_episode(episode_return, payload["episode"], payload["kill_count"])
        record = (
            payload
            | outage
            | stage
            | {
                "episode_feedback_commands": len(commands),
                "episode_surprise_td_error": scales.td_error,
                "timeouts_in_episode": int(len(episode) - np.sum(episode.model_outputs(EXCHANGE_OK))),
            }
        )
        if not link.device.unpaced:  # an unpaced culture's run repeats bit for bit: no clock in its records
            record["wall_time"] = time.time()
        if link.settings.step_log:
            record["steps"] = episode_steps(episode, link)  # RunLog writes it to steps/, not the JSONL
        _EPISODE_RECORDS.append({"device_id": link.device.device_id, "env_runner": link.runner_index} | record)
        if metrics_logger is not None:
            stats = link.stats()
            lat = stats["latency_ms"]
            for key in ("p50", "p99", "max"):
                metrics_logger.log_value(f"culture/latency_{key}_ms", lat[key], reduce="mean", window=1)
            for key in (*LOOP_COUNTERS, "clamped_commands", "feedback_sent", "feedback_suppressed", "events_sent"):
                metrics_logger.log_value(f"culture/{key}", stats[key], reduce="max", window=1)
            # The device's own account (its last device_status): charge delivered and commands it refused.
            link.device_dose = status_metrics(stats.get("device_status"))
            for key, value in link.device_dose.items():
                metrics_logger.log_value(f"culture/{key}", value, reduce="max", window=1)
            # What left per step once the budget applied (commands_per_step counts what was asked for).
            counts = link.counts
            metrics_logger.log_value(
                "culture/feedback_dropped", counts.get("feedback_dropped", 0), reduce="max", window=1
            )
            metrics_logger.log_value(
                "culture/feedback_datagrams_per_step",
                counts.get("feedback_commands", 0) / max(1, counts.get("exchanges", 0)),
                window=1,
            )
            metrics_logger.log_value("culture/device_duty", link.duty(), window=1)
            metrics_logger.log_value("culture/episode_surprise_td_error", scales.td_error, window=100)
        _log_episode_metrics(metrics_logger, payload)

    def on_sample_end(self, *, env_runner=None, metrics_logger=None, samples=None, **kwargs) -> None:
        """What the feedback policy built since the last sample: per feedback name, a count and the mean scales."""
        if metrics_logger is None or not _has_culture(env_runner):
            return
        try:
            link = current_link()
        except RuntimeError:
            return  # the local env runner of a run with remote ones drives no culture
        log_feedback_telemetry(metrics_logger, link.feedback_policy.telemetry.drain())
        log_sent_feedback(metrics_logger, link.sent_feedback.drain())  # absolute Hz and uA, after the envelope
        log_reply_check(metrics_logger, link)
        # Outages waited out (loop.on_device_loss: wait), since the link opened: TensorBoard's device/outages, ...
        metrics_logger.log_value("culture/device_outages", link.counts["device_outages"], reduce="max", window=1)
        metrics_logger.log_value(
            "culture/device_outage_s", link.counts["device_outage_ms"] / 1000, reduce="max", window=1
        )
        if link.meter is not None:  # the live information meter's latest figures (TensorBoard culture/info_*)
            for name, value in link.meter.metrics().items():
                metrics_logger.log_value(f"culture/{name}", value, window=1)


def _feature_names(vector_env) -> tuple[str, ...]:
    """The names of the observation's features, from the first game of a gymnasium vector env (() if unknown)."""
    from spikeloop.envs.features import feature_names

    envs = getattr(vector_env, "envs", None)  # SyncVectorEnv; an AsyncVectorEnv's games are in subprocesses
    settings = getattr(envs[0].unwrapped, "feature_settings", None) if envs else None
    return tuple(feature_names(settings)) if settings is not None else ()


def log_feedback_telemetry(metrics_logger, telemetry: dict[str, dict[str, float]]) -> None:
    """Per feedback name (reward_positive, an event, episode_negative, step, episode): count and mean scales.

    Counts add up over the iteration (and over env runners); scales are this sample's means.
    """
    for name, stats in telemetry.items():
        for stat, value in stats.items():
            key = f"{FEEDBACK_BY_NAME}{name}/{stat}"  # TensorBoard: feedback/<name>/<stat>
            if stat == "count":
                metrics_logger.log_value(key, value, reduce="sum")  # "sum" restarts each iteration
            else:
                metrics_logger.log_value(key, value, window=1)


def _log_episode_metrics(metrics_logger, payload: dict[str, Any]) -> None:
    if metrics_logger is not None:
        metrics_logger.log_value("episode/kills", payload["kill_count"], window=100)
        metrics_logger.log_value("episode/success_rate", payload["success_rate"], window=100)
        # The reference trainer's success / fail / neutral action counts: steps with a positive, negative or zero
        # reward, summed over the episodes that ended in the iteration.
        for kind, count in payload["episode_actions"].items():
            metrics_logger.log_value(f"episode/{kind}_actions", count, reduce="sum")  # "sum" restarts each iteration


__all__ = ["ClosedLoopCallbacks", "close_link", "episode_end_payload", "pop_episode_records", "step_accounting"]
