"""The culture protocol through the front door: `spikeloop train experiments/culture_protocol.yaml` as a subprocess.

The culture is `spikeloop device` in its own process (the simulated culture, as fast as possible), reached as a
cl1 device and recording every stimulation it takes, so that the phases are checked on what the device
received: all-zero stimulations for the rest before play, the game's stimulations, all-zero ones again. Phases
are short (3 s of rest, 25.6 s of play: two 128-step iterations). Then the files of the trial directory, the
trial's last result and the module's weights across its checkpoints; and a contradicting setting refused before
anything starts.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS, SPIKE_GROUP_NAMES
from spikeloop.experiments.protocol.session import OUTCOME_TAGS
from spikeloop.models.decoder import motor_map
from tests.support.hardware_rig import DevicePorts, DeviceProgram
from tests.support.spikeloop_cli import run_spikeloop

REST_TICKS = 30
PLAY_STEPS = 256
SHORT = [
    "--set",
    "protocol.rest_before_s=3",
    "--set",
    "protocol.rest_after_s=3",
    "--set",
    "protocol.rest_settle_s=0.5",
    "--set",
    "protocol.rest_block_s=0.5",
    "--set",
    f"protocol.play_s={PLAY_STEPS / 10}",
    "--set",
    "protocol.early_s=10",
    "--set",
    "protocol.late_s=10",
    "--set",
    "protocol.bootstrap_resamples=1000",
    "--set",
    "ppo.train_batch_size_per_learner=128",
    "--set",
    "ppo.minibatch_size=64",
    "--set",
    "ppo.num_epochs=1",
    "--set",
    "checkpoint.every_iterations=1",
    "--set",
    "checkpoint.keep=2",  # both iterations' checkpoints: the weights before and after the second
    "--set",
    "loop.timeout_s=1.0",  # a loaded 2-core machine can stall the device program for a moment
]


def module_state(checkpoint: Path) -> dict[str, np.ndarray]:
    """The RL module's weights and buffers as the checkpoint stores them."""
    (path,) = sorted(checkpoint.glob("**/rl_module/default_policy/module_state.pkl"))
    with path.open("rb") as f:
        return {k: np.asarray(v) for k, v in pickle.load(f).items()}


def recorded_stimulations(recording: Path) -> list[dict]:
    """Every stimulation the device took, in the order it took them."""
    (path,) = [p for p in recording.glob("device-*.jsonl") if not p.name.endswith(".events.jsonl")]
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["kind"] == "stim"]


@pytest.mark.slow
def test_a_session_rests_plays_and_rests_with_the_mapping_frozen(tmp_path: Path) -> None:
    ports = DevicePorts()
    recording = tmp_path / "recording"
    root = tmp_path / "runs"
    device = DeviceProgram(
        ["spikeloop", "device", "--backend", "sim", "--as-fast-as-possible", "--recording-path", str(recording)]
        + ports.device_flags(),
        tmp_path / "device.log",
    )
    try:
        proc = run_spikeloop(
            [
                "train",
                "experiments/culture_protocol.yaml",
                "--set",
                "devices=[{device_id: dish, backend: cl1}]",
                *ports.experiment_sets(),
                "--set",
                "resources.num_env_runners=1",
                "--set",
                "tune.search_space={}",  # the example's grid holds no_cells, which a cl1 device cannot run
                *SHORT,
                "--set",
                f"output.root_dir={root}",
            ],
            timeout=900,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-6000:]
        counters = device.summary()  # the device program ends with the run
    finally:
        device.stop()

    # The phases, in order, as the run reports them.
    marks = ["[protocol] rest_before: 30", "[iter 1]", "[iter 2]", "[protocol] rest_after: 30", "[protocol] statistics"]
    where = [output.find(mark) for mark in marks]
    assert all(i >= 0 for i in where) and where == sorted(where), output[-6000:]

    # What the device received: 30 all-zero stimulations, the game's 256, 30 all-zero ones.
    stims = recorded_stimulations(recording)
    off = [not any(s["frequencies_hz"]) and not any(s["amplitudes_ua"]) for s in stims]
    assert off == [True] * REST_TICKS + [False] * PLAY_STEPS + [True] * REST_TICKS
    assert not any("refused" in s for s in stims)
    assert counters["stim"] == counters["replies"] == len(stims) and counters["exit_reason"] == "training_complete"

    (run_dir,) = root.glob("culture-protocol-*")
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]

    # Each rest's record holds the ticks the device answered, by the timestamps the device logged.
    stamps = [s["timestamp_us"] for s in stims]
    for name, sent in (("rest_before.npz", stamps[:REST_TICKS]), ("rest_after.npz", stamps[-REST_TICKS:])):
        with np.load(trial / name) as rest:
            assert rest["counts"].shape == (1, REST_TICKS, N_SPIKE_GROUPS)
            assert rest["stim_timestamp_us"][0].tolist() == sent
            assert rest["answered"].all() and list(rest["group_names"]) == list(SPIKE_GROUP_NAMES)
            assert float(rest["tick_s"]) == 0.1 and list(rest["device_ids"]) == ["dish"]

    # protocol.json: the phases, both comparisons and the outcome; the same outcome in the trial's last result.
    result = json.loads((trial / "protocol.json").read_text())
    assert (result["design"], result["condition"]) == ("rest-play-rest", "feedback")
    assert result["condition_applied"] == {
        "feedback.enabled": True,
        "model.ablation": "none",
        "devices.backend": ["cl1"],
    }
    assert [p["phase"] for p in result["phases"]] == ["rest_before", "play", "rest_after"]
    before, play, after = result["phases"]
    assert before["ticks"] == after["ticks"] == REST_TICKS and before["culture_s"] == 3.0
    assert play["env_steps_taken"] == PLAY_STEPS and play["iterations"] == 2
    assert before["wall_start"] <= before["wall_end"] == play["wall_start"] <= play["wall_end"]
    assert play["wall_end"] == after["wall_start"] <= after["wall_end"]
    early_late = result["early_late"]
    assert early_late["early"]["episodes"] + early_late["late"]["episodes"] >= 1
    for name in ("return", "kill_rate"):
        assert {"early_mean", "late_mean", "late_minus_early", "ci95", "p_one_sided", "method"} <= set(early_late[name])
    rest = result["rest"]
    assert (rest["settle_ticks"], rest["block_ticks"]) == (5, 5)
    assert set(rest["groups"]) == {*SPIKE_GROUP_NAMES, "total"}
    for stat in rest["groups"].values():
        assert {"before_mean", "after_mean", "change", "ci95", "p_two_sided"} <= set(stat)
    assert set(result["outcome"]) == set(OUTCOME_TAGS)
    last = json.loads((trial / "result.json").read_text().splitlines()[-1])
    for tag, value in result["outcome"].items():
        key = tag.replace("/", "_")
        assert key in last, key
        assert (value is None and last[key] != last[key]) or last[key] == pytest.approx(value)

    # Nothing on the path from stimulation to action moved: encoder, decoder and their statistics.
    first, final = module_state(trial / "checkpoint_000000"), module_state(trial / "checkpoint_000001")
    frozen = [k for k in first if k.startswith(("encoder.", "decoder.", "feature_norm.", "spike_"))]
    assert any(k.startswith("encoder.") for k in frozen) and "decoder.weight" in frozen
    for key in frozen:
        np.testing.assert_array_equal(first[key], final[key], err_msg=f"{key} moved during the protocol")
    gain = yaml.safe_load((trial / "experiment.yaml").read_text())["model"]["decoder_map_gain"]
    np.testing.assert_array_equal(final["decoder.weight"], motor_map(8, N_SPIKE_GROUPS).numpy() * gain)
    assert not final["spike_mean"].any() and not final["feature_norm.count"].any()
    assert any(not np.array_equal(first[k], final[k]) for k in first if k.startswith("value_net.")), "value net learns"


def test_a_contradicting_setting_is_refused_before_anything_starts() -> None:
    proc = run_spikeloop(
        ["train", "experiments/culture_protocol.yaml", "--set", "model.encoder_trainable=true"], timeout=120
    )
    assert proc.returncode != 0
    assert "model.encoder_trainable: True contradicts the protocol" in proc.stderr, proc.stderr[-3000:]
    assert "Ray" not in proc.stdout  # refused when the file was read, before Ray started


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_a_sweep_runs_each_condition_as_its_name_says(tmp_path: Path) -> None:
    """stimulus_only and no_cells of one seed: the same games at chance, cells stimulated or none, no feedback or
    feedback into nothing."""
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "tune",
            "experiments/culture_protocol.yaml",
            "--set",
            "tune.search_space={protocol.condition: {grid: [stimulus_only, no_cells]}}",
            *SHORT,
            "--set",
            f"output.root_dir={root}",
        ],
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    (run_dir,) = root.glob("culture-protocol-*")
    sessions = {}
    for path in run_dir.glob("*/protocol.json"):
        result = json.loads(path.read_text())
        last = json.loads((path.parent / "result.json").read_text().splitlines()[-1])
        episodes = [json.loads(line) for line in (path.parent / "episodes.jsonl").read_text().splitlines()]
        with np.load(path.parent / "rest_before.npz") as rest:
            counts = rest["counts"]
        sessions[result["condition"]] = (result, last, episodes, counts)
    assert set(sessions) == {"stimulus_only", "no_cells"}
    stimulated, stimulated_last, stimulated_games, stimulated_rest = sessions["stimulus_only"]
    empty, empty_last, empty_games, empty_rest = sessions["no_cells"]
    assert stimulated["condition_applied"] == {
        "feedback.enabled": False,
        "model.ablation": "zero",
        "devices.backend": ["sim"],
    }
    assert empty["condition_applied"] == {
        "feedback.enabled": True,
        "model.ablation": "none",
        "devices.backend": ["zero"],
    }
    assert stimulated_rest.sum() > 0 and empty_rest.sum() == 0  # cells at rest fire; no cells, no counts
    # Both play at chance with the same seed: the same actions, hence the same games, episode by episode.
    assert [e["episode_reward"] for e in stimulated_games] == [e["episode_reward"] for e in empty_games]
    assert stimulated_last["feedback_sent"] == 0 < empty_last["feedback_sent"]
