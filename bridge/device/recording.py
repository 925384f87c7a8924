"""Read back what `spikeloop device --recording-path DIR` recorded (sim, random, zero, transparent backends).

`read_recording(DIR)` joins every recording in the directory (a device program started again starts a new one
beside the old), in the order they were made, and marks what the trainer discarded (its `discarded` event,
spikeloop.bridge.wire.discarded): `stims` are the stimulation entries, `events` the trainer's events, each with
`"discarded": True|False`. The cl backend keeps the same entries and events in its HDF5 recording's
`spikeloop_exchanges` and `spikeloop_events` data streams; `mark_discarded` applies to them alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spikeloop.bridge.wire.discarded import mark_discarded

EVENTS_SUFFIX = ".events.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the line a crash cut short (the recorder flushes whole lines otherwise)
            raise ValueError(f"{path}:{number}: not a JSON line; is this a spikeloop device recording?") from None
    return rows


def read_recording(directory: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(stimulation entries, trainer events) of every recording in `directory`, oldest first, marked."""
    events_files = sorted(directory.glob(f"device-*{EVENTS_SUFFIX}"))  # names start with the UTC time
    if not events_files:
        raise ValueError(f"{directory}: no device recording (device-*{EVENTS_SUFFIX}) in it")
    stims: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for events_file in events_files:
        main = events_file.with_name(events_file.name[: -len(EVENTS_SUFFIX)] + ".jsonl")
        if main.exists():
            stims += [row for row in _lines(main) if row.get("kind") == "stim"]
        events += _lines(events_file)
    return mark_discarded(stims, events)
