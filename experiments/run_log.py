"""What a run leaves behind while it trains: TensorBoard, episodes.jsonl, a learning curve.

All written into the trial's directory by the trial itself, after each training
iteration: TensorBoard scalars grouped by prefix (episode/, ppo/, encoder/,
decoder/, spikes/, feedback/, loop/, device/, culture/), one JSON line per finished episode
(numbering continues across resumes), and `learning_curve.png` redrawn from
the JSONL. A progress line per iteration goes to stdout. At the start the
trial's HPARAMS session, at the end its final figures (final/): hparams_log.py.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from pathlib import Path
from typing import Any

from spikeloop.bridge.trainer.core import LOOP_COUNTERS
from spikeloop.experiments.dotted import flatten
from spikeloop.experiments.trial_files import (  # noqa: F401  (re-exported: the names the writer and its readers share)
    CURVE_FILE,
    DEVICE_LOST,
    ENDED_SHORT,
    EPISODES_FILE,
    FINISHED,
    NOTHING_TRAINED,
    SETUP_ERROR,
    STEPS_DIR,
)
from spikeloop.models.closed_loop.meter import VARIABLES as METER_VARIABLES
from spikeloop.models.closed_loop.sent_feedback import FEEDBACK_BY_NAME

# TensorBoard tag -> path in RLlib's result dict ("*" = any module id).
RESULT_TAGS: dict[str, str] = {
    "episode/return_mean": "env_runners/episode_return_mean",
    "episode/length_mean": "env_runners/episode_len_mean",
    "episode/kills": "env_runners/episode/kills",
    "episode/success_rate": "env_runners/episode/success_rate",
    "episode/env_steps_lifetime": "num_env_steps_sampled_lifetime",
    "episode/success_actions": "env_runners/episode/success_actions",
    "episode/fail_actions": "env_runners/episode/fail_actions",
    "episode/neutral_actions": "env_runners/episode/neutral_actions",
    "ppo/policy_loss": "learners/*/policy_loss",
    "ppo/vf_loss": "learners/*/vf_loss",
    "ppo/kl": "learners/*/mean_kl_loss",
    "ppo/clip_fraction": "learners/*/clip_fraction",
    "ppo/explained_variance": "learners/*/vf_explained_var",
    "ppo/advantage_std": "learners/*/advantage_std",
    "encoder/entropy": "learners/*/encoder_entropy",
    "encoder/lr": "learners/*/encoder_learning_rate",  # RLlib logs "<optimizer>_learning_rate"
    "decoder/entropy": "learners/*/decoder_entropy",
    "decoder/weight_norm": "learners/*/decoder_weight_norm",
    "decoder/bias_norm": "learners/*/decoder_bias_norm",
    "decoder/l2_loss": "learners/*/decoder_l2_loss",
    "decoder/lr": "learners/*/decoder_learning_rate",
    "value/lr": "learners/*/default_optimizer_learning_rate",  # the value net keeps RLlib's default optimizer
    "value/target_mean": "learners/*/value_target_mean",
    "value/target_std": "learners/*/value_target_std",
    "ppo/gradient_norm": "learners/*/gradients_global_norm",
    "encoder/ratio_mean": "learners/*/encoder_ratio_mean",
    "encoder/ratio_std": "learners/*/encoder_ratio_std",
    "encoder/ratio_clip_fraction": "learners/*/encoder_ratio_clip_fraction",
    "decoder/ratio_mean": "learners/*/decoder_ratio_mean",
    "decoder/ratio_std": "learners/*/decoder_ratio_std",
    "decoder/ratio_clip_fraction": "learners/*/decoder_ratio_clip_fraction",
    "feedback/commands_per_step": "env_runners/culture/feedback_commands_per_step",
    "feedback/datagrams_per_step": "env_runners/culture/feedback_datagrams_per_step",
    "feedback/dropped": "env_runners/culture/feedback_dropped",
    "feedback/sent": "env_runners/culture/feedback_sent",
    "feedback/suppressed": "env_runners/culture/feedback_suppressed",
    "feedback/clamped_commands": "env_runners/culture/clamped_commands",
    "feedback/frequency_scale": "env_runners/culture/feedback_frequency_scale",
    "feedback/surprise_td_error": "env_runners/culture/surprise_td_error",
    "feedback/surprise_ratio": "env_runners/culture/surprise_ratio",
    "feedback/episode_surprise_td_error": "env_runners/culture/episode_surprise_td_error",
    "feedback/events_sent": "env_runners/culture/events_sent",
    "loop/latency_p50_ms": "env_runners/culture/latency_p50_ms",
    "loop/latency_p99_ms": "env_runners/culture/latency_p99_ms",
    "loop/latency_max_ms": "env_runners/culture/latency_max_ms",
    **{f"loop/{name}": f"env_runners/culture/{name}" for name in LOOP_COUNTERS},
    "loop/exchange_ok_fraction": "env_runners/culture/exchange_ok_fraction",
    "loop/device_duty": "env_runners/culture/device_duty",
    "ppo/env_steps_received": "learners/__all_modules__/num_env_steps_received",
    "ppo/env_steps_received_lifetime": "learners/__all_modules__/num_env_steps_received_lifetime",
    "loop/causality_r_current": "env_runners/culture/causality_r_current",
    "loop/causality_r_previous": "env_runners/culture/causality_r_previous",
    "loop/unsolicited": "env_runners/culture/unsolicited",
    # The device's own account, from its last device_status (docs/architecture.md, "Stimulation dose").
    "device/dose_max_nc_per_min": "env_runners/culture/device_dose_max_nc_per_min",
    "device/dose_max_nc_session": "env_runners/culture/device_dose_max_nc_session",
    "device/dose_total_nc_session": "env_runners/culture/device_dose_total_nc_session",
    "device/dose_refused_stim": "env_runners/culture/device_dose_refused_stim",
    "device/dose_refused_feedback": "env_runners/culture/device_dose_refused_feedback",
    "device/refused_stim": "env_runners/culture/device_refused_stim",
    "device/refused_feedback": "env_runners/culture/device_refused_feedback",
    "device/rate_refused_stim": "env_runners/culture/device_rate_refused_stim",
    "device/rate_refused_feedback": "env_runners/culture/device_rate_refused_feedback",
    # Outages the loop paused for (loop.on_device_loss: wait): how many, and the seconds waited (largest env runner).
    "device/outages": "env_runners/culture/device_outages",
    "device/outage_s": "env_runners/culture/device_outage_s",
    # The live information meter (models/closed_loop/meter.py): bits per tick the culture's counts carry about
    # the stimulation's class, the observation's feature class and the action, over its window; _sd: its noise.
    **{
        f"culture/info_{variable}{part}": f"env_runners/culture/info_{variable}{part}"
        for variable in METER_VARIABLES
        for part in ("", "_sd")
    },
}

EMPTY_ITERATIONS_TAG = "ppo/empty_iterations"
"""Iterations so far in which the learner received no env steps (written by RunLog, not read from RLlib)."""
SPIKE_MEAN_PREFIX = "spike_mean_"


def metric_tag(name: str) -> str:
    """The TensorBoard tag a Tune metric names: a tag as is, or the RLlib result path it is read from.

    Raises ValueError for a name that is neither (the trial never reports it, so Tune could not rank by it).
    """
    from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES

    if name in RESULT_TAGS or name in {f"spikes/mean_{g}" for g in SPIKE_GROUP_NAMES}:
        return name
    by_path = {path: tag for tag, path in RESULT_TAGS.items()}
    if name in by_path:
        return by_path[name]
    raise ValueError(
        f"unknown metric {name!r}: use a TensorBoard tag of the run, e.g. "
        f"{', '.join(list(RESULT_TAGS)[:4])}, loop/latency_p50_ms (all: experiments/run_log.py)"
    )


def metric_key(tag: str) -> str:
    """The key under which a trial reports a tag to Tune (Tune nests keys with '/', so they become '_')."""
    return tag.replace("/", "_")


def _lookup(result: dict[str, Any], path: str) -> Any:
    """Follow `a/b/c` through nested dicts; RLlib also keeps keys like "culture/x" flat, so try those too."""
    parts = path.split("/")
    node: Any = result
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return None
        rest = "/".join(parts[i:])
        if rest in node:
            return node[rest]
        if part == "*":
            node = next((v for k, v in node.items() if isinstance(v, dict) and k != "__all_modules__"), None)
        else:
            node = node.get(part)
        if node is None:
            return None
    return node


def _is_number(value: Any) -> bool:
    """A real number, numpy scalars included (RLlib's counters are numpy int64, not int)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def scalars(result: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one training result, by tag."""
    out: dict[str, float] = {}
    for tag, path in RESULT_TAGS.items():
        value = _lookup(result, path)
        if _is_number(value) and math.isfinite(float(value)):
            out[tag] = float(value)
    learner = _lookup(result, "learners/*") or {}
    for key, value in learner.items():
        if key.startswith(SPIKE_MEAN_PREFIX) and _is_number(value):
            out[f"spikes/mean_{key[len(SPIKE_MEAN_PREFIX) :]}"] = float(value)
    # Per feedback name (reward_positive, each event, episode_negative, step, episode): count and mean scales.
    # RLlib keeps some metric keys flat, some nested: one level of '/'-joined paths.
    for path, value in flatten(result.get("env_runners") or {}, "/").items():
        if path.startswith(FEEDBACK_BY_NAME) and _is_number(value) and math.isfinite(float(value)):
            out["feedback/" + path[len(FEEDBACK_BY_NAME) :]] = float(value)
    return out


def last_episode_index(path: Path) -> int:
    """The highest `episode_index` in an episodes.jsonl (0 if there is none yet): where a resumed trial carries on."""
    if not path.exists():
        return 0
    last = 0
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    last = max(last, int(json.loads(line).get("episode_index", 0)))
                except (ValueError, TypeError, AttributeError):
                    continue
    return last


def write_step_log(directory: Path, episode_index: int, steps: dict[str, Any]) -> str:
    """Save one episode's per-step arrays under `directory`; return the file's path relative to it."""
    import numpy as np

    relative = f"{STEPS_DIR}/episode_{episode_index:06d}.npz"
    (directory / STEPS_DIR).mkdir(exist_ok=True)
    np.savez_compressed(directory / relative, **{k: np.asarray(v) for k, v in steps.items()})
    return relative


def _fmt(value: float | None, spec: str) -> str:
    """A figure for the progress line, or "-" where there is none yet (never "nan")."""
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def empty_iteration_cause(result: dict[str, Any], sample_timeout_s: float | None) -> str | None:
    """Why the learner received no env steps in this iteration, with the fix; None when it received some."""
    received = _lookup(result, "learners/__all_modules__/num_env_steps_received")
    if _is_number(received) and received > 0:
        return None
    healthy = _lookup(result, "fault_tolerance/num_healthy_workers")
    if _is_number(healthy) and healthy == 0 and _lookup(result, "config/num_env_runners"):
        return (
            "no env runner was healthy to sample (they failed: see the trial's log above); the run cannot train "
            "until one is restored"
        )
    waited = f"{sample_timeout_s:g} s" if sample_timeout_s is not None else "RLlib's sample timeout"
    return (
        f"no env runner returned its sample within loop.sample_timeout_s ({waited}), so the learner received 0 env "
        "steps while the culture was stimulated; set loop.sample_timeout_s: auto (it allows for the device's pace "
        "and the batch) or a larger number, or make ppo.train_batch_size_per_learner smaller"
    )


def curve_window(episodes: int) -> int:
    """Episodes in the learning curve's rolling mean (learning_curve.png and the live view's curve)."""
    return max(1, min(100, episodes // 5))


CURVE_REDRAW_S = 30.0
"""learning_curve.png is redrawn at most this often while a trial runs (and at its end): drawing it was 7% of a
sweep trial's process time, redrawn after every iteration of a few seconds."""


class RunLog:
    """TensorBoard, episodes.jsonl and the learning curve of one trial directory."""

    def __init__(self, trial_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.trial_dir = Path(trial_dir)
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.trial_dir), flush_secs=10)
        self.episodes_path = self.trial_dir / EPISODES_FILE
        self.episodes_logged = self._count_lines(self.episodes_path)  # continue numbering after a resume
        self.steps_logged = 0
        """Env steps of the episodes this RunLog wrote (this driver's; a resume starts again at 0)."""
        self._started = time.monotonic()
        self._last_step = 0
        self._curve_drawn_at: float | None = None
        self._curve_stale = False

    @staticmethod
    def _count_lines(path: Path) -> int:
        if not path.exists():
            return 0
        with path.open() as f:
            return sum(1 for line in f if line.strip())

    def log_iteration(self, result: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, float]:
        """Write one iteration: scalars, episode lines, the curve (at most every CURVE_REDRAW_S); return the scalars."""
        step = int(result.get("num_env_steps_sampled_lifetime") or result.get("training_iteration", 0))
        self._last_step = step
        values = scalars(result)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        if records:
            # Each record carries the trial's episode number (its episode_end event's "episode"), counted across
            # env runners and resumes; a record without one (none from an env runner) is numbered here.
            records = sorted(records, key=lambda r: r.get("episode", float("inf")))
            with self.episodes_path.open("a") as f:
                for record in records:
                    self.episodes_logged += 1
                    self.steps_logged += int(record.get("episode_length", 0))
                    index = int(record.get("episode") or self.episodes_logged)
                    line = {
                        "episode_index": index,
                        "iteration": result.get("training_iteration"),
                        "env_steps_lifetime": step,
                    } | record
                    steps = line.pop("steps", None)
                    if steps is not None:
                        line["step_log"] = self._write_steps(index, steps)
                    f.write(json.dumps(line) + "\n")
            self._curve_stale = True
        now = time.monotonic()
        if self._curve_stale and (self._curve_drawn_at is None or now - self._curve_drawn_at >= CURVE_REDRAW_S):
            self.draw_curve()
            self._curve_drawn_at, self._curve_stale = now, False
        self.writer.flush()
        return values

    def _write_steps(self, episode_index: int, steps: dict[str, Any]) -> str:
        return write_step_log(self.trial_dir, episode_index, steps)

    def draw_curve(self) -> None:
        """Redraw learning_curve.png from episodes.jsonl (written atomically)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [json.loads(line) for line in self.episodes_path.read_text().splitlines() if line.strip()]
        if not rows:
            return
        x = [r["episode_index"] for r in rows]
        y = [r["episode_reward"] for r in rows]
        killed = [1.0 if r.get("kill_count", 0) > 0 else 0.0 for r in rows]
        window = curve_window(len(y))

        def rolling(values: list[float]) -> list[float]:
            return [
                sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
                for i in range(len(values))
            ]

        fig, (ax, ax_kills) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
        ax.plot(x, y, ".", alpha=0.35, label="episode reward")
        ax.plot(x, rolling(y), "-", label=f"mean of last {window}")
        ax.set_xlabel("episode")
        ax.set_ylabel("reward")
        ax.set_title(f"{self.trial_dir.name}: {len(rows)} episodes")
        ax.legend(loc="best")
        ax_kills.plot(x, rolling(killed), "-", color="tab:red")
        ax_kills.set_ylim(-0.02, 1.02)
        ax_kills.set_xlabel("episode")
        ax_kills.set_ylabel(f"kill rate (last {window} episodes)")
        fig.tight_layout()
        tmp = self.trial_dir / (CURVE_FILE + ".tmp.png")
        fig.savefig(tmp)
        plt.close(fig)
        tmp.replace(self.trial_dir / CURVE_FILE)

    def progress_line(self, result: dict[str, Any], values: dict[str, float], empty_cause: str | None = None) -> str:
        """One human line per iteration: episodes, reward, steps/s, loop latency; or why nothing was trained.

        `empty_cause` (see `empty_iteration_cause`): the learner received no env steps in this iteration.
        """
        it = result.get("training_iteration", 0)
        elapsed = f"elapsed {time.monotonic() - self._started:.0f} s"
        if empty_cause is not None:
            return f"[iter {it}] NOTHING TRAINED: {empty_cause}  episodes {self.episodes_logged}  {elapsed}"
        steps = int(values.get("ppo/env_steps_received", 0))
        dt = result.get("time_this_iter_s") or 0.0
        p50 = values.get("loop/latency_p50_ms")
        return (
            f"[iter {it}] episodes {self.episodes_logged}  reward {_fmt(values.get('episode/return_mean'), '.1f')}  "
            f"kills/episode {_fmt(values.get('episode/kills'), '.2f')}  env steps {steps}  "
            f"steps/s {_fmt(steps / dt if dt else None, '.1f')}  "
            f"loop p50 {_fmt(p50, '.2f')}{' ms' if p50 is not None else ''}  "
            f"timeouts {int(values.get('loop/timeouts', 0))}  {elapsed}"
        )

    def log_empty_iterations(self, result: dict[str, Any], count: int) -> None:
        """Write the running count of iterations that trained on nothing (0 while all is well)."""
        step = int(result.get("num_env_steps_sampled_lifetime") or result.get("training_iteration", 0))
        self.writer.add_scalar(EMPTY_ITERATIONS_TAG, count, global_step=step)

    def start_session(self, experiment, base_seed: int) -> None:
        """The trial's swept settings and seed for TensorBoard's HPARAMS tab (experiments/hparams_log.py)."""
        from spikeloop.experiments.hparams_log import session_start

        for summary in session_start(experiment, self.trial_dir.name, base_seed):
            self.writer.file_writer.add_summary(summary, global_step=0)
        self.writer.flush()

    def close(self) -> None:
        """Write the final figures (final/return_mean, final/kill_rate: the HPARAMS tab's metrics), then close."""
        from spikeloop.experiments.hparams_log import final_figures

        if self._curve_stale:
            self.draw_curve()
            self._curve_stale = False
        for tag, value in final_figures(self.trial_dir).items():
            self.writer.add_scalar(tag, value, global_step=self._last_step)
        self.writer.close()
