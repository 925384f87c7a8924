"""Assemble the closed-loop PPO: env, module, learner, culture connector, callbacks.

`closed_loop_config` is the one place where the pieces meet; the experiment
runner (and tests) build every algorithm through it. `finish` tells every
device that training is over.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from experiments.culture_connector import make_culture_connector
from experiments.culture_link import CultureSettings, close_link, current_link
from experiments.live_view.settings import VIEW_SETTINGS_ATTR, ViewSettings
from experiments.loop_callbacks import CULTURE_SETTINGS_ATTR, ClosedLoopCallbacks
from models.config import ClosedLoopPPOConfig
from models.direct_module import DirectRLModule

log = logging.getLogger(__name__)

DEVICE_SLOT_RESOURCE = "cl1_slot"
"""Every node that owns CL1 devices advertises one of these per device; each env runner takes one."""


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
) -> ClosedLoopPPOConfig:
    """A ClosedLoopPPOConfig wired to the culture (one device per env runner), or the direct control."""
    from envs import register

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    register()  # env runners resolve the env by name; restoring a checkpoint needs it too
    direct = policy == "direct"
    hardware = not direct and any(not d.simulated for d in culture.devices)
    runner_resources = {DEVICE_SLOT_RESOURCE: 1} if hardware else {}
    env_config = dict(env_config or {})
    if direct:
        view = None  # the live view shows a culture's stimulation and spikes: there are none
    if view is not None and view.enabled:
        env_config["render_mode"] = "rgb_array"  # RGB frames only for a live view: GRAY8 is cheaper to copy
    config = (
        ClosedLoopPPOConfig()
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
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=DirectRLModule, model_config=dict(model_config or {})))
    else:
        config.closed_loop(culture_connector=make_culture_connector)
    if not direct and culture.on_device_loss == "stop":
        # RLlib's default (restart failed env runners) swallows an env runner's error, waits 60 s and
        # restarts it: a lost device would never stop the experiment. Let the error end the run.
        config.fault_tolerance(restart_failed_env_runners=False)
    if training:
        config.training(**training)
    setattr(config, CULTURE_SETTINGS_ATTR, None if direct else culture)
    setattr(config, VIEW_SETTINGS_ATTR, view if view is not None and view.enabled else None)
    return config


def _finish_runner(env_runner, reason: str, total_steps: int, total_episodes: int) -> bool:
    try:
        link = current_link()
    except RuntimeError:
        return False  # e.g. the local env runner, which drives no culture
    link.flush([], [("training_complete", {"total_episodes": total_episodes, "total_steps": total_steps,
                                            "reason": reason})])
    close_link()
    return True


def finish(algo, reason: str = "completed", total_steps: int = 0, total_episodes: int = 0) -> int:
    """Send `training_complete` to every culture and close the links; returns how many were told."""
    results = algo.env_runner_group.foreach_env_runner(
        lambda runner: _finish_runner(runner, reason, total_steps, total_episodes), local_env_runner=True
    )
    return sum(bool(r) for r in results)


def restore(algo, checkpoint_path: str) -> None:
    """Restore a checkpoint and make sure every env runner acts with the restored weights.

    RLlib 2.60 pushes restored weights to remote env runners without waiting and the
    update can be lost; the first iteration would then stimulate the culture with an
    untrained encoder and a zero spike mean. A blocking sync closes that gap.
    """
    algo.restore_from_path(checkpoint_path)
    if algo.env_runner_group is not None and algo.learner_group is not None:
        algo.env_runner_group.sync_weights(
            from_worker_or_learner_group=algo.learner_group, inference_only=True, timeout_seconds=60
        )

