"""A real ClosedLoopPPOLearner, built from the config with a toy env, updated on closed-loop episodes."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import DEFAULT_OPTIMIZER
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import SPIKES, STIM_TIMESTAMP
from spikeloop.models.learner import DECODER_OPTIMIZER, ENCODER_OPTIMIZER, ClosedLoopPPOLearner, _scaled_lr
from spikeloop.models.ppo_config import ClosedLoopPPOConfig
from tests.support.toy_loop import ToyClosedLoopEnv, closed_loop_step, synthetic_episodes

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MID = "default_policy"
ENCODER_LR = 1e-3 * ClosedLoopPPOConfig().encoder_lr_multiplier
"""The encoder learning rate of the learners built here with lr=1e-3."""


def build(**training) -> ClosedLoopPPOLearner:
    config = ClosedLoopPPOConfig().environment(ToyClosedLoopEnv).training(**training)
    return config.build_learner(env=ToyClosedLoopEnv())


def peek(results: dict, *keys: str) -> float:
    value = results
    for key in keys:
        value = value[key]
    return float(value.peek())


def update(learner: ClosedLoopPPOLearner, episodes) -> dict:
    return learner.update(
        episodes=episodes, num_epochs=2, minibatch_size=64, shuffle_batch_per_epoch=True, timesteps={}
    )


@pytest.fixture(scope="module")
def learner() -> ClosedLoopPPOLearner:
    return build(lr=1e-3)


def test_defaults() -> None:
    config = ClosedLoopPPOConfig()
    # Kept from the reference trainer.
    assert (config.gamma, config.lambda_, config.clip_param, config.vf_loss_coeff) == (0.997, 0.95, 0.2, 0.3)
    assert (config.decoder_entropy_coeff, config.encoder_entropy_coeff, config.grad_clip) == (0.02, 0.0, 3.0)
    # Measured to learn (docs/architecture.md, "The learner").
    assert (config.lr, config.encoder_lr_multiplier, config.decoder_lr_multiplier) == (1e-2, 0.3, 1.0)
    assert (config.minibatch_size, config.num_epochs, config.train_batch_size_per_learner) == (128, 4, 512)
    assert config.ratio_clipping == "factored"
    with pytest.raises(ValueError, match="ratio_clipping"):
        ClosedLoopPPOConfig().environment(ToyClosedLoopEnv).training(ratio_clipping="both").validate()


def test_config_rejects_rllib_entropy_coeff_and_vector_envs() -> None:
    with pytest.raises(ValueError, match="decoder_entropy_coeff"):
        ClosedLoopPPOConfig().environment(ToyClosedLoopEnv).training(entropy_coeff=0.01).validate()
    with pytest.raises(ValueError, match="num_envs_per_env_runner"):
        ClosedLoopPPOConfig().environment(ToyClosedLoopEnv).env_runners(num_envs_per_env_runner=2).validate()


def test_separate_optimizers_and_learning_rates(learner) -> None:
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    ids = {}
    for name, lr, params in (
        (ENCODER_OPTIMIZER, ENCODER_LR, module.encoder_parameters()),
        (DECODER_OPTIMIZER, 1e-3, module.decoder_parameters()),
        (DEFAULT_OPTIMIZER, 1e-3, module.value_parameters()),
    ):
        optimizer = learner.get_optimizer(MID, name)
        assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(lr)], name
        ids[name] = {id(p) for g in optimizer.param_groups for p in g["params"]}
        assert ids[name] == {id(p) for p in params}, name
    assert not (ids[ENCODER_OPTIMIZER] & ids[DECODER_OPTIMIZER] or ids[DECODER_OPTIMIZER] & ids[DEFAULT_OPTIMIZER])
    assert _scaled_lr([[0, 1e-3], [1000, 1e-4]], 4.0) == [[0, 4e-3], [1000, 4e-4]]


def test_update_on_episodes(learner) -> None:
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    env = ToyClosedLoopEnv()
    episodes = synthetic_episodes(module, env, n_steps=256, seed=1)
    before = {k: np.array(v, copy=True) for k, v in module.get_state().items()}
    # Read before updating: PPO's learner connector appends a bootstrap step to the episodes in place.
    used = np.concatenate([e.get_extra_model_outputs(SPIKES) for e in episodes])
    results = update(learner, episodes)
    metrics = results[MID]
    for key in (
        "policy_loss",
        "vf_loss",
        "encoder_entropy",
        "decoder_entropy",
        "mean_kl_loss",
        "clip_fraction",
        "vf_explained_var",
        "decoder_weight_norm",
        "total_loss",
    ):
        assert math.isfinite(peek(results, MID, key)), key
    assert peek(results, MID, "encoder_learning_rate") == pytest.approx(ENCODER_LR)
    assert peek(results, MID, "decoder_learning_rate") == pytest.approx(1e-3)
    assert peek(results, MID, "default_optimizer_learning_rate") == pytest.approx(1e-3)
    for part in ("encoder", "decoder"):
        for stat in ("mean", "std", "clip_fraction"):
            assert math.isfinite(peek(results, MID, f"{part}_ratio_{stat}")), (part, stat)
    assert 0 < peek(results, MID, "gradients_global_norm")

    # The spike mean: the first batch sets it to the mean of the spikes actually used (each step once).
    assert used.shape == (256, len(SPIKE_GROUP_NAMES))
    np.testing.assert_allclose(module.spike_mean.numpy(), used.mean(0), rtol=1e-5)
    state = module.get_state()
    np.testing.assert_allclose(state["spike_mean"], used.mean(0), rtol=1e-5)
    assert state["spike_mean_count"] == 256
    assert "spike_mean" in learner.get_state()["rl_module"][MID]
    for i, name in enumerate(SPIKE_GROUP_NAMES):
        assert peek(metrics, f"spike_mean_{name}") == pytest.approx(float(used.mean(0)[i]), rel=1e-5)

    # Every network moved.
    for prefix in ("encoder.", "decoder.", "value_net."):
        assert any(not np.allclose(before[k], state[k]) for k in state if k.startswith(prefix)), prefix


def test_feature_statistics_move_after_the_update_not_before() -> None:
    """The loss sees the feature normalisation the episodes were acted with; the batch is folded in afterwards."""
    learner = build(lr=1e-3)
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    env = ToyClosedLoopEnv()
    for seed in (3, 4):  # the first batch sets the statistics outright, the second moves them
        episodes = synthetic_episodes(module, env, n_steps=128, seed=seed)
        count = module.feature_norm.count.item()
        mean = module.feature_norm.mean.clone()
        results = learner.update(episodes=episodes, num_epochs=1, minibatch_size=None, timesteps={})
        # One minibatch before any gradient step: acting and the loss agree, each part's ratio is 1.
        for part in ("encoder", "decoder"):
            assert peek(results, MID, f"{part}_ratio_mean") == pytest.approx(1.0, abs=1e-5), part
            assert peek(results, MID, f"{part}_ratio_std") == pytest.approx(0.0, abs=1e-4), part
        assert module.feature_norm.count.item() == count + 128
        assert not torch.equal(module.feature_norm.mean, mean)


def test_update_on_a_ready_batch_skips_connectors() -> None:
    # A pre-made train batch (advantages included) bypasses the learner connector, hence also the spike mean.
    learner = build()
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(64, 59, generator=g) * 2 - 1
    columns = closed_loop_step(module, {Columns.OBS: obs}, g)
    batch = SampleBatch(
        {
            Columns.OBS: obs.numpy(),
            **{k: v.numpy() for k, v in columns.items()},
            Postprocessing.ADVANTAGES: torch.randn(64, generator=g).numpy(),
            Postprocessing.VALUE_TARGETS: torch.randn(64, generator=g).numpy(),
        }
    )
    results = learner.update(batch=MultiAgentBatch({MID: batch}, env_steps=64), timesteps={})
    assert math.isfinite(peek(results, MID, "total_loss"))
    assert module.spike_mean_count.item() == 0


def test_frozen_decoder_stays_put_and_update_runs() -> None:
    config = ClosedLoopPPOConfig().environment(ToyClosedLoopEnv).rl_module(model_config={"decoder_frozen": True})
    learner = config.build_learner(env=ToyClosedLoopEnv())
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    weight = module.decoder.weight.detach().clone()
    results = update(learner, synthetic_episodes(module, ToyClosedLoopEnv(), n_steps=64, seed=2))
    assert math.isfinite(peek(results, MID, "total_loss"))
    torch.testing.assert_close(module.decoder.weight, weight)


def test_checkpoint_round_trip_keeps_spike_mean(learner, tmp_path) -> None:
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    module.update_spike_mean(torch.full((4, len(SPIKE_GROUP_NAMES)), 2.5))
    module.value_net.update_target_stats(torch.tensor([-500.0, -410.0, -430.0]))
    learner.save_to_path(tmp_path)
    restored = build(lr=1e-3)
    restored.restore_from_path(tmp_path)
    restored_module: ClosedLoopRLModule = restored.module[MID].unwrapped()
    torch.testing.assert_close(restored_module.spike_mean, module.spike_mean)
    assert restored_module.spike_mean_count.item() == module.spike_mean_count.item()
    for name in ("target_mean", "target_std", "target_count"):  # the value scale travels with the weights
        torch.testing.assert_close(getattr(restored_module.value_net, name), getattr(module.value_net, name))
    assert restored.get_optimizer(MID, ENCODER_OPTIMIZER).param_groups[0]["lr"] == pytest.approx(ENCODER_LR)


def test_gradient_clip_is_one_global_norm_over_encoder_decoder_and_value(learner) -> None:
    """The reference's clip: all of the module's gradients scaled together to norm 3, proportions kept."""
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    grads, before = {}, {}
    # Very different magnitudes per part: a clip per optimizer would scale each part on its own.
    for params, value in (
        (module.encoder_parameters(), 10.0),
        (module.decoder_parameters(), 0.1),
        (module.value_parameters(), 100.0),
    ):
        for param in params:
            key = learner.get_param_ref(param)
            grads[key] = torch.full_like(param, value)
            before[key] = grads[key].clone()
    config = learner.config.get_config_for_module(MID)
    assert config.grad_clip == 3.0
    clipped = learner.postprocess_gradients_for_module(module_id=MID, config=config, module_gradients_dict=grads)
    total = torch.sqrt(sum(g.pow(2).sum() for g in clipped.values()))
    assert float(total) == pytest.approx(3.0, rel=1e-4)
    factors = [float((clipped[key] / before[key]).mean()) for key in before]
    assert max(factors) == pytest.approx(min(factors), rel=1e-5), "every part scaled by the same factor"


def test_learning_rate_schedule_reaches_every_optimizer_scaled() -> None:
    """ppo.lr as [[env_steps, rate], ...]: each optimizer follows it, times its multiplier."""
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = build(lr=[[0, 1e-2], [1000, 1e-3]])
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    episodes = synthetic_episodes(module, ToyClosedLoopEnv(), n_steps=64, seed=4)
    multiplier = ClosedLoopPPOConfig().encoder_lr_multiplier
    for steps, rate in ((0, 1e-2), (500, 5.5e-3), (1000, 1e-3)):
        results = learner.update(
            episodes=episodes,
            num_epochs=1,
            minibatch_size=64,
            shuffle_batch_per_epoch=False,
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: steps},
        )
        assert peek(results, MID, "default_optimizer_learning_rate") == pytest.approx(rate), steps
        assert peek(results, MID, "encoder_learning_rate") == pytest.approx(rate * multiplier), steps


def test_a_schedule_that_holds_the_rate_updates_exactly_as_the_rate_itself() -> None:
    """Until a schedule leaves its first rate, the weights are the constant rate's to the last bit.

    RLlib hands an optimizer a schedule's first rate as a float32 tensor (0.01 becomes 0.0099999998) until its
    first update; a run with a schedule then parted from its constant-rate twin (docs/benchmarks.md, "The rate
    held to the default budget").
    """
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    weights = []
    for lr in (1e-2, [[0, 1e-2], [20480, 1e-2], [40960, 1e-3]]):
        torch.manual_seed(11)
        learner = build(lr=lr)
        module: ClosedLoopRLModule = learner.module[MID].unwrapped()
        for name in (ENCODER_OPTIMIZER, DECODER_OPTIMIZER, DEFAULT_OPTIMIZER):
            rate = learner.get_optimizer(MID, name).param_groups[0]["lr"]
            assert type(rate) is float, (name, type(rate))
        for steps in (512, 1024, 20480):
            episodes = synthetic_episodes(module, ToyClosedLoopEnv(), n_steps=64, seed=steps)
            learner.update(
                episodes=episodes,
                num_epochs=2,
                minibatch_size=32,
                shuffle_batch_per_epoch=False,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: steps},
            )
        weights.append(module.get_state())
    constant, scheduled = weights
    assert constant.keys() == scheduled.keys()
    for key in constant:
        assert np.array_equal(constant[key], scheduled[key]), key


def test_wire_timestamps_never_reach_the_learner_batch() -> None:
    """Env runners record each stimulation's uint64 wire timestamp; the learner drops it before the batch becomes
    tensors: torch on CUDA cannot index a uint64 tensor, and a GPU learner failed in its first minibatch shuffle."""
    learner = build(lr=1e-3)
    module: ClosedLoopRLModule = learner.module[MID].unwrapped()
    env = ToyClosedLoopEnv()
    episodes = synthetic_episodes(module, env, n_steps=64, seed=5, wire_timestamps=True)
    assert all(e.get_extra_model_outputs(STIM_TIMESTAMP).dtype == np.uint64 for e in episodes)
    batch = learner._learner_connector(
        rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=learner.metrics
    )
    assert STIM_TIMESTAMP not in batch[MID]
    unsigned = {torch.uint16, torch.uint32, torch.uint64}
    assert not [k for k, v in batch[MID].items() if isinstance(v, torch.Tensor) and v.dtype in unsigned]
    results = update(learner, synthetic_episodes(module, env, n_steps=64, seed=6, wire_timestamps=True))
    assert math.isfinite(peek(results, MID, "total_loss"))
