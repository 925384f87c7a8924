"""Assemble the closed-loop PPO: env, module, learner, culture connector, callbacks.

`closed_loop_config` is the one place where the pieces meet; the experiment
runner (and tests) build every algorithm through it. `finish` tells the
devices that training is over: the simulated ones of a trial when the trial
ends; a hardware device, which serves trial after trial of a sweep (and
Tune's retries), is told once, by the driver, when the whole run ends
(`tell_devices_training_complete`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import ray
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.models.closed_loop.callbacks import ClosedLoopCallbacks
from spikeloop.models.closed_loop.connector import make_culture_connector
from spikeloop.models.closed_loop.experiment_config import ClosedLoopExperimentConfig
from spikeloop.models.closed_loop.link import close_link, current_link
from spikeloop.models.closed_loop.settings import CultureSettings
from spikeloop.models.direct_module import DirectRLModule

log = logging.getLogger(__name__)


POLICIES = ("closed_loop", "direct")
"""`closed_loop`: encoder -> culture -> decoder. `direct`: features -> actions, no culture (the control)."""


def closed_loop_config(
    *,
    culture: CultureSettings,
    policy: str = "closed_loop",
    env: str = "spikeloop-doom",
    env_config: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    num_env_runners: int = 1,
    training: dict[str, Any] | None = None,
    seed: int | None = None,
    view: ViewSettings | None = None,
    sample_timeout_s: float | None = None,
) -> ClosedLoopExperimentConfig:
    """A closed-loop PPO config wired to the culture (one device per env runner), or the direct control.

    `sample_timeout_s`: how long RLlib waits for an env runner's sample (models/closed_loop/sampling.py);
    None keeps RLlib's default, for tests that build toy configs.
    """
    from spikeloop.envs import register

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    register()  # env runners resolve the env by name; restoring a checkpoint needs it too
    direct = policy == "direct"
    runner_resources = {} if direct else culture.runner_resources()
    env_config = dict(env_config or {})
    if direct:
        view = None  # the live view shows a culture's stimulation and spikes: there are none
    if view is not None and view.enabled:
        env_config["render_mode"] = "rgb_array"  # RGB frames only for a live view: GRAY8 is cheaper to copy
    config = (
        ClosedLoopExperimentConfig()
        .environment(env, env_config=env_config)
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=1,
            custom_resources_per_env_runner=runner_resources,
            num_cpus_per_env_runner=1 if num_env_runners else 0,
            rollout_fragment_length="auto",
        )
        .rl_module(model_config=dict(model_config or {}))
        .callbacks(ClosedLoopCallbacks)
        .debugging(seed=seed)
    )
    if direct:
        config.rl_module(
            rl_module_spec=RLModuleSpec(module_class=DirectRLModule, model_config=dict(model_config or {}))
        )
    else:
        # The connector's own generator (the `random` ablation's noise) follows the run's seed too.
        config.closed_loop(culture_connector=functools.partial(make_culture_connector, seed=seed))
    if not direct and culture.on_device_loss in ("stop", "wait"):
        # RLlib's default (restart failed env runners) swallows an env runner's error, waits 60 s and
        # restarts it: a lost device would never stop the experiment. Let the error end the run (with
        # `wait`, once the device stayed silent for max_wait_s).
        config.fault_tolerance(restart_failed_env_runners=False)
    if sample_timeout_s is not None:
        config.env_runners(sample_timeout_s=sample_timeout_s)
    if training:
        config.training(**training)
    config.experiment(culture_settings=None if direct else culture, live_view=view)
    return config


def _finish_runner(env_runner, reason: str, total_steps: int, total_episodes: int, hardware: bool) -> bool:
    try:
        link = current_link()
    except RuntimeError:
        return False  # e.g. the local env runner, which drives no culture
    told = hardware or link.device.simulated
    events = (
        [("training_complete", {"total_episodes": total_episodes, "total_steps": total_steps, "reason": reason})]
        if told
        else []
    )
    link.send_events(events)
    close_link()
    return told


def finish(
    algo, reason: str = "completed", total_steps: int = 0, total_episodes: int = 0, hardware: bool = True
) -> int:
    """Close every culture link, sending `training_complete` first; returns how many devices were told.

    `hardware=False` (a trial of a run, whose driver tells its hardware devices at the very end) tells only the
    simulated devices, which end with the trial anyway.
    """
    results = algo.env_runner_group.foreach_env_runner(
        lambda runner: _finish_runner(runner, reason, total_steps, total_episodes, hardware), local_env_runner=True
    )
    return sum(bool(r) for r in results)


def tell_devices_training_complete(culture: CultureSettings, data: dict[str, Any]) -> list[str]:
    """Send `training_complete` to every hardware device, from a task on its node; returns one line per device.

    The run's driver calls this once at the end: trials leave hardware devices running, because the device program
    exits on `training_complete` and the next trial of a sweep (or Tune's retry) needs it.
    """
    from spikeloop.bridge.trainer.actor import DEVICE_RESOURCE_SHARE

    tasks = {
        dev.device_id: _tell_device.options(resources={dev.resource: DEVICE_RESOURCE_SHARE}).remote(
            culture.bridge_config(dev), data
        )
        for dev in culture.hardware
    }
    lines = []
    for device_id, task in tasks.items():
        try:
            lines.append(ray.get(task, timeout=120))
        except Exception as exc:  # one device that cannot be told must not keep the others from being told
            lines.append(f"device {device_id!r}: could not send training_complete ({type(exc).__name__}: {exc})")
    return lines


def restore(algo, checkpoint_path: str) -> None:
    """Restore a checkpoint and make sure every env runner acts with the restored weights.

    RLlib 2.60 pushes restored weights to remote env runners without waiting and the
    update can be lost; the first iteration would then stimulate the culture with an
    untrained encoder and a zero spike mean. A blocking sync closes that gap.
    """
    algo.restore_from_path(checkpoint_path)
    sync_env_runners(algo)


def sync_env_runners(algo) -> None:
    """Block until every env runner holds the learner's weights (RLlib's own sync after a restore does not wait)."""
    if algo.env_runner_group is not None and algo.learner_group is not None:
        algo.env_runner_group.sync_weights(
            from_worker_or_learner_group=algo.learner_group, inference_only=True, timeout_seconds=60
        )


@ray.remote(num_cpus=0, max_retries=0)
def _tell_device(config, data: dict[str, Any]) -> str:
    """Send one `training_complete` through the device's bridge, or through a bridge of our own if none runs."""
    import time

    from spikeloop.bridge.trainer.actor import find_bridge
    from spikeloop.bridge.trainer.core import BridgeCore

    try:
        ray.get(find_bridge(config.device_id).event.remote("training_complete", data), timeout=30)
        how = "through its bridge"
    except Exception:
        deadline = time.monotonic() + 15.0  # the last trial's bridge may still hold the spike port for a moment
        while True:
            try:
                core = BridgeCore(config)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
        with core:
            core.event("training_complete", data)
        how = f"from {core.bind_host}:{config.address.spike_port}"
    return (
        f"device {config.device_id!r} at {config.address.host}:{config.address.event_port}: training_complete "
        f"sent {how} "
        f"({data.get('reason')})"
    )
