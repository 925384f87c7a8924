"""A short closed-loop PPO training run on the simulated culture, checkpointed and restored.

Two iterations of real sampling (VizDoom `basic`, a simulated culture started for the env
runner) and real PPO updates; the losses are finite, the spike-centring buffer has learnt a
non-zero mean, and a checkpoint restores into a new algorithm (`Algorithm.from_checkpoint`)
with identical module weights and buffers, which trains on and syncs them to its env runner.
The restored env runner, synced as `--resume` syncs it, acts exactly as before the save on the
same observations and spikes: the running statistics (feature normalisation, spike mean and
std) came back with the weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from ray.rllib.algorithms.algorithm import Algorithm

from spikeloop.models.closed_loop.ppo import closed_loop_config, finish, sync_env_runners
from spikeloop.models.closed_loop.settings import CultureSettings, DeviceSettings
from tests.support.closed_loop_helpers import SMALL_MODEL

TRAINING = {"train_batch_size_per_learner": 256, "minibatch_size": 64, "num_epochs": 1}
LOSS_KEYS = ("total_loss", "policy_loss", "vf_loss")


def _config(seed: int = 11):
    return closed_loop_config(
        culture=CultureSettings(
            devices=(DeviceSettings(backend="sim", artifact_wait_ms=10.0, collect_window_ms=20.0),)
        ),
        env_config={"scenario": "basic"},
        model_config=SMALL_MODEL,
        num_env_runners=1,
        training=TRAINING,
        seed=seed,
    )


def _learner_state(algo) -> dict[str, np.ndarray]:
    state = algo.learner_group.get_state()["learner"]["rl_module"]["default_policy"]
    return {k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


def _runner_state(runner) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in runner.module.state_dict().items()}


def _acting_batch(algo, n: int = 16) -> tuple[object, np.ndarray]:
    """n observations of the env runner's observation space and n spike vectors, fixed by their seeds."""
    from gymnasium.vector.utils import batch_space

    ((space, n_inputs),) = algo.env_runner_group.foreach_env_runner(
        lambda runner: (runner.module.observation_space, runner.module.n_decoder_inputs), local_env_runner=False
    )
    batched = batch_space(space, n)
    batched.seed(3)
    return batched.sample(), np.random.default_rng(3).poisson(3.0, size=(n, n_inputs)).astype(np.float32)


def _acts(runner, obs, spikes) -> dict[str, np.ndarray]:
    """What the env runner's module does with these observations and spikes (deterministic acting)."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.torch_utils import convert_to_torch_tensor

    from spikeloop.models.columns import STIM_DIST_INPUTS

    module = runner.module
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: convert_to_torch_tensor(obs)})
        logits = module.decode(torch.as_tensor(spikes))
        action, _ = module.act(logits, explore=False)
    return {
        "stim_dist_inputs": out[STIM_DIST_INPUTS].numpy(),
        "value": out[Columns.VF_PREDS].numpy(),
        "action_logits": logits.numpy(),
        "action": action.numpy(),
    }


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_two_iterations_checkpoint_and_restore(ray_session, tmp_path):
    algo = _config().build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        trained = _learner_state(algo)
        (acting,) = algo.env_runner_group.foreach_env_runner(_runner_state, local_env_runner=False)
        obs, spikes = _acting_batch(algo)
        (acted,) = algo.env_runner_group.foreach_env_runner(
            lambda runner: _acts(runner, obs, spikes), local_env_runner=False
        )
        path = algo.save_to_path(str(tmp_path.absolute() / "checkpoint"))
        finish(algo, total_steps=sum(r["env_runners"]["num_env_steps_sampled"] for r in results))
    finally:
        algo.stop()

    for result in results:
        assert result["env_runners"]["num_env_steps_sampled"] >= TRAINING["train_batch_size_per_learner"]
        learner = result["learners"]["default_policy"]
        for key in LOSS_KEYS:
            assert math.isfinite(float(learner[key])), f"{key} = {learner[key]}"
        assert result["env_runners"]["culture/exchange_ok_fraction"] == 1.0
    # The running spike mean learnt from the culture's answers, and the env runner acts with it.
    assert np.abs(trained["spike_mean"]).sum() > 0 and trained["spike_mean_count"] >= 512
    _assert_same(acting, trained)  # the weights the env runner acts with, centring mean included

    restored = Algorithm.from_checkpoint(path)
    try:
        _assert_same(_learner_state(restored), trained)
        # Synced as `--resume` syncs (spikeloop.models.closed_loop.ppo.restore), the env runner acts exactly as before
        # the save: same stimulation distribution, value, action logits and action on the same inputs.
        sync_env_runners(restored)
        (restored_acted,) = restored.env_runner_group.foreach_env_runner(
            lambda runner: _acts(runner, obs, spikes), local_env_runner=False
        )
        _assert_same(restored_acted, acted)
        assert np.abs(trained["feature_norm.mean"]).sum() > 0 and np.abs(trained["spike_sq_mean"]).sum() > 0
        # NOTE: right after the restore the remote env runner does NOT reliably hold these weights:
        # RLlib 2.60's `restore_from_path` syncs them fire-and-forget and the update is often lost
        # (seen in 2 of 3 runs), so the first iteration after a resume can sample with fresh weights.
        # What is checked: the restored learner trains on, and the runner then acts with its weights.
        again = restored.train()
        assert math.isfinite(float(again["learners"]["default_policy"]["total_loss"]))
        resumed = _learner_state(restored)
        assert not np.array_equal(resumed["spike_mean"], trained["spike_mean"])
        assert (
            resumed["spike_mean_count"] == trained["spike_mean_count"] + again["env_runners"]["num_env_steps_sampled"]
        )
        (restored_acting,) = restored.env_runner_group.foreach_env_runner(_runner_state, local_env_runner=False)
        _assert_same(restored_acting, resumed)
        finish(restored)
    finally:
        restored.stop()
