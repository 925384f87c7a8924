"""A minimal trainer for device tests: sends datagrams to a device on loopback and reads its replies."""

from __future__ import annotations

import socket

import numpy as np

from spikeloop.bridge.wire.protocol import StimCommand, decode_spikes, encode_stim


class LoopbackTrainer:
    """Sends datagrams to a device and reads its replies on a spike port of its own."""

    def __init__(self, timeout_s: float) -> None:
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.settimeout(timeout_s)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    @property
    def spike_port(self) -> int:
        """Where the device must send its replies."""
        return self.rx.getsockname()[1]

    def exchange(self, stim_port: int, ts: int, freqs: tuple[float, ...], amps: tuple[float, ...]) -> np.ndarray:
        """One stimulation and its reply's counts; the reply must echo the stimulation's timestamp."""
        self.tx.sendto(encode_stim(StimCommand(ts, freqs, amps)), ("127.0.0.1", stim_port))
        reply = decode_spikes(self.rx.recv(64))
        assert reply.timestamp_us == ts
        return np.array(reply.counts)

    def close(self) -> None:
        """Close both sockets."""
        self.rx.close()
        self.tx.close()
