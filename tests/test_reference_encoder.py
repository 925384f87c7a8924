"""The reference trainer's encoder options: a frozen encoder, the pooled screen CNN, a value net that sees the
screen, and same-frame encoding (several stimulations per frame, their replies side by side).

Module-level checks use real modules and a real learner on the toy env; the `spikeloop
train` tests (a subprocess, the simulated culture) read what a run left behind: the
checkpoints (a frozen encoder did not move, the decoder did) and the step log (one
stimulation and one reply per round).
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from spikeloop.experiments.analysis import read_steps
from spikeloop.experiments.schema import experiment_from_dict
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import STIM_DIST_INPUTS
from spikeloop.models.direct_module import DirectRLModule
from spikeloop.models.encoder import screen_view
from spikeloop.models.learner import ENCODER_OPTIMIZER
from spikeloop.models.ppo_config import ClosedLoopPPOConfig
from tests.support.spikeloop_cli import run_spikeloop
from tests.support.toy_loop import ToyClosedLoopEnv, synthetic_episodes

MID = "default_policy"
SCREEN_SHAPE = (60, 80, 1)
OBS_WITH_SCREEN = gym.spaces.Dict(
    {
        "features": gym.spaces.Box(-1.0, 1.0, (6,), np.float32),
        "screen": gym.spaces.Box(0, 255, SCREEN_SHAPE, np.uint8),
    }
)


def module(cls=ClosedLoopRLModule, obs_space=OBS_WITH_SCREEN, **model_config):
    """A closed-loop (or direct) module on a features + screen observation."""
    torch.manual_seed(0)
    return cls(observation_space=obs_space, action_space=gym.spaces.Discrete(5), model_config=model_config)


def observations(n: int, seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {
        "features": torch.from_numpy(rng.uniform(-1, 1, (n, 6)).astype(np.float32)),
        "screen": torch.from_numpy(rng.integers(0, 256, (n, *SCREEN_SHAPE), dtype=np.uint8)),
    }


def test_frozen_encoder_is_never_updated_and_stimulates_deterministically() -> None:
    config = (
        ClosedLoopPPOConfig()
        .environment(ToyClosedLoopEnv)
        .rl_module(model_config={"encoder_trainable": False})
        .training(lr=1e-3)
    )
    learner = config.build_learner(env=ToyClosedLoopEnv())
    mod: ClosedLoopRLModule = learner.module[MID].unwrapped()
    assert mod.encoder_parameters() == []
    assert ENCODER_OPTIMIZER not in {name for name, _ in learner.get_optimizers_for_module(MID)}

    encoder_before = {k: v.clone() for k, v in mod.encoder.state_dict().items()}
    decoder_before = mod.decoder.weight.detach().clone()
    episodes = synthetic_episodes(mod, ToyClosedLoopEnv(), n_steps=128, seed=3)
    # Exploring, the frozen encoder still sends each observation's one stimulation, with log-probability 0.
    stim_logp = np.concatenate([np.asarray(e.get_extra_model_outputs("stim_logp")) for e in episodes])
    assert np.all(stim_logp == 0.0)
    obs = torch.from_numpy(np.stack([ToyClosedLoopEnv().observation_space.sample() for _ in range(4)]))
    dist = mod.encoder_distribution(mod.forward_exploration({Columns.OBS: obs})[STIM_DIST_INPUTS])
    torch.testing.assert_close(dist.sample(), dist.sample())

    results = learner.update(
        episodes=episodes, num_epochs=2, minibatch_size=64, shuffle_batch_per_epoch=True, timesteps={}
    )
    assert math.isfinite(float(results[MID]["total_loss"].peek()))
    assert float(results[MID]["encoder_entropy"].peek()) == 0.0
    for key, value in mod.encoder.state_dict().items():
        torch.testing.assert_close(value, encoder_before[key], msg=f"frozen encoder moved: {key}")
    assert not torch.equal(mod.decoder.weight, decoder_before), "the decoder must still learn"


def test_frozen_encoder_of_the_direct_control_keeps_its_trunk_and_trains_its_head() -> None:
    direct = module(DirectRLModule, encoder_trainable=False)
    trainable = {name for name, p in direct.encoder.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
    assert direct.encoder_parameters() == []


def test_pooled_screen_cnn_is_the_reference_stack() -> None:
    mod = module(screen_cnn="pooled")
    convs = [m for m in mod.encoder.screen_cnn.convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 64, (3, 3), (1, 1)),
        (64, 128, (3, 3), (1, 1)),
        (128, 256, (3, 3), (1, 1)),
    ]
    assert mod.encoder.screen_cnn.out_size == 256
    assert mod.encoder.trunk[0].in_features == 6 + 256
    obs = observations(3, seed=1)
    out = mod.forward_exploration({Columns.OBS: obs})[STIM_DIST_INPUTS]
    # Another screen with the same features: another stimulation.
    other = dict(obs, screen=torch.flip(obs["screen"], dims=[1]))
    assert not torch.allclose(out, mod.forward_exploration({Columns.OBS: other})[STIM_DIST_INPUTS])


@pytest.mark.parametrize("sees_screen", [True, False])
def test_value_net_sees_the_screen_only_when_asked(sees_screen: bool) -> None:
    mod = module(value_sees_screen=sees_screen)
    obs = observations(4, seed=2)
    other = dict(obs, screen=255 - obs["screen"])
    values, other_values = (mod.compute_values({Columns.OBS: o}) for o in (obs, other))
    assert torch.allclose(values, other_values) is (not sees_screen)
    assert mod.value_net.net[0].in_features == 6 + (int(np.prod(SCREEN_SHAPE)) if sees_screen else 0)


def test_value_net_on_the_screen_without_a_screen_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"env\.screen: true"):
        module(obs_space=OBS_WITH_SCREEN["features"], value_sees_screen=True)


def _module_state(checkpoint: Path) -> dict[str, np.ndarray]:
    """The RL module's weights as the checkpoint stores them."""
    paths = sorted(checkpoint.glob(f"**/rl_module/{MID}/module_state.pkl"))
    assert paths, f"no module state under {checkpoint}"
    with paths[0].open("rb") as f:
        return {k: np.asarray(v) for k, v in pickle.load(f).items()}


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_train_with_frozen_encoder_pooled_cnn_and_screen_value_net(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            "--set",
            f"output.root_dir={root}",
            "--set",
            "stop.iterations=2",
            "--set",
            "checkpoint.every_iterations=1",
            "--set",
            "ppo.train_batch_size_per_learner=128",
            "--set",
            "ppo.minibatch_size=64",
            "--set",
            "env.screen=true",
            "--set",
            "model.screen_cnn=pooled",
            "--set",
            "model.screen_cnn_channels=8",
            "--set",
            "model.value_sees_screen=true",
            "--set",
            "model.encoder_trainable=false",
        ],
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    trial = next(p for p in next(root.iterdir()).iterdir() if p.is_dir() and p.name.startswith("train_trial"))
    first, second = (_module_state(trial / name) for name in ("checkpoint_000000", "checkpoint_000001"))
    assert first["encoder.screen_cnn.convs.6.weight"].shape == (32, 16, 3, 3)
    assert first["value_net.net.0.weight"].shape[1] == int(np.prod(SCREEN_SHAPE)) + first["feature_norm.mean"].size
    encoder_keys = [k for k in first if k.startswith("encoder.")]
    assert encoder_keys
    for key in encoder_keys:
        np.testing.assert_array_equal(first[key], second[key], err_msg=f"frozen encoder moved: {key}")
    assert not np.array_equal(first["decoder.weight"], second["decoder.weight"]), "the decoder must still learn"


def test_same_frame_rounds_widen_stimulation_and_decoder_input() -> None:
    mod = module(same_frame_rounds=3, screen_cnn="pooled", screen_cnn_channels=4)
    obs = observations(5, seed=4)
    inputs = mod.forward_exploration({Columns.OBS: obs})[STIM_DIST_INPUTS]
    assert inputs.shape == (5, 2 * 16 * 3)
    dist = mod.encoder_distribution(inputs)
    stim = dist.sample()
    assert stim.shape == (5, 48)
    # Every round is a whole stimulation: 8 frequencies in 4-40 Hz, then 8 amplitudes in 1-2.5 uA.
    for r in range(3):
        assert torch.all((stim[:, 16 * r : 16 * r + 8] >= 4.0) & (stim[:, 16 * r : 16 * r + 8] <= 40.0))
        assert torch.all((stim[:, 16 * r + 8 : 16 * r + 16] >= 1.0) & (stim[:, 16 * r + 8 : 16 * r + 16] <= 2.5))
    assert mod.decoder.weight.shape == (5, 24) and mod.spike_mean.shape == (24,)
    logits = mod.decode(torch.ones(5, 24))
    assert logits.shape == (5, 5)


def test_each_round_sees_the_screen_through_its_own_view() -> None:
    screen = torch.from_numpy(np.random.default_rng(5).uniform(0, 1, (2, 1, 60, 80)).astype(np.float32))
    for view in ("edge", "contrast"):
        seen = screen_view(screen, view)
        assert seen.shape == screen.shape and float(seen.min()) >= 0.0 and float(seen.max()) <= 1.0
        assert not torch.allclose(seen, screen), view
    obs = observations(3, seed=6)
    views = module(
        same_frame_rounds=3, same_frame_views=("raw", "edge", "contrast"), screen_cnn="pooled", screen_cnn_channels=4
    )
    raw = module(
        same_frame_rounds=3, same_frame_views=("raw", "raw", "raw"), screen_cnn="pooled", screen_cnn_channels=4
    )
    a, b = (m.forward_exploration({Columns.OBS: obs})[STIM_DIST_INPUTS] for m in (views, raw))
    modes_a, modes_b = a[:, :48].reshape(3, 3, 16), b[:, :48].reshape(3, 3, 16)
    torch.testing.assert_close(modes_a[:, 0], modes_b[:, 0])  # the same weights, both raw in round 1
    assert not torch.allclose(modes_a[:, 1], modes_b[:, 1]) and not torch.allclose(modes_a[:, 2], modes_b[:, 2])


def test_same_frame_rounds_train_through_the_learner() -> None:
    config = (
        ClosedLoopPPOConfig()
        .environment(ToyClosedLoopEnv)
        .rl_module(model_config={"same_frame_rounds": 2})
        .training(lr=1e-3)
    )
    learner = config.build_learner(env=ToyClosedLoopEnv())
    mod: ClosedLoopRLModule = learner.module[MID].unwrapped()
    episodes = synthetic_episodes(mod, ToyClosedLoopEnv(), n_steps=128, seed=7)
    results = learner.update(
        episodes=episodes, num_epochs=2, minibatch_size=64, shuffle_batch_per_epoch=True, timesteps={}
    )
    assert math.isfinite(float(results[MID]["total_loss"].peek()))
    assert {"spike_mean_attack", "spike_mean_attack_r2"} <= set(results[MID])
    assert mod.spike_mean_count.item() == 128


def test_same_frame_rounds_are_refused_for_the_direct_policy() -> None:
    with pytest.raises(ValueError, match="same_frame_rounds"):
        experiment_from_dict({"policy": "direct", "model": {"same_frame_rounds": 2}}, [], source="test")


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_train_with_same_frame_rounds_sends_a_stimulation_per_round(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            "--set",
            f"output.root_dir={root}",
            "--set",
            "output.step_log=true",
            "--set",
            "stop.iterations=2",
            "--set",
            "ppo.train_batch_size_per_learner=128",
            "--set",
            "ppo.minibatch_size=64",
            "--set",
            "model.same_frame_rounds=2",
        ],
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    trial = next(p for p in next(root.iterdir()).iterdir() if p.is_dir() and p.name.startswith("train_trial"))
    steps = read_steps(trial)
    assert steps["stim"].shape[1] == 32 and steps["raw_spikes"].shape[1] == 16 and steps["spikes"].shape[1] == 16
    # Two exchanges per step: the rounds' stimulations differ, and so do the culture's replies.
    assert not np.allclose(steps["stim"][:, :16], steps["stim"][:, 16:])
    assert not np.array_equal(steps["raw_spikes"][:, :8], steps["raw_spikes"][:, 8:])
    checkpoint = sorted(trial.glob("checkpoint_*"))[-1]
    assert _module_state(checkpoint)["decoder.weight"].shape == (54, 16)
