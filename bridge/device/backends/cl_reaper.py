"""Ends the cl-sdk simulator's worker processes when the process that opened the simulator dies, however it dies.

cl-sdk runs its data producer (and its recording writer and visualisation server) as
processes of their own, each in a new session, and they stop only when the process
that opened the simulator tells them to: when it leaves the simulator
(`ClBackend.close`) or, at the latest, from its exit hook. A process killed by a
signal it does not handle (SIGKILL, an out-of-memory kill, a test's timeout), or
ending through `os._exit`, tells them nothing: they run on with PPID 1, the data
producer generating 64 channels at 25 kHz forever, most of a core each.

`SimulatorReaper` starts a small watcher process (this file, run by path, stdlib
only) and hands it the workers' process ids. The watcher waits for the end of its
stdin, which comes when the opener closes the pipe or dies, and then ends every
worker still alive (SIGTERM, then SIGKILL after `GRACE_S`). A worker is recognised
by its parent (the opener) and its command line (cl-sdk's worker entry point, `CL_SDK_WORKER`)
and checked again by its start time before a signal, so a recycled process id is never hit.
Linux only (/proc); elsewhere nothing is watched and only a clean close stops the workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CL_SDK_WORKER = "cl._sim._subprocess_main"
"""The module cl-sdk starts each of its simulator workers with."""
GRACE_S = 3.0
"""How long a worker may take to end after SIGTERM before it gets SIGKILL."""
PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 onwards), or None if the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: gone, or a zombie)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def cl_sdk_workers(parent_pid: int) -> dict[int, int]:
    """The cl-sdk simulator workers `parent_pid` started, alive now: process id -> start time."""
    workers: dict[int, int] = {}
    if not PROC.is_dir():
        return workers
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is None or int(fields[1]) != parent_pid or fields[0] in ("Z", "X"):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if CL_SDK_WORKER.encode() in argv:
            workers[pid] = int(fields[19])
    return workers


class SimulatorReaper:
    """A watcher process that ends the workers it was handed once this process closes its pipe or dies."""

    def __init__(self) -> None:
        # Its own session: a Ctrl-C or a signal to this process group must not end the watcher first.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._watched: set[int] = set()

    def watch_new_workers(self) -> int:
        """Hand the watcher the cl-sdk workers this process started since the last call; how many there were."""
        assert self._proc.stdin is not None
        new = {pid: t for pid, t in cl_sdk_workers(os.getpid()).items() if pid not in self._watched}
        for pid, started in new.items():
            self._proc.stdin.write(f"{pid} {started}\n".encode())
        self._proc.stdin.flush()
        self._watched |= set(new)
        return len(new)

    @property
    def watched(self) -> frozenset[int]:
        """Process ids handed to the watcher so far."""
        return frozenset(self._watched)

    def close(self) -> None:
        """Close the pipe (the watcher ends whatever worker is still alive) and wait for the watcher."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=GRACE_S + 5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _end(workers: dict[int, int]) -> None:
    """SIGTERM every worker still alive (the same process: same start time), then SIGKILL what outlives GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        alive = [pid for pid, started in workers.items() if start_time(pid) == started]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if start_time(pid) == workers[pid]]
        if not alive:
            return


def main() -> None:
    """The watcher: read "PID START_TIME" lines until the end of stdin, then end those workers."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    workers: dict[int, int] = {}
    for line in sys.stdin.buffer:
        pid, started = line.split()
        workers[int(pid)] = int(started)
    _end(workers)


if __name__ == "__main__":
    main()
