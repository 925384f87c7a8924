"""`spikeloop replay`: what a recorded session's spikes say, offline, from the trial's step logs.

For each trial of a run directory that kept its per-step log (`output.step_log: true`), in episode order:

- `information`: the culture information meter (bridge/information.py) over the session, in chunks of
  consecutive ticks: bits per tick that the culture's counts (`raw_spikes`) carry about the stimulation's class
  (its strongest encoding electrode) and about the action taken.
- `fresh_decoder`: a decoder trained offline on the first 80% of episodes, from the decoder's input (`spikes`:
  the counts after any ablation) to the action taken, tested on the last 20%: its held-out accuracy against
  chance (always guessing the training episodes' most common action), and the held-out information. How much of
  the policy the spikes alone determine.
- `saved_decoder`: the trial's newest checkpoint's decoder on the recorded decoder input: how often its most
  likely action is the action taken, and the mean log-likelihood of the actions taken against a uniform guess.
  The actions were sampled (exploration) by the policies of their time, so even a decoder that drove every
  action agrees less than always.

Writes `replay.json` and `replay.png` into each trial directory.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge.information import (
    confusion_information_bits,
    decoded_information,
    fit_and_predict,
    strongest_electrode,
)
from experiments.run_log import STEPS_DIR

CHUNKS = 5
MIN_CHUNK_TICKS = 50
HELD_OUT_FRACTION = 0.2
SHUFFLES = 5
REPORT_JSON = "replay.json"
REPORT_PNG = "replay.png"


class ReplayError(ValueError):
    """A run directory replay cannot read, with what to do about it."""


@dataclass
class Session:
    """One trial's recorded ticks, in episode order."""

    trial_dir: Path
    episode: np.ndarray
    stim: np.ndarray
    raw_spikes: np.ndarray
    spikes: np.ndarray
    action: np.ndarray


def trial_dirs(run_dir: Path) -> list[Path]:
    """The trial directories under `run_dir` (itself included) that hold a step log."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: no such run directory")
    found = sorted({p.parent.parent for p in run_dir.rglob(f"{STEPS_DIR}/episode_*.npz")})
    if not found:
        raise ReplayError(
            f"{run_dir}: no step log found (steps/episode_*.npz). Replay reads the per-step record: run the "
            "experiment with `output.step_log: true` (or `--set output.step_log=true`)"
        )
    return found


def load_session(trial_dir: Path) -> Session:
    """All of a trial's step logs, concatenated in episode order."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("episode", "stim", "raw_spikes", "spikes", "action")}
    for path in sorted((trial_dir / STEPS_DIR).glob("episode_*.npz")):
        index = int(re.sub(r"\D", "", path.stem))
        try:
            with np.load(path) as log:
                n = len(log["action"])
                parts["episode"].append(np.full(n, index))
                for key in ("stim", "raw_spikes", "spikes", "action"):
                    parts[key].append(np.asarray(log[key]))
        except (OSError, KeyError, ValueError) as exc:
            raise ReplayError(f"{path}: not a readable step log ({exc}); remove or restore it") from exc
    joined = {k: np.concatenate(v) for k, v in parts.items()}
    return Session(trial_dir, **joined)


def _chunks(n: int) -> list[tuple[int, int]]:
    """Up to CHUNKS consecutive ranges of at least MIN_CHUNK_TICKS ticks (one, if the session is short)."""
    count = max(1, min(CHUNKS, n // MIN_CHUNK_TICKS))
    edges = np.linspace(0, n, count + 1).astype(int)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def information_over_session(session: Session) -> list[dict[str, Any]]:
    """The meter in chunks of consecutive ticks: bits about the stimulation's class and about the action."""
    stim_class = np.array([strongest_electrode(s[: len(s) // 2], s[len(s) // 2 :]) for s in session.stim])
    rows = []
    for lo, hi in _chunks(len(session.action)):
        row: dict[str, Any] = {"first_tick": lo, "ticks": hi - lo}
        for name, labels in (("stimulation", stim_class), ("action", session.action)):
            if hi - lo >= 10 and len(np.unique(labels[lo:hi])) > 1:
                row[name] = decoded_information(session.raw_spikes[lo:hi], labels[lo:hi]).as_dict()
            else:
                row[name] = None  # one class only (or too few ticks): there is nothing to carry
        rows.append(row)
    return rows


def fresh_decoder(session: Session) -> dict[str, Any]:
    """A decoder trained on the first episodes, tested on the last ones (decoder input -> action taken)."""
    episodes = np.unique(session.episode)
    if len(episodes) < 2:
        return {"skipped": f"{len(episodes)} episode recorded: held-out episodes need at least 2"}
    held_out = episodes[-max(1, round(HELD_OUT_FRACTION * len(episodes))) :]
    test = np.isin(session.episode, held_out)
    actions = np.unique(session.action, return_inverse=True)[1]
    n_classes = int(actions.max()) + 1
    train_x, train_y = session.spikes[~test].astype(np.float64), actions[~test]
    test_x, truth = session.spikes[test].astype(np.float64), actions[test]
    predicted = fit_and_predict(train_x, train_y, test_x, n_classes)
    raw_bits = confusion_information_bits(truth, predicted, n_classes)
    # The plug-in information of a small test set is biased upwards (more so with many actions): subtract what
    # decoders trained on shuffled actions reach on the same test ticks, as the meter does.
    rng = np.random.default_rng(0)
    shuffled = [
        confusion_information_bits(
            truth, fit_and_predict(train_x, rng.permutation(train_y), test_x, n_classes), n_classes
        )
        for _ in range(SHUFFLES)
    ]
    return {
        "train_episodes": int(len(episodes) - len(held_out)),
        "test_episodes": int(len(held_out)),
        "test_ticks": int(len(truth)),
        "accuracy": float((predicted == truth).mean()),
        "chance_accuracy": float((truth == np.bincount(train_y, minlength=n_classes).argmax()).mean()),
        "bits": raw_bits - float(np.mean(shuffled)),
        "raw_bits": raw_bits,
        "shuffle_bits_sd": float(np.std(shuffled)),
    }


def saved_decoder(session: Session) -> dict[str, Any]:
    """The newest checkpoint's decoder on the recorded decoder input, against the actions taken."""
    from experiments.watch_checkpoint import resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(session.trial_dir)
    except FileNotFoundError:
        return {"skipped": "the trial kept no checkpoint"}
    module_dir = next(checkpoint.glob("learner_group/learner/rl_module/*/"), None)
    if module_dir is None:
        return {"skipped": f"{checkpoint}: no RL module in the checkpoint"}
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    from models import rllib_notices

    rllib_notices.install()
    module = RLModule.from_checkpoint(str(module_dir))
    if not hasattr(module, "decode"):
        return {"skipped": "the checkpoint's policy has no decoder (the direct policy)"}
    with torch.no_grad():
        logits = module.decode(torch.as_tensor(session.spikes, dtype=torch.float32))
        logp = torch.log_softmax(logits, dim=-1).numpy()
    taken = session.action.astype(int)
    return {
        "checkpoint": str(checkpoint),
        "agreement": float((logp.argmax(1) == taken).mean()),
        "mean_log_likelihood": float(logp[np.arange(len(taken)), taken].mean()),
        "uniform_log_likelihood": -math.log(logp.shape[1]),
    }


def replay_trial(trial_dir: Path) -> dict[str, Any]:
    """Replay one trial; write replay.json and replay.png into it; return the report."""
    session = load_session(trial_dir)
    report = {
        "trial": trial_dir.name,
        "ticks": int(len(session.action)),
        "episodes": int(len(np.unique(session.episode))),
        "information": information_over_session(session),
        "fresh_decoder": fresh_decoder(session),
        "saved_decoder": saved_decoder(session),
    }
    (trial_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    _plot(report, trial_dir / REPORT_PNG)
    return report


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name in ("stimulation", "action"):
        points = [(r["first_tick"] + r["ticks"] / 2, r[name]) for r in report["information"] if r[name]]
        if points:
            x = [p[0] for p in points]
            ax.errorbar(
                x, [p[1]["bits"] for p in points], yerr=[3 * p[1]["shuffle_bits_sd"] for p in points],
                marker="o", capsize=3, label=f"about the {name}",
            )  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("tick of the session")
    ax.set_ylabel("bits per tick (shuffle-corrected)")
    ax.set_title(f"{report['trial']}: what the spikes carry")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
