"""The trainer side of one CL1 device: sockets, correlation, safety and stats.

`BridgeCore` is plain Python so that it can be tested and benchmarked on its
own; `bridge.actor` wraps it as the named Ray actor the env runners use.

Correlation (which reply answers which stimulation) is the one thing that must
never go wrong: an action decided on the culture's answer to an *earlier*
stimulation silently breaks the closed loop. Two kinds of device exist:

* echo devices put the stimulation's timestamp in the reply; a reply is accepted
  only if it carries the timestamp of the stimulation being waited for;
* plain v1 devices stamp replies with their own clock; then stale datagrams are
  drained before each send and only a reply arriving after the send is taken.
  After a timeout the bridge first waits (up to `late_grace_s`) for the one late
  reply the device still owes, so that it cannot answer the next stimulation.

A reply stamped no later than the last one taken is stale in either mode:
echoed stamps increase, and so does a device's clock (a device whose clock
steps back loses replies until it passes its old time again: they time out).

`correlation="auto"` decides which kind the device is: echo as soon as a reply
carries the awaited timestamp; plain only after `AUTO_PLAIN_VOTES` exchanges
were answered by replies stamped otherwise, so that one stale datagram (say,
from before a trainer restart) cannot decide it for the whole session. While
undecided, a reply stamped later than the stimulation is taken at once (a
device clock cannot stamp an earlier stimulation's answer with a later time
than ours without skew); one stamped earlier is kept waiting until the timeout,
in case the echo follows.

Only the device may answer: replies must come from the device host and, by
default, from its stimulation port, which is where `spikeloop device` replies
from (`device_reply_port`). The bridge sends everything from its spike port,
so that a device can in turn accept commands from that port only.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import functools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from bridge.channels import EVENT_PORT, FEEDBACK_PORT, N_SPIKE_GROUPS, SPIKE_PORT, STIM_PORT
from bridge.protocol import (
    EventMessage,
    FeedbackCommand,
    ProtocolError,
    SpikeCounts,
    StimCommand,
    decode_spikes,
    encode_event,
    encode_feedback,
    encode_stim,
    now_us,
)
from bridge.safety import Policy, SafetyEnvelope

RECV_BYTES = 4096
REMEMBERED_STIMS = 4096  # how many past stimulation timestamps are kept for attributing late replies
LATENCY_WINDOW = 100_000  # latencies kept for the histogram
RECENT_LATENCIES = 16
"""The fastest of this many recent replies is when the next one is expected (for `reply_spin_ms`)."""
SPIN_MIN_LATENCY_S = 0.005
"""Replies faster than this (a simulated device running flat out) are awaited asleep: no spin."""
AUTO_PLAIN_VOTES = 3
"""Auto correlation: exchanges answered by non-echo replies before the device is taken as a plain v1 one."""
R = TypeVar("R")


class DeviceTimeout(TimeoutError):
    """The device did not answer a stimulation within the timeout."""


@dataclass(frozen=True)
class BridgeConfig:
    """Where a device is and how the bridge treats it."""

    device_id: str = "cl1-0"
    device_host: str = "127.0.0.1"
    stim_port: int = STIM_PORT
    event_port: int = EVENT_PORT
    feedback_port: int = FEEDBACK_PORT
    spike_port: int = SPIKE_PORT
    """Port the bridge binds for spike replies; 0 picks a free one."""
    bind_host: str = "127.0.0.1"
    device_reply_port: int | Literal["stim_port"] | None = "stim_port"
    """Replies must come from this source port of the device host: "stim_port" (the default: the stimulation
    port, where `spikeloop device` replies from), a port number, or None for any port (a third-party device
    that replies from elsewhere)."""
    timeout_s: float = 0.5
    timeout_policy: Literal["zeros", "raise"] = "zeros"
    correlation: Literal["auto", "echo", "arrival"] = "auto"
    late_grace_s: float | None = None
    """Arrival mode: after a timeout, wait this long for the late reply (default: timeout_s)."""
    envelope: SafetyEnvelope = field(default_factory=SafetyEnvelope)
    envelope_policy: Policy = "clamp"
    reply_spin_ms: float = 1.0
    """Poll for the reply without sleeping from this long before it is expected until as long after.

    A thread woken from sleep by a datagram starts 0.1-0.3 ms late on small VMs, every tick; polling
    costs at most 2 x this much CPU per exchange. 0 always sleeps."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"bridge timeout_s={self.timeout_s}: must be > 0 seconds")
        if not 0 <= self.reply_spin_ms <= 20:
            raise ValueError(f"bridge reply_spin_ms={self.reply_spin_ms}: use 0 (off) to 20 ms")
        if self.timeout_policy not in ("zeros", "raise"):
            raise ValueError(f"bridge timeout_policy={self.timeout_policy!r}: use 'zeros' or 'raise'")
        if self.correlation not in ("auto", "echo", "arrival"):
            raise ValueError(f"bridge correlation={self.correlation!r}: use 'auto', 'echo' or 'arrival'")
        if self.envelope_policy not in ("clamp", "raise"):
            raise ValueError(f"bridge envelope_policy={self.envelope_policy!r}: use 'clamp' or 'raise'")
        for name in ("stim_port", "event_port", "feedback_port", "spike_port"):
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(f"bridge {name}={port!r}: not a UDP port number")
        reply = self.device_reply_port
        if reply is not None and reply != "stim_port" and (
            isinstance(reply, bool) or not isinstance(reply, int) or not 1 <= reply <= 65535
        ):
            raise ValueError(f"bridge device_reply_port={reply!r}: use 'stim_port', a port number 1-65535 or None")
        if not self.device_host or not self.bind_host:
            raise ValueError("bridge device_host and bind_host must not be empty")


@dataclass(frozen=True)
class SpikeReply:
    """The culture's answer to one stimulation."""

    counts: np.ndarray
    status: Literal["ok", "timeout"]
    latency_s: float
    stim_timestamp_us: int
    reply_timestamp_us: int | None
    clamped: int
    """How many stimulation values the safety envelope had to fix."""

    @property
    def ok(self) -> bool:
        """True when the device answered in time."""
        return self.status == "ok"


class _Bounded:
    """A set that remembers only the most recent `size` items."""

    def __init__(self, size: int) -> None:
        self._order: collections.deque[int] = collections.deque()
        self._items: set[int] = set()
        self._size = size

    def add(self, item: int) -> None:
        self._order.append(item)
        self._items.add(item)
        if len(self._order) > self._size:
            self._items.discard(self._order.popleft())

    def discard(self, item: int) -> None:
        self._items.discard(item)  # left in _order; harmless, it ages out

    def __contains__(self, item: int) -> bool:
        return item in self._items


def _locked(method: Callable[..., R]) -> Callable[..., R]:
    """Run a BridgeCore method under the instance lock."""

    @functools.wraps(method)
    def wrapper(self: BridgeCore, *args: Any, **kwargs: Any) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


COUNTERS = (
    "exchanges",
    "ok",
    "timeouts",
    "late",
    "duplicates",
    "stale",
    "malformed",
    "foreign",
    "feedback_sent",
    "feedback_suppressed",
    "events_sent",
    "clamped_commands",
    "clamped_values",
)


class BridgeCore:
    """Owns one device's sockets; see the module docstring for the correlation rules."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self._spike_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._spike_sock.bind((config.bind_host, config.spike_port))
        except OSError as exc:
            self._spike_sock.close()
            hint = " (is another bridge or trainer running?)" if exc.errno == errno.EADDRINUSE else ""
            raise OSError(
                exc.errno,
                f"bridge {config.device_id!r} cannot bind spike port {config.bind_host}:{config.spike_port}: "
                f"{exc.strerror}{hint}",
            ) from None
        self._spike_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        # Everything goes out from the spike port: a device can then refuse commands from any other port.
        self._send_sock = self._spike_sock
        try:
            self._device_ip = socket.gethostbyname(config.device_host)
        except OSError as exc:
            self._spike_sock.close()
            raise OSError(f"bridge {config.device_id!r}: cannot resolve device host {config.device_host!r}: "
                          f"{exc}") from None
        self._reply_port = config.stim_port if config.device_reply_port == "stim_port" else config.device_reply_port
        self._stim_addr = (self._device_ip, config.stim_port)
        self._feedback_addr = (self._device_ip, config.feedback_port)
        self._event_addr = (self._device_ip, config.event_port)
        self._echo: bool | None = {"auto": None, "echo": True, "arrival": False}[config.correlation]
        self._plain_votes = 0  # auto, undecided: exchanges answered by a reply that did not echo
        self._last_answer_us = -1  # device timestamp of the last reply taken: later answers are stamped later
        self._candidate: SpikeCounts | None = None  # auto, undecided: an earlier-stamped reply, taken at the timeout
        self._foreign_source: tuple[str, int] | None = None  # the last reply refused for its source (for hints)
        self._last_stim_us = 0
        self._answered = _Bounded(REMEMBERED_STIMS)
        self._timed_out = _Bounded(REMEMBERED_STIMS)
        self._owed_late = 0  # arrival mode: replies still owed for timed-out stimulations
        self._latencies_s: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._recent_latencies_s: collections.deque[float] = collections.deque(maxlen=RECENT_LATENCIES)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._busy_s = 0.0
        self._created = time.monotonic()
        self._closed = False
        # The actor may serve an exchange (local-socket thread) and a stats or
        # feedback call at once; one lock keeps a drain from stealing a reply.
        self._lock = threading.RLock()

    # --- public API ----------------------------------------------------------------

    @property
    def spike_port(self) -> int:
        """The port actually bound for spike replies."""
        return self._spike_sock.getsockname()[1]

    @_locked
    def exchange(
        self,
        frequencies_hz: Sequence[float],
        amplitudes_ua: Sequence[float],
        feedback: Sequence[FeedbackCommand] = (),
    ) -> SpikeReply:
        """Stimulate once and return the reply that answers this stimulation.

        `feedback` (the previous step's) is sent first, in order: one call keeps
        "feedback for step t before stimulation t+1" true by construction.
        """
        self._check_open()
        t_start = time.perf_counter()
        for command in feedback:
            self.feedback(command)
        stim = StimCommand(self._next_timestamp(), tuple(frequencies_hz), tuple(amplitudes_ua))
        stim, clamped = self.config.envelope.check_stim(stim, self.config.envelope_policy)
        self._count_clamps(clamped)
        payload = encode_stim(stim)
        self._drain()
        if self._owed_late and not self._echo:
            self._await_owed_late()
        self._counts["exchanges"] += 1
        self._send(payload, self._stim_addr)
        t_sent = time.perf_counter()
        deadline = t_sent + self.config.timeout_s
        spin_window = self._spin_window(t_sent)
        self._candidate = None
        while True:
            got = self._await_datagram(deadline, spin_window)
            if got is None:
                reply = self._take_candidate()
                if reply is None:
                    break
            else:
                reply = self._classify(*got, waiting_for=stim.timestamp_us)
            if reply is not None:
                latency = time.perf_counter() - t_sent
                self._latencies_s.append(latency)
                self._recent_latencies_s.append(latency)
                # Echo devices repeat our timestamp, plain ones their own; either way a
                # second datagram with it is a duplicate, never the next answer.
                self._answered.add(reply.timestamp_us)
                self._last_answer_us = max(self._last_answer_us, reply.timestamp_us)
                self._counts["ok"] += 1
                self._busy_s += time.perf_counter() - t_start
                counts = np.asarray(reply.counts, dtype=np.float32)
                return SpikeReply(counts, "ok", latency, stim.timestamp_us, reply.timestamp_us, clamped)
        self._counts["timeouts"] += 1
        self._timed_out.add(stim.timestamp_us)
        if not self._echo:
            self._owed_late += 1
        self._busy_s += time.perf_counter() - t_start
        if self.config.timeout_policy == "raise":
            raise DeviceTimeout(
                f"device {self.config.device_id!r} at {self._stim_addr[0]}:{self._stim_addr[1]} did not answer "
                f"within {self.config.timeout_s * 1000:.0f} ms (replies expected on port {self.spike_port})"
            )
        zeros = np.zeros(N_SPIKE_GROUPS, dtype=np.float32)
        return SpikeReply(zeros, "timeout", self.config.timeout_s, stim.timestamp_us, None, clamped)

    @_locked
    def feedback(self, command: FeedbackCommand) -> bool:
        """Send a feedback command through the envelope; False if nothing was left to send."""
        self._check_open()
        if command.timestamp_us == 0:
            command = dataclasses.replace(command, timestamp_us=now_us())
        safe, clamped = self.config.envelope.check_feedback(command, self.config.envelope_policy)
        self._count_clamps(clamped)
        if safe is None:
            self._counts["feedback_suppressed"] += 1
            return False
        self._send(encode_feedback(safe), self._feedback_addr)
        self._counts["feedback_sent"] += 1
        return True

    @_locked
    def event(self, event_type: str, data: dict[str, Any] | None = None) -> None:
        """Send an event (e.g. `episode_end`, `training_complete`) to the device."""
        self._check_open()
        payload = encode_event(EventMessage(now_us(), event_type, dict(data or {})))
        self._send(payload, self._event_addr)
        self._counts["events_sent"] += 1

    @_locked
    def stats(self) -> dict[str, Any]:
        """Counters, latency percentiles (ms) and device duty since start."""
        if not self._closed:
            self._drain()
        lat_ms = np.asarray(self._latencies_s, dtype=np.float64) * 1000.0
        if lat_ms.size:
            p50, p90, p99 = np.percentile(lat_ms, [50, 90, 99])
            latency = {"p50": p50, "p90": p90, "p99": p99, "max": lat_ms.max(), "mean": lat_ms.mean()}
        else:
            latency = dict.fromkeys(("p50", "p90", "p99", "max", "mean"), float("nan"))
        wall_s = time.monotonic() - self._created
        mode = {None: "undetermined", True: "echo", False: "arrival"}[self._echo]
        foreign = self._foreign_source
        return {
            "device_id": self.config.device_id,
            "correlation": mode,
            "spike_port": self.spike_port if not self._closed else None,
            "last_foreign_source": None if foreign is None else f"{foreign[0]}:{foreign[1]}",
            **self._counts,
            "latency_ms": {k: float(v) for k, v in latency.items()} | {"n": int(lat_ms.size)},
            "duty": self._busy_s / wall_s if wall_s > 0 else 0.0,
        }

    @_locked
    def close(self) -> None:
        """Close the sockets; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._spike_sock.close()

    def __enter__(self) -> BridgeCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"bridge {self.config.device_id!r} is closed")

    def _next_timestamp(self) -> int:
        # Strictly increasing, so that an echoed timestamp names one stimulation only.
        self._last_stim_us = max(now_us(), self._last_stim_us + 1)
        return self._last_stim_us

    def _count_clamps(self, clamped: int) -> None:
        if clamped:
            self._counts["clamped_commands"] += 1
            self._counts["clamped_values"] += clamped

    def _send(self, payload: bytes, addr: tuple[str, int]) -> None:
        # The socket is also read, and a read may have left it non-blocking: a full send buffer must wait, not fail.
        self._spike_sock.settimeout(self.config.timeout_s)
        self._spike_sock.sendto(payload, addr)

    def _take_candidate(self) -> SpikeCounts | None:
        """Auto, undecided, at the timeout: an earlier-stamped reply is this exchange's answer after all."""
        reply, self._candidate = self._candidate, None
        if reply is not None:
            self._vote_plain()
        return reply

    def _vote_plain(self) -> None:
        self._plain_votes += 1
        if self._plain_votes >= AUTO_PLAIN_VOTES:
            self._echo = False

    def _recv(self, timeout_s: float | None) -> tuple[bytes, tuple[str, int]] | None:
        """One datagram, or None when none arrives in time (timeout 0: only what is waiting)."""
        if timeout_s == 0:
            self._spike_sock.setblocking(False)
        else:
            self._spike_sock.settimeout(timeout_s)
        try:
            return self._spike_sock.recvfrom(RECV_BYTES)
        except (TimeoutError, BlockingIOError):
            return None

    def _spin_window(self, t_sent: float) -> tuple[float, float] | None:
        """When to poll instead of sleep for this stimulation's reply: around the earliest expected one."""
        spin_s = self.config.reply_spin_ms / 1000.0
        if spin_s <= 0 or len(self._recent_latencies_s) < RECENT_LATENCIES:
            return None
        earliest_s = min(self._recent_latencies_s)
        if earliest_s < SPIN_MIN_LATENCY_S:
            return None
        return t_sent + earliest_s - spin_s, t_sent + earliest_s + spin_s

    def _await_datagram(self, deadline: float, spin_window: tuple[float, float] | None):
        """The next spike-port datagram before `deadline` (None if none), polling inside `spin_window`."""
        now = time.perf_counter()
        if spin_window is not None and now < spin_window[1]:
            sleep_until, spin_until = min(spin_window[0], deadline), min(spin_window[1], deadline)
            if sleep_until > now:
                got = self._recv(sleep_until - now)
                if got is not None:
                    return got
            self._spike_sock.setblocking(False)
            while time.perf_counter() < spin_until:
                try:
                    return self._spike_sock.recvfrom(RECV_BYTES)
                except BlockingIOError:
                    pass
        remaining = deadline - time.perf_counter()
        return self._recv(remaining) if remaining > 0 else None

    def _drain(self) -> None:
        """Classify everything already waiting; none of it can answer the next stimulation."""
        while (got := self._recv(0)) is not None:
            self._classify(*got, waiting_for=None)

    def _await_owed_late(self) -> None:
        """Arrival mode: give a late reply the chance to arrive before the next send."""
        grace = self.config.late_grace_s if self.config.late_grace_s is not None else self.config.timeout_s
        deadline = time.perf_counter() + grace
        while self._owed_late and (remaining := deadline - time.perf_counter()) > 0:
            got = self._recv(remaining)
            if got is None:
                break
            self._classify(*got, waiting_for=None)
        self._owed_late = 0  # what did not come by now is taken as dropped

    def _classify(self, data: bytes, addr: tuple[str, int], waiting_for: int | None) -> SpikeCounts | None:
        """Count one datagram; return it only if it answers the stimulation being waited for."""
        if addr[0] != self._device_ip or (self._reply_port is not None and addr[1] != self._reply_port):
            self._counts["foreign"] += 1
            self._foreign_source = (addr[0], addr[1])
            return None
        try:
            reply = decode_spikes(data)
        except ProtocolError:
            self._counts["malformed"] += 1
            return None
        ts = reply.timestamp_us
        if ts in self._answered:
            self._counts["duplicates"] += 1
            return None
        if ts in self._timed_out:
            self._timed_out.discard(ts)
            self._owed_late = max(0, self._owed_late - 1)
            self._counts["late"] += 1
            return None
        if ts <= self._last_answer_us:
            # Stamped no later than an answer already taken (echoed stamps and device clocks both move
            # forward): a leftover, e.g. from before a trainer restart, never a newer answer.
            self._counts["stale"] += 1
            return None
        if waiting_for is not None and ts == waiting_for:
            if self._echo is None:
                self._echo = True
                if self._candidate is not None:  # an earlier-stamped reply came first: stale after all
                    self._candidate = None
                    self._counts["stale"] += 1
            return reply
        if self._echo is None and waiting_for is not None:
            if ts > waiting_for:
                self._vote_plain()  # stamped after our send by the device's own clock: a plain v1 device
                if self._candidate is not None:
                    self._candidate = None
                    self._counts["stale"] += 1
                return reply
            if self._candidate is not None:
                self._counts["stale"] += 1  # two earlier-stamped replies: keep the latest
            self._candidate = reply
            return None
        if self._echo is False:
            if waiting_for is not None:
                return reply  # arrived after the send, and the queue was drained before it
            if self._owed_late:
                self._owed_late -= 1
                self._counts["late"] += 1
            else:
                self._counts["stale"] += 1
            return None
        self._counts["stale"] += 1  # echo device, unknown timestamp: nothing it can answer
        return None
