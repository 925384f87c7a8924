"""The trainer side of one CL1 device: sockets, correlation, safety and stats.

`BridgeCore` is plain Python so that it can be tested and benchmarked on its
own; `spikeloop.bridge.trainer.actor` wraps it as the named Ray actor the env runners use.

Correlation (which reply answers which stimulation) is the one thing that must
never go wrong: an action decided on the culture's answer to an *earlier*
stimulation silently breaks the closed loop. Two kinds of device exist:

* echo devices put the stimulation's timestamp in the reply; a reply is accepted
  only if it carries the timestamp of the stimulation being waited for. Those
  stamps are the bridge's own, strictly increasing: one names one stimulation.
* plain v1 devices stamp replies with their own clock, which may be coarse,
  constant, skewed or stepping back, so its values decide nothing. Replies are
  matched by arrival order and send time, on what protocol v1 promises: one
  reply per stimulation, in order. Before a send everything waiting is drained
  and every reply still owed is waited for (each one until `timeout_s +
  late_grace_s` after its stimulation, its horizon), so that when a stimulation
  leaves no earlier one can still be answered; the first reply after the send
  is its answer, unless it came sooner after the send than the device has ever
  answered (half its fastest recent answer, for devices slower than 5 ms): then
  it was already on its way and cannot be. A reply that repeats one heard
  lately byte for byte is never taken, nor booked as a reply still owed
  (`spikeloop.bridge.trainer.reply_copies`): a copy while the device's stamps
  move (`duplicates`); while they repeat (a coarse or constant clock, answers
  closer than its step) it may be a copy or a fresh answer, which is
  unknowable (`indistinct`); and once a reply was written off, such a
  device's reply is taken only after its usual reply time has passed without
  a second one, and never later than that (`_late_watch`). A reply owed past its
  horizon is written off, and the exchange after a write-off is on probation:
  it watches its own whole horizon and takes its reply only if exactly one came
  (two mean one of them answers the written-off stimulation, and which is
  unknowable: neither is taken, `ambiguous`). A reply is therefore never `ok`
  while it may answer an earlier stimulation, unless the device breaks the
  horizon for two stimulations in a row; extra replies are counted.
  Once a few answers show that the device's clock runs at our rate, its stamps
  decide instead (`spikeloop.bridge.trainer.reply_clock`): a reply answers the awaited
  stimulation only if its stamp, read against the send times, fits that one
  (up to a quarter of the timeout sooner than the device has answered: a device
  on ticks of its own answers sooner at another phase of them) and no earlier one
  still unanswered; whatever cannot be attributed with
  certainty is written off (`unattributed`), never used. Until the clock is
  learnt, arrival order decides only while no stimulation has gone unanswered
  since the device first answered (before that, no reply can be late for
  another, and timeouts before any datagram from the device are its program
  starting up); after one, and after the
  clock is dropped, replies only teach the clock and are written off
  (`withheld`) until it is learnt again. A clock that is still not learnt after `SAMPLES` answers
  (constant, backward, not at our rate) is given up on, and arrival decides.

`correlation="auto"` decides which kind the device is: echo as soon as a reply
carries the awaited timestamp; plain only after `AUTO_PLAIN_VOTES` exchanges
were answered by replies that did not, so that one stale datagram (say, from
before a trainer restart) cannot decide it for the whole session. While
undecided, a non-echo reply stamped later than the stimulation is taken at
once; one stamped no later (a stale echo, or a device clock that is coarse,
constant or behind ours) is held until the timeout in case the echo follows,
then taken. Once the device is plain, its stamps are ignored.

Only the device may answer: replies must come from the device host. By default
(`device_reply_port="auto"`) the source port of the first reply that answers a
stimulation is pinned, and replies from other ports count as foreign; if the
pinned port falls silent for `AUTO_REPIN_TIMEOUTS` exchanges in a row while one
other port of the device host keeps sending, that port is pinned instead (a
restarted device program with a new socket). `spikeloop device` replies from
its stimulation port ("stim_port" pins it from the start); a port number or
None (any port of the host) can be set too. The bridge sends everything from
its spike port, so that a device can in turn accept commands from that port only.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from spikeloop.bridge.trainer.reply_clock import ReplyClock
from spikeloop.bridge.trainer.reply_copies import ReplyCopies
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS
from spikeloop.bridge.wire.protocol import (
    EventMessage,
    FeedbackCommand,
    ProtocolError,
    SpikeCounts,
    StimCommand,
    decode_event,
    decode_spikes,
    encode_event,
    encode_feedback,
    encode_stim,
    now_us,
)
from spikeloop.bridge.wire.safety import Policy, SafetyEnvelope
from spikeloop.bridge.wire.settings import (
    ENVELOPE_POLICY,
    REPLY_PORT,
    REPLY_SPIN_MS,
    STATUS_REQUESTS,
    TIMEOUT_POLICY,
    TIMEOUT_S,
)

RECV_BYTES = 4096
REMEMBERED_STIMS = 4096  # how many past stimulation timestamps are kept for attributing late replies
LATENCY_WINDOW = 100_000  # latencies kept for the histogram
RECENT_LATENCIES = 16
"""The fastest of this many recent replies is when the next one is expected (for `reply_spin_ms`)."""
SPIN_MIN_LATENCY_S = 0.005
"""Replies faster than this (a simulated device running flat out) are awaited asleep: no spin."""
AUTO_PLAIN_VOTES = 3
"""Auto correlation: exchanges answered by non-echo replies before the device is taken as a plain v1 one."""
EARLIEST_REPLY_SHARE = 0.5
"""Plain devices: a reply sooner after the send than this share of the fastest recent answer cannot answer it."""
AUTO_REPIN_TIMEOUTS = 3
"""Auto reply port: timeouts in a row, with replies from one other port of the device host, before that port is pinned."""
STATUS_REQUESTS_UNANSWERED = 3
"""Episode-end status requests a device may leave unanswered (it does not speak them) before the bridge stops asking."""
CLOCK_RESET_EXCHANGES = 4
"""Plain devices: exchanges in a row that heard replies fitting no stimulation before the learnt clock is dropped."""
STALL_MEMORY_HORIZONS = 2.0
"""Learnt clock: for this many horizons after an unanswered stimulation, a late-stamped reply may be its (a device
that stalled past the horizon), so it is not taken, and an on-time one is taken only once no second reply follows
it."""
WATCH_SLACK_S = 0.002
"""Stamps repeating, after a write-off: a reply this much later than the device's slowest recent answer (or its
spread, if wider) may be a late one, and is not taken."""
R = TypeVar("R")

log = logging.getLogger(__name__)


class DeviceTimeout(TimeoutError):
    """The device did not answer a stimulation within the timeout."""


@dataclass(frozen=True)
class BridgeConfig:
    """Where a device is and how the bridge treats it."""

    device_id: str = "cl1-0"
    address: DeviceAddress = field(default_factory=DeviceAddress)
    """Where the device is, and where the bridge binds its spike port (`spike_port` 0 picks a free one)."""
    device_reply_port: int | Literal["stim_port", "auto"] | None = REPLY_PORT.default
    """Replies must come from the device host and: "auto" (the default) the port of the first reply that answers a
    stimulation, pinned from then on (see the module docstring); "stim_port" the stimulation port, where `spikeloop
    device` replies from; a port number; or None, any port."""
    timeout_s: float = TIMEOUT_S.default
    """Its lower bound only: an unpaced simulated device's bridge waits longer than an experiment may set."""
    timeout_policy: Literal["zeros", "raise"] = TIMEOUT_POLICY.default
    correlation: Literal["auto", "echo", "arrival"] = "auto"
    late_grace_s: float | None = None
    """Plain devices: a reply is owed until timeout_s + this after its stimulation, its horizon (default: timeout_s)."""
    envelope: SafetyEnvelope = field(default_factory=SafetyEnvelope)
    envelope_policy: Policy = ENVELOPE_POLICY.default
    status_requests: bool = STATUS_REQUESTS.default
    """Ask the device for its status (`status_request` events: after each episode end until three go unanswered, and
    from `spikeloop check`). False: never send one, for a device whose program should see only the trainer's own
    events; its dose and limits are then not read."""
    reply_spin_ms: float = REPLY_SPIN_MS.default
    """Poll for the reply without sleeping from this long before it is expected until as long after.

    A thread woken from sleep by a datagram starts late on small VMs, every tick (measured:
    docs/benchmarks.md, loop); polling costs at most 2 x this much CPU per exchange. 0 always sleeps."""

    def __post_init__(self) -> None:
        TIMEOUT_S.require(self.timeout_s, "bridge timeout_s", upper=False)
        if self.late_grace_s is not None and not self.late_grace_s >= 0:
            raise ValueError(f"bridge late_grace_s={self.late_grace_s}: must be >= 0 seconds (or None: timeout_s)")
        REPLY_SPIN_MS.require(self.reply_spin_ms, "bridge reply_spin_ms")
        TIMEOUT_POLICY.require(self.timeout_policy, "bridge timeout_policy")
        if self.correlation not in ("auto", "echo", "arrival"):
            raise ValueError(f"bridge correlation={self.correlation!r}: use 'auto', 'echo' or 'arrival'")
        ENVELOPE_POLICY.require(self.envelope_policy, "bridge envelope_policy")
        STATUS_REQUESTS.require(self.status_requests, "bridge status_requests")
        if not isinstance(self.address, DeviceAddress):
            raise ValueError(f"bridge address={self.address!r}: give a spikeloop.bridge.wire.address.DeviceAddress")
        try:
            self.address.require_device_ports()
        except ValueError as exc:
            raise ValueError(f"bridge {exc}") from None
        reply = self.device_reply_port
        if (
            reply is not None
            and reply not in ("stim_port", "auto")
            and (isinstance(reply, bool) or not isinstance(reply, int) or not 1 <= reply <= 65535)
        ):
            raise ValueError(
                f"bridge device_reply_port={reply!r}: use 'auto', 'stim_port', a port number 1-65535 or None"
            )

    @property
    def horizon_s(self) -> float:
        """How long after a stimulation a plain device's reply to it is still expected."""
        return self.timeout_s + (self.timeout_s if self.late_grace_s is None else self.late_grace_s)


@dataclass(frozen=True)
class SpikeReply:
    """The culture's answer to one stimulation."""

    counts: np.ndarray
    status: Literal["ok", "timeout"]
    """"timeout": no reply the bridge can vouch for answers this stimulation (none came, or it was ambiguous)."""
    latency_s: float
    stim_timestamp_us: int
    reply_timestamp_us: int | None
    clamped: int
    """How many stimulation values the safety envelope had to fix."""
    unsolicited: int = 0
    """Datagrams from the device so far that answered no stimulation (`BridgeCore.unsolicited`), as of this reply."""

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


@dataclass
class _Owed:
    """A timed-out stimulation whose reply a plain device may still send."""

    stim_us: int
    horizon: float
    """perf_counter time after which the reply is written off."""


@dataclass(frozen=True)
class _Datagram:
    """One spike datagram from the device, with where and when it came."""

    reply: SpikeCounts
    data: bytes
    port: int
    arrived: float


def _locked(method: Callable[..., R]) -> Callable[..., R]:
    """Run a BridgeCore method under the instance lock."""

    @functools.wraps(method)
    def wrapper(self: BridgeCore, *args: Any, **kwargs: Any) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


COUNTERS = (
    "exchanges",
    "received",
    "ok",
    "timeouts",
    "ambiguous",
    "unattributed",
    "withheld",
    "late",
    "written_off",
    "duplicates",
    "indistinct",
    "stale",
    "malformed",
    "foreign",
    "feedback_sent",
    "feedback_suppressed",
    "events_sent",
    "clamped_commands",
    "clamped_values",
    "status_requests",
    "device_status",
    "clock_resets",
)
"""`received`: well-formed spike datagrams from the device's address, answers or not.
`ambiguous`: exchanges on probation that got two or more replies (none taken; not counted in `timeouts`).
`unattributed`: replies from a plain device whose stamp fits no stimulation, or more than one that may still be
answered (learnt clock, `spikeloop.bridge.trainer.reply_clock`): written off, never taken.
`withheld`: replies from a plain device that arrival order alone would have taken while its clock was still being
learnt after a stimulation had gone unanswered: they teach the clock and are written off (status "timeout", not
counted in `timeouts`).
`clock_resets`: times the learnt clock of a plain device was dropped because its replies stopped fitting it.
`written_off`: stimulations whose reply never came within their horizon (plain devices).
`indistinct`: replies from a plain device whose stamps repeat (a coarse or constant clock) that its stamps cannot tell
from a copy or a late reply, refused: a repeat of a reply heard lately byte for byte (a copy, or a fresh answer with
the same stamp and counts; `spikeloop.bridge.trainer.reply_copies`; from a device whose stamps move such a repeat is
one of `duplicates`), and after a write-off a reply later than the device answers or beside a second one
(`BridgeCore._late_watch`).
`stale` and `duplicates` together are the device's unsolicited datagrams (`BridgeCore.unsolicited`).
`status_requests`: `status_request` events sent (not in `events_sent`, which counts the trainer's events).
`device_status`: `device_status` datagrams heard (answers to `status_request` events; not spike datagrams)."""

LOOP_COUNTERS = (
    "timeouts",
    "late",
    "duplicates",
    "indistinct",
    "foreign",
    "malformed",
    "stale",
    "written_off",
    "ambiguous",
    "unattributed",
    "withheld",
    "clock_resets",
)
"""The correlation counters a run logs each episode (`culture/<name>`, TensorBoard and run log `loop/<name>`)."""


class BridgeCore:
    """Owns one device's sockets; see the module docstring for the correlation rules."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        try:
            address = config.address.resolved()  # bind_host auto: the interface that faces the device, found here
        except OSError as exc:
            raise OSError(f"bridge {config.device_id!r}: {exc}") from None
        self.bind_host = address.bind_host
        """Where the spike port is bound (`bind_host` auto resolved)."""
        self._spike_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._spike_sock.bind((address.bind_host, address.spike_port))
        except OSError as exc:
            self._spike_sock.close()
            hint = " (is another bridge or trainer running?)" if exc.errno == errno.EADDRINUSE else ""
            raise OSError(
                exc.errno,
                f"bridge {config.device_id!r} cannot bind spike port {address.bind_host}:{address.spike_port}: "
                f"{exc.strerror}{hint}",
            ) from None
        self._spike_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        # Everything goes out from the spike port: a device can then refuse commands from any other port.
        self._send_sock = self._spike_sock
        try:
            self._device_ip = socket.gethostbyname(address.host)
        except OSError as exc:
            self._spike_sock.close()
            raise OSError(f"bridge {config.device_id!r}: cannot resolve device host {address.host!r}: {exc}") from None
        reply_port = config.device_reply_port
        self._pin_auto = reply_port == "auto"
        self._reply_port: int | None = (
            address.stim_port if reply_port == "stim_port" else None if reply_port == "auto" else reply_port
        )
        self._repin: tuple[int, int] | None = None  # auto: (other port, timeouts in a row it was heard in)
        self._other_port: int | None = None  # auto, pinned: another port of the device host heard this exchange
        self._stim_addr = (self._device_ip, address.stim_port)
        self._feedback_addr = (self._device_ip, address.feedback_port)
        self._event_addr = (self._device_ip, address.event_port)
        self._echo: bool | None = {"auto": None, "echo": True, "arrival": False}[config.correlation]
        self._plain_votes = 0  # auto, undecided: exchanges answered by a reply that did not echo
        self._last_answer_us = -1  # echo: the last stimulation answered (echoed stamps only increase)
        self._last_plain_stamp: int | None = None
        self._stamps_repeat = False  # plain: two answers in a row carried one stamp, so a repeat may be an answer
        self._copies = ReplyCopies()  # plain: replies heard lately, byte for byte; a repeat is never taken
        self._copies_heard = 0  # plain: timeouts in a row whose windows heard only repeats (for a warning)
        self._copy_this_exchange = False
        self._foreign_source: tuple[str, int] | None = None  # the last reply refused for its source (for hints)
        self._last_stim_us = 0
        self._answered = _Bounded(REMEMBERED_STIMS)  # our stimulation stamps answered by an echo
        self._timed_out = _Bounded(REMEMBERED_STIMS)  # our stimulation stamps that timed out
        self._owed: collections.deque[_Owed] = collections.deque()  # plain or undecided: replies still owed
        self._probation = False  # plain: a reply was written off, so the next exchange waits its whole window
        self._clock = ReplyClock(config.timeout_s, config.horizon_s)  # plain: the device's clock, learnt
        self._unanswered: dict[int, float] = {}  # plain: stimulation stamp -> send time, of those never answered
        self._unfit_streak = 0  # learnt clock: exchanges in a row with replies that fit no stimulation, none taken
        self._unfit_this_exchange = False
        self._fault_seen = False  # plain: a stimulation went unanswered, or the learnt clock was dropped
        self._latencies_s: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._recent_latencies_s: collections.deque[float] = collections.deque(maxlen=RECENT_LATENCIES)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._device_status: dict[str, Any] | None = None  # the device's last `device_status` (docs/protocol.md)
        self._status_unanswered = 0  # status requests since the last device_status heard
        self._consecutive_timeouts = 0
        self._last_reply_wall: float | None = None  # time.time() of the last answer taken
        self._last_heard_wall: float | None = None  # time.time() of the last datagram from the device host
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

    @property
    def unsolicited(self) -> int:
        """Datagrams from the device that answered no stimulation: `stale` (none was owed or awaited, or it came
        sooner than the device can answer) plus `duplicates` (copies of a reply already taken).

        Protocol v1 allows one reply per stimulation and nothing unasked. Whichever of them the bridge counted,
        one more datagram than stimulations came; from a plain device (no echoed stamp) the unasked one may even
        have been taken as the answer, and the real answer counted `stale` instead.
        """
        return self._counts["stale"] + self._counts["duplicates"]

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
        if self._owed:
            self._await_owed()  # when this stimulation leaves, no earlier one can still be answered
        probation, self._probation = self._probation, False
        by_clock = self._by_clock()
        probation = probation and not by_clock  # stamps tell a written-off stimulation's reply from this one's
        self._counts["exchanges"] += 1
        self._other_port = None
        self._copy_this_exchange = False
        self._unfit_this_exchange = False
        # Read before the send: the stimulation cannot have left sooner, so a stamp is never read as too early.
        t_leave = time.perf_counter()
        self._send(payload, self._stim_addr)
        t_sent = time.perf_counter()
        # On probation the whole horizon is watched: a second reply in it means one answers the written-off one.
        deadline = t_sent + (self.config.horizon_s if probation else self.config.timeout_s)
        earliest = t_sent + self._earliest_reply_s()
        spin_window = None if probation else self._spin_window(t_sent)
        answers_by = None if by_clock else self._late_watch(t_sent)  # stamps repeating: later, it may be a late one
        watch = None if probation else answers_by
        candidate: _Datagram | None = None  # auto, undecided: held until the timeout in case the echo follows
        held: list[_Datagram] = []  # probation: every plain reply of the window
        answer: _Datagram | None = None
        answer_by_clock: _Datagram | None = None  # learnt clock: the one reply that fits, while a second is awaited
        while answer is None:
            got = self._await_datagram(deadline, spin_window)
            if got is None:
                break
            datagram = self._accept(*got)
            if datagram is None:
                continue
            if by_clock:
                if not self._attribute(datagram, (stim.timestamp_us, t_leave), earliest):
                    continue
                if answer_by_clock is not None:  # two replies fit: a stalled device's earlier one is among them
                    self._counts["unattributed"] += 2
                    self._unfit_this_exchange = True
                    answer_by_clock = None
                    break
                answer_by_clock = datagram
                if not self._recent_unanswered(t_leave):
                    break
                deadline = min(deadline, datagram.arrived + self._clock.settle_s)
                continue
            kind = self._classify_awaited(datagram, stim.timestamp_us, earliest)
            if kind == "echo":
                if candidate is not None or held:  # earlier non-echo replies were not answers after all
                    self._counts["stale"] += (candidate is not None) + len(held)
                answer = datagram
            elif kind == "plain" and watch is not None:
                if datagram.arrived > watch or held:  # later than the device answers, or a second reply
                    self._counts["indistinct"] += 1 + len(held)  # a late reply is among them, and which is unknowable
                    held.clear()
                    break
                held.append(datagram)  # taken once the device's reply time has passed without a second one
                deadline = min(deadline, watch)
            elif kind == "plain" and not probation:
                if candidate is not None:
                    self._counts["stale"] += 1
                answer = datagram
            elif kind in ("plain", "candidate"):
                if probation:
                    held.append(datagram)  # copies never get here: a copy is one reply, not a second one
                else:
                    if candidate is not None:
                        self._counts["stale"] += 1  # two held replies: the later one is the likelier answer
                    candidate = datagram
        if answer is None and held:
            if len(held) == 1 and answers_by is not None and held[0].arrived > answers_by:
                self._counts["indistinct"] += 1  # on probation: later than the device answers, so maybe the late one
            elif len(held) == 1:
                answer = held[0]
            else:  # one of them answers the written-off stimulation, and which is unknowable
                self._counts["ambiguous"] += 1
                self._fault_seen = True
                self._counts["late"] += 1
                self._counts["stale"] += len(held) - 2
                self._busy_s += time.perf_counter() - t_start
                log.warning(
                    "device %r: %d replies in the window after a written-off one; none taken",
                    self.config.device_id,
                    len(held),
                )
                return self._no_answer(stim, clamped, count_timeout=False)
        if answer is None and candidate is not None:
            answer = candidate
        if answer_by_clock is not None:
            answer = answer_by_clock
        if answer is not None:
            self._busy_s += time.perf_counter() - t_start
            use = answer_by_clock is not None or not self._unsure_by_arrival(answer, stim)
            return self._take(answer, stim, t_sent, clamped, t_leave, use=use)
        self._timed_out.add(stim.timestamp_us)
        if not self._echo:
            # From now on, until the clock is learnt, arrival order vouches for nothing; but before the device has
            # sent anything at all, a timeout is its program starting up, not a reply gone astray.
            self._fault_seen = self._fault_seen or self._counts["received"] > 0
            self._owed.append(_Owed(stim.timestamp_us, t_sent + self.config.horizon_s))
            self._note_unanswered(stim.timestamp_us, t_leave)
        self._note_clock(by_clock)
        self._note_repin()
        self._note_copies()
        self._busy_s += time.perf_counter() - t_start
        if self.config.timeout_policy == "raise":
            self._counts["timeouts"] += 1
            self._consecutive_timeouts += 1
            raise DeviceTimeout(
                f"device {self.config.device_id!r} at {self._stim_addr[0]}:{self._stim_addr[1]} did not answer "
                f"within {self.config.timeout_s * 1000:.0f} ms (replies expected on port {self.spike_port})"
            )
        return self._no_answer(stim, clamped, count_timeout=True)

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
        if (
            event_type == "episode_end"
            and self.config.status_requests
            and (self._device_status is not None or self._status_unanswered < STATUS_REQUESTS_UNANSWERED)
        ):
            # The device's dose and refusals, for the episode's statistics: its answer is read with the next drain.
            self._request_status()

    def _request_status(self) -> None:
        """Send a `status_request` event (counted apart from the trainer's events, in `status_requests`)."""
        self._send(encode_event(EventMessage(now_us(), "status_request", {})), self._event_addr)
        self._counts["status_requests"] += 1
        self._status_unanswered += 1

    @_locked
    def device_status(self, wait_s: float) -> dict[str, Any] | None:
        """Ask the device for its status (envelope, dose, refusals) and wait up to `wait_s` for it; None if none.

        None at once, asking nothing, when `status_requests` is off."""
        self._check_open()
        if not self.config.status_requests:
            return None
        heard = self._counts["device_status"]
        self._request_status()
        deadline = time.perf_counter() + wait_s
        while self._counts["device_status"] == heard:
            remaining = deadline - time.perf_counter()
            got = self._recv(remaining) if remaining > 0 else None
            if got is None:
                return None
            datagram = self._accept(*got)
            if datagram is not None:
                self._classify_unawaited(datagram)
        return self._device_status

    @_locked
    def stats(self) -> dict[str, Any]:
        """Counters, latency percentiles (ms), device duty since start, and where replies come from."""
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
            "device": f"{self._stim_addr[0]}:{self._stim_addr[1]}",
            "correlation": mode,
            "spike_port": self.spike_port if not self._closed else None,
            "bind_host": self.bind_host,
            "reply_source": self._reply_source(),
            "last_foreign_source": None if foreign is None else f"{foreign[0]}:{foreign[1]}",
            **self._counts,
            "unsolicited": self.unsolicited,
            "consecutive_timeouts": self._consecutive_timeouts,
            "last_reply_wall": self._last_reply_wall,
            "last_heard_wall": self._last_heard_wall,
            "latency_ms": {k: float(v) for k, v in latency.items()} | {"n": int(lat_ms.size)},
            "reply_clock": self._clock.describe(),
            "duty": self._busy_s / wall_s if wall_s > 0 else 0.0,
            "device_status": self._device_status,
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

    def _reply_source(self) -> str:
        """Where replies are taken from, for stats and messages."""
        host = self._device_ip
        if self._reply_port is not None:
            return f"{host}:{self._reply_port}" + (" (pinned from the first answer)" if self._pin_auto else "")
        return f"{host}:any port" + (" (auto: pinned at the first answer)" if self._pin_auto else "")

    def _take(
        self,
        answer: _Datagram,
        stim: StimCommand,
        t_sent: float,
        clamped: int,
        t_leave: float | None = None,
        use: bool = True,
    ) -> SpikeReply:
        """Book `answer` as the reply to `stim` (sent at `t_sent`, read just before the send at `t_leave`).

        `use` False: the reply only teaches the device clock; it is written off (`withheld`), never returned.
        """
        reply = answer.reply
        latency = answer.arrived - t_sent
        if use:
            self._latencies_s.append(latency)
        self._recent_latencies_s.append(latency)
        if reply.timestamp_us == stim.timestamp_us and self._echo is not False:
            self._answered.add(stim.timestamp_us)  # a second copy is a duplicate, never the next answer
            self._last_answer_us = max(self._last_answer_us, stim.timestamp_us)
        else:
            if self._echo is None:
                self._vote_plain()
            self._clock.observe(t_sent if t_leave is None else t_leave, reply.timestamp_us)
            self._unfit_streak = 0
            if reply.timestamp_us == self._last_plain_stamp:
                self._stamps_repeat = True  # a coarse or constant clock: a repeated datagram may be an answer
            self._last_plain_stamp = reply.timestamp_us
            self._copies_heard = 0
        if self._pin_auto and self._reply_port is None:
            self._reply_port = answer.port
            log.info(
                "device %r answers from %s:%d; replies from other ports are refused from now on",
                self.config.device_id,
                self._device_ip,
                answer.port,
            )
        self._repin = None
        self._consecutive_timeouts = 0
        self._last_reply_wall = time.time()
        if not use:
            self._counts["withheld"] += 1
            # It may be a late reply to an earlier stimulation, so this one's own may still come: once the clock
            # is learnt, a reply that fits both is not taken.
            self._note_unanswered(stim.timestamp_us, t_sent if t_leave is None else t_leave)
            zeros = np.zeros(N_SPIKE_GROUPS, dtype=np.float32)
            return SpikeReply(zeros, "timeout", latency, stim.timestamp_us, None, clamped, self.unsolicited)
        self._counts["ok"] += 1
        counts = np.asarray(reply.counts, dtype=np.float32)
        return SpikeReply(counts, "ok", latency, stim.timestamp_us, reply.timestamp_us, clamped, self.unsolicited)

    def _no_answer(self, stim: StimCommand, clamped: int, count_timeout: bool) -> SpikeReply:
        if count_timeout:
            self._counts["timeouts"] += 1
        self._consecutive_timeouts += 1
        zeros = np.zeros(N_SPIKE_GROUPS, dtype=np.float32)
        return SpikeReply(zeros, "timeout", self.config.timeout_s, stim.timestamp_us, None, clamped, self.unsolicited)

    def _note_repin(self) -> None:
        """Auto reply port, at a timeout: a device program restarted with a new socket is followed."""
        if not self._pin_auto or self._reply_port is None:
            return
        if self._other_port is None:
            self._repin = None
            return
        heard = self._repin[1] + 1 if self._repin is not None and self._repin[0] == self._other_port else 1
        self._repin = (self._other_port, heard)
        if heard >= AUTO_REPIN_TIMEOUTS:
            log.warning(
                "device %r: port %d silent for %d exchanges while %s:%d sends replies; taking replies "
                "from that port now (device program restarted?)",
                self.config.device_id,
                self._reply_port,
                heard,
                self._device_ip,
                self._other_port,
            )
            self._reply_port, self._repin = self._other_port, None

    def _note_copies(self) -> None:
        """Plain, at a timeout: say so once when a device keeps repeating itself (constant clock, constant counts)."""
        self._copies_heard = self._copies_heard + 1 if self._copy_this_exchange else 0
        if self._copies_heard == AUTO_PLAIN_VOTES:
            log.warning(
                "device %r repeats a reply byte for byte exchange after exchange; a repeat cannot be told from a "
                "duplicate, so none is taken (counted 'duplicates' or 'indistinct'): does its clock move?",
                self.config.device_id,
            )

    def _late_watch(self, t_sent: float) -> float | None:
        """Plain, stamps repeating, after a write-off: until when the device answers (None: no watch needed).

        A reply written off may still come, any time, and a repeating stamp cannot tell it from this stimulation's
        answer; only its arrival can: later than the device answers, or beside a second reply.
        """
        if self._echo is not False or not self._stamps_repeat or not self._counts["written_off"]:
            return None
        if not self._recent_latencies_s:
            return t_sent + self.config.timeout_s
        slowest, fastest = max(self._recent_latencies_s), min(self._recent_latencies_s)
        return t_sent + slowest + max(WATCH_SLACK_S, slowest - fastest)

    def _repeat(self, datagram: _Datagram) -> bool:
        """Plain: True (counted) if `datagram` repeats a reply heard lately byte for byte; it answers nothing then."""
        if not self._copies.repeat(datagram.data):
            return False
        # While the stamps move a repeat is surely a copy; while they repeat it may be a fresh answer, unknowably.
        self._counts["indistinct" if self._stamps_repeat else "duplicates"] += 1
        self._copy_this_exchange = True
        return True

    def _vote_plain(self) -> None:
        self._plain_votes += 1
        if self._plain_votes >= AUTO_PLAIN_VOTES:
            self._echo = False

    def _unsure_by_arrival(self, answer: _Datagram, stim: StimCommand) -> bool:
        """A non-echo answer taken by arrival while the device clock is still being learnt, after a fault.

        Only a stimulation left unanswered can have its reply arrive in a later window, so until the first
        one, arrival order is right; after it, a device that breaks the horizon could answer the wrong
        stimulation, and only a learnt clock could tell. Such replies teach the clock and are written off.
        """
        plain = answer.reply.timestamp_us != stim.timestamp_us and self._echo is not True
        return plain and self._fault_seen and self._clock.learning

    def _by_clock(self) -> bool:
        """Plain device whose clock is learnt: stamps, read against send times, decide which stimulation a reply fits."""
        return self._echo is False and self._clock.ready

    def _attribute(self, datagram: _Datagram, awaited: tuple[int, float] | None, earliest: float) -> bool:
        """Learnt clock: True if `datagram` answers the awaited (stamp, send time); else counted and written off.

        It answers the awaited stimulation only if its stamp fits that one's window and no other stimulation that
        may still be answered; fitting exactly one earlier one, it is that one's late reply. Anything else (no
        window, or several) is `unattributed`: a guess could name the wrong stimulation.
        """
        if self._repeat(datagram):
            return False
        stamp, arrived = datagram.reply.timestamp_us, datagram.arrived
        earlier = [us for us, t in self._unanswered.items() if self._clock.fits(stamp, t)]
        fits_awaited = awaited is not None and arrived >= earliest and self._clock.fits(stamp, awaited[1])
        if fits_awaited and awaited is not None and not self._clock.on_time(stamp, awaited[1]):
            # Stamped later than the device answers: a stalled device's reply to a recent unanswered one may be it.
            fits_awaited = not self._recent_unanswered(awaited[1])
            if not fits_awaited and not earlier:
                self._counts["unattributed"] += 1
                self._unfit_this_exchange = True
                return False
        if fits_awaited and not earlier:
            return True
        if len(earlier) == 1 and not fits_awaited:
            (stim_us,) = earlier
            del self._unanswered[stim_us]
            self._timed_out.discard(stim_us)
            self._owed = collections.deque(o for o in self._owed if o.stim_us != stim_us)
            self._counts["late"] += 1
            return False
        self._counts["unattributed"] += 1
        self._unfit_this_exchange = True
        return False

    def _note_unanswered(self, stim_us: int, t_leave: float) -> None:
        """Plain: remember a stimulation no reply was taken for (its send time), for late replies to fit."""
        self._unanswered[stim_us] = t_leave
        if len(self._unanswered) > REMEMBERED_STIMS:
            del self._unanswered[next(iter(self._unanswered))]

    def _recent_unanswered(self, t_sent: float) -> bool:
        """Was a stimulation left unanswered recently enough (before `t_sent`) that a stalled device may answer it?"""
        if not self._unanswered:
            return False
        newest = next(reversed(self._unanswered.values()))
        return newest >= t_sent - STALL_MEMORY_HORIZONS * self.config.horizon_s

    def _note_clock(self, by_clock: bool) -> None:
        """Learnt clock, at a timeout: replies that fit nothing, exchange after exchange, mean the clock moved."""
        self._unfit_streak = self._unfit_streak + 1 if by_clock and self._unfit_this_exchange else 0
        if self._unfit_streak >= CLOCK_RESET_EXCHANGES:
            log.warning(
                "device %r: replies fit no stimulation for %d exchanges in a row; relearning its clock "
                "(did the device clock step?)",
                self.config.device_id,
                self._unfit_streak,
            )
            self._clock.forget()
            self._fault_seen = True
            self._counts["clock_resets"] += 1
            self._unfit_streak = 0

    def _earliest_reply_s(self) -> float:
        """How soon after a send a plain device's reply can answer it (0 until its speed is known)."""
        if self._echo or len(self._recent_latencies_s) < RECENT_LATENCIES:
            return 0.0
        fastest = min(self._recent_latencies_s)
        return EARLIEST_REPLY_SHARE * fastest if fastest >= SPIN_MIN_LATENCY_S else 0.0

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
            datagram = self._accept(*got)
            if datagram is not None:
                self._classify_unawaited(datagram)

    def _await_owed(self) -> None:
        """Plain devices: wait for every reply still owed, each until its horizon; write off the rest."""
        while self._owed:
            # With a learnt clock, a little past the horizon, so that the next stimulation's window starts after it.
            margin = self._clock.margin_s if self._by_clock() else 0.0
            remaining = self._owed[0].horizon + margin - time.perf_counter()
            got = self._recv(remaining) if remaining > 0 else None
            if got is None:
                self._owed.popleft()
                self._counts["written_off"] += 1
                self._probation = True  # should it come after all, the next window must not take it
                continue
            datagram = self._accept(*got)
            if datagram is not None:
                self._classify_unawaited(datagram)

    def _accept(self, data: bytes, addr: tuple[str, int]) -> _Datagram | None:
        """A well-formed spike datagram from the device, or None (counted foreign or malformed)."""
        arrived = time.perf_counter()
        if addr[0] == self._device_ip:
            self._last_heard_wall = time.time()
        if addr[0] != self._device_ip or (self._reply_port is not None and addr[1] != self._reply_port):
            self._counts["foreign"] += 1
            self._foreign_source = (addr[0], addr[1])
            if addr[0] == self._device_ip and self._pin_auto:
                self._other_port = addr[1]
            return None
        try:
            reply = decode_spikes(data)
        except ProtocolError:
            if not self._take_status(data):
                self._counts["malformed"] += 1
            return None
        self._counts["received"] += 1
        return _Datagram(reply, data, addr[1], arrived)

    def _take_status(self, data: bytes) -> bool:
        """Keep a `device_status` datagram (the event format, never a spike datagram's size); True if it was one."""
        try:
            status = decode_event(data)
        except ProtocolError:
            return False
        if status.event_type != "device_status":
            return False
        self._device_status = status.data
        self._status_unanswered = 0
        self._counts["device_status"] += 1
        return True

    def _echo_bookkeeping(self, ts: int) -> bool:
        """Count a reply echoing one of our earlier stimulations (duplicate or late); True if it did."""
        if ts in self._answered:
            self._counts["duplicates"] += 1
            return True
        if ts in self._timed_out:
            self._timed_out.discard(ts)
            self._counts["late"] += 1
            for i, owed in enumerate(self._owed):  # undecided: it was also owed as a plain reply
                if owed.stim_us == ts:
                    del self._owed[i]
                    self._unanswered.pop(ts, None)
                    break
            return True
        return False

    def _classify_unawaited(self, datagram: _Datagram) -> None:
        """Count a reply that arrived while no stimulation was awaited: it answers none of them now."""
        if self._by_clock():
            self._attribute(datagram, None, 0.0)
            return
        if self._echo is not False and self._echo_bookkeeping(datagram.reply.timestamp_us):
            return
        if self._echo is True:
            self._counts["stale"] += 1  # echo device, unknown timestamp: nothing it can answer
        elif self._repeat(datagram):
            return  # a copy is not the reply still owed: that one may yet come, and must not be taken later
        elif self._owed:
            self._unanswered.pop(self._owed.popleft().stim_us, None)  # in order: the oldest one still owed a reply
            self._counts["late"] += 1
        else:
            self._counts["stale"] += 1  # a reply nothing is owed: more replies than stimulations

    def _classify_awaited(self, datagram: _Datagram, waiting_for: int, earliest: float) -> str | None:
        """While `waiting_for` is awaited: "echo", "plain", "candidate" (auto: hold), or None (counted, not it)."""
        ts = datagram.reply.timestamp_us
        if self._echo is not False:
            if ts == waiting_for:
                self._echo = True
                return "echo"
            if self._echo_bookkeeping(ts):
                return None
            if self._echo is True:
                self._counts["stale"] += 1
                return None
        if self._repeat(datagram):
            return None  # before the owed reply is booked: a copy must not stand in for it
        if self._owed:  # replies come in order: the oldest owed one is answered first
            self._unanswered.pop(self._owed.popleft().stim_us, None)
            self._counts["late"] += 1
            return None
        if datagram.arrived < earliest:
            self._counts["stale"] += 1  # sooner than the device can answer: it was on its way before the send
            return None
        if self._echo is None and ts <= waiting_for:
            return "candidate"  # a stale echo, or a coarse, constant or lagging clock: wait for the echo
        return "plain"
