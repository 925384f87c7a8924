"""`spikeloop replay` on recorded runs, as a user runs it: a sim culture run and its zero-ablation twin.

One `spikeloop tune` of two trials (the simulated culture with `ablation: none` and `ablation: zero`, the same
seed, a decoder that starts with large weights, a few hundred env steps, the session record and the step log
both kept, a checkpoint at the end), then `spikeloop replay` of the run directory as a subprocess, which reads
the session records. Under `zero` the decoder's input is all zeros whatever the culture did, so nothing about
the action can be read from it: a decoder trained afresh must come out at chance, and the checkpoint's decoder, which sees the same zeros every
tick, always proposes one action. The record and the step log of each trial must hold the same session.

Without a training run (tests/support/replay_sessions.py writes a made-up session through the real writers): a
record cut short by `kill -9` replays from its committed rows, and a trial without a record falls back on its
step log, says so, and comes to the same figures.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from spikeloop.experiments.analysis.replay import load_session
from spikeloop.models.closed_loop.session_record import RecordError, read_record
from tests.support import replay_sessions
from tests.support.spikeloop_cli import REPO, cli_env, run_spikeloop
from tests.support.tensorboard_events import event_scalars

SWEEP_YAML = textwrap.dedent("""\
    name: replayed
    seed: 0
    devices:
      - {device_id: culture, backend: sim}
    env: {scenario: basic, frame_skip: 4}
    model: {decoder_init_std: 3.0}
    ppo: {train_batch_size_per_learner: 256, minibatch_size: 128, num_epochs: 1}
    resources: {num_env_runners: 0}
    stop: {iterations: 1}
    checkpoint: {every_iterations: 100, keep: 1, at_end: true}
    output: {step_log: true}
    tune:
      search_space:
        ablation: {grid: [none, zero]}
      max_concurrent_trials: 2
      max_failures: 0
    """)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("replay")
    config = root / "replayed.yaml"
    config.write_text(SWEEP_YAML)
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={root}"], timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = Path(re.findall(r"run directory: (\S+)", proc.stdout)[-1])
    replay = run_spikeloop(["replay", str(run_dir)], timeout=300)
    assert replay.returncode == 0, (replay.stdout + replay.stderr)[-4000:]
    return run_dir, replay.stdout


def _reports(run_dir: Path) -> dict[str, dict]:
    reports = {}
    for path in run_dir.glob("*/replay.json"):
        ablation = yaml.safe_load((path.parent / "experiment.yaml").read_text())["ablation"]
        reports[ablation] = json.loads(path.read_text())
        assert (path.parent / "replay.png").stat().st_size > 0
    return reports


@pytest.mark.slow
def test_replay_reports_every_trial_with_the_meter_and_both_decoders(replayed: tuple[Path, str]) -> None:
    run_dir, stdout = replayed
    reports = _reports(run_dir)
    assert set(reports) == {"none", "zero"}, stdout
    for report in reports.values():
        assert report["source"] == "record" and [f["closed"] for f in report["record_files"]] == [True], report
        assert report["ticks"] + report["unfinished_steps"] == 256  # one sample of 256 steps, all recorded
        assert report["ticks"] > 0
        assert report["episodes"] >= 2 and report["information"], report
        assert sum(chunk["ticks"] for chunk in report["information"]) == report["ticks"]
        assert {"accuracy", "chance_accuracy", "bits"} <= set(report["fresh_decoder"]), report["fresh_decoder"]
        assert {"agreement", "mean_log_likelihood"} <= set(report["saved_decoder"]), report["saved_decoder"]
    assert stdout.count("written: ") == 2 and stdout.count("source: session record") == 2, stdout


@pytest.mark.slow
def test_the_record_and_the_step_log_hold_the_same_session(replayed: tuple[Path, str]) -> None:
    """Tick for tick: the episodes, stimulation classes, counts, decoder input and actions replay reads."""
    for trial_dir in sorted(p.parent for p in replayed[0].glob("*/replay.json")):
        record, step_log = load_session(trial_dir, "record"), load_session(trial_dir, "steps")
        assert (record.source, step_log.source) == ("record", "steps")
        for column in ("episode", "stim_class", "raw_spikes", "spikes", "action"):
            assert np.array_equal(getattr(record, column), getattr(step_log, column)), (trial_dir.name, column)


@pytest.mark.slow
def test_the_zero_ablation_comes_out_at_chance(replayed: tuple[Path, str]) -> None:
    zero = _reports(replayed[0])["zero"]
    fresh = zero["fresh_decoder"]
    assert fresh["accuracy"] == fresh["chance_accuracy"] and fresh["bits"] == 0.0, fresh
    saved = zero["saved_decoder"]  # zeros every tick: one proposal, agreeing only as often as that action was taken
    assert 0.0 < saved["agreement"] < 1.0, saved


@pytest.mark.slow
def test_the_live_meter_finds_no_action_in_the_counts_under_the_zero_ablation(replayed: tuple[Path, str]) -> None:
    # The live information meter's TensorBoard figures of both trials. Under `zero` the decoder sees zeros, so the
    # action cannot depend on the culture's counts: its figure must be 0 within the estimator's noise. Without the
    # ablation the decoder acts on the counts, so they carry the action: with the default decoder (std 0.3) that
    # was 0.07 bits on one machine and -0.005 (noise 0.009) on another, an untrained readout too weak to show; at
    # std 3.0 the action follows the counts by construction (0.093 bits, noise 0.009, on the second machine).
    for path in replayed[0].glob("*/experiment.yaml"):
        ablation = yaml.safe_load(path.read_text())["ablation"]
        scalars = event_scalars(path.parent)
        for variable in ("stim", "features", "action"):
            assert f"culture/info_{variable}" in scalars and f"culture/info_{variable}_sd" in scalars, sorted(scalars)
        ((_, bits),) = scalars["culture/info_action"]  # one iteration: one figure
        ((_, noise),) = scalars["culture/info_action_sd"]
        if ablation == "zero":
            assert abs(bits) < max(3 * noise, 0.03), (bits, noise)
        else:
            assert bits > 3 * noise, (bits, noise)


def test_a_directory_without_a_record_or_step_log_is_refused_with_the_fix(tmp_path: Path) -> None:
    proc = run_spikeloop(["replay", str(tmp_path)], timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "record/*.h5" in proc.stderr and "output.step_log" in proc.stderr, proc.stderr


FLUSH_S = 0.2


def _kill_a_recording_writer(record_path: Path) -> None:
    """Write the made-up session into a record and `kill -9` its writer with the next episode under way."""
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.replay_sessions", str(record_path), str(FLUSH_S)],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and replay_sessions.WRITTEN in writer.stdout.readline()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until some steps of the unfinished episode are committed too
            try:
                if (
                    len(read_record(record_path)[1]["steps"]["step"])
                    > replay_sessions.EPISODES * replay_sessions.LENGTH
                ):
                    break
            except RecordError:
                pass  # the read met a flush half-way: read again
            time.sleep(FLUSH_S)
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)


def test_a_record_cut_short_by_kill_9_replays_and_a_trial_without_one_falls_back_on_its_step_log(
    tmp_path: Path,
) -> None:
    """One run directory, three trials holding the same made-up session: a killed record, a step log only, and a
    closed record of a run under `ablation: random`, whose decoder input (Poisson draws) the record does not keep."""
    run_dir = tmp_path / "run"
    killed, logged, random = run_dir / "trial_killed", run_dir / "trial_logged", run_dir / "trial_random"
    record_path = killed / "record" / "runner1-killed.h5"
    record_path.parent.mkdir(parents=True)
    logged.mkdir()
    _kill_a_recording_writer(record_path)
    replay_sessions.write_record(random / "record" / "runner1-random.h5", 60.0, ablation="random").close()
    committed_steps = len(read_record(record_path)[1]["steps"]["step"])
    # A kill in the middle of a flush leaves rows past the committed count: an episode end claiming every step.
    with h5py.File(record_path, "r+") as f:
        for table, junk in (("steps", 7), ("episodes", 99)):
            for ds in f[table].values():
                ds.resize(ds.shape[0] + 1, axis=0)
                ds[-1] = junk if ds.dtype.kind in "iuf" else ds[0]
    replay_sessions.write_step_logs(logged)

    proc = run_spikeloop(["replay", str(run_dir)], timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    from_record = json.loads((killed / "replay.json").read_text())
    from_steps = json.loads((logged / "replay.json").read_text())
    from_random = json.loads((random / "replay.json").read_text())

    finished = replay_sessions.EPISODES * replay_sessions.LENGTH
    assert from_record["source"] == "record" and from_record["record_files"][0]["closed"] is False, from_record
    assert from_record["episodes"] == replay_sessions.EPISODES and from_record["ticks"] == finished
    assert from_record["unfinished_steps"] == committed_steps - finished > 0  # the episode the kill cut short
    assert "not closed" in proc.stdout and "runner1-killed.h5" in proc.stdout, proc.stdout
    assert from_steps["source"] == "steps" and "source: step log" in proc.stdout, proc.stdout
    # The same session from either source: the same report.
    for key in ("ticks", "episodes", "information", "fresh_decoder", "saved_decoder"):
        assert from_record[key] == from_steps[key], key
    fresh = from_record["fresh_decoder"]  # the made-up culture's counts tell the action
    assert fresh["accuracy"] > 0.9 > 0.6 > fresh["chance_accuracy"] and fresh["bits"] > 0.5, fresh
    assert from_record["saved_decoder"] == {"skipped": "the trial kept no checkpoint"}
    # Under ablation random the meter (the culture's counts) is there; the decoders are unavailable, and say why.
    assert from_random["source"] == "record" and from_random["information"] == from_steps["information"]
    for decoder in ("fresh_decoder", "saved_decoder"):
        assert "unavailable from the session record" in from_random[decoder]["skipped"], from_random[decoder]
