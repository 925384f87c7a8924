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
"""

from __future__ import annotations

import argparse
import heapq
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from bridge.protocol import STIM_SIZE, SpikeCounts, StimCommand, decode_stim, encode_spikes, encode_stim, now_us

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
        if fault == "drop":
            return
        if self.tick_s > 0:  # read on the next tick boundary, answered on the tick after it
            read_at = math.ceil(arrived / self.tick_s) * self.tick_s
            self._schedule(read_at + self.tick_s + (delay if fault == "delay" else 0.0), good)
            return
        if fault == "delay":
            threading.Timer(delay, self._reply.sendto, args=(good, dest)).start()
            return
        if fault == "corrupt":
            self._reply.sendto(good[:-3], dest)  # truncated: must be counted malformed
        if fault == "stale":
            self._reply.sendto(encode_spikes(SpikeCounts(max(0, ts - STALE_BY_US), (55.0,) * 8)), dest)
        if fault == "foreign":
            # Right timestamp, wrong counts: accepting it would be caught by the caller.
            forged = encode_spikes(SpikeCounts(ts, (99.0,) * 8))
            self._foreign.sendto(forged, dest)
        self._reply.sendto(good, dest)
        if fault == "duplicate":
            self._reply.sendto(good, dest)

    def _schedule(self, at: float, datagram: bytes) -> None:
        with self._queue_ready:
            heapq.heappush(self._queue, (at, self._order, datagram, self._reply))
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


def main(argv: list[str] | None = None) -> int:
    """Run a fault-free loopback device until interrupted (for benchmarks)."""
    parser = argparse.ArgumentParser(prog="python -m bridge.loopback_device", description=__doc__)
    parser.add_argument("--spike-port", type=int, required=True, help="trainer port that receives replies")
    parser.add_argument("--stim-port", type=int, default=0, help="port to listen on for stimulation (0: free)")
    parser.add_argument("--own-clock", action="store_true", help="stamp replies with the device clock, not the echo")
    args = parser.parse_args(argv)
    device = LoopbackDevice(spike_port=args.spike_port, stim_port=args.stim_port, echo_timestamps=not args.own_clock)
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


if __name__ == "__main__":
    raise SystemExit(main())
