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
trainer sends them). Malformed datagrams are logged, counted and skipped.
`training_complete` ends the run with exit status 0; SIGINT and SIGTERM end it
too, always closing the recording cleanly.

In-process use (tests, one simulated device per env runner):

    device = Device(DeviceConfig(stim_port=0, event_port=0, feedback_port=0, spike_port=my_port))
    thread = device.start()          # serve_forever in a background thread
    ... device.stim_port ...         # the ports actually bound
    device.stop(); thread.join()
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge import channels
from bridge.backends import BACKEND_NAMES, Backend, make_backend
from bridge.protocol import (
    DEVICE_RECV_BYTES,
    ProtocolError,
    SpikeCounts,
    decode_event,
    decode_feedback,
    decode_stim,
    encode_spikes,
)

log = logging.getLogger("spikeloop.device")

SPIN_MARGIN_S = 0.0015
"""Sleep until this long before a reply is due, then spin: OS sleeps overshoot by up to ~1 ms."""
IDLE_POLL_S = 0.02
"""Longest block in select, so stop() and a real-time culture's catch-up stay timely."""
LOGGED_MALFORMED_PER_KIND = 10
"""Log the first few malformed datagrams of a kind in full, then every 1000th."""


@dataclass(frozen=True)
class DeviceConfig:
    """Settings of one device; port 0 binds a free port (see `Device.*_port`)."""

    training_host: str = "127.0.0.1"
    bind_host: str = "127.0.0.1"
    stim_port: int = channels.STIM_PORT
    spike_port: int = channels.SPIKE_PORT
    event_port: int = channels.EVENT_PORT
    feedback_port: int = channels.FEEDBACK_PORT
    tick_frequency_hz: float = channels.TICK_FREQUENCY_HZ
    artifact_wait_ms: float = channels.ARTIFACT_WAIT_MS
    collect_window_ms: float = channels.COLLECT_WINDOW_MS
    recording_path: Path | None = None
    backend: str = "sim"
    seed: int = 0
    random_spike_rate_hz: float = 5.0
    realtime: bool = True
    cl_sim_culture: bool = False


@dataclass
class _PendingReply:
    stim_timestamp_us: int
    collect_start_s: float
    collect_end_s: float
    received_monotonic_s: float


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
        )
        self.counters: collections.Counter[str] = collections.Counter()
        self.exit_reason = ""
        self._stop = threading.Event()
        self._pending: collections.deque[_PendingReply] = collections.deque()
        self._reply_to = (config.training_host, config.spike_port)
        self._stim_sock = self._bind(config.stim_port)
        self._feedback_sock = self._bind(config.feedback_port)
        self._event_sock = self._bind(config.event_port)
        # Feedback before stimulation before events: the order a trainer sends them in.
        self._socks = [self._feedback_sock, self._stim_sock, self._event_sock]
        self._handlers = {
            self._feedback_sock: self._on_feedback,
            self._stim_sock: self._on_stim,
            self._event_sock: self._on_event,
        }
        self._closed = False

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # Bursts of datagrams must not be dropped while the device spins for a deadline.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((self.config.bind_host, port))
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
        self._reply_to = (self.config.training_host, int(port))

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
            log.info("device up: backend=%s stim=%d feedback=%d event=%d -> replies to %s:%d",
                     self.backend.name, self.stim_port, self.feedback_port, self.event_port, *self._reply_to)
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
            self.backend.close()
        finally:
            for sock in self._socks:
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

    def _wait_s(self) -> float:
        if not self._pending:
            return IDLE_POLL_S
        if not self.backend.paced:
            return 0.0
        until_due = self._pending[0].collect_end_s - self.backend.now_s() - SPIN_MARGIN_S
        return min(IDLE_POLL_S, max(0.0, until_due))

    def _drain(self, sock: socket.socket) -> None:
        handler = self._handlers[sock]
        while not self._stop.is_set():
            try:
                data = sock.recv(DEVICE_RECV_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. ICMP port unreachable surfacing on some platforms
                self.counters["socket_errors"] += 1
                log.debug("recv error: %s", exc)
                return
            try:
                handler(data)
            except ProtocolError as exc:
                self._malformed(handler.__name__.removeprefix("_on_"), data, exc)

    def _malformed(self, kind: str, data: bytes, exc: ProtocolError) -> None:
        key = f"malformed_{kind}"
        self.counters[key] += 1
        n = self.counters[key]
        if n <= LOGGED_MALFORMED_PER_KIND or n % 1000 == 0:
            log.warning("skipped malformed %s datagram #%d (%d bytes): %s", kind, n, len(data), exc)

    # --- handlers ----------------------------------------------------------------------

    def _on_stim(self, data: bytes) -> None:
        received = time.monotonic()  # the windows start when the command is taken in, before decoding it
        at_s = self.backend.now_s()
        cmd = decode_stim(data)
        self.counters["stim"] += 1
        self.backend.advance_to(at_s)
        self.backend.stimulate(at_s, cmd.frequencies_hz, cmd.amplitudes_ua)
        start_s = at_s + self.config.artifact_wait_ms / 1000.0
        end_s = start_s + self.config.collect_window_ms / 1000.0
        self._pending.append(_PendingReply(cmd.timestamp_us, start_s, end_s, received))
        self.backend.record("stim", {"t_s": at_s, "timestamp_us": cmd.timestamp_us,
                                     "frequencies_hz": list(cmd.frequencies_hz),
                                     "amplitudes_ua": list(cmd.amplitudes_ua)})
        if not self.backend.paced:
            self._send_due_replies()  # simulated time: answer before the next command moves the clock

    def _on_feedback(self, data: bytes) -> None:
        cmd = decode_feedback(data)
        self.counters["feedback"] += 1
        at_s = self.backend.now_s()
        self.backend.advance_to(at_s)
        self.backend.feedback(at_s, cmd)
        self.backend.record("feedback", {"t_s": at_s, "timestamp_us": cmd.timestamp_us,
                                         "type": cmd.feedback_type.name.lower(), "channels": list(cmd.channels),
                                         "frequency_hz": cmd.frequency_hz, "amplitude_ua": cmd.amplitude_ua,
                                         "pulses": cmd.pulses, "unpredictable": cmd.unpredictable,
                                         "event_name": cmd.event_name})

    def _on_event(self, data: bytes) -> None:
        event = decode_event(data)
        self.counters["event"] += 1
        self.counters[f"event_{event.event_type}"] += 1
        if event.event_type == "training_complete":
            log.info("training_complete: %s", event.data)
            self.backend.record_event(event)
            self.stop("training_complete")
            return
        self.backend.record_event(event)

    # --- replies -----------------------------------------------------------------------

    def _send_due_replies(self) -> None:
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
        return counts, encode_spikes(SpikeCounts(reply.stim_timestamp_us, tuple(counts)))

    def _send(self, reply: _PendingReply, counts: list[float], datagram: bytes) -> None:
        try:
            self._stim_sock.sendto(datagram, self._reply_to)
        except OSError as exc:
            self.counters["send_errors"] += 1
            log.warning("could not send spike reply to %s:%d: %s", *self._reply_to, exc)
            return
        self.counters["replies"] += 1
        self.backend.record("spikes", {"t_s": reply.collect_end_s, "timestamp_us": reply.stim_timestamp_us,
                                       "counts": counts,
                                       "device_latency_ms": (time.monotonic() - reply.received_monotonic_s) * 1e3})


# --- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The `spikeloop device` argument parser."""
    p = argparse.ArgumentParser(
        prog="spikeloop device",
        description="Device-side program for CL1 wire protocol v1: takes stimulation, feedback and event "
        "datagrams, answers each stimulation with spike counts per channel group.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--backend", choices=BACKEND_NAMES, default="sim",
                   help="sim: simulated culture; cl: Cortical Labs cl API (CL1 or cl-sdk); "
                   "random: Poisson counts; zero: all-zero counts")
    p.add_argument("--training-host", default="127.0.0.1", help="host that receives the spike replies")
    p.add_argument("--bind-host", default="127.0.0.1",
                   help="address the device binds its stimulation, event and feedback ports on (0.0.0.0: all)")
    p.add_argument("--stim-port", type=int, default=channels.STIM_PORT,
                   help="UDP port for stimulation commands (device binds; 0 = any free port)")
    p.add_argument("--spike-port", type=int, default=channels.SPIKE_PORT,
                   help="UDP port on the training host that receives spike counts")
    p.add_argument("--event-port", type=int, default=channels.EVENT_PORT,
                   help="UDP port for event metadata (device binds; 0 = any free port)")
    p.add_argument("--feedback-port", type=int, default=channels.FEEDBACK_PORT,
                   help="UDP port for feedback commands (device binds; 0 = any free port)")
    p.add_argument("--tick-frequency", type=float, default=channels.TICK_FREQUENCY_HZ,
                   help="hardware tick rate in Hz; a stimulation command's burst lasts one tick "
                   "(pulses = frequency / tick rate, at least one)")
    p.add_argument("--artifact-wait-ms", type=float, default=channels.ARTIFACT_WAIT_MS,
                   help="milliseconds skipped after a stimulation before counting spikes")
    p.add_argument("--collect-window-ms", type=float, default=channels.COLLECT_WINDOW_MS,
                   help="milliseconds of spikes counted after the artifact wait; the reply leaves at its end")
    p.add_argument("--recording-path", type=Path, default=None,
                   help="directory for the recording (cl: HDF5 with data streams; others: JSONL of "
                   "stim/spikes/feedback plus a .events.jsonl beside it); default: no recording")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated culture or the random counts")
    p.add_argument("--random-spike-rate-hz", type=float, default=5.0,
                   help="random backend: Poisson rate per recorded electrode")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--realtime", dest="realtime", action="store_true", default=True,
                      help="sim: culture time follows the wall clock, replies wait for the windows")
    pace.add_argument("--as-fast-as-possible", dest="realtime", action="store_false",
                      help="sim: simulate the windows at once and reply as soon as computed")
    p.add_argument("--cl-sim-culture", action="store_true",
                   help="cl backend under the cl-sdk simulator only: the simulator's data comes from the "
                   "simulated culture (seeded by --seed) instead of cl-sdk's random source")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="logging verbosity")
    return p


def config_from_args(args: argparse.Namespace) -> DeviceConfig:
    """DeviceConfig from parsed command-line flags."""
    return DeviceConfig(
        training_host=args.training_host, bind_host=args.bind_host, stim_port=args.stim_port,
        spike_port=args.spike_port, event_port=args.event_port, feedback_port=args.feedback_port,
        tick_frequency_hz=args.tick_frequency, artifact_wait_ms=args.artifact_wait_ms,
        collect_window_ms=args.collect_window_ms, recording_path=args.recording_path, backend=args.backend,
        seed=args.seed, random_spike_rate_hz=args.random_spike_rate_hz, realtime=args.realtime,
        cl_sim_culture=args.cl_sim_culture,
    )


def main(argv: list[str]) -> int:
    """Run the device until training_complete, SIGTERM or Ctrl-C; print the counters at exit."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    if config.tick_frequency_hz <= 0 or config.artifact_wait_ms < 0 or config.collect_window_ms < 0:
        print("spikeloop device: tick frequency must be > 0 and windows >= 0 ms", file=sys.stderr)
        return 2
    device = Device(config)
    previous = signal.signal(signal.SIGTERM, lambda *_: device.stop("SIGTERM"))
    try:
        device.serve_forever()
    except KeyboardInterrupt:
        device.stop("SIGINT")
    finally:
        device.close()  # idempotent; closes the recording if the loop was interrupted
        signal.signal(signal.SIGTERM, previous)
    summary: dict[str, Any] = {"exit_reason": device.exit_reason or "loop ended", **device.counters,
                               "recording_files": [str(p) for p in device.recording_files()]}
    print(json.dumps({"spikeloop_device": summary}), file=sys.stderr)
    return 0


