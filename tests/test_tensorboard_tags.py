"""TensorBoard as a user reads it: the event files of `spikeloop train` and `spikeloop watch`, read back.

One short quickstart run with the event table (`use_reward_feedback: false`, so per-event feedback is sent),
then a watch of it that samples and keeps updating the spike mean (the reference trainer's watch).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.envs.rewards import EVENTS
from spikeloop.models.closed_loop.feedback import FeedbackSettings
from tests.support.spikeloop_cli import run_spikeloop
from tests.support.tensorboard_events import event_scalars

BATCH = 256
SENT_STATS = ("mean_frequency_hz", "max_frequency_hz", "mean_amplitude_ua", "max_amplitude_ua", "max_pulses")


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_train_and_watch_write_the_reference_telemetry_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            "--set",
            "stop={iterations: 2}",
            "--set",
            f"ppo.train_batch_size_per_learner={BATCH}",
            "--set",
            "ppo.minibatch_size=64",
            "--set",
            "feedback.use_reward_feedback=false",
            "--set",
            f"output.root_dir={root}",
        ],
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir,) = sorted(root.glob("quickstart-*"))
    (trial_dir,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    scalars = event_scalars(trial_dir)
    tags = set(scalars)

    # One set of tags: the trial's own, no `ray/tune/*` copies from Tune's logger.
    assert not [t for t in tags if t.startswith("ray/")], sorted(tags)
    for tag in (
        "ppo/advantage_std",
        "decoder/weight_norm",
        "decoder/bias_norm",
        "encoder/ratio_mean",
        "encoder/ratio_std",
        "encoder/ratio_clip_fraction",
        "decoder/ratio_mean",
        "decoder/ratio_std",
        "decoder/ratio_clip_fraction",
        "episode/success_actions",
        "episode/fail_actions",
        "episode/neutral_actions",
        "feedback/step/count",
        "feedback/step/frequency_scale",
        "feedback/step/amplitude_scale",
        "feedback/step/pulse_scale",
        "feedback/episode/frequency_scale",
        "feedback/episode/amplitude_scale",
        "loop/causality_r_current",
        "loop/causality_r_previous",
        "loop/unsolicited",
    ):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    # The reply check (tests/test_check_causality.py tells a late device from a correct one by them): correlations,
    # and no datagram unasked from the simulated device.
    for tag in ("loop/causality_r_current", "loop/causality_r_previous"):
        assert all(-1.0 <= value <= 1.0 for _, value in scalars[tag]), scalars[tag]
    assert all(value == 0.0 for _, value in scalars["loop/unsolicited"])
    # The device's own account of the charge it delivered (its device_status, read at episode ends): the simulated
    # device stimulates, has no dose budget and refuses nothing the trainer's (equal) envelope let out.
    for tag in ("device/dose_max_nc_per_min", "device/dose_total_nc_session", "device/dose_refused_stim"):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    assert scalars["device/dose_total_nc_session"][-1][1] > 0.0
    assert all(value == 0.0 for _, value in scalars["device/dose_refused_stim"] + scalars["device/refused_stim"])
    assert all(value == 0.0 for _, value in scalars["decoder/bias_norm"])  # the zero-bias readout has none
    assert all(value > 0.0 for _, value in scalars["ppo/advantage_std"])  # unnormalised: not PPO's std of 1
    # Counts add up per iteration: every step's feedback is built once (the last one, on the next tick).
    assert all(abs(value - BATCH) <= 2 for _, value in scalars["feedback/step/count"]), scalars["feedback/step/count"]
    # The event table: per-event counts and scales (a missed shot on `basic` is surely one of them).
    event_rows = {t.split("/")[1] for t in tags if t.startswith("feedback/") and t.split("/")[1] in EVENTS}
    assert event_rows, sorted(tags)
    for name in event_rows:
        for stat in ("count", "frequency_scale", "amplitude_scale", "pulse_scale"):
            assert f"feedback/{name}/{stat}" in tags
    # What reached the wire, in absolute units, per feedback name: within the envelope, the mean below the max.
    envelope, feedback = SafetyEnvelope(), FeedbackSettings()  # quickstart sets neither
    sent = {t.split("/")[1] for t in tags if t.startswith("feedback/") and t.endswith("/max_frequency_hz")}
    assert event_rows & sent and {"episode_negative", "episode_positive"} & sent, sorted(tags)
    for name in sent:
        series = {stat: [v for _, v in scalars[f"feedback/{name}/{stat}"]] for stat in SENT_STATS}
        assert all(
            envelope.min_frequency_hz <= mean <= high <= envelope.max_frequency_hz
            for mean, high in zip(series["mean_frequency_hz"], series["max_frequency_hz"], strict=True)
        ), (name, series)
        assert all(
            envelope.min_amplitude_ua <= mean <= high <= min(envelope.max_amplitude_ua, feedback.max_amplitude_ua)
            for mean, high in zip(series["mean_amplitude_ua"], series["max_amplitude_ua"], strict=True)
        ), (name, series)
        assert all(1 <= pulses <= envelope.max_pulses for pulses in series["max_pulses"]), (name, series)
    # Steps with a positive, negative or zero reward: every step of an ended episode is one of them.
    ended = sum(
        v
        for _, v in scalars["episode/success_actions"]
        + scalars["episode/fail_actions"]
        + scalars["episode/neutral_actions"]
    )
    assert ended > 0

    # The reference trainer's watch: sampling, the spike mean kept up to date, TensorBoard written too.
    out = tmp_path / "watched"
    proc = run_spikeloop(
        ["watch", str(run_dir), "--episodes", "2", "--explore", "--update-spike-mean", "--output", str(out)],
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (watch_dir,) = sorted(out.glob("watch-quickstart-*"))
    description = yaml.safe_load((watch_dir / "watch.yaml").read_text())
    assert description["explore"] is True and description["update_spike_mean"] is True
    assert description["weights_changed"] == []  # nothing learned...
    assert any(n.endswith("/spike_mean") for n in description["spike_statistics_changed"])  # ...the mean moved
    watched = event_scalars(watch_dir)
    for tag in (
        "episode/return",
        "episode/length",
        "episode/success_actions",
        "feedback/step/count",
        "loop/latency_p50_ms",
    ):
        assert tag in watched, f"{tag} missing from {sorted(watched)}"
    assert [step for step, _ in watched["episode/return"]] == [1, 2]
