"""The learning benchmark's conditions: what each one runs, as an (unvalidated) experiment dict.

Apart from the benchmark itself (experiments/benchmarks/learning.py) so that the analysis package can read a condition's
policy and device without importing the benchmark, which imports the analysis.
"""

from __future__ import annotations

import copy
from typing import Any

CONDITIONS = ("direct", "transparent", "sim", "zero", "random")
"""The default conditions."""
EXTRA_CONDITIONS = ("sim_reference",)
"""Conditions run only when asked for (the feedback controls below too)."""
SCENARIO = "basic"
ABLATION_CONDITIONS = ("zero", "random")
"""Conditions whose decoder reads zeros or Poisson noise (the `ablation` setting) in place of the culture's counts.

No culture's counts reach their decoder, the learner or the env (the counts go only to the live meter and the
step records), so they run against the `zero` backend rather than a simulated culture whose answer would be thrown
away: the same episodes, about 30% sooner (docs/benchmarks.md, "The ablations without a simulated culture"). With
one seed they play the same game and draw the same learner streams as `sim`, so they are `sim`'s paired partners
(`pairing_key`)."""
TUNING_SEEDS = range(5)
"""Seeds 0-4: the seeds every setting was chosen on. The learner's settings (learning rate and its schedule, network
sizes, the encoder's and decoder's defaults), the control cultures' knobs and the feedback settle time were each
picked while reading `bench learning` / `bench feedback` runs of these seeds (and the quickstart's seed 0), so a
result on them is not a fresh test of those choices."""
FRESH_FIRST_SEED = 100
"""Where the benchmarks' seeds start by default (`--first-seed`): held apart from `TUNING_SEEDS`."""

FEEDBACK_ON: dict[str, Any] = {
    "use_reward_feedback": False,
    "use_episode_feedback": False,
    "surprise": {"enabled": False},
}
"""Feedback in the "on" controls: the event table at its base values. On `basic` with the shaped reward every step
reward and every episode return is below 0 (each shot costs 10, the episode's end 5 per HP left), so reward-sign and
episode feedback carry no good news at all; the event table sends enemy_kill (good news) on a kill and ammo_waste
(bad news) on a missed shot, whatever the TD error."""
FEEDBACK_SETTLE_MS = 100.0
"""The settle time of the "_settle" controls: with the 50 ms artifact wait, a collection window starts 150 ms or
more after the last feedback pulse, past the network burst a pulse sets off (docs/architecture.md)."""
FEEDBACK_CONDITIONS: dict[str, tuple[str, bool, bool]] = {
    "dopamine_on_settle": ("dopamine_stdp", True, True),
    "dopamine_on": ("dopamine_stdp", True, False),
    "dopamine_off": ("dopamine_stdp", False, False),
    "stdp_on": ("stdp", True, False),
    "stdp_off": ("stdp", False, False),
    "none_on": ("none", True, False),
    "none_on_settle": ("none", True, True),
    "none_off": ("none", False, False),
    "dopamine_frozen_on_settle": ("none", True, True),
}
"""Feedback controls: condition -> (the culture's plasticity rule, feedback on, device feedback_settle_ms on)."""
CULTURE_OF: dict[str, str] = {"dopamine_frozen_on_settle": "dopamine_stdp"}
"""Conditions that run another rule's control culture (`CONTROL_CULTURES` key) under their own rule.

`dopamine_frozen_on_settle` is the positive control's culture with its weights fixed, feedback on and the direct
path cut: feedback's pulses still reach the culture, but nothing can change it. Against `dopamine_on_settle` it
separates the plastic path from the pulses themselves; against `dopamine_off` (no feedback, so no dopamine and no
weight change: the same frozen network) it measures what the pulses alone do."""
CONTROL_CULTURES: dict[str, dict[str, Any]] = {
    "dopamine_stdp": {"excitatory_weight_mv": 6.0, "maturation_ms": 0.0},
    "stdp": {},
    "none": {},
}
"""Culture knobs of each rule's feedback controls beyond the rule (`--culture` goes on top).

The positive control runs a fresh (no maturation), over-excited culture (excitatory weights 6 mV, not 4) so that
feedback has room to matter: on today's culture the decoder learns without any culture plasticity (pilot: `none_off`
seed 0 kill rate 0.99; `dopamine_off` seed 0 0.97 at 16,896 env steps). In the over-excited culture a stimulation
sets off a network-wide burst, and a ridge readout of one window's spike-group counts recovers none of the
stimulation while the weights stay frozen, as they do under `dopamine_off` (held-out R^2 summed over the 16 inputs,
at most 16; seeds 0-4: -0.10 to 0.29). With kill feedback releasing dopamine its weights fell (mean 6.0 -> 4.3 mV)
and the R^2 rose from -0.44 to 1.05 within 10 kills; without feedback it stayed at -0.43 (seed 0; open loop, outside
training). That is a global calming, not shown to be reward-specific; whether it becomes a difference in learning
is what `spikeloop bench feedback` measures (docs/benchmarks.md, "feedback controls": on the tuning seeds 0-4 it
does, through the weight change, the plastic path +53.4 against the pulses alone +9.2; on fresh seeds 100-104
feedback on against off gave +50.3, p 0.028, and the frozen-weights comparison has not been run there).
The negative controls run today's culture."""


def control_culture(condition: str) -> dict[str, Any]:
    """The control culture's knobs of a feedback condition (before `--culture` and the rule go on top)."""
    return CONTROL_CULTURES[CULTURE_OF.get(condition, FEEDBACK_CONDITIONS[condition][0])]


ALL_CONDITIONS = CONDITIONS + EXTRA_CONDITIONS + tuple(FEEDBACK_CONDITIONS)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `over` merged in (nested dicts merged, everything else replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


BASE_EXPERIMENT: dict[str, Any] = {"env": {"scenario": SCENARIO}, "resources": {"num_env_runners": 1}}
"""What every condition starts from: the default learner, model and device settings (models/ppo_config.py,
models/module_config.py, the sim device's reference timing), so the benchmark measures what a user gets.
An optional "sim_device" key is merged into the sim device entry."""


NO_CULTURE_DEVICE: dict[str, Any] = {"device_id": "zero", "backend": "zero", "realtime": False}
"""The device of the `ABLATION_CONDITIONS`: every reply zero counts, as fast as possible (the sim device's knobs do not apply)."""


def pairing_key(condition: str) -> tuple[str, str]:
    """What two conditions share when seed k of one is paired with seed k of the other: policy and culture.

    An ablation counts as the culture it replaces (`sim`'s), since its seed's game and learner streams are `sim`'s."""
    data = experiment_dict(condition, 0)
    if condition in ABLATION_CONDITIONS:
        return data.get("policy", "closed_loop"), "sim"
    devices = data.get("devices") or [{}]
    return data.get("policy", "closed_loop"), devices[0].get("backend", "sim")


def experiment_dict(
    condition: str, seed: int, scenario: str = SCENARIO, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The (unvalidated) experiment of one condition and seed."""
    if condition not in ALL_CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; choose from {', '.join(ALL_CONDITIONS)}")
    data = copy.deepcopy(BASE_EXPERIMENT if base is None else base)
    sim_device = {"device_id": "sim", "backend": "sim", "realtime": False, "seed": seed}
    sim_device |= data.pop("sim_device", None) or {}
    if condition in FEEDBACK_CONDITIONS:
        rule, feedback_on, settle = FEEDBACK_CONDITIONS[condition]
        device = deep_merge({"culture": control_culture(condition)}, sim_device)
        device = deep_merge(device, {"culture": {"plasticity": rule}})
        device["feedback_settle_ms"] = FEEDBACK_SETTLE_MS if settle else 0.0
        own = {"devices": [device], "feedback": FEEDBACK_ON if feedback_on else {"enabled": False}}
    else:
        own = {
            "direct": {"policy": "direct"},
            "transparent": {"devices": [{"device_id": "transparent", "backend": "transparent", "seed": seed}]},
            "sim": {"devices": [sim_device]},
            "sim_reference": {"devices": [sim_device | {"stim_mode": "reference"}]},
            **{ablation: {"devices": [NO_CULTURE_DEVICE], "ablation": ablation} for ablation in ABLATION_CONDITIONS},
        }[condition]
    data = deep_merge(data, own | {"name": f"learning-{condition}-{seed}", "seed": seed})
    data.setdefault("env", {})["scenario"] = scenario
    return data
