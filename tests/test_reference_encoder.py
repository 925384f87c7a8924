"""The reference trainer's encoder options: a frozen encoder, the pooled screen CNN, a value net that sees the screen.

Module-level checks use real modules and a real learner on the toy env; the last test
trains through `spikeloop train` (a subprocess, the simulated culture) with all three
on and reads the two checkpoints back: the encoder did not move, the decoder did.
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

from models.closed_loop_module import STIM_DIST_INPUTS, ClosedLoopRLModule
from models.config import ClosedLoopPPOConfig
from models.direct_module import DirectRLModule
from models.learner import ENCODER_OPTIMIZER
from models.synthetic import ToyClosedLoopEnv, synthetic_episodes
from tests.spikeloop_cli import run_spikeloop

MID = "default_policy"
SCREEN_SHAPE = (60, 80, 1)
OBS_WITH_SCREEN = gym.spaces.Dict({
    "features": gym.spaces.Box(-1.0, 1.0, (6,), np.float32),
    "screen": gym.spaces.Box(0, 255, SCREEN_SHAPE, np.uint8),
})


def module(cls=ClosedLoopRLModule, obs_space=OBS_WITH_SCREEN, **model_config):
    """A closed-loop (or direct) module on a features + screen observation."""
    torch.manual_seed(0)
    return cls(observation_space=obs_space, action_space=gym.spaces.Discrete(5), model_config=model_config)


def observations(n: int, seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {"features": torch.from_numpy(rng.uniform(-1, 1, (n, 6)).astype(np.float32)),
            "screen": torch.from_numpy(rng.integers(0, 256, (n, *SCREEN_SHAPE), dtype=np.uint8))}


def test_frozen_encoder_is_never_updated_and_stimulates_deterministically() -> None:
    config = (ClosedLoopPPOConfig().environment(ToyClosedLoopEnv)
              .rl_module(model_config={"encoder_trainable": False}).training(lr=1e-3))
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

    results = learner.update(episodes=episodes, num_epochs=2, minibatch_size=64, shuffle_batch_per_epoch=True,
                             timesteps={})
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
        (1, 64, (3, 3), (1, 1)), (64, 128, (3, 3), (1, 1)), (128, 256, (3, 3), (1, 1))]
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
def test_train_with_frozen_encoder_pooled_cnn_and_screen_value_net(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop([
        "train", "experiments/quickstart.yaml", "--set", f"output.root_dir={root}",
        "--set", "stop.iterations=2", "--set", "checkpoint.every_iterations=1",
        "--set", "ppo.train_batch_size_per_learner=128", "--set", "ppo.minibatch_size=64",
        "--set", "env.screen=true", "--set", "model.screen_cnn=pooled", "--set", "model.screen_cnn_channels=8",
        "--set", "model.value_sees_screen=true", "--set", "model.encoder_trainable=false",
    ], timeout=400)
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
