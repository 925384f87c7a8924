"""A session record (models/closed_loop/session_record.py) as an NWB file (pynwb): `spikeloop export nwb RUN_DIR`.

One NWB file per record, written beside it (`record/<name>.nwb`). Times are seconds from the record's
creation (the NWB session start). What goes where (docs/session-record.md, "NWB export"):

* `intervals/stimulation`: one row per stimulation, from sending it to taking the reply, with the reply;
* `acquisition/spike_counts`: the spike count per group at each reply (TimeSeries);
* `processing/culture/feedback`, `processing/culture/events`: each feedback command and each event (tables);
* `trials`: one row per episode (return, length, kills; `discarded` for an episode the trial threw away);
* `processing/behavior`: the action and the reward of each env step (TimeSeries).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.models.closed_loop.session_record import (
    TABLES,
    RecordError,
    discarded_episodes,
    read_record,
    record_discards,
)

SOURCE = "spikeloop export nwb"


def _column(table: str, name: str, data: np.ndarray, rename: str | None = None):
    from hdmf.common import VectorData

    _, _, unit, doc = TABLES[table][name]
    unit_text = f" ({unit})" if unit else ""
    return VectorData(name=rename or name, description=f"{doc}{unit_text}", data=data)


def _time_column(times: np.ndarray, doc: str):
    from hdmf.common import VectorData

    return VectorData(name="time_s", description=f"{doc} (s from session start)", data=times)


def _intervals(name: str, description: str, start: np.ndarray, stop: np.ndarray, columns: list):
    from hdmf.common import VectorData
    from pynwb.epoch import TimeIntervals

    return TimeIntervals(
        name=name,
        description=description,
        columns=[
            VectorData(name="start_time", description="start, s from session start", data=start),
            VectorData(name="stop_time", description="stop, s from session start", data=stop),
            *columns,
        ],
    )


def _text(values: np.ndarray) -> list[str]:
    return [str(v) for v in values]


@dataclass(frozen=True)
class CultureSubject:
    """What NWB asks of a subject, for a culture: species, age (ISO 8601 duration), sex (M, F, U, O)."""

    species: str = "Homo sapiens"
    age: str = "P0D"
    sex: str = "U"

    def describe(self) -> str:
        """Which values were given and which are the defaults."""
        defaults = CultureSubject()
        return ", ".join(
            f"{name} {getattr(self, name)}" + (" (default)" if getattr(self, name) == getattr(defaults, name) else "")
            for name in ("species", "age", "sex")
        )


def record_to_nwb(record_file: Path, nwb_file: Path, subject: CultureSubject = CultureSubject()) -> Path:
    """Write one session record as an NWB file; returns its path. RecordError for a file that is not a record."""
    attrs, tables = read_record(record_file)  # first: a file that is no record is refused before pynwb loads

    from hdmf.common import DynamicTable
    from pynwb import NWBHDF5IO, NWBFile, TimeSeries
    from pynwb.file import Subject

    t0 = float(attrs["created_wall_time_s"])
    device_id = str(attrs.get("device_id", "culture"))
    backend = str(attrs.get("device_backend", "unknown"))
    groups = json.loads(str(attrs.get("spike_group_names", "[]")))

    def rel(values: np.ndarray) -> np.ndarray:
        return np.maximum(np.asarray(values, dtype=np.float64) - t0, 0.0)

    nwb = NWBFile(
        session_description=(
            f"spikeloop closed-loop session: env runner {attrs.get('runner_index')} driving culture {device_id} "
            f"({backend} backend); stimulation, spike replies, feedback, events, actions and rewards"
        ),
        identifier=f"{record_file.parent.parent.name}-{record_file.stem}",
        session_start_time=datetime.fromtimestamp(t0, tz=UTC),
        experiment_description="spikeloop experiment (the resolved YAML is in notes)",
        notes=str(attrs.get("experiment_yaml") or "(no experiment stored)"),
        source_script=SOURCE,
        source_script_file_name="experiments/export_nwb.py",
    )
    culture = (
        "a neural culture on a CL1 multi-electrode array"
        if backend == "cl1"
        else f"a simulated culture (spikeloop's {backend} backend), no living tissue"
    )
    nwb.subject = Subject(
        subject_id=device_id,
        description=f"{culture}; species, age and sex as given to `{SOURCE}` ({subject.describe()})",
        species=subject.species,
        age=subject.age,
        sex=subject.sex,
    )
    nwb.create_device(
        name=device_id,
        description=(
            f"{backend} culture device; stim_mode {attrs.get('stim_mode')}, tick {attrs.get('tick_frequency_hz')} Hz; "
            f"settings: {attrs.get('device_settings_json')}"
        ),
        manufacturer="Cortical Labs (CL1)" if backend == "cl1" else "spikeloop (simulated culture)",
    )

    stim, spikes = tables["stim"], tables["spikes"]
    if len(stim["wall_time_s"]):
        n = min(len(stim["wall_time_s"]), len(spikes["wall_time_s"]))
        start = rel(stim["wall_time_s"][:n])
        stop = np.maximum(rel(spikes["wall_time_s"][:n]), start)
        columns = [_column("stim", c, stim[c][:n]) for c in ("stim_timestamp_us", "frequency_hz", "amplitude_ua")]
        columns += [_column("stim", c, stim[c][:n]) for c in ("pulses", "clamped")]
        columns += [
            _column("spikes", "reply_timestamp_us", spikes["reply_timestamp_us"][:n]),
            _column("spikes", "counts", spikes["counts"][:n], rename="spike_counts"),
            _column("spikes", "ok", spikes["ok"][:n], rename="reply_ok"),
            _column("spikes", "latency_ms", spikes["latency_ms"][:n]),
        ]
        nwb.add_time_intervals(
            _intervals(
                "stimulation",
                "each stimulation command (one column per encoding electrode "
                f"{attrs.get('encoding_electrodes')}), from sending it to taking its reply or timeout",
                start,
                stop,
                columns,
            )
        )
        nwb.add_acquisition(
            TimeSeries(
                name="spike_counts",
                description=f"spike count per electrode group at each reply; groups in order: {', '.join(groups)}",
                data=spikes["counts"],
                unit="spikes",
                timestamps=rel(spikes["wall_time_s"]),
                comments="zeros where the reply timed out (see intervals/stimulation, reply_ok)",
            )
        )
    fb, ev = tables["feedback"], tables["events"]
    if len(fb["wall_time_s"]) or len(ev["wall_time_s"]):
        culture = nwb.create_processing_module(
            name="culture", description="what was sent to the culture besides stimulation"
        )
    if len(fb["wall_time_s"]):
        columns = [_time_column(rel(fb["wall_time_s"]), "when the command was handed to the bridge")]
        columns += [_column("feedback", c, fb[c]) for c in ("timestamp_us", "kind")]
        columns.append(_column("feedback", "name", np.asarray(_text(fb["name"]), dtype=object), rename="feedback_name"))
        columns += [
            _column("feedback", c, fb[c])
            for c in ("channels", "frequency_hz", "amplitude_ua", "pulses", "unpredictable", "sent")
        ]
        culture.add(
            DynamicTable(name="feedback", description="each feedback command handed to the device", columns=columns)
        )
    if len(ev["wall_time_s"]):
        columns = [
            _time_column(rel(ev["wall_time_s"]), "when the event was handed to the bridge"),
            _column("events", "type", np.asarray(_text(ev["type"]), dtype=object), rename="event_type"),
        ]
        columns += _event_data_columns(ev["data_json"])
        culture.add(
            DynamicTable(name="events", description="events sent to the device (episode_end, ...)", columns=columns)
        )
    steps, episodes = tables["steps"], tables["episodes"]
    if len(episodes["wall_time_s"]):
        stop = rel(episodes["wall_time_s"])
        start = _episode_starts(steps, episodes, stop, rel)
        nwb.trials = _intervals(
            "trials",
            "one trial per game episode",
            start,
            stop,
            [_column("episodes", c, episodes[c]) for c in ("episode", "last_step", "length", "return", "kills")]
            + [_column("episodes", "terminated", episodes["terminated"]), _discarded_column(record_file, episodes)],
        )
    if len(steps["wall_time_s"]):
        behavior = nwb.create_processing_module(name="behavior", description="the agent's actions and rewards")
        times = rel(steps["wall_time_s"])
        for name, unit, description in (
            ("action", "n.a.", "the action index the decoder chose at each env step (the env's action set)"),
            ("reward", "a.u.", "the reward of each env step (env.reward_mode of the experiment)"),
        ):
            behavior.add(TimeSeries(name=name, description=description, data=steps[name], unit=unit, timestamps=times))
    nwb_file.parent.mkdir(parents=True, exist_ok=True)
    with NWBHDF5IO(str(nwb_file), "w") as io:
        io.write(nwb)
    return nwb_file


def _discarded_column(record_file: Path, episodes: dict[str, Any]):
    """Which episodes the trial threw away: the `discarded` events of all its records (that of a resumed run)."""
    from hdmf.common import VectorData

    discards = []
    for sibling in sorted(record_file.parent.glob("*.h5")):
        try:
            discards += record_discards(read_record(sibling)[1])
        except RecordError:
            continue  # a sibling that is no record says nothing about this one
    return VectorData(
        name="discarded",
        description=(
            "1: the trial threw this episode away (the iteration it ended in was lost before it was logged; its "
            "number was given again after the resume: the later copy stands; docs/protocol.md, discarded)"
        ),
        data=discarded_episodes(episodes, discards).astype(np.uint8),
    )


def _flat(data: dict[str, Any], prefix: str = "data.") -> dict[str, Any]:
    """An event's data with nested mappings spelled out (`data.episode_actions.success`)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _event_data_columns(data_json: np.ndarray) -> list:
    """One text column per key of the events' data (JSON values; empty where an event has no such key)."""
    from hdmf.common import VectorData

    rows = [_flat(json.loads(str(text) or "{}")) for text in data_json]
    keys = sorted({key for row in rows for key in row})
    return [
        VectorData(
            name=key,
            description=f"the event's {key[len('data.') :]} (JSON value; empty when the event has none)",
            data=np.asarray([json.dumps(row[key]) if key in row else "" for row in rows], dtype=object),
        )
        for key in keys
    ]


def _episode_starts(steps: dict[str, Any], episodes: dict[str, Any], stops: np.ndarray, rel) -> np.ndarray:
    """Each episode's first step's time (its stop when the steps were not recorded)."""
    starts = stops.copy()
    step_times = rel(steps["wall_time_s"])
    index = {int(s): i for i, s in enumerate(steps["step"])}
    for row, (last, length) in enumerate(zip(episodes["last_step"], episodes["length"])):
        first = index.get(int(last) - int(length) + 1)
        if first is not None:
            starts[row] = min(step_times[first], stops[row])
    return starts
