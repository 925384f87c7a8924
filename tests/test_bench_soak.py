"""`spikeloop bench soak`: its checks on handcrafted records, its refusals, and (long tier) a short soak end to end.

The long case runs the command a user types, `spikeloop bench soak`, as a subprocess: a paced `spikeloop train`
against the loopback device program in its own process, faults injected, the device killed mid-run and started
again on the same ports, the run resumed; the result file must say nothing was lost or misaligned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spikeloop.experiments.benchmarks.soak import (
    episode_numbering,
    measure_tree,
    misaligned_steps,
    read_truth,
    rss_growth,
    slope_per_hour,
)
from spikeloop.experiments.run_log import write_step_log
from tests.support.spikeloop_cli import REPO, cli_env, run_spikeloop


def test_slope_is_per_hour_and_needs_three_points():
    points = [(t, 100.0 + 0.01 * t) for t in (0.0, 30.0, 60.0, 90.0)]  # 0.01 MB/s = 36 MB/h
    assert slope_per_hour(points) == pytest.approx(36.0)
    assert slope_per_hour(points[:2]) is None
    assert slope_per_hour([(5.0, 1.0), (5.0, 2.0), (5.0, 3.0)]) is None  # no spread in time: no slope


def test_rss_growth_is_fitted_per_driver_while_it_trains_after_its_warmup():
    def sample(t: float, driver: int, iteration: int, training_s: float | None, rss: float | None) -> dict:
        tree = None if rss is None else {"rss_mb": rss}
        return {"t_s": t, "driver": driver, "iteration": iteration, "training_s": training_s, "trainer": tree}

    samples = [
        sample(0, 1, 0, None, 50.0),  # Ray starting: left out
        sample(30, 1, 1, 0, 450.0),  # the first iteration's line: warm-up from here, left out
        *(sample(t, 1, 2, t - 30, 500.0) for t in (90, 120, 150)),  # flat
        sample(160, 1, 3, 130, 200.0),  # after the last iteration's line (the device was lost): left out
        sample(200, 1, 3, None, None),  # the outage: no trainer
        sample(230, 2, 3, None, 900.0),  # the resumed driver's start
        *(sample(230 + t, 2, 4, t, 400.0 + t / 36) for t in (60, 90, 120)),  # 100 MB/h
        sample(380, 2, 5, 150, 100.0),  # shutting down after its last iteration: left out
    ]
    growth = rss_growth(samples, warmup_s=60)
    assert [g["driver"] for g in growth] == [1, 2]
    assert growth[0]["samples"] == 3 and growth[0]["rss_mb_per_h"] == pytest.approx(0.0)
    assert growth[1]["samples"] == 3 and growth[1]["rss_mb_per_h"] == pytest.approx(100.0)


def _steps(stims: np.ndarray, counts: np.ndarray, ok: list[int], stamps: list[int]) -> dict:
    return {
        "stim": stims.astype(np.float32),
        "raw_spikes": counts.astype(np.float32),
        "exchange_ok": np.array(ok, dtype=np.float32),
        "stim_timestamp_us": np.array(stamps, dtype=np.uint64),
    }


def test_a_reply_matched_to_the_wrong_stimulation_is_misaligned(tmp_path: Path):
    rng = np.random.default_rng(0)
    stims = np.concatenate([rng.uniform(4, 40, (6, 8)), rng.uniform(1, 2.5, (6, 8))], axis=1)
    counts = stims[:, :8].copy()  # the loopback device's answer: count i = frequency i
    counts[3] = stims[2, :8]  # step 3 took step 2's reply
    counts[4] = 0.0  # step 4 timed out: zeros, not used
    stamps = [1000 + i for i in range(6)]
    truth_file = tmp_path / "truth.jsonl"
    truth_file.write_text(
        "".join(
            json.dumps({"stim_us": s, "reply_us": s, "fault": "drop" if s == 1005 else None, "delay_s": 0.1}) + "\n"
            for s in stamps[:-1] + [1005]
        )
    )
    truth = read_truth(truth_file)
    # Through the file the trainer writes: the step log of one episode, read back as the soak reads it.
    relative = write_step_log(tmp_path, 1, _steps(stims, counts, [1, 1, 1, 1, 0, 1], stamps))
    with np.load(tmp_path / relative) as saved:
        found = misaligned_steps(dict(saved), truth)
    # Step 5's reply encodes its stimulation, but the device's record says it dropped it: used without a reply.
    assert found == {
        "steps": 6,
        "used": 5,
        "timeouts": 1,
        "wrong_counts": 1,
        "unknown_to_device": 0,
        "used_but_dropped": 1,
        "misaligned": 2,
    }
    aligned = misaligned_steps(_steps(stims, stims[:, :8], [1] * 6, [1000 + i for i in range(6)]), {})
    assert aligned["unknown_to_device"] == 6 and aligned["misaligned"] == 6  # the device never saw them


def test_episode_numbering_finds_gaps_and_repeats():
    assert episode_numbering([1, 2, 3]) == {"episodes": 3, "missing": [], "repeated": 0, "in_order": True}
    assert episode_numbering([1, 2, 4, 4]) == {"episodes": 4, "missing": [3], "repeated": 1, "in_order": True}
    assert episode_numbering([2, 1])["in_order"] is False


def test_a_process_tree_is_measured_with_its_children():
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        tree = None
        for _ in range(100):
            tree = measure_tree(parent.pid)
            if tree is not None and tree["processes"] == 2:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert tree is not None and tree["processes"] == 2, tree
        assert tree["rss_mb"] > 1 and tree["open_files"] >= 3, tree
    finally:
        import os
        import signal

        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert measure_tree(parent.pid) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration-s", "10"], "at least 60 seconds"),
        (["--on-device-loss", "continue"], "argument --on-device-loss: invalid choice: 'continue'"),
        (["--fault", "drop=2"], "a rate is between 0 and 1"),
        (["--fault", "melt=0.1"], "KIND must be one of drop, late"),
        (["--fault", "drop=0.6", "--fault", "late=0.6"], "add up to 1.2"),
        (["--train-batch", "4"], "at least 16"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path, args: list[str], message: str):
    out = tmp_path / "soak.json"
    done = run_spikeloop(["bench", "soak", *args, "--output", str(out), "--work-dir", str(tmp_path / "w")], 120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert not out.exists() and not (tmp_path / "w").exists()


def test_a_work_dir_with_an_earlier_soak_is_refused(tmp_path: Path):
    (tmp_path / "w" / "runs" / "cl1-20260101-000000").mkdir(parents=True)
    done = run_spikeloop(
        ["bench", "soak", "--work-dir", str(tmp_path / "w"), "--output", str(tmp_path / "o.json")], 120
    )
    assert done.returncode == 2 and "holds an earlier soak's runs" in done.stderr, done.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.long  # two `spikeloop train` drivers, each with its own Ray start, around a device restart: minutes
@pytest.mark.timeout(1500)
def test_a_short_soak_with_a_device_restart_loses_and_mixes_up_nothing(tmp_path: Path):
    out = tmp_path / "soak.json"
    argv = ["bench", "soak", "--duration-s", "90", "--sample-s", "5", "--warmup-s", "10", "--train-batch", "64"]
    argv += ["--work-dir", str(tmp_path / "work"), "--output", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", *argv],
        cwd=REPO,
        # A shared machine under load can take Ray's node past its 60 s registration wait (Ray names this knob).
        env=cli_env() | {"RAY_raylet_start_wait_time_s": "300"},
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    result = json.loads(out.read_text())
    assert {"command", "machine", "started_at", "ended_at", "settings", "samples", "events", "summary"} <= set(result)
    summary = result["summary"]
    # 90 s is no measure of memory growth (the hour is): the slope is only there; nothing lost or mixed up is.
    assert set(summary["checks"]) == {"rss_growth", "misaligned", "lost_episodes"}
    assert summary["checks"]["misaligned"] is True and summary["checks"]["lost_episodes"] is True
    assert summary["misaligned"] == 0 and summary["lost_episodes"] == 0
    assert summary["passed"] == all(summary["checks"].values())
    # The restart happened as a lab meets it: killed, the trainer stopped on the loss, back, resumed.
    events = [e["event"] for e in result["events"]]
    assert (
        events.index("device_killed") < events.index("trainer_stopped") < events.index("first_iteration_after_outage")
    )
    assert [e["driver"] for e in result["events"] if e["event"] == "trainer_started"] == [1, 2]
    outage = summary["outage"]
    assert outage["device_down_s"] > outage["loss_threshold_s"] > 0
    # Replies were checked on both sides of the restart, against the device's own record, with faults injected.
    trial = result["trial"]
    assert trial["alignment"]["used"] > 0 and trial["alignment"]["unknown_to_device"] == 0
    assert trial["numbering"]["episodes"] >= 2 and trial["numbering"]["missing"] == []
    assert sum(v for k, v in trial["device_faults"].items() if k != "none") > 0
    # Both drivers were measured with their Ray processes (the tree is the driver alone while Ray starts).
    largest: dict[int, int] = {}
    for s in result["samples"]:
        if s["trainer"] is not None:
            largest[s["driver"]] = max(largest.get(s["driver"], 0), s["trainer"]["processes"])
    assert set(largest) == {1, 2} and min(largest.values()) >= 3, largest
    assert summary["env_steps"] > 0 and summary["timeouts"] >= 0


@pytest.mark.slow  # one paced `spikeloop train` with its own Ray start, stopped after its first iteration
@pytest.mark.timeout(900)
def test_a_soak_stopped_in_the_background_stops_its_trainer_and_device(tmp_path: Path):
    """A SIGTERM to a soak that a script started (SIGINT ignored, as its children inherit): the trainer stops as on
    Ctrl-C (exit 130, its state saved), the device closes, and nothing of either is left running."""
    import os
    import re
    import signal
    import time

    from tests.support.process_tree import group_and_descendants, sigkill_all
    from tests.support.spikeloop_cli import spikeloop_with_sigint

    work = tmp_path / "work"
    args = ["bench", "soak", "--duration-s", "3600", "--sample-s", "2", "--warmup-s", "0", "--train-batch", "64"]
    args += ["--work-dir", str(work), "--output", str(tmp_path / "soak.json")]
    soak = subprocess.Popen(
        spikeloop_with_sigint("ignored", args),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert soak.stdout is not None
    lines: list[str] = []
    started: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 600
        for line in soak.stdout:
            lines.append(line)
            if match := re.search(r"\] (device|trainer)_started .*\"pid\": (\d+)", line):
                started[match[1]] = int(match[2])
            if re.search(r"driver 1 iter [1-9]", line):  # training, past its first iteration
                soak.send_signal(signal.SIGTERM)
                break
            assert time.monotonic() < deadline, "".join(lines)[-4000:]
        rest, _ = soak.communicate(timeout=240)
        text = "".join(lines) + rest
        assert set(started) == {"device", "trainer"}, text[-4000:]
        assert soak.returncode == 130 and "spikeloop soak: interrupted" in text, text[-4000:]
        # Each stopped as asked (SIGKILL after the grace would read -9): the trainer as on Ctrl-C, the device cleanly.
        assert '] stopped {"process": "trainer", "returncode": 130}' in text, text[-4000:]
        assert '] stopped {"process": "device", "returncode": 0}' in text, text[-4000:]
        trainer_log = (work / "train-1.log").read_text()
        assert "--resume`" in trainer_log, trainer_log[-3000:]
        # Nothing of either left behind: not the programs, not the trainer's Ray processes (their groups).
        deadline = time.monotonic() + 60
        while (left := group_and_descendants(started["trainer"]) | group_and_descendants(started["device"])) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert not left, [
            Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left if os.path.exists(f"/proc/{pid}")
        ]
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
        sigkill_all({pid for pgid in started.values() for pid in group_and_descendants(pgid)})
