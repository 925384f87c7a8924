"""`BridgeClient`: how an env runner (or any caller) talks to a device's bridge actor.

Exchanges are the hot path, once per game tick. A caller on the bridge's node
(every env runner: they are placed there) sends them over the bridge's local
Unix socket (`spikeloop.bridge.trainer.local_channel`): one message each way, where a Ray actor
call goes through Ray's scheduling and serialisation (measured: docs/benchmarks.md,
bridge); a caller elsewhere uses actor calls. The
other calls (feedback, events, stats) take the same socket when it is open and
no exchange is in flight. If the actor dies during an exchange, the client
waits for Ray to restart it, reconnects and repeats the exchange: the repeat is
a new tick for the culture, and is counted. Other calls are not repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import ray

from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.bridge.trainer.local_channel import ChannelLost, LocalChannelClient
from spikeloop.bridge.wire.protocol import FeedbackCommand
from spikeloop.bridge.wire.settings import FAST_PATH

log = logging.getLogger(__name__)


class BridgeClient:
    """Caller-side handle to a `CL1Bridge` actor."""

    def __init__(
        self, actor: ray.actor.ActorHandle, *, fast_path: bool = FAST_PATH.default, restart_wait_s: float = 60.0
    ) -> None:
        self.actor = actor
        self.fast_path = fast_path
        self.restart_wait_s = restart_wait_s
        self.restarts_seen = 0
        self._channel: LocalChannelClient | None = None
        self._channel_refused = False  # the bridge runs on another node: actor calls only
        self._held_feedback: list[FeedbackCommand] = []  # actor-call path: leaves with the next exchange or events
        self._in_flight: tuple[tuple, Any] | None = None  # (arguments, ObjectRef | None for the socket | error)

    def exchange(self, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> SpikeReply:
        """Stimulate once and return the culture's answer (feedback held back leaves first)."""
        self.send_exchange(frequencies_hz, amplitudes_ua)
        return self.receive_reply()

    def send_exchange(self, frequencies_hz: Sequence[float], amplitudes_ua: Sequence[float]) -> None:
        """Start an exchange: the stimulation (after any feedback held back) leaves now; `receive_reply` answers.

        The caller may work while the culture answers (a tick's device window is
        ~100 ms). An exchange still in flight is answered and dropped first, so a
        reply is never taken for a later stimulation's.
        """
        if self._in_flight is not None:
            log.warning("an exchange was started before the previous reply was taken; dropping that reply")
            self.receive_reply()
        args = (frequencies_hz, amplitudes_ua, tuple(self._held_feedback))
        self._held_feedback.clear()
        try:
            self._in_flight = (args, self._send(args))
        except (ray.exceptions.RayActorError, ChannelLost) as exc:
            self._in_flight = (args, exc)  # recovered in receive_reply, like a loss while waiting

    def receive_reply(self) -> SpikeReply:
        """The answer to the exchange `send_exchange` started."""
        if self._in_flight is None:
            raise RuntimeError("no exchange in flight: call send_exchange first")
        (args, ticket), self._in_flight = self._in_flight, None
        try:
            if isinstance(ticket, Exception):
                raise ticket
            return self._receive(ticket)
        except (ray.exceptions.RayActorError, ChannelLost) as exc:
            log.warning("bridge actor lost during an exchange (%s); waiting for its restart", type(exc).__name__)
            self._drop_channel()
            self._wait_for_restart()
            self.restarts_seen += 1
            return self._receive(self._send(args))

    def send_feedback(self, feedback: Sequence[FeedbackCommand]) -> None:
        """Send feedback commands ahead of the next stimulation, without waiting: the one way feedback leaves.

        Over the local socket they leave now and the bridge handles them while the
        caller prepares the stimulation; an error they cause is raised by the next
        call. Over actor calls (a bridge on another node) they are held back and
        leave with the next exchange or `send_events`: an actor call of their own
        would add a whole actor call to the tick (measured: docs/benchmarks.md,
        bridge). Either way they reach the device before
        the next stimulation. If the actor dies in between, feedback may be lost:
        never sent twice.
        """
        if not feedback:
            return
        if self._channel is None or self._in_flight is not None:
            self._held_feedback.extend(feedback)
            return
        try:
            self._channel.post_feedback(feedback)
        except ChannelLost:
            self._drop_channel()  # the next exchange waits for the restart and reconnects
            self._held_feedback.extend(feedback)

    def send_events(self, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Send events (type, data) to the device now, after any feedback still held back."""
        held, self._held_feedback = tuple(self._held_feedback), []
        self._call("send_all", held, tuple(events))

    def stats(self) -> dict[str, Any]:
        """The bridge's loop statistics."""
        return self._call("stats")

    @property
    def path(self) -> str:
        """How exchanges travel now: `local socket` or `actor calls`."""
        return "local socket" if self._channel is not None else "actor calls"

    def close(self) -> None:
        """Hang up the fast path (the actor and its sockets stay up); a reply still owed is dropped."""
        self._in_flight = None
        self._drop_channel()

    # --- internals -----------------------------------------------------------------

    def _send(self, args: tuple) -> ray.ObjectRef | None:
        """Start the exchange on the fastest path; returns what `_receive` needs (None: the socket)."""
        if self.fast_path and self._channel is None and not self._channel_refused:
            self._channel = self._connect()
        if self._channel is not None:
            self._channel.send(*args)
            return None
        frequencies_hz, amplitudes_ua, feedback = args
        return self.actor.exchange.remote(tuple(map(float, frequencies_hz)), tuple(map(float, amplitudes_ua)), feedback)

    def _call(self, name: str, *args: Any) -> Any:
        """A bridge method other than the exchange: over the local socket when it is open and idle.

        Not repeated if the actor dies meanwhile (feedback must never reach a culture twice); the
        caller sees the error, and the next exchange reconnects.
        """
        if self._channel is None or self._in_flight is not None:
            return ray.get(getattr(self.actor, name).remote(*args))
        try:
            return self._channel.invoke(name, *args)
        except ChannelLost:
            self._drop_channel()
            raise

    def _receive(self, ticket: ray.ObjectRef | None) -> SpikeReply:
        if ticket is not None:
            return ray.get(ticket)
        if self._channel is None:
            raise ChannelLost("the exchange socket was closed while a reply was owed")
        return self._channel.receive()

    def _connect(self) -> LocalChannelClient | None:
        """The bridge's local socket, or None when the bridge runs on another node."""
        channel: ray.ObjectRef[tuple[str, str, float]] = self.actor.local_channel.remote()
        node_id, path, answer_within_s = ray.get(channel)
        if node_id != ray.get_runtime_context().get_node_id():
            log.info("bridge actor on node %s, this caller elsewhere: exchanges use actor calls", node_id[:8])
            self._channel_refused = True
            return None
        return LocalChannelClient(path, answer_within_s)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

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
