"""Shared pieces of the closed-loop acceptance tests (invariant, cluster, training).

Nothing here is a mock: the helpers start real loopback devices (real UDP),
build algorithms through `spikeloop.models.closed_loop.ppo.closed_loop_config` and run code on
the real RLlib env runners. Functions that run on an env runner are pickled by
value (this module is registered with cloudpickle), so the Ray workers need not
import `tests`.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import ray.cloudpickle
import torch
import tree
from ray.rllib.core.columns import Columns

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.ports import free_port
from spikeloop.models.closed_loop.settings import DeviceSettings
from spikeloop.models.columns import (
    EXCHANGE_OK,
    RAW_SPIKES,
    SPIKE_MEAN,
    SPIKE_STD,
    SPIKES,
    STIM,
    STIM_DIST_INPUTS,
    STIM_TIMESTAMP,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SMALL_MODEL = {"encoder_hiddens": [32], "value_hiddens": [32]}
"""Small nets: these tests are about the loop, not about learning."""

STEP_COLUMNS = (
    STIM,
    SPIKES,
    SPIKE_MEAN,
    SPIKE_STD,
    RAW_SPIKES,
    EXCHANGE_OK,
    STIM_TIMESTAMP,
    Columns.ACTION_LOGP,
    Columns.VF_PREDS,
)


def start_loopback(**kwargs: Any) -> LoopbackDevice:
    """A started LoopbackDevice that replies to a free port (the bridge binds that port)."""
    device = LoopbackDevice(**kwargs)
    device.spike_port = free_port()
    return device.start()


def cl1_device(device_id: str, device: LoopbackDevice) -> DeviceSettings:
    """The cl1 DeviceSettings that reach `device` over loopback."""
    return DeviceSettings(
        device_id=device_id,
        backend="cl1",
        address=DeviceAddress(
            host="127.0.0.1",
            stim_port=device.stim_port,
            spike_port=device.spike_port,
            event_port=device.event_port,
            feedback_port=device.feedback_port,
        ),
    )


def _stack(items: list) -> Any:
    return tree.map_structure(lambda *xs: np.stack(xs), *items)


def _observations(episode) -> Any:
    """The observation each step acted on (not the one after the last step), batched."""
    obs = episode.get_observations(slice(0, len(episode)))
    return _stack(list(obs)) if isinstance(obs, list) else obs


def steps_of(episodes: list) -> dict[str, np.ndarray]:
    """Per-step columns of a list of episode chunks, concatenated (order of the list)."""
    cols: dict[str, list] = {k: [] for k in (*STEP_COLUMNS, "action", "obs", "episode", "t")}
    for n, episode in enumerate(episodes):
        if len(episode) == 0:
            continue
        cols["action"].append(np.asarray(episode.get_actions()))
        cols["obs"].append(_observations(episode))
        cols["episode"].append(np.full(len(episode), n))
        cols["t"].append(np.arange(len(episode)))
        for key in STEP_COLUMNS:
            cols[key].append(np.asarray(episode.get_extra_model_outputs(key)))
    out = {k: np.concatenate(v) for k, v in cols.items() if k != "obs"}
    out["obs"] = tree.map_structure(lambda *xs: np.concatenate(xs), *cols["obs"])
    return out


@torch.no_grad()
def replay_logp(module, steps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Recompute, with `module`, what the culture connector computed when it acted.

    Returns the joint log-probability log p(stim | obs) + log p(action | spikes, spike_mean, spike_std) and the
    decoder's logits, from the stored observation, stimulation, spikes, spike mean and std, and action.
    """
    obs = tree.map_structure(torch.as_tensor, steps["obs"])
    encoder = module.encoder_distribution(module._forward({Columns.OBS: obs})[STIM_DIST_INPUTS])
    stim_logp = encoder.logp(torch.as_tensor(steps[STIM]))
    logits = module.decode(
        torch.as_tensor(steps[SPIKES]), torch.as_tensor(steps[SPIKE_MEAN]), torch.as_tensor(steps[SPIKE_STD])
    )
    decoder = module.decoder_distribution(logits)
    action_logp = decoder.logp(torch.as_tensor(steps["action"]))
    return {
        "joint_logp": (stim_logp + action_logp).numpy(),
        "decoder_logits": logits.numpy(),
        "encoder_mean": encoder.deterministic_sample().numpy(),
    }


def sample_and_replay(runner, num_timesteps: int, explore: bool) -> dict[str, Any]:
    """Run on an env runner: sample real steps, then replay them through the runner's own module."""
    import ray as _ray

    episodes = runner.sample(num_timesteps=num_timesteps, explore=explore)
    steps = steps_of(episodes)
    steps.update({f"replay_{k}": v for k, v in replay_logp(runner.module, steps).items()})
    steps["node_id"] = _ray.get_runtime_context().get_node_id()
    steps["worker_index"] = runner.worker_index
    return steps
