"""Find a test's own processes by process group, so cleanup never touches anyone else's Ray."""

from __future__ import annotations

import os
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
