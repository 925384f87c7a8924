"""A protocol-v1 test device on loopback that can misbehave on purpose.

It answers each stimulation at once with counts that *encode the stimulation*
(count i = frequency i, as float32), so a caller can check that a reply answers
its own stimulation without trusting timestamps. It can be told to drop, delay,
duplicate or corrupt a reply, or to send a forged one from a foreign address
first, and it keeps every feedback and event datagram it receives so tests can
inspect what actually left the bridge. Used by the bridge tests, the invariant
test and `spikeloop bench bridge`; not a culture.

It can also behave like a third-party protocol-v1 device: stamp replies with a
clock of its own (`clock`: any function, so coarse, constant or backward clocks
too), answer on hardware ticks (`tick_s`: a reply leaves one tick after the
tick boundary that follows the stimulation's arrival, faults' delays added),
and reply from a socket of its own (`reply_from_own_socket`).

It knows the truth: `answered` (and, with `record`, a JSON-lines file) holds,
for every stimulation it took in, the stimulation's stamp, the stamp of its
reply and the fault injected, so a test can check which stimulation each reply
the bridge took really answered. The datagrams stay protocol v1, byte for byte.
Run as its own process (`python -m spikeloop.bridge.device.loopback_device --help`) it injects
faults at given rates (`FaultPlan`) and keeps a clock of its own, offset and
drifting, coarse (`--clock-resolution-ms`) or constant (`--constant-clock`).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Literal

from spikeloop.bridge.wire.protocol import (
    STIM_SIZE,
    SpikeCounts,
    StimCommand,
    decode_stim,
    encode_spikes,
    encode_stim,
    now_us,
)

Fault = Literal["drop", "delay", "duplicate", "corrupt", "foreign", "stale"]
FAULTS: tuple[Fault, ...] = ("drop", "delay", "duplicate", "corrupt", "foreign")
"""The faults a plain v1 device can show too. "stale" (a reply stamped a second early, from the device,
just before the right one: what a trainer restart against a real-time device sees) is asked for by name."""
STALE_BY_US = 1_000_000
FOREIGN_HOST = "127.0.0.2"  # another loopback address: a different sender, same machine


def counts_for(frequencies_hz: tuple[float, ...]) -> tuple[float, ...]:
    """The counts this device answers a stimulation with: its frequencies."""
    return tuple(frequencies_hz)


@dataclass
class LoopbackDevice:
    """Answers stimulations on loopback; see the module docstring."""

    trainer_host: str = "127.0.0.1"
    spike_port: int = 0
    echo_timestamps: bool = True
    fault_for: Callable[[int], Fault | None] = lambda i: None
    delay_s: float = 0.1
    delay_for: Callable[[int], float] | None = None
    """Per-reply delay of a "delay" fault (default: delay_s for every one)."""
    clock: Callable[[], int] | None = None
    """Stamps replies with this clock instead of echoing (overrides echo_timestamps)."""
    tick_s: float = 0.0
    """> 0: replies leave on ticks of this period (one tick after the tick that follows the arrival)."""
    reply_from_own_socket: bool = False
    stim_port: int = 0
    feedback_port: int = 0
    event_port: int = 0
    received_stims: list[bytes] = field(default_factory=list)
    received_feedback: list[bytes] = field(default_factory=list)
    received_events: list[bytes] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*FAULTS, "stale"), 0))
    answered: list[tuple[int, int, str | None]] = field(default_factory=list)
    """The truth: (stimulation stamp, reply stamp, fault) for every stimulation taken in, in order."""
    record: str | None = None
    """A JSON-lines file that gets each `answered` entry as it happens (for a device in its own process)."""

    def __post_init__(self) -> None:
        self._socks = {}
        for kind in ("stim", "feedback", "event"):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", getattr(self, f"{kind}_port")))
            sock.settimeout(0.05)
            setattr(self, f"{kind}_port", sock.getsockname()[1])
            self._socks[kind] = sock
        self._reply = self._socks["stim"]  # replies leave from the stimulation port, as `spikeloop device`'s do
        if self.reply_from_own_socket:  # ... or from a socket of their own, as a third-party device's may
            self._reply = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._reply.bind(("127.0.0.1", 0))
        self._reply_port = self._reply.getsockname()[1]
        self._queue: list[tuple[float, int, bytes, socket.socket]] = []  # (send at, order, datagram, socket)
        self._queue_ready = threading.Condition()
        self._order = 0
        self._foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._foreign.bind((FOREIGN_HOST, 0))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._n = 0
        self._record: IO[str] | None = open(self.record, "a", encoding="utf-8") if self.record else None  # noqa: SIM115

    @property
    def reply_port(self) -> int:
        """The port replies leave from."""
        return self._reply_port

    def start(self) -> LoopbackDevice:
        """Serve in background threads."""
        for kind in self._socks:
            t = threading.Thread(target=self._serve, args=(kind,), daemon=True, name=f"loopback-{kind}")
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._send_scheduled, daemon=True, name="loopback-sender")
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop serving and close the sockets."""
        self._stop.set()
        with self._queue_ready:
            self._queue_ready.notify_all()
        for t in self._threads:
            t.join(timeout=1)
        for sock in {*self._socks.values(), self._foreign, self._reply}:
            sock.close()
        if self._record is not None:
            self._record.close()
            self._record = None

    def __enter__(self) -> LoopbackDevice:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, kind: str) -> None:
        sock = self._socks[kind]
        while not self._stop.is_set():
            try:
                data, _ = sock.recvfrom(4096)
            except (TimeoutError, OSError):
                continue
            if kind == "feedback":
                self.received_feedback.append(data)
            elif kind == "event":
                self.received_events.append(data)
            else:
                self.received_stims.append(data)
                self._answer(data)

    def _answer(self, data: bytes) -> None:
        if len(data) != STIM_SIZE:
            return
        arrived = time.monotonic()
        stim = decode_stim(data)
        ts = self.clock() if self.clock is not None else stim.timestamp_us if self.echo_timestamps else now_us()
        good = encode_spikes(SpikeCounts(ts, counts_for(stim.frequencies_hz)))
        fault = self.fault_for(self._n)
        delay = self.delay_for(self._n) if self.delay_for is not None else self.delay_s
        self._n += 1
        dest = (self.trainer_host, self.spike_port)
        if fault is not None:
            self.injected[fault] += 1
        self.answered.append((stim.timestamp_us, ts, fault))
        if self._record is not None:
            line = {"stim_us": stim.timestamp_us, "reply_us": ts, "fault": fault, "delay_s": delay}
            self._record.write(json.dumps(line) + "\n")
            self._record.flush()
        if fault == "drop":
            return
        send_at = None  # now
        if self.tick_s > 0:  # read on the next tick boundary, answered on the tick after it
            send_at = math.ceil(arrived / self.tick_s) * self.tick_s + self.tick_s
        if fault == "delay":
            if send_at is None:
                threading.Timer(delay, self._reply.sendto, args=(good, dest)).start()
            else:
                self._emit(self._reply, good, send_at + delay)
            return
        if fault == "corrupt":
            self._emit(self._reply, good[:-3], send_at)  # truncated: must be counted malformed
        if fault == "stale":
            self._emit(self._reply, encode_spikes(SpikeCounts(max(0, ts - STALE_BY_US), (55.0,) * 8)), send_at)
        if fault == "foreign":
            # Right timestamp, wrong counts: accepting it would be caught by the caller.
            self._emit(self._foreign, encode_spikes(SpikeCounts(ts, (99.0,) * 8)), send_at)
        self._emit(self._reply, good, send_at)
        if fault == "duplicate":
            self._emit(self._reply, good, send_at)

    def _emit(self, sock: socket.socket, datagram: bytes, at: float | None) -> None:
        """Send now (`at` None), or at monotonic time `at`."""
        if at is None:
            sock.sendto(datagram, (self.trainer_host, self.spike_port))
        else:
            self._schedule(at, datagram, sock)

    def _schedule(self, at: float, datagram: bytes, sock: socket.socket | None = None) -> None:
        with self._queue_ready:
            heapq.heappush(self._queue, (at, self._order, datagram, sock or self._reply))
            self._order += 1
            self._queue_ready.notify()

    def _send_scheduled(self) -> None:
        """Send tick-quantised and delayed replies when their time comes."""
        dest = (self.trainer_host, self.spike_port)
        while not self._stop.is_set():
            with self._queue_ready:
                if not self._queue:
                    self._queue_ready.wait(0.05)
                    continue
                at, _, datagram, sock = self._queue[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._queue_ready.wait(min(wait, 0.05))
                    continue
                heapq.heappop(self._queue)
            try:
                sock.sendto(datagram, dest)
            except OSError:
                pass  # stopped meanwhile


def raw_round_trip(device: tuple[str, int], reply_sock: socket.socket, frequencies_hz: tuple[float, ...]) -> float:
    """One stimulation and its reply over bare sockets; returns seconds (the benchmark's baseline)."""
    payload = encode_stim(StimCommand(now_us(), frequencies_hz, (1.0,) * 8))
    t0 = time.perf_counter()
    reply_sock.sendto(payload, device)
    reply_sock.recvfrom(4096)
    return time.perf_counter() - t0


PLAN_FAULTS = ("drop", "late", "very_late", "duplicate", "corrupt", "foreign")
"""What a `FaultPlan` injects: "late" and "very_late" are "delay" faults with delays from their own ranges."""


@dataclass
class FaultPlan:
    """Faults drawn at random, at most one per stimulation, at the given rates (for a device in its own process)."""

    rates: dict[str, float]
    late_s: tuple[float, float] = (0.55, 0.95)
    """Delays of "late" replies: by default past the bridge's default timeout (0.5 s), within its horizon (1 s)."""
    very_late_s: tuple[float, float] = (1.05, 3.0)
    """Delays of "very_late" replies: by default past the bridge's default horizon."""
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(PLAN_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault {sorted(unknown)}: use {', '.join(PLAN_FAULTS)}")
        if any(not 0 <= p <= 1 for p in self.rates.values()) or sum(self.rates.values()) > 1:
            raise ValueError(f"fault rates {self.rates}: each in 0-1, together at most 1")
        for name in ("late_s", "very_late_s"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name}={lo},{hi}: give LO,HI seconds with 0 <= LO <= HI")
        self._rng = random.Random(self.seed)
        self._drawn: tuple[int, Fault | None, float] = (-1, None, 0.0)

    def _draw(self, i: int) -> tuple[Fault | None, float]:
        if self._drawn[0] != i:  # the device asks for stimulation i's fault, then its delay
            u, kind = self._rng.random(), None
            for name in PLAN_FAULTS:
                u -= self.rates.get(name, 0.0)
                if u < 0:
                    kind = name
                    break
            delay = 0.0
            if kind in ("late", "very_late"):
                delay = self._rng.uniform(*(self.late_s if kind == "late" else self.very_late_s))
            fault: Fault | None = "delay" if kind in ("late", "very_late") else kind  # type: ignore[assignment]
            self._drawn = (i, fault, delay)
        return self._drawn[1], self._drawn[2]

    def fault_for(self, i: int) -> Fault | None:
        """Stimulation i's fault (None: answered as it should be)."""
        return self._draw(i)[0]

    def delay_for(self, i: int) -> float:
        """Stimulation i's delay, if its fault is one."""
        return self._draw(i)[1]


def drifting_clock(offset_s: float, drift_ppm: float) -> Callable[[], int]:
    """A device clock `offset_s` away from ours, running `drift_ppm` fast (microseconds since the epoch)."""
    start_us = now_us()
    offset_us = round(offset_s * 1e6)
    return lambda: max(0, start_us + offset_us + round((now_us() - start_us) * (1 + drift_ppm * 1e-6)))


def coarse(clock: Callable[[], int], resolution_ms: float) -> Callable[[], int]:
    """`clock` read in steps of `resolution_ms` (0: as it is), as a device clock with a coarse tick reads."""
    step_us = round(resolution_ms * 1000)
    return clock if step_us <= 0 else lambda: clock() // step_us * step_us


def _pair(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LO,HI seconds, e.g. 0.1,0.2") from None
    return lo, hi


def _rate(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give KIND=RATE, e.g. drop=0.03") from None


def main(argv: list[str] | None = None) -> int:
    """Run a loopback device until interrupted (benchmarks; tests that need a device process of its own)."""
    parser = argparse.ArgumentParser(prog="python -m spikeloop.bridge.device.loopback_device", description=__doc__)
    parser.add_argument("--spike-port", type=int, required=True, help="trainer port that receives replies")
    parser.add_argument("--stim-port", type=int, default=0, help="port to listen on for stimulation (0: free)")
    # Fixed ports let a device restarted after a crash come back where the trainer expects it.
    parser.add_argument("--feedback-port", type=int, default=0, help="port to listen on for feedback (0: free)")
    parser.add_argument("--event-port", type=int, default=0, help="port to listen on for events (0: free)")
    parser.add_argument("--own-clock", action="store_true", help="stamp replies with the device clock, not the echo")
    parser.add_argument("--tick-s", type=float, default=0.0, help="> 0: answer on ticks of this period")
    parser.add_argument("--clock-offset-s", type=float, default=0.0, help="own clock: seconds ahead of ours")
    parser.add_argument("--clock-drift-ppm", type=float, default=0.0, help="own clock: how much faster it runs")
    parser.add_argument(
        "--clock-resolution-ms", type=float, default=0.0, help="own clock: moves in steps of this many ms (0: 1 us)"
    )
    parser.add_argument("--constant-clock", action="store_true", help="stamp every reply the same (implies own clock)")
    parser.add_argument(
        "--fault", type=_rate, action="append", default=[], help=f"KIND=RATE, KIND one of {', '.join(PLAN_FAULTS)}"
    )
    parser.add_argument("--late-s", type=_pair, default=(0.55, 0.95), help="delays of late replies: LO,HI seconds")
    parser.add_argument("--very-late-s", type=_pair, default=(1.05, 3.0), help="delays of very late replies")
    parser.add_argument("--seed", type=int, default=0, help="seed of the faults")
    parser.add_argument("--record", default=None, help="JSON-lines file: the truth, one line per stimulation")
    args = parser.parse_args(argv)
    try:
        plan = FaultPlan(dict(args.fault), args.late_s, args.very_late_s, args.seed) if args.fault else None
    except ValueError as exc:
        parser.error(str(exc))
    if not (math.isfinite(args.clock_resolution_ms) and args.clock_resolution_ms >= 0):
        parser.error(f"--clock-resolution-ms {args.clock_resolution_ms}: give a number of milliseconds >= 0")
    own_clock = (
        args.own_clock
        or args.constant_clock
        or args.clock_offset_s != 0
        or args.clock_drift_ppm != 0
        or args.clock_resolution_ms > 0
    )
    clock = None
    if args.constant_clock:
        constant_us = now_us() + round(args.clock_offset_s * 1e6)
        clock = lambda: constant_us  # noqa: E731
    elif own_clock:
        clock = coarse(drifting_clock(args.clock_offset_s, args.clock_drift_ppm), args.clock_resolution_ms)
    device = LoopbackDevice(
        spike_port=args.spike_port,
        stim_port=args.stim_port,
        feedback_port=args.feedback_port,
        event_port=args.event_port,
        echo_timestamps=not own_clock,
        clock=clock,
        fault_for=plan.fault_for if plan else lambda i: None,
        delay_for=plan.delay_for if plan else None,
        record=args.record,
        tick_s=args.tick_s,
    )
    # A SIGTERM (what a program stopping this one sends) closes it as Ctrl-C does, its record complete.
    signal.signal(signal.SIGTERM, _stop_as_ctrl_c)
    device.start()
    print(
        f"stim_port={device.stim_port} feedback_port={device.feedback_port} event_port={device.event_port}", flush=True
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        device.stop()
    return 0


def _stop_as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
