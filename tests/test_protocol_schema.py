"""The `protocol:` section: what it fixes, the four conditions, the play's stop, and every contradiction refused
with its key path, before Ray starts; the fixed motor-map readout it decodes with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from spikeloop.bridge.device.backends import make_backend
from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS, SPIKE_GROUP_NAMES
from spikeloop.envs.actions import action_buttons
from spikeloop.experiments.protocol.settings import CONDITIONS, FROZEN_MODEL
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict, load_experiment, set_path
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.decoder import motor_map

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "experiments" / "culture_protocol.yaml"


def test_the_example_resolves_to_a_frozen_mapping_and_a_play_length() -> None:
    e = load_experiment(PROTOCOL)
    assert e.protocol is not None and e.protocol.design == "rest-play-rest" and e.protocol.condition == "feedback"
    for key, value in FROZEN_MODEL.items():
        assert getattr(e.model, key) == value, key
    # 1,200 s of play at 50 + 50 ms an exchange, one env runner (num_env_runners 0: the local one).
    assert (e.stop.env_steps, e.stop.iterations, e.stop.episodes, e.stop.time_s) == (12000, None, None, None)
    resolved = e.plain()
    assert experiment_from_dict(resolved).plain() == resolved  # the resolved experiment validates unchanged


def test_the_shorthand_is_the_default_session() -> None:
    e = experiment_from_dict({"protocol": "rest-play-rest", "devices": [{"backend": "sim"}]})
    assert e.protocol is not None and (e.protocol.rest_before_s, e.protocol.play_s) == (300.0, 1200.0)


def test_play_length_counts_each_culture_and_each_round() -> None:
    e = load_experiment(
        PROTOCOL,
        [
            "protocol.play_s=60",
            "protocol.early_s=20",
            "protocol.late_s=20",
            "devices.0.artifact_wait_ms=10",
            "devices.0.collect_window_ms=20",
            "model.same_frame_rounds=2",
            "resources.num_env_runners=2",
        ],
    )
    assert e.stop.env_steps == 2 * 1000  # 60 s / (30 ms x 2 rounds) per culture, two cultures


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.encoder_trainable=true"], "model.encoder_trainable"),
        (["model.decoder_frozen=false"], "model.decoder_frozen"),
        (["model.decoder_init=random"], "model.decoder_init"),
        (["model.spike_mean_mode=ema"], "model.spike_mean_mode"),
        (["model.spike_scaling=true"], "model.spike_scaling"),
        (["model.feature_normalization=true"], "model.feature_normalization"),
        (["stop.iterations=2"], "stop"),
        (["stop.env_steps=500"], "stop"),
        (["ablation=random"], "ablation"),
        (["feedback.enabled=false"], "feedback.enabled"),
        (["policy=direct"], "policy"),
        (["devices.0.backend=zero"], "devices.0.backend"),
        (
            ["devices=[{device_id: dish, backend: cl1, host: 127.0.0.1}]", "protocol.condition=no_cells"],
            "devices.0.backend",
        ),
        (["protocol.early_s=600", "protocol.late_s=900"], "protocol"),
        (["protocol.rest_block_s=200"], "protocol"),
        (["protocol.condition=best"], "protocol.condition"),
        (["devices.0.artifact_wait_ms=0", "devices.0.collect_window_ms=0"], "protocol"),
        (["tune.search_space={model.spike_mean_mode: {grid: [ema, off]}}"], "tune.search_space.model.spike_mean_mode"),
    ],
)
def test_a_contradiction_is_refused_with_its_key_path(overrides: list[str], key: str) -> None:
    with pytest.raises(ExperimentError) as info:
        load_experiment(PROTOCOL, overrides)
    problems = str(info.value).splitlines()[1:]
    assert any(line.strip().startswith(f"{key}:") or line.strip().startswith(f"{key}.") for line in problems), str(
        info.value
    )


@pytest.mark.parametrize("base", CONDITIONS)
def test_each_condition_is_what_its_name_says_whichever_condition_the_file_names(base: str) -> None:
    # A sweep re-validates the resolved experiment with each grid value: every base must allow every condition.
    resolved = load_experiment(PROTOCOL, [f"protocol.condition={base}"]).plain()
    built = {}
    for condition in CONDITIONS:
        data = dict(resolved)
        set_path(data, "protocol.condition", condition)
        e = experiment_from_dict(data)
        culture = e.culture_settings()
        built[condition] = (culture.feedback.enabled, e.model.ablation, culture.devices[0].backend)
    assert built == {
        "feedback": (True, "none", "sim"),
        "no_feedback": (False, "none", "sim"),
        "stimulus_only": (False, "zero", "sim"),
        "no_cells": (True, "none", "zero"),
    }


def test_no_cells_answers_as_fast_as_the_culture_it_replaces() -> None:
    # The zero device of an experiment runs on the device's clock (one window per stimulation), as sim does.
    e = load_experiment(PROTOCOL, ["protocol.condition=no_cells"])
    device = e.culture_settings().devices[0]
    assert (device.backend, device.realtime) == ("zero", False)
    backend = make_backend("zero", tick_frequency_hz=10.0, realtime=device.realtime)
    assert not backend.paced and backend.now_s() == 0.0
    backend.advance_to(0.1)
    assert backend.now_s() == pytest.approx(0.1) and not backend.spike_counts(0.05, 0.1).any()
    assert make_backend("zero", tick_frequency_hz=10.0).paced  # `spikeloop device --backend zero`: the wall clock


def test_motor_map_reads_each_action_s_own_motor_groups() -> None:
    single = motor_map(8, N_SPIKE_GROUPS)
    for action, buttons in enumerate(action_buttons("single")):
        expected = np.zeros(N_SPIKE_GROUPS)
        for button in buttons:
            expected[SPIKE_GROUP_NAMES.index(button.name.lower())] = 1.0
        np.testing.assert_array_equal(single[action].numpy(), expected)
    assert single[:, SPIKE_GROUP_NAMES.index("encoding")].sum() == 0 and single[7].sum() == 0  # no-op reads nothing
    joint = motor_map(54, 2 * N_SPIKE_GROUPS)  # two same-frame rounds: both rounds' groups count
    assert joint.shape == (54, 16) and torch.equal(joint[:, :8], joint[:, 8:])
    assert joint[0, :8].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]  # forward + left + turn left + attack
    assert joint[53].sum() == 0
    with pytest.raises(ValueError, match="motor_map needs an action set"):
        motor_map(5, N_SPIKE_GROUPS)


def test_the_protocol_s_module_stimulates_and_decodes_by_fixed_rules() -> None:
    e = load_experiment(PROTOCOL)
    obs = spaces.Box(-1.0, 1.0, (6,), np.float32)
    module = ClosedLoopRLModule(
        observation_space=obs, action_space=spaces.Discrete(8), model_config=e.algorithm_config().model_config
    )
    assert module.decoder_parameters() == [] and module.encoder_parameters() == []  # nothing to train there
    gain = e.model.decoder_map_gain
    torch.testing.assert_close(module.decoder.effective_weight(), motor_map(8, N_SPIKE_GROUPS) * gain)
    spikes = torch.tensor([[9.0, 1, 2, 3, 4, 5, 6, 7]])
    # Raw counts in, no centring or scaling: the logit of action i is gain x the count of motor group i + 1.
    torch.testing.assert_close(module.decode(spikes), torch.tensor([[1.0, 2, 3, 4, 5, 6, 7, 0]]) * gain)
