"""The session record: everything one env runner sent to and got from its culture, in one HDF5 file.

Each env runner that drives a culture writes `record/runner<k>-<start time>-<pid>.h5` in its trial directory
(docs/session-record.md has the layout): every stimulation, spike reply, feedback command, event, env step
(action, reward) and episode end, in columns of resizable chunked datasets, one group per table.

Crash safety: rows are kept in memory and written in one burst every `flush_s` (a timer thread) and at close.
A burst writes the rows, flushes the file, then rewrites the one `committed_rows` attribute (every table's
count, committed together) and flushes again, so a reader that takes the committed rows gets only rows that
were fully on disk. A `kill -9` loses
at most the rows of the last `flush_s`; the file itself was made whole (its tables empty) under another name
and renamed into place, so it opens from its first moment. The writer takes no file lock, so the record can be
read while the run goes on (`read_record`); a read that meets a flush half-way may fail and can be repeated.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ENCODING, N_SPIKE_GROUPS, SPIKE_GROUPS
from spikeloop.bridge.wire.protocol import MAX_FEEDBACK_CHANNELS

RECORD_DIR = "record"
"""The trial directory's folder of session records (one file per env runner process)."""
FORMAT = "spikeloop-session-record"
FORMAT_VERSION = 1
COMMITTED = "committed_rows"
"""File attribute: the rows fully on disk of each table, in the order of the `tables` attribute (int64 array).
One attribute for all tables, rewritten in place, so that they are committed together. Rows past it (a crash
during a flush) are to be ignored."""
DEFAULT_FLUSH_S = 2.0

_STR = "str"  # variable-length UTF-8 text

# table -> column -> (dtype, per-row shape, unit, what it holds). The one description of the layout: the writer
# builds the file from it and docs/session-record.md documents it (tests/test_session_record.py checks both).
TABLES: dict[str, dict[str, tuple[str, tuple[int, ...], str, str]]] = {
    "stim": {
        "wall_time_s": ("f8", (), "s", "Unix time the stimulation was handed to the bridge"),
        "stim_timestamp_us": ("u8", (), "us", "the command's timestamp on the wire (its id; the reply names it)"),
        "frequency_hz": ("f4", (N_ENCODING,), "Hz", "per encoding electrode, as the safety envelope lets it out"),
        "amplitude_ua": ("f4", (N_ENCODING,), "uA", "per encoding electrode, as the safety envelope lets it out"),
        "pulses": ("u2", (N_ENCODING,), "pulses", "per encoding electrode, as the device's stim_mode makes them"),
        "clamped": ("u2", (), "values", "values the safety envelope had to fix"),
    },
    "spikes": {
        "wall_time_s": ("f8", (), "s", "Unix time the reply (or the timeout) was taken"),
        "stim_timestamp_us": ("u8", (), "us", "the stimulation this reply answers (stim/stim_timestamp_us)"),
        "reply_timestamp_us": ("u8", (), "us", "the reply datagram's own timestamp (0: no reply)"),
        "counts": ("f4", (N_SPIKE_GROUPS,), "spikes", "spike count per group (zeros on a timeout)"),
        "ok": ("u1", (), "", "1: the device answered in time, 0: timeout"),
        "latency_ms": ("f4", (), "ms", "from sending the stimulation to taking the reply"),
    },
    "feedback": {
        "wall_time_s": ("f8", (), "s", "Unix time the command was handed to the bridge"),
        "timestamp_us": ("u8", (), "us", "the command's timestamp on the wire"),
        "kind": ("u1", (), "", "0 interrupt, 1 event, 2 reward (the wire's feedback type)"),
        "name": (_STR, (), "", "feedback name: reward_positive, an event, episode_negative, ..."),
        "channels": ("i2", (MAX_FEEDBACK_CHANNELS,), "electrode", "electrodes, padded with -1"),
        "frequency_hz": ("f4", (), "Hz", "as the safety envelope lets it out (0 for an interrupt)"),
        "amplitude_ua": ("f4", (), "uA", "as the safety envelope lets it out (0 for an interrupt)"),
        "pulses": ("u4", (), "pulses", "as the safety envelope lets it out"),
        "unpredictable": ("u1", (), "", "1: the device randomises its timing"),
        "sent": ("u1", (), "", "1: left for the device; 0: refused by the envelope (nothing left to send)"),
    },
    "events": {
        "wall_time_s": ("f8", (), "s", "Unix time the event was handed to the bridge"),
        "type": (_STR, (), "", "episode_end, training_complete, ..."),
        "data_json": (_STR, (), "", "the event's data as JSON"),
    },
    "steps": {
        "wall_time_s": ("f8", (), "s", "Unix time the env step ended"),
        "step": ("u8", (), "steps", "this env runner's step count (1 = its first step)"),
        "episode_step": ("u4", (), "steps", "steps since the episode began (1 = its first)"),
        "action": ("i8", (), "", "the action index the decoder chose"),
        "reward": ("f4", (), "", "the reward the env gave for it"),
        "stim_rows": ("u8", (), "rows", "rows of stim written so far: this step's stimulations end there"),
    },
    "episodes": {
        "wall_time_s": ("f8", (), "s", "Unix time the episode ended"),
        "episode": ("u8", (), "", "the trial's episode number (as in episodes.jsonl and the episode_end event)"),
        "last_step": ("u8", (), "steps", "steps/step of the episode's last step"),
        "length": ("u4", (), "steps", "env steps in the episode"),
        "return": ("f8", (), "", "sum of the episode's rewards"),
        "kills": ("u4", (), "", "monsters killed"),
        "terminated": ("u1", (), "", "1: the game ended it, 0: cut off (truncated)"),
    },
}


@dataclass(frozen=True)
class RecordSettings:
    """Where env runners write their session records and how often they flush (`output.record`)."""

    trial_dir: str
    flush_s: float = DEFAULT_FLUSH_S
    experiment_yaml: str = ""
    """The trial's resolved experiment, stored as the `experiment_yaml` attribute."""


class RecordError(ValueError):
    """A file that is not a readable session record."""


def _dtype(code: str) -> Any:
    import h5py

    return h5py.string_dtype("utf-8") if code == _STR else np.dtype(code)


def _attr(value: Any) -> Any:
    """An attribute value h5py stores: numbers and text as they are, anything else as JSON."""
    if isinstance(value, str | int | float | bool | np.number):
        return value
    return json.dumps(value, default=str)


def record_path(trial_dir: Path, runner_index: int) -> Path:
    """A new record file for env runner `runner_index` (one per process: a restarted runner starts another)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(trial_dir) / RECORD_DIR / f"runner{runner_index}-{stamp}-{os.getpid()}.h5"


class SessionRecord:
    """One env runner's append-only HDF5 record, flushed every `flush_s` and at close."""

    def __init__(self, path: Path, attrs: Mapping[str, Any], flush_s: float = DEFAULT_FLUSH_S) -> None:
        import h5py

        if not flush_s > 0:
            raise ValueError(f"flush_s={flush_s}: give a positive number of seconds")
        self.path = Path(path)
        self.flush_s = float(flush_s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(self.path.name + ".part")
        with h5py.File(staging, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["created_wall_time_s"] = time.time()
            f.attrs["flush_s"] = self.flush_s
            f.attrs["encoding_electrodes"] = np.asarray(ENCODING_ELECTRODES, dtype="i2")
            f.attrs["spike_groups_json"] = json.dumps({k: list(v) for k, v in SPIKE_GROUPS.items()})
            for key, value in attrs.items():
                f.attrs[key] = _attr(value)
            f.attrs["tables"] = list(TABLES)
            f.attrs[COMMITTED] = np.zeros(len(TABLES), dtype=np.int64)
            for table, columns in TABLES.items():
                group = f.create_group(table)
                for name, (code, shape, unit, doc) in columns.items():
                    ds = group.create_dataset(
                        name,
                        shape=(0, *shape),
                        maxshape=(None, *shape),
                        dtype=_dtype(code),
                        chunks=(max(16, 4096 // max(1, int(np.prod(shape)))), *shape),
                    )
                    ds.attrs["unit"] = unit
                    ds.attrs["description"] = doc
        os.replace(staging, self.path)  # the file appears whole, its tables empty
        self._file = h5py.File(self.path, "r+", locking=False)  # readable while it is written
        self._rows: dict[str, list[tuple]] = {table: [] for table in TABLES}
        self._written = dict.fromkeys(TABLES, 0)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._timer = threading.Thread(target=self._flush_loop, name="session-record-flush", daemon=True)
        self._timer.start()

    # --- rows ----------------------------------------------------------------------

    def append(self, table: str, **row: Any) -> None:
        """Queue one row of `table` (every column given); it reaches the file at the next flush."""
        columns = TABLES[table]
        if row.keys() != columns.keys():
            missing, extra = columns.keys() - row.keys(), row.keys() - columns.keys()
            raise ValueError(f"{table} row: missing {sorted(missing)}, unknown {sorted(extra)}")
        with self._lock:
            if self._closed.is_set():
                return
            self._rows[table].append(tuple(row[name] for name in columns))

    def rows(self, table: str) -> int:
        """Rows of `table` so far (written or queued)."""
        with self._lock:
            return self._written[table] + len(self._rows[table])

    # --- writing -------------------------------------------------------------------

    def flush(self) -> None:
        """Write the queued rows, then mark them committed; both reach the OS before this returns."""
        with self._lock:
            if self._file is None or not self._file.id.valid:
                return
            pending = {table: rows for table, rows in self._rows.items() if rows}
            if not pending:
                return
            self._rows = {table: [] for table in TABLES}
            for table, rows in pending.items():
                group = self._file[table]
                start = self._written[table]
                end = start + len(rows)
                for i, (name, (code, shape, _, _)) in enumerate(TABLES[table].items()):
                    values = [row[i] for row in rows]
                    data = np.asarray(values, dtype=object if code == _STR else code).reshape(len(rows), *shape)
                    ds = group[name]
                    ds.resize(end, axis=0)
                    ds[start:end] = data
                self._written[table] = end
            self._file.flush()  # the rows first ...
            self._file.attrs[COMMITTED] = np.array([self._written[t] for t in TABLES], dtype=np.int64)
            self._file.flush()  # ... then the counts that make them visible

    def _flush_loop(self) -> None:
        while not self._closed.wait(self.flush_s):
            try:
                self.flush()
            except Exception:  # a full disk must not end the run; the next flush (or close) tries again
                import logging

                logging.getLogger(__name__).exception("session record %s: flush failed", self.path)

    def close(self) -> None:
        """Flush what is queued and close the file (idempotent)."""
        if self._closed.is_set():
            return
        self.flush()
        with self._lock:
            self._closed.set()
            self._file.attrs["closed_wall_time_s"] = time.time()
            self._file.close()
        self._timer.join(timeout=5)


# --- reading -----------------------------------------------------------------------


def find_records(run_dir: Path) -> list[Path]:
    """The session records of a trial directory, or of every trial in a run directory, in path order."""
    run_dir = Path(run_dir)
    found = [*run_dir.glob(f"{RECORD_DIR}/*.h5"), *run_dir.glob(f"*/{RECORD_DIR}/*.h5")]
    return sorted(p for p in found if p.is_file())


def read_record(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """A record's attributes and its committed rows, table by table; RecordError for a file that is not one."""
    import h5py

    try:
        f = h5py.File(path, "r", locking=False)  # the writer holds no lock either
    except OSError as exc:
        raise RecordError(
            f"{path}: not a readable HDF5 file ({exc}); it may be damaged or still being created"
        ) from None
    with f:
        if f.attrs.get("format") != FORMAT:
            raise RecordError(f"{path}: an HDF5 file, but not a spikeloop session record (no format={FORMAT!r})")
        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
        tables: dict[str, dict[str, np.ndarray]] = {}
        try:
            committed = dict(zip(TABLES, (int(n) for n in f.attrs[COMMITTED]), strict=True))
            for table, columns in TABLES.items():
                group = f[table]
                n = committed[table]
                tables[table] = {}
                for name, (code, _, _, _) in columns.items():
                    data = group[name][:n]
                    if code == _STR:
                        data = np.asarray([s.decode() if isinstance(s, bytes) else s for s in data], dtype=object)
                    tables[table][name] = data
        except (KeyError, OSError, ValueError) as exc:
            raise RecordError(f"{path}: a session record with a missing or damaged table ({exc})") from None
    return attrs, tables


def record_discards(tables: dict[str, dict[str, np.ndarray]]) -> list[tuple[float, int]]:
    """(wall time, episodes_from) of each `discarded` event a record's env runner sent (docs/protocol.md)."""
    events = tables["events"]
    return [
        (float(wall), int(json.loads(str(data))["episodes_from"]))
        for wall, kind, data in zip(events["wall_time_s"], events["type"], events["data_json"])
        if str(kind) == "discarded"
    ]


def discarded_episodes(episodes: dict[str, np.ndarray], discards: list[tuple[float, int]]) -> np.ndarray:
    """Which episode rows a trial threw away: ended before a `discarded` event, numbered from its episodes_from on.

    `discards`: of all the trial's records (the event is in the record of the run that started again).
    """
    numbers, walls = episodes["episode"].astype(np.int64), episodes["wall_time_s"].astype(np.float64)
    dropped = np.zeros(len(numbers), dtype=bool)
    for wall, first in discards:
        dropped |= (numbers >= first) & (walls < wall)
    return dropped
