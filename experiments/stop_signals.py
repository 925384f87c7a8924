"""How a SIGTERM stops a spikeloop program: as Ctrl-C does, so every `finally` runs and every child is stopped.

A scheduler's stop, `kill`, or a script that ends a background run sends SIGTERM, whose default ends the process
at once: no `finally`, no Tune checkpoint, and any device program or trainer it started in a session of its own
left running. Here a SIGTERM runs whatever handles Ctrl-C at that moment (Tune's handler during a fit) or raises
KeyboardInterrupt where nothing does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """Run whatever handles Ctrl-C now (Tune's handler during a fit, else Python's KeyboardInterrupt)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        # SIGINT ignored: a program started in the background by a script (`nohup spikeloop ... &`) inherits that,
        # and a SIGINT sent to itself would be lost with it. A SIGTERM is still a request to stop.
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, a SIGTERM ends the program as Ctrl-C does (the main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
