"""The session record's writer (models/closed_loop/session_record.py) and `spikeloop export nwb`'s refusals.

Fast cases for the default suite: rows reach the file on the writer's own timer (read by another process while
the writer still runs), a `kill -9` of a writing process leaves a file that opens and holds every row up to the
last flush, attributes round-trip, the layout is documented, and the export refuses what is not a record with
one clear line. In the long tier: a synthetic record with every table filled is exported and checked by
nwbinspector; the same through `spikeloop train` (a real run, killed or not) is in tests/test_session_record_run.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from spikeloop.models.closed_loop.session_record import (
    COMMITTED,
    FORMAT,
    TABLES,
    SessionRecord,
    find_records,
    read_record,
)
from tests.support.hardware_rig import REPO, spikeloop_export_nwb, user_env

FLUSH_S = 0.3


def stim_row(i: int) -> dict:
    return {
        "wall_time_s": time.time(),
        "stim_timestamp_us": i,
        "frequency_hz": np.full(8, 4.0 + i % 30, dtype=np.float32),
        "amplitude_ua": np.full(8, 1.5, dtype=np.float32),
        "pulses": np.ones(8, dtype=np.uint16),
        "clamped": 0,
    }


def read_elsewhere(path: Path) -> dict:
    """Read a record in another process (as `spikeloop export` or a notebook would): committed rows per table."""
    code = (
        "import json, sys; from spikeloop.models.closed_loop.session_record import read_record; "
        "a, t = read_record(sys.argv[1]); "
        "print(json.dumps({k: len(v['wall_time_s']) for k, v in t.items()} | {'_stamps': t['stim']['stim_timestamp_us'].tolist()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_rows_reach_the_file_on_the_timer_and_can_be_read_while_it_is_written(tmp_path: Path) -> None:
    """No flush called: the timer writes the rows, and another process reads them while the writer stays open."""
    record = SessionRecord(tmp_path / "trial_0" / "record" / "r.h5", {"device_id": "sim-1"}, flush_s=FLUSH_S)
    try:
        for i in range(100):
            record.append("stim", **stim_row(i))
        deadline = time.monotonic() + 60
        seen = read_elsewhere(record.path)
        while seen["stim"] < 100 and time.monotonic() < deadline:
            time.sleep(FLUSH_S)
            seen = read_elsewhere(record.path)
        assert seen["stim"] == 100 and seen["_stamps"] == list(range(100))
        assert seen["spikes"] == 0  # tables nothing was appended to stay empty, and readable
    finally:
        record.close()
    assert find_records(tmp_path / "trial_0") == [record.path]  # a trial directory's records
    assert find_records(tmp_path) == [record.path]  # and a run directory's


def test_attributes_and_rows_round_trip(tmp_path: Path) -> None:
    settings = {"stim_mode": "burst", "tick": 10.0, "nested": {"ports": [1, 2]}}
    record = SessionRecord(
        tmp_path / "r.h5", {"device_id": "cl1-a", "runner_index": 2, "device_settings": settings}, flush_s=60
    )
    record.append("stim", **stim_row(7))
    record.append("events", wall_time_s=1.5, type="episode_end", data_json=json.dumps({"episode": 3}))
    record.append(
        "feedback",
        wall_time_s=2.0,
        timestamp_us=9,
        kind=2,
        name="reward_positive",
        channels=[4, 5, *[-1] * 62],
        frequency_hz=20.0,
        amplitude_ua=1.0,
        pulses=10,
        unpredictable=0,
        sent=1,
    )
    with pytest.raises(ValueError, match="missing .*'reward'"):
        record.append("steps", wall_time_s=1.0, step=1, episode_step=1, action=0, stim_rows=1)
    assert record.rows("stim") == 1
    record.close()  # flushes: the 60 s timer never fired
    record.close()  # closing twice is harmless
    attrs, tables = read_record(record.path)
    assert attrs["format"] == FORMAT and attrs["device_id"] == "cl1-a" and attrs["runner_index"] == 2
    assert json.loads(attrs["device_settings"]) == settings
    assert attrs["closed_wall_time_s"] >= attrs["created_wall_time_s"]
    assert tables["stim"]["stim_timestamp_us"].tolist() == [7]
    assert tables["stim"]["frequency_hz"].shape == (1, 8) and tables["stim"]["frequency_hz"][0, 0] == 11.0
    assert tables["events"]["type"].tolist() == ["episode_end"]
    assert json.loads(tables["events"]["data_json"][0]) == {"episode": 3}
    assert tables["feedback"]["name"].tolist() == ["reward_positive"]
    assert tables["feedback"]["channels"][0, :3].tolist() == [4, 5, -1]
    with h5py.File(record.path, "r") as f:  # plain h5py reads it too; units travel with each column
        assert (
            f["stim/frequency_hz"].attrs["unit"] == "Hz"
            and f.attrs[COMMITTED].tolist()[list(TABLES).index("stim")] == 1
        )


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from spikeloop.models.closed_loop.session_record import SessionRecord
    record = SessionRecord(Path(sys.argv[1]), {"device_id": "sim-1"}, flush_s=float(sys.argv[2]))
    print("open", flush=True)
    i = 0
    while True:
        record.append("stim", wall_time_s=time.time(), stim_timestamp_us=i, frequency_hz=np.full(8, 5.0),
                      amplitude_ua=np.full(8, 1.0), pulses=np.ones(8), clamped=0)
        record.append("spikes", wall_time_s=time.time(), stim_timestamp_us=i, reply_timestamp_us=i, counts=np.ones(8),
                      ok=1, latency_ms=1.0)
        i += 1
        time.sleep(0.001)
    """
)


def test_kill_9_of_a_writer_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    """A writing process is SIGKILLed: its file opens, and holds every row up to within the flush interval."""
    path = tmp_path / "record" / "r.h5"
    for attempt in range(2):  # two kills at different moments of the flush cycle
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(FLUSH_S)],
            cwd=REPO,
            env=user_env(PYTHONPATH=str(REPO)),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        time.sleep(1.0 + 0.37 * attempt)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=30)
        attrs, tables = read_record(path)
        stamps = tables["stim"]["stim_timestamp_us"]
        assert len(stamps) > 0, "nothing was flushed in a second of writing"
        assert stamps.tolist() == list(range(len(stamps)))  # every committed row, in order, none damaged
        replies = tables["spikes"]["stim_timestamp_us"].tolist()  # committed with stim: the same flush
        assert replies == stamps.tolist()[: len(replies)] and len(stamps) - len(replies) <= 1
        assert "closed_wall_time_s" not in attrs  # it really died without closing
        # The last committed row is at most one flush interval (plus the writer's scheduling under load) old.
        lost_s = killed_at - float(tables["stim"]["wall_time_s"][-1])
        assert lost_s < FLUSH_S + 2.0, f"the record lost the last {lost_s:.2f} s"
        path.unlink()


def test_the_layout_is_documented() -> None:
    """docs/session-record.md names every table and column the writer makes, and README links it."""
    doc = (REPO / "docs" / "session-record.md").read_text()
    for table, columns in TABLES.items():
        assert f"`{table}`" in doc, table
        for name in columns:
            assert f"`{table}/{name}`" in doc, f"{table}/{name}"
    assert "docs/session-record.md" in (REPO / "README.md").read_text()


# --- spikeloop export nwb -------------------------------------------------------------


def test_export_refuses_what_is_not_a_run_with_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing directory, a file, no record, a damaged file, an HDF5 file that is no record: one clear line each.

    The damaged file goes through `spikeloop export` as a subprocess (what a user sees: no traceback); the rest
    call the same command's `main` in this process, to keep the default suite short.
    """
    from spikeloop.experiments.commands.export import main as export_main

    broken = tmp_path / "broken" / "trial_0" / "record"
    broken.mkdir(parents=True)
    (broken / "runner1.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)  # a signature and nothing else
    result = spikeloop_export_nwb(str(tmp_path / "broken"))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "runner1.h5: not a readable HDF5 file" in result.stderr and "Traceback" not in result.stderr

    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    foreign = tmp_path / "foreign" / "record"
    foreign.mkdir(parents=True)
    with h5py.File(foreign / "data.h5", "w") as f:
        f["x"] = [1, 2, 3]
    cases = {
        "nope": "no such directory",
        "file.txt": "not a directory",
        "empty": "holds no session record",
        "foreign": "not a spikeloop session record",
    }
    for name, text in cases.items():
        assert export_main(["nwb", str(tmp_path / name)]) == 1, name
        err = capsys.readouterr().err
        assert err.startswith("spikeloop export: ") and text in err and err.count("\n") == 1, (name, err)
    assert not list(tmp_path.rglob("*.nwb"))


@pytest.mark.long  # pynwb and nwbinspector take ~20 s to load on a busy 2-core machine
def test_export_writes_nwb_that_nwbinspector_passes(tmp_path: Path) -> None:
    """A record with every table filled becomes an NWB file with no CRITICAL or BEST_PRACTICE_VIOLATION finding."""
    from nwbinspector import Importance, inspect_nwbfile
    from pynwb import NWBHDF5IO

    rng = np.random.default_rng(0)
    record = SessionRecord(tmp_path / "trial_0" / "record" / "runner1.h5", {"device_id": "sim-1"}, flush_s=60)
    for i in range(120):
        record.append("stim", **stim_row(i))
        record.append(
            "spikes",
            wall_time_s=time.time() + 1e-4,
            stim_timestamp_us=i,
            reply_timestamp_us=i + 100,
            counts=rng.poisson(2, 8),
            ok=int(i % 17 != 0),
            latency_ms=1.0,
        )
        record.append(
            "steps",
            wall_time_s=time.time() + 2e-4,
            step=i + 1,
            episode_step=i % 40 + 1,
            action=int(rng.integers(0, 8)),
            reward=float(rng.normal()),
            stim_rows=i + 1,
        )
        if i % 40 == 39:
            end = {"episode": i // 40 + 1, "episode_actions": {"success": 3, "fail": 1}}
            record.append("events", wall_time_s=time.time(), type="episode_end", data_json=json.dumps(end))
            record.append(
                "episodes",
                wall_time_s=time.time() + 3e-4,
                episode=i // 40 + 1,
                last_step=i + 1,
                length=40,
                kills=1,
                terminated=1,
                **{"return": 2.5},
            )
            for kind, hz in ((0, 0.0), (2, 20.0)):
                record.append(
                    "feedback",
                    wall_time_s=time.time(),
                    timestamp_us=i,
                    kind=kind,
                    name="episode_positive" if kind else "",
                    channels=[4, 5, *[-1] * 62],
                    frequency_hz=hz,
                    amplitude_ua=1.0 * bool(kind),
                    pulses=10 * bool(kind),
                    unpredictable=0,
                    sent=1,
                )
        time.sleep(0.002)
    record.close()
    result = spikeloop_export_nwb(str(tmp_path), "--age", "P30D")
    assert result.returncode == 0, result.stderr
    nwb = record.path.with_suffix(".nwb")
    assert f"wrote {nwb}" in result.stdout
    bad = [
        f"{m.importance.name} {m.check_function_name}: {m.message}"
        for m in inspect_nwbfile(nwbfile_path=str(nwb))
        if m.importance in (Importance.CRITICAL, Importance.BEST_PRACTICE_VIOLATION)
    ]
    assert not bad, bad
    with NWBHDF5IO(str(nwb), "r") as io:
        f = io.read()
        assert len(f.intervals["stimulation"]) == 120 and len(f.trials) == 3
        assert f.acquisition["spike_counts"].data.shape == (120, 8)
        assert f.processing["behavior"]["action"].data.shape == (120,)
        assert len(f.processing["culture"]["feedback"]) == 6 and f.subject.age == "P30D"
