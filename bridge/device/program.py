"""`spikeloop device`: the device-side program, speaking CL1 wire protocol v1.

The device binds the stimulation, event and feedback ports, and answers every
stimulation command with exactly one spike-count datagram sent to
(training host, spike port), carrying the stimulation's timestamp. The reply
counts spikes in the collection window that follows the artifact wait, both in
milliseconds from the moment the command was taken in, and leaves as soon as
that window has ended: the device sleeps until just before the deadline, then
spins, instead of waiting for whole hardware ticks.

Every datagram waiting on any port is handled each time the device wakes
(feedback first, then stimulation, then events, matching the order in which a
trainer sends them), up to `MAX_DATAGRAMS_PER_WAKE` per port so that a flood
on one port cannot hold back the replies. A device that runs as fast as possible (`--as-fast-as-possible`)
also takes in the feedback waiting before it applies each stimulation, so that the culture gets everything the
trainer sent before that stimulation first, whatever order the wake-up saw them in (the run then repeats bit
for bit: docs/architecture.md, "Unpaced simulated runs repeat bit for bit"). `training_complete` ends the run
with exit status 0 (unless its reason says the trainer stopped on an error:
then the device stays up for `--resume`, or exits with
`--exit-on-error-complete`); SIGINT and SIGTERM end it too, always closing the
recording cleanly.

What the device accepts (see docs/architecture.md, "Threat model"): datagrams
from the training host only (`accept_from`), and only stimulation and feedback
inside its own safety envelope (`DeviceConfig.envelope`, whatever the trainer's
says). Everything else is counted (`malformed_*`, `foreign_*`, `refused_*`,
`errors_*`), logged at a bounded rate and skipped; a refused stimulation is
still answered (exactly one reply per stimulation command) without stimulating.
No datagram stops the device except `training_complete` from an accepted source.

Stimulation dose (bridge/device/dose.py): the device books the charge it delivers per electrode, per minute and per
session, and refuses (counted as `dose_refused_*`, still answered) any command that would take an electrode past
the lab's budget (`--dose-budget-nc-per-min`, `--dose-budget-nc-per-session`). A `status_request` event is
answered with one `device_status` datagram in the event format, sent where the replies go: the device's envelope,
dose budget, dose so far and refusal counts (docs/protocol.md, "Device status").

Third-party devices, for rehearsal and tests (`--tick-quantised`, `--own-clock`,
`--clock-resolution-ms`, `--constant-clock`, `--reply-from ephemeral`): the
device can behave like the reference trainer's device program instead, the
kind of protocol-v1 device the bridge must work with unchanged. Tick-quantised,
it runs a fixed-rate hardware loop: each tick it takes at most one datagram per
port (the rest wait their turn, in order), a stimulation taken while a reply is
still pending discards that reply, and a reply leaves on the first tick after
the windows have passed, counted in whole ticks from the tick that took the
stimulation in (at 10 Hz with 50 + 50 ms windows: the next tick, 100-200 ms
after the stimulation was sent). With its own clock it stamps replies with its
wall clock (optionally coarse, or constant) instead of echoing; it can reply
from a socket of its own rather than its stimulation port. In tick mode the
counters show how far behind the device fell: `lag_ticks_max_<port>` (the most
ticks a datagram waited to be taken) and `backlog_max_<port>`.

Protocol faults, to show that `spikeloop check` and training catch them
(`--answer-previous`, `--chatty`; never what a device should do): answering each
stimulation with the counts evoked by the one before it (as a device does that
applies a stimulation only after the tick it reports: stamps and timing stay
right, only the counts are one stimulation late), and sending one spike
datagram per tick whether a stimulation asked for it or not (counted as
`unsolicited_sent`).

In-process use (tests, one simulated device per env runner):

    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=my_port)
    device = Device(DeviceConfig(address=address))
    thread = device.start()          # serve_forever in a background thread
    ... device.stim_port ...         # the ports actually bound
    device.stop(); thread.join()
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import math
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from spikeloop.bridge.device.backends import Backend, make_backend
from spikeloop.bridge.device.dose import DoseBudget, DoseMeter, DoseRefusal, feedback_charges_nc, stim_charges_nc
from spikeloop.bridge.device.pulse_rate import Burst, PulseBook, PulseRateRefusal, feedback_bursts, stim_bursts
from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig, knob_table
from spikeloop.bridge.wire import channels
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.discarded import DISCARDED_EVENT
from spikeloop.bridge.wire.protocol import (
    DEVICE_RECV_BYTES,
    KNOWN_EVENT_TYPES,
    EventMessage,
    FeedbackType,
    ProtocolError,
    SpikeCounts,
    decode_event,
    decode_feedback,
    decode_stim,
    encode_event,
    encode_spikes,
    now_us,
)
from spikeloop.bridge.wire.safety import Policy, SafetyEnvelope, SafetyViolation
from spikeloop.bridge.wire.settings import (
    ARTIFACT_WAIT_MS,
    COLLECT_WINDOW_MS,
    CULTURE_SEED,
    CULTURE_STATE,
    DEVICE_BACKEND,
    DEVICE_REALTIME,
    DOSE_BUDGET_NC_PER_MIN,
    FEEDBACK_SETTLE_MAX_HOLD_MS,
    FEEDBACK_SETTLE_MS,
    MAX_PULSE_RATE_HZ,
    RANDOM_SPIKE_RATE_HZ,
    SEED,
    SETTINGS,
    STIM_MODE,
    TICK_FREQUENCY_HZ,
)

log = logging.getLogger("spikeloop.device")

SPIN_MARGIN_S = 0.0015
"""Sleep until this long before a reply is due, then spin: OS sleeps overshoot (measured: docs/benchmarks.md, device)."""
IDLE_POLL_S = 0.02
"""Longest block in select, so stop() and a real-time culture's catch-up stay timely."""
MAX_DATAGRAMS_PER_WAKE = 256
"""Datagrams taken from one port per wake-up; the rest wait for the next (replies go out in between)."""
REPLY_STAMPS = ("echo", "own", "constant")
"""`echo`: replies carry the stimulation's timestamp; `own`: the device's wall clock (at `clock_resolution_ms`);
`constant`: the same stamp on every reply (a clock that never moves)."""
REPLY_FROM = ("stim_port", "ephemeral")
"""Which socket replies leave from: the stimulation port, or a socket of their own on a free port."""
TICK_QUEUE_LIMIT = 256
"""Tick-quantised: datagrams waiting per port, like a socket buffer; more are dropped (`overflow_<port>`)."""
STATUS_COUNTERS = (
    "refused_stim",
    "refused_feedback",
    "dose_refused_stim",
    "dose_refused_feedback",
    "rate_refused_stim",
    "rate_refused_feedback",
)
"""The refusal counts a `device_status` datagram carries."""
ACCEPT_FROM = ("host", "spike_port", "any")
"""`host`: datagrams from the training host's address only; `spike_port`: only from the training host's
spike port (the bridge sends from it); `any`: from anywhere."""


def reply_ticks(tick_frequency_hz: float, artifact_wait_ms: float, collect_window_ms: float) -> int:
    """Tick-quantised: ticks from the one that takes a stimulation in to the one its reply leaves on."""
    return max(1, math.ceil((artifact_wait_ms + collect_window_ms) / 1000.0 * tick_frequency_hz - 1e-9))


def tick_loop_limit_steps_per_s(tick_frequency_hz: float, artifact_wait_ms: float, collect_window_ms: float) -> float:
    """The most closed-loop steps per second a tick-quantised device allows a trainer that needs any time at all
    between a reply and the next stimulation: that stimulation is taken on the tick after the reply's."""
    return tick_frequency_hz / (reply_ticks(tick_frequency_hz, artifact_wait_ms, collect_window_ms) + 1)


class BoundedLog:
    """Warnings about bad datagrams at a bounded rate: the first few of a kind, then one per interval."""

    def __init__(self, logger: logging.Logger, first: int = 10, interval_s: float = 10.0) -> None:
        self._log = logger
        self._first = first
        self._interval_s = interval_s
        self._state: dict[str, list[float]] = {}  # key -> [lines logged, time of the last, not logged since]

    def warning(self, key: str, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log `message` unless this key has used up its share; True if it was logged."""
        now = time.monotonic()
        state = self._state.setdefault(key, [0, -math.inf, 0])
        if state[0] >= self._first and now - state[1] < self._interval_s:
            state[2] += 1
            return False
        suffix = f" ({int(state[2])} more like it not logged)" if state[2] else ""
        self._log.warning(message + suffix, *args, exc_info=exc_info)
        state[0] += 1
        state[1] = now
        state[2] = 0
        return True


@dataclass(frozen=True)
class DeviceConfig:
    """Settings of one device; port 0 binds a free port (see `Device.*_port`)."""

    address: DeviceAddress = field(default_factory=DeviceAddress)
    """Read from the device's end (bridge/wire/address.py): it binds its stimulation, event and feedback ports on
    `host` and replies to `bind_host:spike_port`, the training host."""
    tick_frequency_hz: float = TICK_FREQUENCY_HZ.default
    artifact_wait_ms: float = ARTIFACT_WAIT_MS.default
    collect_window_ms: float = COLLECT_WINDOW_MS.default
    recording_path: Path | None = None
    backend: str = DEVICE_BACKEND.default
    seed: int = SEED.default
    random_spike_rate_hz: float = RANDOM_SPIKE_RATE_HZ.default
    realtime: bool = DEVICE_REALTIME.default
    """A device program's default; an experiment's simulated device passes its own (`SIM_REALTIME`)."""
    cl_sim_culture: bool = False
    envelope: SafetyEnvelope = field(default_factory=SafetyEnvelope)
    """The device's own limits: stimulation or feedback outside them is refused, whatever the trainer sent."""
    dose_budget: DoseBudget = field(default_factory=DoseBudget)
    """Per-electrode charge limits (bridge/device/dose.py): a command that would exceed one is refused."""
    max_pulse_rate_hz: float = MAX_PULSE_RATE_HZ.default
    """No electrode pulsed faster than this across commands (bridge/device/pulse_rate.py)."""
    accept_from: Literal["host", "spike_port", "any"] = "host"
    tick_quantised: bool = False
    """Behave like a fixed-rate hardware loop: one datagram per port per tick, replies on ticks (module docstring)."""
    reply_stamp: Literal["echo", "own", "constant"] = "echo"
    clock_resolution_ms: float = 0.0
    """With reply_stamp "own": the device clock moves in steps of this many ms (0: microseconds)."""
    reply_from: Literal["stim_port", "ephemeral"] = "stim_port"
    answer_previous: bool = False
    """Fault: answer each stimulation with the counts of the previous one's windows (the first with zeros)."""
    chatty: bool = False
    """Fault: besides the replies, send one spike datagram per tick that answers no stimulation."""
    culture: SimulatedCultureConfig | None = None
    """The sim backend's culture knobs (None: the defaults); refused for other backends."""
    culture_seed: int | None = CULTURE_SEED.default
    """sim: which culture (bridge/device/culture_variation.py): the knobs not in `culture_fixed` are drawn from it,
    and so is the wiring (`seed` is then not used)."""
    culture_fixed: frozenset[str] = frozenset()
    """The culture knobs set explicitly: a culture seed leaves them alone; a saved culture must agree with them."""
    culture_state: Path | None = CULTURE_STATE.default
    """sim: loaded from this file if it exists, else built; saved to it when the device closes
    (bridge/device/culture_state.py)."""
    feedback_settle_ms: float = FEEDBACK_SETTLE_MS.default
    """0: a stimulation is applied when it arrives. > 0: a stimulation that arrives while feedback is still being
    delivered, or less than this long after its last pulse, is held until then (its windows start then), so that
    no feedback pulse and none of its immediate echo falls in a collection window (docs/architecture.md)."""
    feedback_settle_max_hold_ms: float = FEEDBACK_SETTLE_MAX_HOLD_MS.default
    """The longest a stimulation is held for feedback to settle (its windows then start, whatever still pulses)."""
    stim_mode: Literal["burst", "reference"] = STIM_MODE.default
    """What one stimulation command does (spikeloop.bridge.wire.settings.STIM_MODE): `burst`, a burst lasting one tick per
    encoding electrode; `reference`, the reference device's: interrupt every stimulable electrode, then one pulse
    per encoding electrode."""
    exit_on_error_complete: bool = False
    """False: a `training_complete` whose reason starts with "error" (a trainer that stopped on a failure, a lost
    device among them) is recorded and the device stays up, so that `spikeloop train --resume` finds it; True: it
    ends the device like any other `training_complete`."""

    def __post_init__(self) -> None:
        if not isinstance(self.dose_budget, DoseBudget):
            raise ValueError(f"device dose_budget={self.dose_budget!r}: give a spikeloop.bridge.device.dose.DoseBudget")
        if not isinstance(self.address, DeviceAddress):
            raise ValueError(f"device address={self.address!r}: give a spikeloop.bridge.wire.address.DeviceAddress")
        for setting in (
            TICK_FREQUENCY_HZ,
            ARTIFACT_WAIT_MS,
            COLLECT_WINDOW_MS,
            RANDOM_SPIKE_RATE_HZ,
            SEED,
            MAX_PULSE_RATE_HZ,
        ):
            setting.require(getattr(self, setting.name), f"device {setting.name}")
        DEVICE_BACKEND.require(self.backend, "device backend")
        if self.accept_from not in ACCEPT_FROM:
            raise ValueError(f"device accept_from={self.accept_from!r}: choose from {', '.join(ACCEPT_FROM)}")
        if self.reply_stamp not in REPLY_STAMPS:
            raise ValueError(f"device reply_stamp={self.reply_stamp!r}: choose from {', '.join(REPLY_STAMPS)}")
        if self.reply_from not in REPLY_FROM:
            raise ValueError(f"device reply_from={self.reply_from!r}: choose from {', '.join(REPLY_FROM)}")
        STIM_MODE.require(self.stim_mode, "device stim_mode")
        if not (math.isfinite(self.clock_resolution_ms) and self.clock_resolution_ms >= 0):
            raise ValueError(f"device clock_resolution_ms={self.clock_resolution_ms!r}: must be a finite number >= 0")
        if self.culture is not None and self.backend != "sim":
            raise ValueError(
                f"device culture settings are for the sim backend's simulated culture; backend {self.backend!r} "
                "has none (remove them, or use --backend sim)"
            )
        CULTURE_SEED.require(self.culture_seed, "device culture_seed")
        for setting in (CULTURE_SEED, CULTURE_STATE):
            if getattr(self, setting.name) is not None and self.backend != "sim":
                raise ValueError(
                    f"{setting.flag} is for the sim backend's simulated culture; backend {self.backend!r} has none "
                    f"(remove {setting.flag}, or use --backend sim)"
                )
        FEEDBACK_SETTLE_MS.require(self.feedback_settle_ms, "device feedback_settle_ms")
        FEEDBACK_SETTLE_MAX_HOLD_MS.require(self.feedback_settle_max_hold_ms, "device feedback_settle_max_hold_ms")
        if self.feedback_settle_ms > 0 and (self.tick_quantised or self.backend == "cl"):
            raise ValueError(
                "device feedback_settle_ms: holding a stimulation is implemented for the sim, random, zero and "
                "transparent backends without --tick-quantised"
            )
        if self.tick_quantised and self.backend == "cl":
            raise ValueError("--tick-quantised emulates a hardware loop; the cl backend already runs on its own ticks")
        for flag, on in (("--tick-quantised", self.tick_quantised), ("--chatty", self.chatty)):
            if on and not self.realtime and self.backend != "cl":
                raise ValueError(f"{flag} runs on the wall clock: use it with --realtime, not --as-fast-as-possible")
        longest_burst = self.envelope.max_frequency_hz / self.tick_frequency_hz
        if self.stim_mode == "burst" and longest_burst > self.envelope.max_pulses:
            raise ValueError(
                f"a stimulation burst lasts one tick: at {self.envelope.max_frequency_hz:g} Hz and a "
                f"{self.tick_frequency_hz:g} Hz tick that is {longest_burst:g} pulses, above the envelope's "
                f"max_pulses={self.envelope.max_pulses}; raise the tick frequency or lower max_frequency_hz"
            )


@dataclass
class _PendingReply:
    stim_timestamp_us: int
    collect_start_s: float
    collect_end_s: float
    received_monotonic_s: float
    due_tick: int = 0
    """Tick-quantised: the tick on which the reply leaves."""


class Device:
    """One device: its sockets, its backend and the reply timing between them."""

    def __init__(self, config: DeviceConfig, backend: Backend | None = None) -> None:
        self.config = config
        self.backend = backend or make_backend(
            config.backend,
            tick_frequency_hz=config.tick_frequency_hz,
            seed=config.seed,
            realtime=config.realtime,
            random_spike_rate_hz=config.random_spike_rate_hz,
            cl_sim_culture=config.cl_sim_culture,
            max_pulses=config.envelope.max_pulses,
            culture=config.culture,
            stim_mode=config.stim_mode,
            culture_seed=config.culture_seed,
            culture_fixed=config.culture_fixed,
            culture_state=config.culture_state,
        )
        self.counters: collections.Counter[str] = collections.Counter()
        self.dose = DoseMeter(config.dose_budget)
        self.pulses = PulseBook(config.max_pulse_rate_hz, self.backend.queues_bursts)
        self.exit_reason = ""
        self._stop = threading.Event()
        self._pending: collections.deque[_PendingReply] = collections.deque()
        self._warn = BoundedLog(log)
        address = config.address  # read from this end: listen on host, reply to bind_host:spike_port
        try:
            trainer_ip = socket.gethostbyname(address.bind_host)
        except OSError as exc:
            raise OSError(f"device: cannot resolve training host {address.bind_host!r}: {exc}") from None
        self._reply_to = (trainer_ip, address.spike_port)
        self._stim_sock = self._bind(address.stim_port)
        self._feedback_sock = self._bind(address.feedback_port)
        self._event_sock = self._bind(address.event_port)
        # A third-party device may answer from a socket of its own (a free port) rather than its stimulation port.
        self._reply_sock = self._stim_sock if config.reply_from == "stim_port" else self._bind(0)
        self._constant_stamp_us = now_us()
        self._tick = 0  # tick-quantised: the current tick
        self._held_counts = [0.0] * channels.N_SPIKE_GROUPS  # answer_previous: the counts the next reply carries
        self._last_stim_us = 0  # chatty: the newest stimulation's stamp, echoed by unasked datagrams
        self._next_chatter_s = -math.inf  # chatty, free-running: when the next unasked datagram leaves
        self._window_ticks = reply_ticks(config.tick_frequency_hz, config.artifact_wait_ms, config.collect_window_ms)
        # Feedback before stimulation before events: the order a trainer sends them in.
        self._socks = [self._feedback_sock, self._stim_sock, self._event_sock]
        self._handlers = {
            self._feedback_sock: self._on_feedback,
            self._stim_sock: self._on_stim,
            self._event_sock: self._on_event,
        }
        self._closed = False
        self.final_dose: dict[str, Any] | None = None
        """The dose when the device closed (`DoseMeter.summary`), for the exit summary."""
        self._feedback_clear_s = -math.inf  # feedback_settle_ms: no stimulation is applied before this
        self._max_hold_s = config.feedback_settle_max_hold_ms / 1e3  # a burst the envelope allows can last minutes

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # Bursts of datagrams must not be dropped while the device spins for a deadline.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((self.config.address.host, port))
        sock.setblocking(False)
        return sock

    # --- ports actually bound --------------------------------------------------------

    @property
    def stim_port(self) -> int:
        """Bound stimulation port."""
        return self._stim_sock.getsockname()[1]

    @property
    def spike_port(self) -> int:
        """Port on the training host that receives the replies."""
        return self._reply_to[1]

    @spike_port.setter
    def spike_port(self, port: int) -> None:
        # A trainer that binds its spike port after the device exists (port 0) tells it here.
        self._reply_to = (self._reply_to[0], int(port))

    @property
    def reply_source_port(self) -> int:
        """The port replies leave from (the stimulation port unless reply_from is "ephemeral")."""
        return self._reply_sock.getsockname()[1]

    @property
    def feedback_port(self) -> int:
        """Bound feedback port."""
        return self._feedback_sock.getsockname()[1]

    @property
    def event_port(self) -> int:
        """Bound event port."""
        return self._event_sock.getsockname()[1]

    # --- running ---------------------------------------------------------------------

    def serve_forever(self) -> int:
        """Serve until training_complete or stop(); close the recording; return the exit status."""
        try:
            self.backend.open(self.config.recording_path)
            log.info(
                "device up: backend=%s stim_mode=%s stim=%d feedback=%d event=%d -> replies to %s:%d from port %d%s",
                self.backend.name,
                self.config.stim_mode,
                self.stim_port,
                self.feedback_port,
                self.event_port,
                *self._reply_to,
                self.reply_source_port,
                f" (tick-quantised at {self.config.tick_frequency_hz:g} Hz, replies {self._window_ticks} "
                f"tick(s) after the tick that takes a stimulation)"
                if self.config.tick_quantised
                else "",
            )
            if self.config.tick_quantised:
                self._serve_ticks()
                return 0
            for _ in self.backend.ticks():
                if self._stop.is_set():
                    break
                self._service(block=self.backend.blocking)
        finally:
            self.close()
        return 0

    def start(self) -> threading.Thread:
        """Run serve_forever in a daemon thread and return it."""
        thread = threading.Thread(target=self.serve_forever, name="spikeloop-device", daemon=True)
        thread.start()
        return thread

    def stop(self, reason: str = "stop requested") -> None:
        """Ask serve_forever to return soon (safe from signal handlers and other threads)."""
        if not self.exit_reason:
            self.exit_reason = reason
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Whether stop() was asked for (or training_complete received)."""
        return self._stop.is_set()

    def close(self) -> None:
        """Close the recording and the sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            # Read on the backend's clock, which closes with it (cl: the sample clock): the dose at exit.
            self.final_dose = self.dose.summary(self.backend.now_s())
        except Exception as exc:  # a backend that never opened has no clock; the session figures need none
            log.warning("dose at exit without the last minute (%s: %s)", type(exc).__name__, exc)
            self.final_dose = self.dose.summary(None)
        try:
            self.backend.close()
        finally:
            for sock in {*self._socks, self._reply_sock}:
                sock.close()

    def recording_files(self) -> list[Path]:
        """Files the recording wrote (complete after close)."""
        return self.backend.recording_files()

    # --- one wake-up -----------------------------------------------------------------

    def _service(self, block: bool) -> None:
        timeout = self._wait_s() if block else 0.0
        readable, _, _ = select.select(self._socks, [], [], timeout)
        for sock in self._socks:
            if sock in readable:
                self._drain(sock)
        if self.backend.paced:
            self.backend.advance_to(self.backend.now_s())
        self._send_due_replies()
        if self.config.chatty and self.backend.now_s() >= self._next_chatter_s:
            period = 1.0 / self.config.tick_frequency_hz
            self._next_chatter_s = max(self._next_chatter_s + period, self.backend.now_s())
            self._chatter()

    def _wait_s(self) -> float:
        if not self._pending:
            return IDLE_POLL_S
        if not self.backend.paced:
            return 0.0
        until_due = self._pending[0].collect_end_s - self.backend.now_s() - SPIN_MARGIN_S
        return min(IDLE_POLL_S, max(0.0, until_due))

    def _accepts(self, source: tuple[str, int]) -> bool:
        """Whether a datagram from `source` may be acted on (see `ACCEPT_FROM`)."""
        mode = self.config.accept_from
        if mode == "any":
            return True
        if mode == "spike_port":
            return (source[0], source[1]) == self._reply_to
        return source[0] == self._reply_to[0]

    def _drain(self, sock: socket.socket) -> None:
        for _ in range(MAX_DATAGRAMS_PER_WAKE):
            if self._stop.is_set():
                return
            got = self._recv_one(sock)
            if got is None:
                return
            self._handle(sock, *got)

    def _recv_one(self, sock: socket.socket) -> tuple[bytes, tuple[str, int]] | None:
        """The next datagram waiting on `sock`, or None."""
        try:
            return sock.recvfrom(DEVICE_RECV_BYTES + 1)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:  # e.g. ICMP port unreachable surfacing on some platforms
            self.counters["socket_errors"] += 1
            log.debug("recv error: %s", exc)
            return None

    def _handle(self, sock: socket.socket, data: bytes, source: tuple[str, int]) -> None:
        """Act on one datagram from `sock`'s port; nothing it contains can raise out of here."""
        handler = self._handlers[sock]
        kind = handler.__name__.removeprefix("_on_")
        if not self._accepts(source):
            self._skipped(
                "foreign",
                kind,
                data,
                f"from {source[0]}:{source[1]}, not the training host "
                f"{self._reply_to[0]} (accept_from={self.config.accept_from})",
            )
            return
        try:
            handler(data)
        except ProtocolError as exc:
            self._skipped("malformed", kind, data, str(exc))
        except DoseRefusal as exc:
            self._skipped("dose_refused", kind, data, str(exc))
        except PulseRateRefusal as exc:
            self._skipped("rate_refused", kind, data, str(exc))
        except SafetyViolation as exc:
            self._skipped("refused", kind, data, f"outside the device's envelope: {exc}")
        except Exception as exc:  # the device must outlive any one datagram; the cause goes to the log
            self.counters[f"errors_{kind}"] += 1
            self._warn.warning(
                f"errors_{kind}",
                "%s datagram (%d bytes) raised %s: %s",
                kind,
                len(data),
                type(exc).__name__,
                exc,
                exc_info=True,
            )

    # --- tick-quantised: a fixed-rate hardware loop ------------------------------------

    def _serve_ticks(self) -> None:
        """One datagram per port per tick, replies on ticks, until stopped (see the module docstring)."""
        period = 1.0 / self.config.tick_frequency_hz
        kinds = {sock: self._handlers[sock].__name__.removeprefix("_on_") for sock in self._socks}
        waiting: dict[socket.socket, collections.deque] = {sock: collections.deque() for sock in self._socks}
        next_tick = time.monotonic()
        while not self._stop.is_set():
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            for sock in self._socks:  # what arrived since the last tick joins the port's queue, in order
                while (got := self._recv_one(sock)) is not None:
                    if len(waiting[sock]) >= TICK_QUEUE_LIMIT:
                        self.counters[f"overflow_{kinds[sock]}"] += 1
                    else:
                        waiting[sock].append((*got, self._tick))
            for sock in self._socks:  # feedback, stimulation, events: at most one each per tick
                if self._stop.is_set():
                    return
                if waiting[sock]:
                    data, source, queued_at = waiting[sock].popleft()
                    kind = kinds[sock]
                    self._note_max(f"lag_ticks_max_{kind}", self._tick - queued_at)
                    self._note_max(f"backlog_max_{kind}", len(waiting[sock]))
                    self._handle(sock, data, source)
            self.backend.advance_to(self.backend.now_s())
            self._send_due_replies()
            if self.config.chatty:
                self._chatter()
            self._tick += 1
            next_tick += period
            if next_tick < time.monotonic() - period:
                next_tick = time.monotonic()  # the host stalled: skip the lost ticks instead of racing through them

    def _note_max(self, key: str, value: int) -> None:
        if value > self.counters[key]:
            self.counters[key] = value

    def _skipped(self, why: str, kind: str, data: bytes, detail: str) -> None:
        key = f"{why}_{kind}"
        self.counters[key] += 1
        self._warn.warning(
            key, "skipped %s %s datagram #%d (%d bytes): %s", why, kind, self.counters[key], len(data), detail
        )

    # --- handlers ----------------------------------------------------------------------

    def _stim_at_s(self) -> float:
        """When a stimulation taken in now is applied: now, or once feedback has settled (feedback_settle_ms), but
        never more than feedback_settle_max_hold_ms after now (counted as `settle_capped`)."""
        now = self.backend.now_s()
        if self._feedback_clear_s <= now:
            return now
        if self._feedback_clear_s > now + self._max_hold_s:
            self.counters["settle_capped"] += 1
            return now + self._max_hold_s
        return self._feedback_clear_s

    def _under_ceiling(
        self, at_s: float, bursts_at: Callable[[float], tuple[list[Burst], tuple[int, ...]]], kind: str, what: str
    ) -> tuple[float, list[Burst], tuple[int, ...]]:
        """When a command may start under the pulse-rate ceiling (`at_s`, or up to one period later: counted as
        `rate_deferred_<kind>`), with its bursts and interrupted electrodes then (`bursts_at(start)`)."""
        bursts, interrupted = bursts_at(at_s)
        delay_s = self.pulses.plan(at_s, bursts, interrupted, what)
        if delay_s > 0:  # a burst just cut or replaced pulsed a moment ago: this one starts a period after it
            self.counters[f"rate_deferred_{kind}"] += 1
            at_s += delay_s
            bursts, interrupted = bursts_at(at_s)
        return at_s, bursts, interrupted

    def _book(self, at_s: float, charges: np.ndarray, bursts: list[Burst], interrupted: tuple[int, ...]) -> None:
        """Book an applied command: its charge whole, then back what the bursts it cut short will never give."""
        self.dose.deliver(at_s, charges)
        for cut in self.pulses.deliver(at_s, bursts, interrupted):
            self.dose.refund(cut.electrode, cut.booked_at_s, cut.charge_nc)

    def _on_stim(self, data: bytes) -> None:
        received = time.monotonic()  # the windows start when the command is taken in, before decoding it
        if not self.backend.paced and not self.config.tick_quantised:
            # Unpaced, the culture's clock moves only here: whatever feedback the trainer sent before this
            # stimulation is applied first, even if it reached its socket after this wake-up began.
            self._drain(self._feedback_sock)
        at_s = self._stim_at_s()
        cmd = decode_stim(data)
        self.counters["stim"] += 1
        self._last_stim_us = cmd.timestamp_us
        refused: SafetyViolation | None = None
        charges = stim_charges_nc(cmd, self.config.tick_frequency_hz, self.config.stim_mode)
        bursts: list[Burst] = []
        interrupted: tuple[int, ...] = ()
        try:
            self.config.envelope.check_stim(cmd, "raise")
            mode, tick_hz = self.config.stim_mode, self.config.tick_frequency_hz
            at_s, bursts, interrupted = self._under_ceiling(
                at_s, lambda t: stim_bursts(cmd, t, self.backend.burst_timing, tick_hz, mode), "stim", "stimulation"
            )
            self.dose.check(at_s, charges, "stimulation")
        except SafetyViolation as exc:  # DoseRefusal and PulseRateRefusal included
            refused = exc
        self.backend.advance_to(at_s)
        start_s = at_s + self.config.artifact_wait_ms / 1000.0
        end_s = start_s + self.config.collect_window_ms / 1000.0
        if self.config.tick_quantised and self._pending:
            # A hardware loop holds one stimulation at a time: the newer one replaces it, unanswered.
            self.counters["replies_discarded"] += len(self._pending)
            self._pending.clear()
        # Queued before stimulating: a stimulation that was taken in is answered, whatever happens next.
        self._pending.append(
            _PendingReply(cmd.timestamp_us, start_s, end_s, received, due_tick=self._tick + self._window_ticks)
        )
        entry = {
            "t_s": at_s,
            "timestamp_us": cmd.timestamp_us,
            "frequencies_hz": list(cmd.frequencies_hz),
            "amplitudes_ua": list(cmd.amplitudes_ua),
        }
        if refused is None:
            self.backend.stimulate(at_s, cmd.frequencies_hz, cmd.amplitudes_ua)
            self._book(at_s, charges, bursts, interrupted)
        else:
            self.backend.record("stim", entry | {"refused": str(refused)})
            raise type(refused)(f"{refused} (not stimulated; answered)")
        self.backend.record("stim", entry)
        if not self.backend.paced:
            self._send_due_replies()  # simulated time: answer before the next command moves the clock

    def _on_feedback(self, data: bytes) -> None:
        cmd = decode_feedback(data)
        self.counters["feedback"] += 1
        at_s = self.backend.now_s()
        if not self.backend.paced and 0 < cmd.timestamp_us < self._last_stim_us:
            # Stamped (by spikeloop's bridge) before a stimulation already applied: an unpaced culture got it one
            # stimulation late, so the run no longer repeats (docs/architecture.md, "Unpaced simulated runs repeat
            # bit for bit").
            self.counters["feedback_after_later_stim"] += 1
            self._warn.warning(
                "feedback_after_later_stim",
                "feedback stamped %d us arrived after the stimulation stamped %d us; applied late",
                cmd.timestamp_us,
                self._last_stim_us,
            )
        entry = {
            "t_s": at_s,
            "timestamp_us": cmd.timestamp_us,
            "type": cmd.feedback_type.name.lower(),
            "channels": list(cmd.channels),
            "frequency_hz": cmd.frequency_hz,
            "amplitude_ua": cmd.amplitude_ua,
            "pulses": cmd.pulses,
            "unpredictable": cmd.unpredictable,
            "event_name": cmd.event_name,
        }
        # An interrupt only stops stimulation: its forbidden channels are dropped, never the interrupt.
        policy: Policy = "clamp" if cmd.feedback_type == FeedbackType.INTERRUPT else "raise"
        bursts: list[Burst] = []
        interrupted: tuple[int, ...] = ()
        try:
            safe, _ = self.config.envelope.check_feedback(cmd, policy)
            charges = feedback_charges_nc(safe) if safe is not None else None
            if safe is not None and charges is not None:
                asked_s = at_s
                at_s, bursts, interrupted = self._under_ceiling(
                    at_s,
                    lambda t: feedback_bursts(safe, t, self.backend.burst_timing),
                    "feedback",
                    f"feedback {cmd.event_name!r}",
                )
                if at_s > asked_s:
                    entry["deferred_ms"] = (at_s - asked_s) * 1e3
                self.dose.check(at_s, charges, f"feedback {cmd.event_name!r}")
        except SafetyViolation as exc:  # DoseRefusal and PulseRateRefusal included
            self.backend.record("feedback", entry | {"refused": str(exc)})
            raise
        self.backend.advance_to(at_s)
        if safe is not None and charges is not None:  # None: nothing to stimulate (no pulses, frequency or amplitude)
            self.backend.feedback(at_s, safe)
            self._book(at_s, charges, bursts, interrupted)
            if self.config.feedback_settle_ms > 0 and safe.feedback_type != FeedbackType.INTERRUPT:
                last_pulse_s = self.backend.last_pulse_s(at_s, safe.frequency_hz, int(safe.pulses))
                self._feedback_clear_s = max(
                    self._feedback_clear_s, last_pulse_s + self.config.feedback_settle_ms / 1e3
                )
        self.backend.record("feedback", entry)

    def _on_event(self, data: bytes) -> None:
        event = decode_event(data)
        self.counters["event"] += 1
        # Counters per known type only: a stream of invented types must not grow the table.
        self.counters[f"event_{event.event_type}" if event.event_type in KNOWN_EVENT_TYPES else "event_other"] += 1
        if event.event_type == "status_request":
            self._send_status()
            return
        if event.event_type == "training_complete":
            self.backend.record_event(event)
            if error_complete(event.data) and not self.config.exit_on_error_complete:
                self.counters["training_complete_after_error"] += 1
                log.warning(
                    "training_complete after an error (%s): staying up, so that `spikeloop train --resume` can "
                    "continue (--exit-on-error-complete: exit instead)",
                    event.data,
                )
                return
            log.info("training_complete: %s", event.data)
            self.stop("training_complete")
            return
        if event.event_type == DISCARDED_EVENT:  # kept with the recording: its readers mark the discarded copy
            log.warning("the trainer discarded work this device recorded: %s", event.data)
        self.backend.record_event(event)

    def status(self) -> dict[str, Any]:
        """What a `device_status` datagram carries: envelope, dose budget, dose so far, refusal counts."""
        envelope = self.config.envelope
        return {
            "envelope": {f: getattr(envelope, f) for f in ENVELOPE_FLAGS}
            | {
                "phase_width_us": envelope.phase_width_us,
                "forbidden_electrodes": sorted(envelope.forbidden_electrodes),
            },
            "dose_budget": self.config.dose_budget.as_dict(),
            "dose": self.dose.summary(self.backend.now_s()),
            "refused": {k: self.counters[k] for k in STATUS_COUNTERS},
        }

    def _send_status(self) -> None:
        """Answer a status_request where the replies go (one datagram, the event format)."""
        try:
            self._reply_sock.sendto(
                encode_event(EventMessage(now_us(), "device_status", self.status())), self._reply_to
            )
        except OSError as exc:
            self.counters["send_errors"] += 1
            log.debug("could not send the device status: %s", exc)
            return
        self.counters["status_sent"] += 1

    # --- replies -----------------------------------------------------------------------

    def _send_due_replies(self) -> None:
        if self.config.tick_quantised:
            while self._pending and self._pending[0].due_tick <= self._tick:
                reply = self._pending.popleft()
                self.backend.advance_to(reply.collect_end_s)
                self._send(reply, *self._reply_datagram(reply))
            return
        while self._pending and not self._stop.is_set():
            reply = self._pending[0]
            if self.backend.paced:
                if reply.collect_end_s - self.backend.now_s() > SPIN_MARGIN_S:
                    return
                self.backend.advance_to(reply.collect_end_s)
                if not self.backend.blocking and self.backend.available_until_s() < reply.collect_end_s:
                    return  # hardware data for the window's end comes with a later tick
                # The culture has already run to the window's end: build the datagram now, so that
                # only the send is left when the window closes.
                counts, datagram = self._reply_datagram(reply)
                while self.backend.now_s() < reply.collect_end_s:
                    pass  # spin: the last ~1.5 ms, for a reply within 1 ms of the window's end
            else:
                self.backend.advance_to(reply.collect_end_s)
                counts, datagram = self._reply_datagram(reply)
            self._pending.popleft()
            self._send(reply, counts, datagram)

    def _reply_datagram(self, reply: _PendingReply) -> tuple[list[float], bytes]:
        counts = [float(c) for c in self.backend.spike_counts(reply.collect_start_s, reply.collect_end_s)]
        if self.config.answer_previous:  # the fault: this window's counts wait for the next stimulation's reply
            counts, self._held_counts = self._held_counts, counts
        return counts, encode_spikes(SpikeCounts(self._stamp(reply.stim_timestamp_us), tuple(counts)))

    def _chatter(self) -> None:
        """The chatty fault: one datagram answering no stimulation, with the last tick's counts."""
        now = self.backend.now_s()
        counts = self.backend.spike_counts(max(0.0, now - 1.0 / self.config.tick_frequency_hz), now)
        datagram = encode_spikes(SpikeCounts(self._stamp(self._last_stim_us), tuple(float(c) for c in counts)))
        try:
            self._reply_sock.sendto(datagram, self._reply_to)
        except OSError as exc:
            self.counters["send_errors"] += 1
            log.debug("could not send an unasked datagram: %s", exc)
            return
        self.counters["unsolicited_sent"] += 1

    def _stamp(self, stim_timestamp_us: int) -> int:
        """A datagram's timestamp: the stimulation's (echo), or the device's own clock."""
        if self.config.reply_stamp == "echo":
            return stim_timestamp_us
        if self.config.reply_stamp == "constant":
            return self._constant_stamp_us
        stamp = now_us()
        step = int(round(self.config.clock_resolution_ms * 1000.0))
        return stamp - stamp % step if step > 0 else stamp

    def _send(self, reply: _PendingReply, counts: list[float], datagram: bytes) -> None:
        try:
            self._reply_sock.sendto(datagram, self._reply_to)
        except OSError as exc:
            self.counters["send_errors"] += 1
            log.warning("could not send spike reply to %s:%d: %s", *self._reply_to, exc)
            return
        self.counters["replies"] += 1
        self.backend.record(
            "spikes",
            {
                "t_s": reply.collect_end_s,
                "timestamp_us": reply.stim_timestamp_us,
                "counts": counts,
                "device_latency_ms": (time.monotonic() - reply.received_monotonic_s) * 1e3,
            },
        )


# --- command line ------------------------------------------------------------------------


def error_complete(data: Any) -> bool:
    """Whether a `training_complete` event's data says the trainer stopped on an error (its reason "error...")."""
    return isinstance(data, dict) and str(data.get("reason", "")).startswith("error")


def build_parser() -> argparse.ArgumentParser:
    """The `spikeloop device` argument parser."""
    p = argparse.ArgumentParser(
        prog="spikeloop device",
        description="Device-side program for CL1 wire protocol v1: takes stimulation, feedback and event "
        "datagrams, answers each stimulation with spike counts per channel group.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    DEVICE_BACKEND.add_flag(p)
    p.add_argument(
        "--training-host",
        default="127.0.0.1",
        help="host that receives the spike replies; by default the only host whose datagrams are acted on",
    )
    p.add_argument(
        "--accept-from",
        choices=("host", "spike-port", "any"),
        default="host",
        help="whose stimulation, feedback and events are acted on: host = datagrams from the training "
        "host's address; spike-port = only from its spike port (a spikeloop bridge sends from there; "
        "other processes on that host are refused too); any = from anywhere (opens the device to "
        "every host that can reach it). Others are counted as foreign and skipped",
    )
    p.add_argument(
        "--bind-host",
        default="127.0.0.1",
        help="address the device binds its stimulation, event and feedback ports on (0.0.0.0: all)",
    )
    p.add_argument(
        "--stim-port",
        type=int,
        default=channels.STIM_PORT,
        help="UDP port for stimulation commands (device binds; 0 = any free port)",
    )
    p.add_argument(
        "--spike-port",
        type=int,
        default=channels.SPIKE_PORT,
        help="UDP port on the training host that receives spike counts",
    )
    p.add_argument(
        "--event-port",
        type=int,
        default=channels.EVENT_PORT,
        help="UDP port for event metadata (device binds; 0 = any free port)",
    )
    p.add_argument(
        "--feedback-port",
        type=int,
        default=channels.FEEDBACK_PORT,
        help="UDP port for feedback commands (device binds; 0 = any free port)",
    )
    TICK_FREQUENCY_HZ.add_flag(p, "pulses of a burst = frequency / tick rate, at least one", dest="tick_frequency")
    STIM_MODE.add_flag(p, "sim and cl backends (feedback bursts are interrupted too with reference)")
    ARTIFACT_WAIT_MS.add_flag(p)
    COLLECT_WINDOW_MS.add_flag(p)
    p.add_argument(
        "--recording-path",
        type=Path,
        default=None,
        help="directory for the recording (cl: HDF5 with data streams; others: JSONL of "
        "stim/spikes/feedback plus a .events.jsonl beside it); default: no recording",
    )
    SEED.add_flag(p)
    RANDOM_SPIKE_RATE_HZ.add_flag(p)
    pace = p.add_mutually_exclusive_group()
    pace.add_argument(
        "--realtime",
        dest="realtime",
        action="store_true",
        default=DEVICE_REALTIME.default,
        help=DEVICE_REALTIME.help("sim, transparent, random, zero; replies wait for the windows"),
    )
    pace.add_argument(
        "--as-fast-as-possible",
        dest="realtime",
        action="store_false",
        help="sim, transparent, random, zero: simulate the windows at once and reply as soon as computed",
    )
    p.add_argument(
        "--culture",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="sim: set one knob of the simulated culture (repeatable; VALUE is YAML: 0.5, true, [19, 20]); "
        "e.g. --culture plasticity=dopamine_stdp; --culture-help lists every knob",
    )
    p.add_argument(
        "--culture-file",
        type=Path,
        default=None,
        help="sim: a YAML (or JSON) mapping of culture knobs; --culture pairs override its values",
    )
    p.add_argument(
        "--culture-help", action=_CultureHelp, help="list the culture knobs (default, range, meaning) and exit"
    )
    CULTURE_SEED.add_flag(p, "--culture knobs are kept as given", metavar="N")
    CULTURE_STATE.add_flag(p, "it must agree with --culture-seed and --culture knobs given", metavar="PATH")
    FEEDBACK_SETTLE_MS.add_flag(p, "sim, random, zero and transparent only", metavar="MS")
    FEEDBACK_SETTLE_MAX_HOLD_MS.add_flag(p, metavar="MS")
    p.add_argument(
        "--cl-sim-culture",
        action="store_true",
        help="cl backend under the cl-sdk simulator only: the simulator's data comes from the "
        "simulated culture (seeded by --seed) instead of cl-sdk's random source",
    )
    third = p.add_argument_group(
        "third-party device behaviour (rehearsal and tests)",
        "behave like a protocol-v1 device program that is not spikeloop's, e.g. the reference trainer's: the "
        "bridge must work with such devices unchanged",
    )
    third.add_argument(
        "--tick-quantised",
        action="store_true",
        help="run a fixed-rate hardware loop at --tick-frequency: at most one datagram per port per "
        "tick, a stimulation taken while a reply is pending discards that reply, and replies leave on "
        "the first tick after the windows (counted in whole ticks from the tick that took the "
        "stimulation in); needs real time",
    )
    third.add_argument(
        "--own-clock",
        action="store_true",
        help="stamp replies with the device's wall clock instead of echoing the stimulation's timestamp",
    )
    third.add_argument(
        "--clock-resolution-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="with --own-clock: the clock moves in steps of MS milliseconds (e.g. 16: a coarse clock)",
    )
    third.add_argument(
        "--constant-clock",
        action="store_true",
        help="stamp every reply with the same time (a clock that never moves); implies --own-clock",
    )
    third.add_argument(
        "--reply-from",
        choices=("stim-port", "ephemeral"),
        default="stim-port",
        help="send replies from the stimulation port, or from a socket of their own on a free port",
    )
    faults = p.add_argument_group(
        "protocol faults (to show that spikeloop check and training catch them; never for a real run)",
        "break the rule every protocol-v1 device must keep: one reply per stimulation, carrying the spikes "
        "counted in the windows after that stimulation, and nothing unasked",
    )
    faults.add_argument(
        "--answer-previous",
        action="store_true",
        help="answer each stimulation with the counts evoked by the stimulation before it (the first with "
        "zeros), on time and with the right stamp: a device that applies a stimulation only after the tick it "
        "reports. `spikeloop check` fails it: its counts follow the previous stimulation",
    )
    faults.add_argument(
        "--chatty",
        action="store_true",
        help="besides the replies, send one spike datagram per tick (--tick-frequency) whether a stimulation "
        "asked for it or not, with the last tick's counts (stamped with the newest stimulation's timestamp, or "
        "the device clock with --own-clock); needs real time. `spikeloop check` fails it: unsolicited datagrams",
    )
    envelope = p.add_argument_group(
        "device safety envelope",
        "the device's own limits, checked on every stimulation and feedback command "
        "whatever the trainer's envelope says; a command outside them is refused (counted, logged; a refused "
        "stimulation is still answered, without stimulating)",
    )
    for f in dataclasses.fields(SafetyEnvelope):
        if f.name in ENVELOPE_FLAGS:
            envelope.add_argument(
                f"--{f.name.replace('_', '-')}",
                type=int if f.name == "max_pulses" else float,
                default=f.default,
                help=ENVELOPE_FLAGS[f.name],
            )
    envelope.add_argument(
        "--forbid-electrode",
        dest="forbid_electrodes",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="never stimulate electrode N, in addition to the hardware-forbidden "
        f"{sorted(channels.FORBIDDEN_ELECTRODES)} (repeatable)",
    )
    dose = p.add_argument_group(
        "stimulation dose budget",
        "per electrode, the charge in one phase polarity (nC) the device may deliver; a stimulation or feedback "
        "command that would take any electrode past a limit is refused whole (counted as dose_refused_*, logged; "
        "a refused stimulation is still answered, without stimulating). The per-minute budget is on by default",
    )
    DOSE_BUDGET_NC_PER_MIN.add_flag(dose, metavar="NC")
    MAX_PULSE_RATE_HZ.add_flag(dose, "refused or started up to one period late, counted as rate_*", metavar="HZ")
    dose.add_argument(
        "--dose-budget-nc-per-session",
        type=float,
        default=None,
        metavar="NC",
        help="most charge per electrode since the device program started",
    )
    p.add_argument(
        "--exit-on-error-complete",
        action="store_true",
        help="exit on a training_complete whose reason says the trainer stopped on an error (a lost device, a "
        "failed trial, an interrupted run); by default the device records it and stays up, so that "
        "`spikeloop train EXP --resume` can continue the run",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging verbosity"
    )
    return p


class _CultureHelp(argparse.Action):
    """`--culture-help`: print the knob table (from SimulatedCultureConfig) and exit."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(knob_table())
        parser.exit()


def culture_from_args(pairs: list[str], path: Path | None) -> SimulatedCultureConfig | None:
    """The culture knobs of `--culture-file` and `--culture KNOB=VALUE` (None: neither given)."""
    return _culture_config(culture_values(pairs, path))


def _culture_config(values: dict[str, Any] | None) -> SimulatedCultureConfig | None:
    try:
        return None if values is None else SimulatedCultureConfig.from_mapping(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--culture: {exc}") from None


def culture_values(pairs: list[str], path: Path | None) -> dict[str, Any] | None:
    """The culture knobs `--culture-file` and `--culture KNOB=VALUE` set, unchecked (None: neither given)."""
    if not pairs and path is None:
        return None
    # Imported only here: a device program that sets no culture knob runs without PyYAML (as in cl-sdk's venv).
    import yaml  # type: ignore[import-untyped]  # no stubs in the test extras; only this parses YAML in bridge/

    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"--culture-file {path}: cannot be read as YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--culture-file {path}: must hold a mapping of culture knobs (--culture-help lists them)")
        values |= loaded
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--culture {pair!r}: write KNOB=VALUE, e.g. --culture plasticity=dopamine_stdp")
        try:
            values[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"--culture {pair!r}: the value is not YAML: {exc}") from None
    return values


ENVELOPE_FLAGS = {
    "min_frequency_hz": "lowest stimulation or feedback frequency (Hz; 0 on the wire means off)",
    "max_frequency_hz": "highest stimulation or feedback frequency (Hz)",
    "min_amplitude_ua": "lowest amplitude (uA; 0 on the wire means off)",
    "max_amplitude_ua": "highest amplitude (uA)",
    "max_pulses": "most pulses in one feedback burst or one stimulation burst",
    "max_charge_per_phase_nc": "charge limit per phase (nC): amplitude x phase width",
}
"""The SafetyEnvelope fields `spikeloop device` sets from flags (defaults: SafetyEnvelope's own)."""


ADDRESS_FLAGS = {
    "host": "--bind-host",
    "bind_host": "--training-host",
    "stim_port": "--stim-port",
    "spike_port": "--spike-port",
    "event_port": "--event-port",
    "feedback_port": "--feedback-port",
}
"""The flag that sets each DeviceAddress field, read from the device's end."""


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    """DeviceConfig from parsed command-line flags (ValueError names a flag combination that cannot work)."""
    try:
        envelope = SafetyEnvelope(
            **{name: getattr(args, name) for name in ENVELOPE_FLAGS},
            forbidden_electrodes=channels.FORBIDDEN_ELECTRODES | set(args.forbid_electrodes),
        )
    except ValueError as exc:
        field_name = str(exc).partition("=")[0]
        flag = f"--{field_name.replace('_', '-')}" if field_name in ENVELOPE_FLAGS else "device safety envelope"
        raise ValueError(f"{flag}: {exc}") from None
    try:
        DOSE_BUDGET_NC_PER_MIN.require(args.dose_budget_nc_per_min, "device dose_budget_nc_per_min")
    except ValueError as exc:
        raise ValueError(f"{DOSE_BUDGET_NC_PER_MIN.flag}: {exc}") from None
    try:
        dose_budget = DoseBudget(args.dose_budget_nc_per_min, args.dose_budget_nc_per_session)
    except ValueError as exc:
        field_name, _, rest = str(exc).partition("=")
        raise ValueError(f"--dose-budget-{field_name.replace('_', '-')} {rest}") from None
    try:  # the device's end of the address: it listens on --bind-host and replies to --training-host
        address = DeviceAddress(
            host=args.bind_host,
            bind_host=args.training_host,
            stim_port=args.stim_port,
            spike_port=args.spike_port,
            event_port=args.event_port,
            feedback_port=args.feedback_port,
        )
    except ValueError as exc:
        field_name, _, rest = str(exc).partition("=")
        raise ValueError(f"{ADDRESS_FLAGS.get(field_name, field_name)} {rest}") from None
    culture_set = culture_values(args.culture, args.culture_file)
    culture = _culture_config(culture_set)
    if args.culture_seed is not None and args.seed != SEED.default:
        raise ValueError(
            f"--seed {args.seed} with --culture-seed {args.culture_seed}: the culture seed names the whole culture, "
            "its wiring too (one dish); drop --seed"
        )
    try:
        return _device_config(args, address, envelope, dose_budget, culture, frozenset(culture_set or ()))
    except ValueError as exc:  # a declared setting's check names its field: say which flag sets it
        field_name = str(exc).removeprefix("device ").partition("=")[0]
        setting_flag = SETTING_FLAGS.get(field_name)
        raise ValueError(f"{setting_flag}: {exc}" if setting_flag else str(exc)) from None


SETTING_FLAGS = {s.name: s.flag for s in SETTINGS if s.flag}
"""The flag that sets each declared setting of the device program (bridge/wire/settings.py)."""


def _device_config(
    args: argparse.Namespace,
    address: DeviceAddress,
    envelope: SafetyEnvelope,
    dose_budget: DoseBudget,
    culture: SimulatedCultureConfig | None,
    culture_fixed: frozenset[str],
) -> DeviceConfig:
    return DeviceConfig(
        address=address,
        tick_frequency_hz=args.tick_frequency,
        artifact_wait_ms=args.artifact_wait_ms,
        collect_window_ms=args.collect_window_ms,
        recording_path=args.recording_path,
        backend=args.backend,
        seed=args.seed,
        random_spike_rate_hz=args.random_spike_rate_hz,
        realtime=args.realtime,
        cl_sim_culture=args.cl_sim_culture,
        envelope=envelope,
        dose_budget=dose_budget,
        max_pulse_rate_hz=args.max_pulse_rate_hz,
        accept_from=args.accept_from.replace("-", "_"),
        tick_quantised=args.tick_quantised,
        reply_stamp="constant" if args.constant_clock else "own" if args.own_clock else "echo",
        clock_resolution_ms=args.clock_resolution_ms,
        reply_from=args.reply_from.replace("-", "_"),
        answer_previous=args.answer_previous,
        chatty=args.chatty,
        culture=culture,
        culture_seed=args.culture_seed,
        culture_fixed=culture_fixed,
        culture_state=args.culture_state,
        feedback_settle_ms=args.feedback_settle_ms,
        feedback_settle_max_hold_ms=args.feedback_settle_max_hold_ms,
        stim_mode=args.stim_mode,
        exit_on_error_complete=args.exit_on_error_complete,
    )


def main(argv: list[str]) -> int:
    """Run the device until training_complete, SIGTERM or Ctrl-C; print the counters at exit."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"spikeloop device: {exc}", file=sys.stderr)
        return 2
    try:
        device = Device(config)
    except ValueError as exc:  # the backend refuses what only it can check (a saved culture's file, its knobs)
        print(f"spikeloop device: {exc}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, lambda *_: device.stop("SIGTERM"))
    try:
        device.serve_forever()
    except KeyboardInterrupt:
        device.stop("SIGINT")
    finally:
        device.close()  # idempotent; closes the recording if the loop was interrupted
        signal.signal(signal.SIGTERM, previous)
    summary: dict[str, Any] = {
        "exit_reason": device.exit_reason or "loop ended",
        **device.counters,
        "dose": device.final_dose,
        "recording_files": [str(p) for p in device.recording_files()],
    }
    print(json.dumps({"spikeloop_device": summary}), file=sys.stderr)
    return 0
