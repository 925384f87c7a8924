"""The `discarded` event: work a device saw that the trainer threw away, and which copy of the record stands.

A trial that stops on a lost device (`loop.on_device_loss: stop`) or fails drops the iteration under way: its
episodes never reach episodes.jsonl and the learner never sees its steps, but the device stimulated and recorded
them, and heard their `episode_end`. When the trial starts again (`spikeloop train --resume`, Tune's retry), it
numbers episodes on from its episodes.jsonl, so the device hears those numbers a second time. Before its first
stimulation each env runner therefore tells its device what no longer stands (docs/protocol.md): the
stimulations stamped after `stimulations_after_us` and before `stimulations_until_us` (the stamps the trainer put
on them), and the `episode_end` events in that range numbered `episodes_from` or more. Everything recorded after
the event is the copy that stands. `mark_discarded` applies that to a recording's entries and events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DISCARDED_EVENT = "discarded"
DISCARDED_KEYS = ("reason", "kept_iteration", "episodes_from", "stimulations_after_us", "stimulations_until_us")
"""The keys of a `discarded` event's data (docs/protocol.md)."""


def discarded_data(
    reason: str, kept_iteration: int, episodes_from: int, after_us: int, until_us: int
) -> dict[str, Any]:
    """A `discarded` event's data: what was thrown away since the last kept iteration, and the numbers reused."""
    return {
        "reason": reason,
        "kept_iteration": int(kept_iteration),
        "episodes_from": int(episodes_from),
        "stimulations_after_us": int(after_us),
        "stimulations_until_us": int(until_us),
    }


def _ranges(events: Iterable[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(after_us, until_us, episodes_from) of each `discarded` event."""
    ranges = []
    for event in events:
        if event.get("event_type") == DISCARDED_EVENT:
            data = event.get("data") or {}
            ranges.append(
                (
                    int(data["stimulations_after_us"]),
                    int(data["stimulations_until_us"]),
                    int(data["episodes_from"]),
                )
            )
    return ranges


def mark_discarded(
    stims: list[dict[str, Any]], events: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recording's stimulations and events, each with `"discarded": True|False` (the rule in the docstring).

    `stims`: entries with `timestamp_us` (the stamp the trainer sent); `events`: `{"event_type", "timestamp_us",
    "data"}` as the device recorded them. Only stimulations and `episode_end` events can be discarded.
    """
    ranges = _ranges(events)

    def stim_dropped(stamp: int) -> bool:
        return any(after < stamp < until for after, until, _ in ranges)

    def episode_dropped(event: dict[str, Any]) -> bool:
        if event.get("event_type") != "episode_end":
            return False
        stamp, number = int(event["timestamp_us"]), int((event.get("data") or {}).get("episode", 0))
        return any(after < stamp < until and number >= first for after, until, first in ranges)

    return (
        [s | {"discarded": stim_dropped(int(s["timestamp_us"]))} for s in stims],
        [e | {"discarded": episode_dropped(e)} for e in events],
    )


def standing_episodes(events: list[dict[str, Any]]) -> list[int]:
    """The episode numbers of the `episode_end` events that stand, in the order the device heard them."""
    _, marked = mark_discarded([], events)
    return [int(e["data"]["episode"]) for e in marked if e["event_type"] == "episode_end" and not e["discarded"]]
