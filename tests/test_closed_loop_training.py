"""A short closed-loop PPO training run on the simulated culture, checkpointed and restored.

Two iterations of real sampling (VizDoom `basic`, a simulated culture started for the env
runner) and real PPO updates; the losses are finite, the spike-centring buffer has learnt a
non-zero mean, and a checkpoint restores into a new algorithm (`Algorithm.from_checkpoint`)
with identical module weights and buffers, which trains on and syncs them to its env runner.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from ray.rllib.algorithms.algorithm import Algorithm

from experiments.closed_loop.ppo import closed_loop_config, finish
from experiments.closed_loop.settings import CultureSettings, DeviceSettings
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
