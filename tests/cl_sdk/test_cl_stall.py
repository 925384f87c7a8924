"""A device program whose cl loop falls behind cl-sdk's frame buffer goes on instead of dying.

cl keeps about 5 s of frames; a process stalled for longer (a loaded machine, a long pause) cannot read the
frames it missed, and `neurons.loop` raises. The backend logs the gap and goes on from the present.
"""

from __future__ import annotations

import time

from spikeloop.bridge.device.backends.cl import ClBackend

STALL_S = 10.0
"""Well beyond cl-sdk's buffer (131,072 frames at 25 kHz: 5.2 s): its clock lags the wall clock on a loaded
machine, and 6 s of sleep once stayed within the buffer there (no stall, with a sweep and the suite on 2 cores)."""


def _run_ticks(ticks, seconds: float) -> int:
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        next(ticks)
        count += 1
    return count


def test_a_stall_longer_than_the_frame_buffer_is_survived_and_counted() -> None:
    backend = ClBackend(tick_frequency_hz=10.0)
    backend.open(None)
    try:
        ticks = backend.ticks()
        assert _run_ticks(ticks, 0.3) > 0
        time.sleep(STALL_S)  # the loop is not read: it falls behind the buffer
        assert _run_ticks(ticks, 0.5) > 0  # went on instead of raising
        assert backend.stalls == 1
        assert _run_ticks(ticks, 0.3) > 0 and backend.stalls == 1  # and keeps up again
    finally:
        backend.close()
