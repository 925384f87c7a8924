"""A trainer's sockets on loopback and `spikeloop device` as its own process, for tests of the device's limits."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    EventMessage,
    StimCommand,
    decode_event,
    decode_spikes,
    encode_event,
    encode_stim,
)

ROOT = Path(__file__).resolve().parents[2]
TICK_HZ = 10.0  # the device's --tick-frequency below


class Client:
    """A trainer's sockets on loopback: sends to the device's ports from the port its replies come to."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(5.0)
        self.ports = {"stim": free_port(), "event": free_port(), "feedback": free_port()}

    @property
    def spike_port(self) -> int:
        return self.sock.getsockname()[1]

    def stim(self, ts: int, freqs: tuple[float, ...], amps: tuple[float, ...]) -> None:
        """One stimulation; its reply must come (a refused one is answered too) and echo the stamp."""
        self.sock.sendto(encode_stim(StimCommand(ts, freqs, amps)), ("127.0.0.1", self.ports["stim"]))
        reply = decode_spikes(self.sock.recv(4096))
        assert reply.timestamp_us == ts

    def status(self) -> dict:
        """Ask for the device's status and return its data."""
        request = encode_event(EventMessage(1, "status_request", {}))
        self.sock.sendto(request, ("127.0.0.1", self.ports["event"]))
        status = decode_event(self.sock.recv(4096))
        assert status.event_type == "device_status"
        return status.data


def start_device(client: Client, *flags: str, realtime: bool = False) -> subprocess.Popen:
    """`spikeloop device` as its own process, replying to the client; returns once it answers."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spikeloop.experiments.cli",
            "device",
            "--backend",
            "zero",
            "--realtime" if realtime else "--as-fast-as-possible",
            "--tick-frequency",
            str(TICK_HZ),
            "--artifact-wait-ms",
            "1",
            "--collect-window-ms",
            "1",
            "--stim-port",
            str(client.ports["stim"]),
            "--event-port",
            str(client.ports["event"]),
            "--feedback-port",
            str(client.ports["feedback"]),
            "--spike-port",
            str(client.spike_port),
            *flags,
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=os.environ.copy(),
    )
    client.sock.settimeout(0.2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # an all-off stimulation delivers no charge: a safe "are you up?"
        client.sock.sendto(encode_stim(StimCommand(1, (0.0,) * 8, (0.0,) * 8)), ("127.0.0.1", client.ports["stim"]))
        try:
            decode_spikes(client.sock.recv(4096))
            break
        except TimeoutError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    client.sock.settimeout(5.0)
    time.sleep(0.1)
    while True:  # replies to the repeated probes may still be on their way
        client.sock.settimeout(0.1)
        try:
            client.sock.recv(4096)
        except TimeoutError:
            break
    client.sock.settimeout(5.0)
    return proc


def stop_device(proc: subprocess.Popen) -> dict:
    """SIGTERM; the counters the device prints at exit."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return json.loads(err.strip().splitlines()[-1])["spikeloop_device"]
