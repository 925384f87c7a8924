"""Find a test's own processes by process group, so cleanup never touches anyone else's Ray."""

from __future__ import annotations

import os
import signal
import time
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
