"""Waiting for an in-process device's reply without waiting on a device that has died.

A device run in a thread (`Device.start`) that raises ends its thread and replies no
more; a test blocked in `recv` would sit out its whole timeout (minutes, where the
first reply waits for cl-sdk to start). `recv_reply` fails within a second instead.
"""

from __future__ import annotations

import socket
import threading
import time

from spikeloop.bridge.wire.protocol import SpikeCounts, decode_spikes


def recv_reply(rx: socket.socket, device_thread: threading.Thread, timeout_s: float) -> SpikeCounts:
    """The next spike-count reply on `rx` within `timeout_s`; AssertionError as soon as the device thread ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        rx.settimeout(min(1.0, max(0.01, deadline - time.monotonic())))
        try:
            return decode_spikes(rx.recv(64))
        except TimeoutError:
            if not device_thread.is_alive():
                raise AssertionError("the device thread ended without replying (its exception is above)") from None
            if time.monotonic() >= deadline:
                raise
