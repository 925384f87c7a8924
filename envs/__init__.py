"""spikeloop's VizDoom environment; call `register()` to make it known to Gymnasium and Ray Tune."""

from __future__ import annotations

GYM_ID = "spikeloop/Doom-v0"
RAY_ENV_NAME = "spikeloop-doom"


def _make_env(config: dict | None = None):
    """Ray Tune env creator: the env config's entries are `DoomEnv` keyword arguments."""
    from spikeloop.envs.doom_env import DoomEnv

    return DoomEnv(**dict(config or {}))


def register() -> None:
    """Register `DoomEnv` as Gymnasium id `spikeloop/Doom-v0` and Ray Tune env `spikeloop-doom`; idempotent."""
    import gymnasium

    if GYM_ID not in gymnasium.registry:
        gymnasium.register(id=GYM_ID, entry_point="spikeloop.envs.doom_env:DoomEnv")
    # ray is imported only here: importing the env must not pay for (or require) Ray.
    from ray.tune.registry import register_env

    register_env(RAY_ENV_NAME, _make_env)
