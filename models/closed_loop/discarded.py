"""Telling devices what a trial threw away when it starts again (the `discarded` event, spikeloop.bridge.wire.discarded).

After each iteration it logs, the trial notes in its directory (`KEPT_FILE`) the iteration and, per device, the
stamp of the last stimulation that iteration exchanged: what episodes.jsonl holds ends there. A trial that starts
again and finds the note (a resume after a lost device or a stop, Tune's retry after a failure) has each env runner
send its device a `discarded` event before its first stimulation: the stimulations after that stamp, and the
episode numbers from where episodes.jsonl ends, no longer stand. Unpaced simulated trials, which never continue
(runner._restart_if_repeatable), and their in-process devices need no note.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spikeloop.bridge.wire.discarded import DISCARDED_EVENT, discarded_data
from spikeloop.bridge.wire.protocol import now_us
from spikeloop.experiments.trial_files import KEPT_FILE


def last_stimulation() -> tuple[str, int] | None:
    """(device id, stamp of its last stimulation) of this env runner's culture link; None without one."""
    from spikeloop.models.closed_loop.link import current_link

    try:
        link = current_link()
    except RuntimeError:
        return None  # the local env runner, or the direct policy: no culture
    return link.device.device_id, link.last_stim_us


def note_kept(trial_dir: Path, iteration: int, last_stims: dict[str, int]) -> None:
    """Note the iteration just logged and each device's last stimulation in it (atomically: a kill leaves one note)."""
    path = trial_dir / KEPT_FILE
    earlier = read_kept(trial_dir) or {}
    # A device that exchanged nothing this iteration keeps its earlier mark.
    stims = dict(earlier.get("last_stimulation_us", {})) | {k: v for k, v in last_stims.items() if v}
    note = {"iteration": int(iteration), "time_us": now_us(), "last_stimulation_us": stims}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(note) + "\n")
    os.replace(tmp, path)


def read_kept(trial_dir: Path) -> dict[str, Any] | None:
    """The trial's note, or None when it has none (a first start)."""
    path = trial_dir / KEPT_FILE
    if not path.exists():
        return None
    try:
        note = json.loads(path.read_text())
        return {
            "iteration": int(note["iteration"]),
            "time_us": int(note["time_us"]),
            "last_stimulation_us": {str(k): int(v) for k, v in dict(note.get("last_stimulation_us", {})).items()},
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a note of the last kept iteration ({exc}); remove it to resume without telling the "
            "devices what was discarded"
        ) from None


def _tell_runner(kept: dict[str, Any], episodes_from: int, reason: str) -> str | None:
    from spikeloop.models.closed_loop.link import current_link

    try:
        link = current_link()
    except RuntimeError:
        return None
    device_id = link.device.device_id
    # A device the kept iteration never stimulated: everything since that iteration was logged is discarded.
    after = kept["last_stimulation_us"].get(device_id, kept["time_us"])
    data = discarded_data(reason, kept["iteration"], episodes_from, after, now_us())
    link.send_events([(DISCARDED_EVENT, data)])
    return device_id


def tell_discarded(algo, kept: dict[str, Any], episodes_from: int, reason: str = "resume") -> list[str]:
    """Send every env runner's device the `discarded` event; returns the devices told."""
    told = algo.env_runner_group.foreach_env_runner(
        lambda _runner: _tell_runner(kept, episodes_from, reason), local_env_runner=True
    )
    return [device for device in told if device is not None]


def tell_discarded_at_start(algo, trial_dir: Path, first_episode: int, resumed: bool) -> str | None:
    """At a trial's start: tell the devices what was discarded if the trial ran before, else start the note.

    Returns the line to print when devices were told.
    """
    kept = read_kept(trial_dir)
    if kept is None:
        note_kept(trial_dir, algo.iteration, {})
        return None
    told = tell_discarded(algo, kept, first_episode, "resume" if resumed else "restart")
    if not told:
        return None
    return (
        f"told {', '.join(told)}: its recording after iteration {kept['iteration']} is discarded; episodes from "
        f"{first_episode} are numbered again"
    )
