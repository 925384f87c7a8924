"""`spikeloop replay` on recorded runs, as a user runs it: a sim culture run and its zero-ablation twin.

One `spikeloop tune` of two trials (the simulated culture with `ablation: none` and `ablation: zero`, the same
seed, a few hundred env steps, the per-step record kept, a checkpoint at the end), then `spikeloop replay` of
the run directory as a subprocess. Under `zero` the decoder's input is all zeros whatever the culture did, so
nothing about the action can be read from it: a decoder trained afresh must come out at chance, and the
checkpoint's decoder, which sees the same zeros every tick, always proposes one action.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.spikeloop_cli import run_spikeloop
from tests.support.tensorboard_events import event_scalars

pytestmark = pytest.mark.slow

SWEEP_YAML = textwrap.dedent("""\
    name: replayed
    seed: 0
    devices:
      - {device_id: culture, backend: sim}
    env: {scenario: basic, frame_skip: 4}
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


def test_replay_reports_every_trial_with_the_meter_and_both_decoders(replayed: tuple[Path, str]) -> None:
    run_dir, stdout = replayed
    reports = _reports(run_dir)
    assert set(reports) == {"none", "zero"}, stdout
    for report in reports.values():
        assert 0 < report["ticks"] <= 256  # the episodes finished in one sample of 256 steps
        assert report["episodes"] >= 2 and report["information"], report
        assert sum(chunk["ticks"] for chunk in report["information"]) == report["ticks"]
        assert {"accuracy", "chance_accuracy", "bits"} <= set(report["fresh_decoder"]), report["fresh_decoder"]
        assert {"agreement", "mean_log_likelihood"} <= set(report["saved_decoder"]), report["saved_decoder"]
    assert stdout.count("written: ") == 2


def test_the_zero_ablation_comes_out_at_chance(replayed: tuple[Path, str]) -> None:
    zero = _reports(replayed[0])["zero"]
    fresh = zero["fresh_decoder"]
    assert fresh["accuracy"] == fresh["chance_accuracy"] and fresh["bits"] == 0.0, fresh
    saved = zero["saved_decoder"]  # zeros every tick: one proposal, agreeing only as often as that action was taken
    assert 0.0 < saved["agreement"] < 1.0, saved


def test_the_live_meter_finds_no_action_in_the_counts_under_the_zero_ablation(replayed: tuple[Path, str]) -> None:
    # The live information meter's TensorBoard figures of both trials. Under `zero` the decoder sees zeros, so the
    # action cannot depend on the culture's counts: its figure must be 0 within the estimator's noise. Without the
    # ablation the decoder acts on the counts, so they carry the action (0.07 bits, noise 0.01, when written).
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


def test_a_directory_without_a_step_record_is_refused_with_the_fix(tmp_path: Path) -> None:
    proc = run_spikeloop(["replay", str(tmp_path)], timeout=120)
    assert proc.returncode == 2 and "output.step_log" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
