"""Watch a trained policy play: episodes with a checkpoint's weights, never an update.

The checkpoint's trial directory holds the resolved `experiment.yaml` one level
up; it rebuilds the same closed loop (env, module, culture connector, feedback
callbacks), with overrides and feedback on or off. Episodes run on the local
env runner in this process (`num_env_runners=0`): watch drives exactly one
culture, no env-runner actor or learner update is involved, and there is no
`cl1_slot` to reserve. For a cl1 device this process must therefore run on the
node that owns it: a local Ray started here advertises the devices' resources
itself; on a cluster, run watch on (or submit it to) the device's node.

Every episode sends its feedback and `episode_end` event as in training; the
end sends `training_complete`. Results go to a new run directory
`<root>/watch-<name>-<timestamp>/` (`watch.yaml`, `experiment.yaml`,
`episodes.jsonl`, TensorBoard event files with one point per episode);
nothing that exists is overwritten.

Deterministic by default (the encoder's most likely stimulation, the decoder's
most likely action) with the spike mean frozen: what the policy learned, without
sampling noise, and a checkpoint left exactly as trained. The reference
trainer's watch samples and keeps updating its spike-centering mean; `explore`
and `update_spike_mean` do that.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spikeloop.experiments.schema import Experiment, load_experiment

RESOLVED_FILE = "experiment.yaml"
CHECKPOINT_MARKER = "rllib_checkpoint.json"
WATCH_FILE = "watch.yaml"
EPISODES_FILE = "episodes.jsonl"


@dataclass
class WatchSettings:
    """What to watch and how."""

    checkpoint: Path
    episodes: int = 5
    feedback: bool = True
    explore: bool = False
    update_spike_mean: bool = False
    """Fold each episode's spikes into the decoder's running spike mean and std (the module's own rule)."""
    overrides: list[str] = field(default_factory=list)
    output_root: Path | None = None
    """Where the watch directory is created (default: the experiment's output.root_dir)."""


# --- finding the checkpoint and its experiment ---------------------------------------


def resolve_checkpoint(path: Path) -> Path:
    """The checkpoint directory for a checkpoint, trial or run directory (trial: newest; run: best)."""
    path = path.resolve()
    if (path / CHECKPOINT_MARKER).is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint directory")
    checkpoints = sorted(path.glob("checkpoint_*/" + CHECKPOINT_MARKER), key=lambda p: _number(p.parent.name))
    if checkpoints:
        return checkpoints[-1].parent  # a trial directory: its newest checkpoint
    summary = path / "summary.yaml"
    if summary.is_file():
        best = (yaml.safe_load(summary.read_text()) or {}).get("best_checkpoint")
        if best and (Path(best) / CHECKPOINT_MARKER).is_file():
            return Path(best)
    raise FileNotFoundError(
        f"{path} is not a checkpoint (no {CHECKPOINT_MARKER}), nor a trial directory with checkpoint_* "
        "subdirectories, nor a run directory whose summary.yaml names a best_checkpoint"
    )


def _number(name: str) -> int:
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else -1


def watch_experiment(checkpoint: Path, overrides: list[str], feedback: bool) -> Experiment:
    """The experiment the checkpoint was trained with, plus overrides (and feedback off if asked)."""
    resolved = checkpoint.parent / RESOLVED_FILE
    if not resolved.is_file():
        raise FileNotFoundError(
            f"{checkpoint}: its trial directory has no {RESOLVED_FILE} to rebuild the experiment from "
            "(expected a checkpoint written by `spikeloop train` or `spikeloop tune`)"
        )
    # Watch drives one culture from one env runner whatever the training used (0 is not valid with cl1 devices).
    fixed = ["resources.num_env_runners=1", *([] if feedback else ["feedback.enabled=false"])]
    return load_experiment(resolved, [*overrides, *fixed])


def new_watch_dir(root: Path, name: str) -> Path:
    """A fresh `watch-<name>-<timestamp>` directory under root (suffixed rather than reused)."""
    root.mkdir(parents=True, exist_ok=True)
    base = f"watch-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        candidate = root / (base if n == 1 else f"{base}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new watch directory under {root}")


# --- Ray and the algorithm ------------------------------------------------------------


def init_ray_for(experiment: Experiment) -> bool:
    """Join RAY_ADDRESS, or start a local Ray that owns the experiment's cl1 devices; True if started here."""
    import ray

    from spikeloop.experiments.ray_session import init_ray

    if ray.is_initialized():
        return False
    # This machine is where the devices are reached from, so this node owns them.
    init_ray(resources=experiment.culture_settings().node_resources())
    return True


def build_watch_algo(experiment: Experiment, checkpoint: Path):
    """The experiment's algorithm with one local env runner and a local learner, restored from the checkpoint."""
    config = (
        experiment.algorithm_config()  # registers the env too, which the restore needs
        .env_runners(num_env_runners=0, num_cpus_per_env_runner=1, custom_resources_per_env_runner={})
        .learners(num_learners=0, num_gpus_per_learner=0)
    )
    from spikeloop.experiments.checkpoint_upgrade import raise_if_old_name
    from spikeloop.models.closed_loop.ppo import restore

    algo = config.build_algo()
    try:
        restore(algo, str(checkpoint))
    except ModuleNotFoundError as exc:  # one line naming the upgrade, not RLlib's traceback
        raise_if_old_name(exc, checkpoint)
        raise
    return algo


def module_weights(algo) -> dict[str, np.ndarray]:
    """Every tensor of the acting module (env runner) and the learner's module, by name."""
    acting = algo.env_runner.module.get_state()
    learner = algo.learner_group.get_weights()
    flat = {f"env_runner/{k}": np.array(v, copy=True) for k, v in acting.items()}
    for module_id, state in learner.items():
        flat |= {f"learner/{module_id}/{k}": np.array(v, copy=True) for k, v in state.items()}
    return flat


def weight_changes(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> list[str]:
    """Names of tensors that differ (or appeared/disappeared) between two snapshots."""
    names = set(before) | set(after)
    return sorted(n for n in names if n not in before or n not in after or not np.array_equal(before[n], after[n]))


SPIKE_STATISTICS = ("spike_mean", "spike_mean_count", "spike_sq_mean")
"""The acting module's running spike statistics (buffers), which `update_spike_mean` lets change."""


def is_spike_statistic(name: str) -> bool:
    """Whether a `module_weights` name is one of the env runner's running spike statistics."""
    return name.startswith("env_runner/") and name.rsplit("/", 1)[-1] in SPIKE_STATISTICS


def fold_spikes(runner, episodes) -> int:
    """Fold the episodes' decoder-side spikes into the acting module's running spike mean; returns the steps."""
    import torch

    from spikeloop.models.closed_loop_module import SPIKES

    module = runner.module
    if not hasattr(module, "update_spike_mean"):
        return 0  # the direct control: no spikes
    rows = [np.asarray(e.get_extra_model_outputs(SPIKES), dtype=np.float32) for e in episodes if len(e)]
    rows = [r.reshape(len(r), -1) for r in rows if r.size]
    if not rows:
        return 0
    spikes = np.concatenate(rows)
    module.update_spike_mean(torch.as_tensor(spikes))
    return len(spikes)


def _pop_records(algo) -> list[dict[str, Any]]:
    from spikeloop.models.closed_loop.callbacks import pop_episode_records

    return pop_episode_records()


def sample_one_episode(runner, *, explore: bool) -> list:
    """Step the env runner until one episode ends; returns its chunks (each step in exactly one).

    Samples by timesteps, as training does, and not with `sample(num_episodes=1)`: RLlib
    resets and reseeds the env on every num_episodes call, which would replay the first
    episode's start each time. By timesteps, the env is seeded on the runner's first
    sample only and later episodes start from the env's own autoreset, unseeded (public
    API only; tests/test_watch_sampling.py pins this RLlib behaviour).
    """
    chunks: list = []
    while True:
        got = runner.sample(num_timesteps=1, explore=explore)
        chunks += got
        if any(e.is_done for e in got):
            return chunks


def play_episodes(algo, settings: WatchSettings) -> Iterator[dict[str, Any]]:
    """Play `settings.episodes` episodes on the local env runner, yielding each one's record as it ends."""
    runner = algo.env_runner
    for i in range(1, settings.episodes + 1):
        t0 = time.monotonic()
        episodes = sample_one_episode(runner, explore=settings.explore)
        if settings.update_spike_mean:
            fold_spikes(runner, episodes)
        new = _pop_records(algo)
        record = new[-1] if new else {"episode_length": sum(len(e) for e in episodes)}
        yield record | {"watch_episode": i, "wall_s": round(time.monotonic() - t0, 3)}


def _peek(node: Any) -> Any:
    """An env runner's `get_metrics()` (RLlib's Stats objects, for the driver to merge) as plain values."""
    if isinstance(node, dict):
        return {key: _peek(value) for key, value in node.items()}
    peek = getattr(node, "peek", None)
    if callable(peek):
        try:
            return peek()
        except Exception:
            return None
    return node


def episode_scalars(record: dict[str, Any], runner_metrics: dict[str, Any]) -> dict[str, float]:
    """TensorBoard scalars of one watched episode: its own summary, and the loop's and feedback's tags as in
    training (what the env runner logged since the last episode)."""
    from spikeloop.experiments.run_log import scalars

    out = {
        tag: value
        for tag, value in scalars({"env_runners": _peek(runner_metrics)}).items()
        if tag.startswith(("feedback/", "loop/"))
    }
    actions = record.get("episode_actions") or {}
    own = {
        "episode/return": record.get("episode_reward"),
        "episode/length": record.get("episode_length"),
        "episode/kills": record.get("kill_count"),
        "episode/game_reward": record.get("game_reward_sum"),
        "episode/success_rate": record.get("success_rate"),
        "episode/success_actions": actions.get("success"),
        "episode/fail_actions": actions.get("fail"),
        "episode/neutral_actions": actions.get("neutral"),
        "feedback/episode_commands": record.get("episode_feedback_commands"),
        "feedback/episode_surprise_td_error": record.get("episode_surprise_td_error"),
        "loop/timeouts_in_episode": record.get("timeouts_in_episode"),
    }
    out |= {tag: float(v) for tag, v in own.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out


def progress_line(record: dict[str, Any], total: int) -> str:
    """One line per finished episode."""
    return (
        f"[episode {record['watch_episode']}/{total}] length {record.get('episode_length', 0)}  "
        f"return {record.get('episode_reward', float('nan')):.1f}  kills {record.get('kill_count', 0)}  "
        f"timeouts {record.get('timeouts_in_episode', 0)}  "
        f"episode feedback commands {record.get('episode_feedback_commands', 0)}  {record['wall_s']:.1f} s"
    )


# --- the whole watch --------------------------------------------------------------------


def watch(settings: WatchSettings, log: Callable[[str], None] = print) -> Path:
    """Run the watch described by `settings`; returns its new directory."""
    import ray
    from torch.utils.tensorboard import SummaryWriter

    from spikeloop.experiments.checkpoint_upgrade import refuse_old
    from spikeloop.experiments.run_log import write_step_log
    from spikeloop.models.closed_loop.ppo import finish

    checkpoint = resolve_checkpoint(settings.checkpoint)
    refuse_old(checkpoint)  # one written before `spikeloop.*`: a line naming the upgrade, before Ray
    experiment = watch_experiment(checkpoint, settings.overrides, settings.feedback)
    root = (settings.output_root or Path(experiment.output.root_dir)).resolve()
    out = new_watch_dir(root, experiment.name)
    (out / RESOLVED_FILE).write_text(experiment.to_yaml())
    description: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "trial_dir": str(checkpoint.parent),
        "experiment": experiment.name,
        "episodes": settings.episodes,
        "explore": settings.explore,
        "update_spike_mean": settings.update_spike_mean,
        "feedback": experiment.feedback.enabled,
        "overrides": list(settings.overrides),
        "devices": [d.device_id for d in experiment.devices],
        "ablation": experiment.ablation,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (out / WATCH_FILE).write_text(yaml.safe_dump(description, sort_keys=False))
    log(
        f"watching {checkpoint}\n  -> {out}\n  {settings.episodes} episode(s), explore={settings.explore}, "
        f"update_spike_mean={settings.update_spike_mean}, "
        f"feedback {'on' if experiment.feedback.enabled else 'off'}, no training"
    )

    started_ray = init_ray_for(experiment)
    algo = None
    records: list[dict[str, Any]] = []
    reason = "watch complete"
    writer = SummaryWriter(log_dir=str(out), flush_secs=10)
    try:
        algo = build_watch_algo(experiment, checkpoint)
        before = module_weights(algo)
        with (out / EPISODES_FILE).open("x") as episodes_file:
            for record in play_episodes(algo, settings):
                records.append(record)
                steps = record.pop("steps", None)  # output.step_log: arrays go to steps/, as in training
                if steps is not None:
                    record["step_log"] = write_step_log(out, record["watch_episode"], steps)
                episodes_file.write(json.dumps(record, default=float) + "\n")
                episodes_file.flush()  # readable while the watch goes on
                for tag, value in episode_scalars(record, algo.env_runner.get_metrics()).items():
                    writer.add_scalar(tag, value, global_step=record["watch_episode"])
                writer.flush()
                log(progress_line(record, settings.episodes))
        changed = weight_changes(before, module_weights(algo))
        if settings.update_spike_mean:
            description["spike_statistics_changed"] = [n for n in changed if is_spike_statistic(n)]
            changed = [n for n in changed if not is_spike_statistic(n)]
        description |= {"weights_compared": len(before), "weights_changed": changed}
        log(
            f"weights: {len(before)} tensors compared before/after (env runner and learner module): "
            + ("unchanged" if not changed else f"CHANGED: {', '.join(changed)}")
        )
        if changed:
            raise RuntimeError(f"watch changed {len(changed)} weight tensor(s): {', '.join(changed)}")
    except BaseException as exc:
        reason = f"watch error: {type(exc).__name__}"
        raise
    finally:
        writer.close()
        if algo is not None:
            try:
                steps = sum(int(r.get("episode_length", 0)) for r in records)
                told = finish(algo, reason=reason, total_steps=steps, total_episodes=len(records))
                description["training_complete_sent_to"] = told
            finally:
                algo.stop()
        description |= {
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "episodes_done": len(records),
            "end_reason": reason,
        }
        (out / WATCH_FILE).write_text(yaml.safe_dump(description, sort_keys=False))
        if started_ray:
            ray.shutdown()
    log(f"watch directory: {out}")
    return out
