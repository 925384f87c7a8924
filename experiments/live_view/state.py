"""The JSON the dashboard reads: the static layout once, then one small state per tick."""

from __future__ import annotations

import time
from typing import Any

from spikeloop.bridge.wire.channels import (
    ENCODING_ELECTRODES,
    EVENT_FEEDBACK_ELECTRODES,
    FORBIDDEN_ELECTRODES,
    GRID_SIDE,
    N_ENCODING,
    NEGATIVE_FEEDBACK_ELECTRODES,
    POSITIVE_FEEDBACK_ELECTRODES,
    SPIKE_GROUP_NAMES,
    SPIKE_GROUPS,
    STIM_AMPLITUDE_RANGE_UA,
    STIM_FREQUENCY_RANGE_HZ,
)
from spikeloop.experiments.live_view.publisher import Publisher, Tick


def learning(publisher: Publisher, since: int = 0) -> dict[str, Any]:
    """The learning curve's points after episode `since` (this env runner's episodes, by trial number)."""
    return {"runner": publisher.runner_index, "device": publisher.device_id} | publisher.learning.curve(since)


def layout(publisher: Publisher) -> dict[str, Any]:
    """What does not change during a run: the electrode map, ranges, who is playing."""
    return {
        "runner": publisher.runner_index,
        "device": publisher.device_id,
        "grid_side": GRID_SIDE,
        "encoding_electrodes": list(ENCODING_ELECTRODES),
        "spike_groups": {name: list(SPIKE_GROUPS[name]) for name in SPIKE_GROUP_NAMES},
        "feedback_electrodes": {
            "positive": list(POSITIVE_FEEDBACK_ELECTRODES),
            "negative": list(NEGATIVE_FEEDBACK_ELECTRODES),
            **{k: list(v) for k, v in EVENT_FEEDBACK_ELECTRODES.items()},
        },
        "forbidden_electrodes": sorted(FORBIDDEN_ELECTRODES),
        "frequency_range_hz": list(STIM_FREQUENCY_RANGE_HZ),
        "amplitude_range_ua": list(STIM_AMPLITUDE_RANGE_UA),
    }


def _floats(values, digits: int) -> list[float]:
    return [round(float(v), digits) for v in values]


def _elapsed_ms(stim_timestamp_us: int, wall_time: float) -> float:
    """Time from the stimulation's wire timestamp (this node's wall clock) to the tick's publication.

    Only the timestamp's low 32 bits are trusted: the episode column may hold it as int32 (wrapped),
    and 2**32 us (71 minutes) is far beyond any tick.
    """
    return ((int(wall_time * 1e6) - stim_timestamp_us) % 2**32) / 1e3


FEEDBACK_FIGURES = (
    "mean_frequency_hz",
    "max_frequency_hz",
    "mean_amplitude_ua",
    "max_amplitude_ua",
    "last_frequency_hz",
    "last_amplitude_ua",
)


def feedback_rows(publisher: Publisher) -> list[dict[str, Any]]:
    """The feedback panel: per feedback name, what was sent this iteration after the envelope (Hz, uA, pulses)."""
    shown = publisher.feedback_source() if publisher.feedback_source is not None else {}
    return [
        {"name": name, "sent": int(shown[name]["sent"]), "last_pulses": int(shown[name]["last_pulses"])}
        | {key: round(float(shown[name][key]), 3) for key in FEEDBACK_FIGURES}
        for name in sorted(shown)
    ]


def tick_state(publisher: Publisher, frames_encoded: int, clients: int, tick: Tick | None = None) -> dict[str, Any]:
    """A tick (default: the latest) as JSON-ready values, built in the server thread, not in the loop."""
    tick = tick or publisher.latest
    base = {
        "runner": publisher.runner_index,
        "device": publisher.device_id,
        "episodes_done": publisher.episodes_done,
        "recent_returns": _floats(publisher.recent_returns, 3),
        "frames": {"encoded": frames_encoded, "clients": clients},
        "feedback": feedback_rows(publisher),
        # The run's progress, and the newest finished episode: the page fetches /learning.json when it changes.
        "progress": publisher.learning.progress(),
        "curve_last_episode": publisher.learning.episodes[-1][0] if publisher.learning.episodes else 0,
    }
    if publisher.reply_check is not None:
        base["replies"] = publisher.reply_check()
    if publisher.meter is not None:
        base["meter"] = publisher.meter()  # bits per tick about the stimulation, the observation, the action
    if tick is None:
        return base | {"seq": 0}
    stim_to_frame_ms = _elapsed_ms(tick.stim_timestamp_us, tick.wall_time) if tick.stim_timestamp_us else None
    return base | {
        "seq": tick.seq,
        "age_s": round(time.time() - tick.wall_time, 3),
        # With same-frame rounds the view shows the first round's stimulation and reply.
        "stim": {
            "electrodes": list(ENCODING_ELECTRODES),
            "frequency_hz": _floats(tick.stim[:N_ENCODING], 2),
            "amplitude_ua": _floats(tick.stim[N_ENCODING : 2 * N_ENCODING], 3),
        },
        "spikes": {
            "groups": list(SPIKE_GROUP_NAMES),
            "counts": _floats(tick.raw_spikes[: len(SPIKE_GROUP_NAMES)], 2),
            "decoder_input": _floats(tick.decoder_spikes[: len(SPIKE_GROUP_NAMES)], 2),
        },
        "action": {"index": tick.action, "name": publisher.action_name(tick.action)},
        "reward": {
            "step": round(tick.reward, 4),
            "episode_return": round(tick.episode_return, 3),
            "episode": tick.episode,
            "episode_step": tick.episode_step,
        },
        "loop": {
            "exchange_ok": tick.exchange_ok,
            "tick_ms": round(tick.tick_s * 1e3, 2),
            "ticks_per_s": round(1.0 / tick.tick_s, 1) if tick.tick_s > 0 else None,
            "stim_to_frame_ms": None if stim_to_frame_ms is None else round(stim_to_frame_ms, 2),
        },
    }
