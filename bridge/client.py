"""`BridgeClient`: how an env runner (or any caller) talks to a device's bridge actor.

Exchanges are the hot path, once per game tick, so they go through a Ray
compiled graph (a shared-memory channel to the actor instead of a task per
call): on the 2-core reference machine that cuts the round trip through the
actor from about 1-2 ms to a few tenths of a millisecond. Everything else
(feedback, events, stats) is an ordinary actor call. If the actor dies, the
client waits for Ray to restart it, compiles the graph again and repeats the
exchange: the repeat is a new tick for the culture, and is counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import ray

from bridge.core import SpikeReply
from bridge.protocol import FeedbackCommand

log = logging.getLogger(__name__)


class BridgeClient:
    """Caller-side handle to a `CL1Bridge` actor."""

    def __init__(self, actor: ray.actor.ActorHandle, *, fast_path: bool = True, restart_wait_s: float = 60.0) -> None:
        self.actor = actor
        self.fast_path = fast_path
        self.restart_wait_s = restart_wait_s
        self.restarts_seen = 0
        self._graph = None

    def exchange(
        self,
        frequencies_hz: Sequence[float],
        amplitudes_ua: Sequence[float],
        feedback: Sequence[FeedbackCommand] = (),
    ) -> SpikeReply:
        """Send `feedback` (if any), stimulate once, and return the culture's answer."""
        args = (tuple(float(f) for f in frequencies_hz), tuple(float(a) for a in amplitudes_ua), tuple(feedback))
        try:
            return self._exchange_once(args)
        except (ray.exceptions.RayActorError, ray.exceptions.RayChannelError) as exc:
            log.warning("bridge actor lost during an exchange (%s); waiting for its restart", type(exc).__name__)
            self._drop_graph()
            self._wait_for_restart()
            self.restarts_seen += 1
            return self._exchange_once(args)

    def feedback(self, command: FeedbackCommand) -> bool:
        """Send feedback through the bridge's safety envelope."""
        return ray.get(self.actor.feedback.remote(command))

    def event(self, event_type: str, data: dict[str, Any] | None = None) -> None:
        """Send an event to the device."""
        ray.get(self.actor.event.remote(event_type, data or {}))

    def send_all(self, feedback: Sequence[FeedbackCommand], events: Sequence[tuple[str, dict]] = ()) -> int:
        """Send feedback commands, then events, in one actor call."""
        return ray.get(self.actor.send_all.remote(tuple(feedback), tuple(events)))

    def stats(self) -> dict[str, Any]:
        """The bridge's loop statistics."""
        return ray.get(self.actor.stats.remote())

    def close(self) -> None:
        """Tear down the compiled graph (the actor and its sockets stay up)."""
        self._drop_graph()

    # --- internals -----------------------------------------------------------------

    def _exchange_once(self, args: tuple) -> SpikeReply:
        if not self.fast_path:
            return ray.get(self.actor.exchange.remote(*args))
        if self._graph is None:
            self._graph = self._compile()
        return ray.get(self._graph.execute(args))

    def _compile(self):
        from ray.dag import InputNode

        with InputNode() as stim:
            node = self.actor.exchange_packed.bind(stim)
        return node.experimental_compile()

    def _drop_graph(self) -> None:
        if self._graph is not None:
            try:
                self._graph.teardown()
            except Exception as exc:  # a graph whose actor died may fail to tear down cleanly
                log.debug("compiled graph teardown: %s", exc)
            self._graph = None

    def _wait_for_restart(self) -> None:
        deadline = time.monotonic() + self.restart_wait_s
        while True:
            try:
                ray.get(self.actor.pid.remote(), timeout=5)
                return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"bridge actor did not come back within {self.restart_wait_s:.0f} s: {exc}"
                    ) from exc
                time.sleep(0.1)
