"""One episode count per trial, across its env runners and its resumes (the reference trainer counts this way).

The `episode_end` event tells a device which episode just ended; devices record it, so a lab can line the
recording up with `episodes.jsonl`. Counted in each env runner, the number started at 1 again in every env
runner and after every resume. Here the trial owns a small named actor that hands out the numbers: it starts
where the trial's `episodes.jsonl` ends (so a resumed trial carries on), and every env runner of the trial takes
the next number when an episode ends (one actor call per episode, off the tick's path: the episode's feedback is
already on its way). The JSONL's `episode_index` is the same number.

An algorithm built without a counter (tests and benchmarks that build the config themselves) counts in each env
runner, as before.
"""

from __future__ import annotations

import uuid
from typing import Any

import ray


@ray.remote(num_cpus=0, max_restarts=0)
class EpisodeCounter:
    """Hands out the trial's episode numbers, one after the other."""

    def __init__(self, last: int) -> None:
        self.last = int(last)

    def next(self) -> int:
        self.last += 1
        return self.last

    def peek(self) -> int:
        return self.last


def start_counter(last: int) -> tuple[Any, str]:
    """A counter whose next number is `last + 1`, and its name (unique per trial attempt)."""
    name = f"spikeloop-episodes-{uuid.uuid4().hex[:12]}"
    actor = EpisodeCounter.options(name=name).remote(last)
    ray.get(actor.peek.remote())  # up before any env runner asks for it
    return actor, name


class EpisodeNumbers:
    """The next episode number for one env runner: from the trial's counter, else counted here."""

    def __init__(self) -> None:
        self._local = 0
        self._actor = None

    def next(self, config) -> int:
        name = config.episode_counter_name
        if name is None:
            self._local += 1
            return self._local
        if self._actor is None:
            self._actor = ray.get_actor(name)
        return int(ray.get(self._actor.next.remote(), timeout=60))
