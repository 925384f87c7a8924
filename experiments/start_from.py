"""A new run that starts from a checkpoint's weights: `spikeloop train EXP --from CHECKPOINT` (and `tune`).

What carries over is the RLModule's whole state: the encoder, decoder and value
net, and every running statistic the loop acts with, since all of them are module
buffers: the feature normalisation (`feature_norm.*`), the decoder's spike mean
and std (`spike_mean`, `spike_sq_mean`, `spike_mean_count`) and the value-target
normalisation (`value_net.target_*`). The env-to-module and module-to-env
connectors hold no state.

What does not: the optimizer state (Adam's moments and step counts start
afresh), the iteration and env-step counters, the episode numbers and the run
directory. Adam's moments are running estimates of the gradients' scale on the
old run's data; on another culture (a simulated one, then a CL1) the spikes, and
so the decoder's gradients, have other statistics, and stale second moments
would set the step sizes of the first updates by the old culture's. Resuming a
run where it stopped, optimizer included, is `--resume`.

Everything that can be wrong with the checkpoint is found before Ray starts and
before anything is stimulated (`check_start`): a path that is no checkpoint, a
checkpoint of the direct control into a closed-loop experiment (or the other way
round), a model whose tensors do not fit this experiment's (e.g. another
`model.same_frame_rounds` or `model.screen_cnn`). In the trial, `start_from_checkpoint`
loads the module (RLlib's `restore_from_path` with only the module component),
waits until every env runner holds it, and proves that the learner's and every
env runner's weights equal the checkpoint's before the first stimulation.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spikeloop.experiments.checkpoint_upgrade import OldCheckpointError, refuse_old
from spikeloop.experiments.schema import Experiment

MODULE_COMPONENT = "learner_group/learner/rl_module/default_policy"
"""Where an RLlib checkpoint keeps the module's state, and the component name `restore_from_path` takes."""
MODULE_STATE_FILE = "module_state.pkl"
RESOLVED_FILE = "experiment.yaml"
START_FILE = "started_from.yaml"
"""Written into the new trial's directory: which checkpoint it started from, and the proof that it did."""
SPACE_KEYS = ("action_set", "screen", "screen_height", "screen_width", "feature_settings")
"""`env` settings that shape the module (its observation and action spaces)."""


class StartError(ValueError):
    """The checkpoint cannot start this experiment; the message names the problem and the fix."""


# --- the checkpoint on disk -------------------------------------------------------------


def resolve_start(path: Path) -> Path:
    """The checkpoint directory for a checkpoint, trial or run directory (trial: newest; run: best)."""
    from spikeloop.experiments.watch_checkpoint import resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(Path(path).expanduser())
    except FileNotFoundError as exc:
        raise StartError(
            f"--from {path}: not a checkpoint: {exc}. Give a checkpoint_* directory written by `spikeloop train` "
            "or `spikeloop tune`, its trial directory (its newest checkpoint) or its run directory (its best)"
        ) from None
    if not (checkpoint / MODULE_COMPONENT / MODULE_STATE_FILE).is_file():
        raise StartError(
            f"--from {checkpoint}: the checkpoint holds no module state ({MODULE_COMPONENT}/{MODULE_STATE_FILE} "
            "is missing): it is incomplete or not written by spikeloop; pick another checkpoint"
        )
    return checkpoint


def checkpoint_state(checkpoint: Path) -> dict[str, Any]:
    """The module state the checkpoint holds: tensor name -> numpy array (or a float for a scalar buffer)."""
    with (checkpoint / MODULE_COMPONENT / MODULE_STATE_FILE).open("rb") as f:
        return dict(pickle.load(f))


def checkpoint_settings(checkpoint: Path) -> dict[str, Any]:
    """The experiment the checkpoint was trained with, as written in its trial directory (plain data)."""
    resolved = checkpoint.parent / RESOLVED_FILE
    if not resolved.is_file():
        raise StartError(
            f"--from {checkpoint}: its trial directory has no {RESOLVED_FILE}, so what it was trained with is "
            "unknown; give a checkpoint written by `spikeloop train` or `spikeloop tune`"
        )
    return yaml.safe_load(resolved.read_text()) or {}


# --- comparing ----------------------------------------------------------------------------


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(np.shape(value))


def tensor_mismatches(here: dict[str, Any], there: dict[str, Any]) -> list[str]:
    """What differs between two module states by name and shape (values are not compared)."""
    problems = [f"{name} is in this experiment's model, not in the checkpoint" for name in here if name not in there]
    problems += [f"{name} is in the checkpoint, not in this experiment's model" for name in there if name not in here]
    problems += [
        f"{name} is {list(_shape(there[name]))} in the checkpoint, {list(_shape(here[name]))} here"
        for name in here
        if name in there and _shape(here[name]) != _shape(there[name])
    ]
    return problems


def _flat(tree: Any, prefix: str) -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out |= _flat(value, f"{prefix}.{key}")
        return out
    return {prefix: tree}


def settings_differences(experiment: Experiment, trained: dict[str, Any]) -> list[str]:
    """The model-shaping settings (policy, model, env spaces) where the checkpoint's experiment differs."""
    from spikeloop.experiments.schema import env_section_model

    now = experiment.plain()
    env_defaults = {k: env_section_model().model_fields[k].default for k in SPACE_KEYS}
    pick = {
        "policy": lambda d: d.get("policy", "closed_loop"),
        "model": lambda d: d.get("model") or {},
        "env": lambda d: env_defaults | {k: v for k, v in (d.get("env") or {}).items() if k in SPACE_KEYS},
    }
    here: dict[str, Any] = {}
    there: dict[str, Any] = {}
    for section, get in pick.items():
        here |= _flat(get(now), section)
        there |= _flat(get(trained), section)
    missing = object()
    return [
        f"{key}: {_text(there.get(key, missing))} in the checkpoint, {_text(here.get(key, missing))} here"
        for key in sorted(set(here) | set(there))
        if key != "model.ablation" and _normal(here.get(key, missing)) != _normal(there.get(key, missing))
    ]


def _normal(value: Any) -> Any:
    return [_normal(v) for v in value] if isinstance(value, (list, tuple)) else value


def _text(value: Any) -> str:
    return "(default)" if not isinstance(value, (str, int, float, bool, list, tuple, type(None))) else repr(value)


def _module_state(experiment: Experiment) -> dict[str, Any]:
    """A freshly built module of this experiment, as state (names and shapes are what matter)."""
    from spikeloop.envs.doom_env import DoomEnv

    config = experiment.algorithm_config()
    env = DoomEnv(**experiment.env)  # the spaces the module is built for
    try:
        spec = config.get_rl_module_spec(env=env)
    finally:
        env.close()
    return spec.build().get_state()


def check_start(experiment: Experiment, path: Path) -> tuple[Path, str]:
    """Before Ray starts: the checkpoint to start from, and a line saying what is taken from it; StartError if it
    cannot start this experiment."""
    checkpoint = resolve_start(path)
    try:
        refuse_old(checkpoint)
    except OldCheckpointError as exc:
        raise StartError(f"--from {exc}") from None
    trained = checkpoint_settings(checkpoint)
    trained_policy = trained.get("policy", "closed_loop")
    trial_file = checkpoint.parent / RESOLVED_FILE
    if trained_policy != experiment.policy:
        kinds = {
            "direct": "the direct control (policy: direct: features straight to actions, no encoder, decoder or "
            "culture)",
            "closed_loop": "a closed loop (policy: closed_loop: encoder, culture, decoder)",
        }
        raise StartError(
            f"--from {checkpoint}: the checkpoint is of {kinds.get(trained_policy, repr(trained_policy))}, this "
            f"experiment is {kinds.get(experiment.policy, repr(experiment.policy))}; its weights cannot drive this "
            f"run. Start from a checkpoint trained with policy: {experiment.policy}, or run this experiment with "
            f"--set policy={trained_policy}"
        )
    mismatches = tensor_mismatches(_module_state(experiment), checkpoint_state(checkpoint))
    differences = settings_differences(experiment, trained)
    if mismatches:
        shown = "; ".join(mismatches[:6]) + (f"; and {len(mismatches) - 6} more" if len(mismatches) > 6 else "")
        why = f" Settings that differ: {'; '.join(differences)}." if differences else ""
        raise StartError(
            f"--from {checkpoint}: the checkpoint's model does not fit this experiment's: {shown}.{why} Set them "
            f"as the checkpoint was trained (its {trial_file}), or start without --from"
        )
    line = (
        f"starting from {checkpoint}: its weights and running statistics (feature normalisation, spike mean and "
        "std, value targets); a fresh optimizer, iteration count, episode numbers and run directory"
    )
    if differences:
        line += f"\n  model settings that differ from the checkpoint's (same tensors): {'; '.join(differences)}"
    return checkpoint, line


# --- in the trial -------------------------------------------------------------------------


def state_digest(state: dict[str, Any], names: list[str] | None = None) -> str:
    """SHA-256 over the named tensors (all, sorted, by default): name, shape and values as float64."""
    digest = hashlib.sha256()
    for name in sorted(state if names is None else names):
        values = np.ascontiguousarray(np.asarray(state[name], dtype=np.float64))
        digest.update(name.encode() + b"\0" + repr(values.shape).encode() + b"\0" + values.tobytes())
    return digest.hexdigest()


def _runner_state(runner) -> dict[str, Any] | None:
    module = getattr(runner, "module", None)
    if module is None:
        return None
    return {name: np.asarray(value) for name, value in module.get_state().items()}


def start_from_checkpoint(algo, checkpoint: Path) -> dict[str, Any]:
    """Load the checkpoint's module into the learner and every env runner; return the record of what was loaded.

    Raises StartError when the tensors do not fit (a sweep may vary a model setting per trial) and RuntimeError if
    any env runner does not hold exactly the checkpoint's weights afterwards: nothing is stimulated until this
    returns.
    """
    from spikeloop.models.closed_loop.ppo import sync_env_runners

    wanted = checkpoint_state(checkpoint)
    learner_states = algo.learner_group.get_weights()
    mismatches = tensor_mismatches(learner_states["default_policy"], wanted)
    if mismatches:
        raise StartError(
            f"--from {checkpoint}: the checkpoint's model does not fit this trial's: {'; '.join(mismatches[:6])}"
        )
    algo.restore_from_path(checkpoint / MODULE_COMPONENT, component=MODULE_COMPONENT)
    sync_env_runners(algo)
    expected = state_digest(wanted)
    learner = state_digest(algo.learner_group.get_weights()["default_policy"])
    runners = [
        s for s in algo.env_runner_group.foreach_env_runner(_runner_state, local_env_runner=True) if s is not None
    ]
    record: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "trained_as": str(checkpoint_settings(checkpoint).get("name", "?")),
        "tensors": len(wanted),
        "checkpoint_digest": expected,
        "learner_digest": learner,
        "env_runner_digests": [state_digest(s) for s in runners],
        "env_runner_tensors": [len(s) for s in runners],
        "optimizer": "fresh",
    }
    wrong = ["the learner"] if learner != expected else []
    wrong += [
        f"env runner {i}"
        for i, s in enumerate(runners)
        if set(s) - set(wanted) or state_digest(s) != state_digest(wanted, list(s))
    ]
    if wrong:
        raise RuntimeError(
            f"after loading {checkpoint}, {', '.join(wrong)} did not hold the checkpoint's weights; nothing was "
            "stimulated"
        )
    return record


def start_trial(algo, checkpoint: Path, trial_dir: Path) -> None:
    """A trial's start from the checkpoint: load and verify it, then write `started_from.yaml` and say so."""
    record = start_from_checkpoint(algo, checkpoint)
    (trial_dir / START_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    print(
        f"started from {checkpoint}: {record['tensors']} tensors (weights and running statistics) in the learner "
        f"and {len(record['env_runner_digests'])} env runner(s), verified; fresh optimizer",
        flush=True,
    )
