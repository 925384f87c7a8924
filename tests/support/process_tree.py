"""Find a test's own processes by process group, so cleanup never touches anyone else's Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgid) of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[2])


def group_and_descendants(pgid: int) -> set[int]:
    """Every process in `pgid` and all their descendants (Ray daemons reparent to init, keeping the group)."""
    table = {pid: st for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()) if (st := proc_stat(pid))}
    found = {pid for pid, (_, group) in table.items() if group == pgid}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    found.discard(os.getpid())
    return found


def sigkill_all(pids: set[int], wait_s: float = 30.0) -> None:
    """SIGKILL every process in `pids` at once (nothing gets to clean up), then wait until all are gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(proc_stat(pid) and not _zombie(pid) for pid in pids):
        time.sleep(0.2)


def sigkill_group_once(
    process: subprocess.Popen, ready: Callable[[], bool], log: Path, timeout_s: float, waiting_for: str
) -> None:
    """Wait until `ready()`, then SIGKILL `process`'s whole group (it, its local Ray, its trials): nothing gets to
    clean up. Fails with the end of `log` if the process ends first or `waiting_for` does not come in time; the
    group is killed whatever happens."""
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert process.poll() is None, f"it ended before it was killed:\n{log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"no {waiting_for} in time:\n{log.read_text()[-6000:]}"
            time.sleep(0.2)
    finally:
        sigkill_all(group_and_descendants(process.pid))
        process.wait(timeout=30)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_processes(pids: set[int], grace_s: float = 5.0) -> None:
    """SIGTERM `pids`, then SIGKILL whichever are still alive after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(proc_stat(pid) for pid in pids):
            time.sleep(0.2)
        pids = {pid for pid in pids if proc_stat(pid)}
        if not pids:
            return
