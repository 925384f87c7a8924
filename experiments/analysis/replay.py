"""`spikeloop replay`: what a recorded session's spikes say, offline, from the trial's session record.

Per trial of a run directory, in episode order, from one of two sources:

- the session record (`record/*.h5`, models/closed_loop/session_record.py), written by default and crash-safe: every
  stimulation, reply and step of each env runner. The primary source: a trial that has one is replayed from
  it. Only committed rows are read, so a record cut short by `kill -9` replays up to its last flush; steps of
  an episode that never ended (the one under way at a kill or at the end of the run) are left out and counted.
- the step log (`steps/episode_*.npz`, `output.step_log: true`), for trials without a record (older runs).

`--source record|steps` picks one; the report's `source` says which was read. From either, the same report:

- `information`: the culture information meter (bridge/trainer/information.py) over the session, in chunks of
  consecutive ticks: bits per tick that the culture's counts carry about the stimulation's class (its
  strongest encoding electrode, first round) and about the action taken.
- `fresh_decoder`: a decoder trained offline on the first 80% of episodes, from the decoder's input (the
  counts after any ablation) to the action taken, tested on the last 20%: its held-out accuracy against chance
  (always guessing the training episodes' most common action), and the held-out information. How much of the
  policy the spikes alone determine.
- `saved_decoder`: the trial's newest checkpoint's decoder on the recorded decoder input: how often its most
  likely action is the action taken, and the mean log-likelihood of the actions taken against a uniform guess.
  The actions were sampled (exploration) by the policies of their time, so even a decoder that drove every
  action agrees less than always.

The record keeps the culture's counts, not the decoder's input: under `ablation: none` they are the same,
under `zero` the input was all zeros, but the Poisson draws of `ablation: random` are not recorded, so for
such a trial both decoders are reported as unavailable from the record (the step log has them).

Writes `replay.json` and `replay.png` into each trial directory.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spikeloop.bridge.trainer.information import (
    confusion_information_bits,
    decoded_information,
    fit_and_predict,
    strongest_electrode,
)
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.experiments.run_log import STEPS_DIR
from spikeloop.models.closed_loop.session_record import (
    RECORD_DIR,
    RecordError,
    discarded_episodes,
    read_record,
    record_discards,
)

CHUNKS = 5
MIN_CHUNK_TICKS = 50
HELD_OUT_FRACTION = 0.2
SHUFFLES = 5
REPORT_JSON = "replay.json"
REPORT_PNG = "replay.png"
AUTO, RECORD, STEPS = "auto", "record", "steps"
SOURCES = (AUTO, RECORD, STEPS)
"""`--source`: the record when the trial has one (auto), or only the record, or only the step log."""


class ReplayError(ValueError):
    """A run directory replay cannot read, with what to do about it."""


@dataclass
class Session:
    """One trial's recorded ticks, in episode order, and where they were read from."""

    trial_dir: Path
    source: str
    """RECORD or STEPS."""
    episode: np.ndarray
    stim_class: np.ndarray
    """The stimulation's class of each tick: its strongest encoding electrode (first round)."""
    raw_spikes: np.ndarray
    """The culture's counts of each tick (all rounds side by side)."""
    spikes: np.ndarray | None
    """The decoder's input of each tick (after the ablation); None when the source does not hold it."""
    action: np.ndarray
    spikes_missing: str = ""
    """Why `spikes` is None."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """Per record file: its name, whether it was closed, its committed steps and finished episodes."""
    unfinished_steps: int = 0
    """Steps of episodes that never ended (left out)."""
    discarded_steps: int = 0
    """Steps of episodes the trial threw away (their `discarded` event; left out)."""


def _has_record(trial_dir: Path) -> bool:
    return any(p.is_file() for p in (trial_dir / RECORD_DIR).glob("*.h5"))


def _has_step_log(trial_dir: Path) -> bool:
    return any((trial_dir / STEPS_DIR).glob("episode_*.npz"))


def trial_dirs(run_dir: Path, source: str = AUTO) -> list[Path]:
    """The trial directories under `run_dir` (itself included) that hold what `source` reads."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: no such run directory")
    found = {p.parent.parent for p in run_dir.rglob(f"{RECORD_DIR}/*.h5")} if source != STEPS else set()
    if source != RECORD:
        found |= {p.parent.parent for p in run_dir.rglob(f"{STEPS_DIR}/episode_*.npz")}
    if not found:
        wanted = {
            AUTO: f"no session record ({RECORD_DIR}/*.h5) and no step log ({STEPS_DIR}/episode_*.npz)",
            RECORD: f"no session record ({RECORD_DIR}/*.h5)",
            STEPS: f"no step log ({STEPS_DIR}/episode_*.npz)",
        }[source]
        raise ReplayError(
            f"{run_dir}: {wanted}. Replay reads a trial's session record, which runs write unless "
            "`output.record: false`, or its per-step log: run the experiment with `output.step_log: true` "
            "(or `--set output.step_log=true`) to keep one"
        )
    return sorted(found)


def load_session(trial_dir: Path, source: str = AUTO) -> Session:
    """A trial's session: from its record when it has one (or `source` says so), else from its step log."""
    if source == RECORD or (source == AUTO and _has_record(trial_dir)):
        if not _has_record(trial_dir):
            raise ReplayError(f"{trial_dir}: no session record ({RECORD_DIR}/*.h5); replay its step log instead")
        return load_record_session(trial_dir)
    if not _has_step_log(trial_dir):
        raise ReplayError(f"{trial_dir}: no step log ({STEPS_DIR}/episode_*.npz); replay its record instead")
    return load_step_log_session(trial_dir)


def load_step_log_session(trial_dir: Path) -> Session:
    """All of a trial's step logs, concatenated in episode order."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("episode", "stim_class", "raw_spikes", "spikes", "action")}
    for path in sorted((trial_dir / STEPS_DIR).glob("episode_*.npz"), key=lambda p: int(re.sub(r"\D", "", p.stem))):
        index = int(re.sub(r"\D", "", path.stem))
        try:
            with np.load(path) as log:
                n = len(log["action"])
                stim = np.asarray(log["stim"]).reshape(n, -1)
                parts["episode"].append(np.full(n, index))
                # A row holds each round's frequencies then amplitudes: the class is the first round's.
                parts["stim_class"].append(_stim_class(stim[:, :N_ENCODING], stim[:, N_ENCODING : 2 * N_ENCODING]))
                for key in ("raw_spikes", "spikes", "action"):
                    parts[key].append(np.asarray(log[key]))
        except (OSError, KeyError, ValueError) as exc:
            raise ReplayError(f"{path}: not a readable step log ({exc}); remove or restore it") from exc
    joined = {k: np.concatenate(v) for k, v in parts.items()}
    return Session(
        trial_dir,
        STEPS,
        episode=joined["episode"],
        stim_class=joined["stim_class"],
        raw_spikes=joined["raw_spikes"],
        spikes=joined["spikes"],
        action=joined["action"],
    )


def load_record_session(trial_dir: Path) -> Session:
    """The finished episodes of all of a trial's session records (one per env runner process), in episode order."""
    episodes: list[tuple[int, dict[str, np.ndarray]]] = []
    files: list[dict[str, Any]] = []
    unfinished, discarded_steps, missing = 0, 0, ""
    records = []
    for path in sorted(p for p in (trial_dir / RECORD_DIR).glob("*.h5") if p.is_file()):
        try:
            records.append((path, *read_record(path)))
        except RecordError as exc:
            raise ReplayError(
                f"{exc}. Move it out of {RECORD_DIR}/ to replay the trial's other records, or replay its step "
                "log with --source steps"
            ) from None
    # Episodes of an iteration the trial threw away (a lost device, then --resume): their numbers came again.
    discards = [d for _, _, tables in records for d in record_discards(tables)]
    for path, attrs, tables in records:
        try:
            experiment = yaml.safe_load(attrs.get("experiment_yaml") or "{}")
        except yaml.YAMLError as exc:
            raise ReplayError(f"{path}: its experiment_yaml attribute is not YAML ({exc})") from None
        if not isinstance(experiment, dict):
            raise ReplayError(f"{path}: its experiment_yaml attribute is not an experiment (a YAML mapping)")
        rounds = int((experiment.get("model") or {}).get("same_frame_rounds", 1))
        ablation = str(experiment.get("ablation", "none"))
        steps, stim, counts = tables["steps"], tables["stim"], tables["spikes"]["counts"]
        # A step's stimulations are the `rounds` stim rows that end at its stim_rows (one reply row each).
        ends = steps["stim_rows"].astype(np.int64)
        usable = (ends >= rounds) & (ends <= min(len(counts), len(stim["frequency_hz"])))
        first = ends - rounds
        step_number = steps["step"].astype(np.int64)
        taken = np.zeros(len(ends), dtype=bool)
        dropped = discarded_episodes(tables["episodes"], discards)
        for row in range(len(tables["episodes"]["episode"])):
            last, length = (int(tables["episodes"][k][row]) for k in ("last_step", "length"))
            mask = (step_number > last - length) & (step_number <= last)
            if dropped[row]:
                taken |= mask  # ended, so not unfinished: counted apart
                discarded_steps += int(mask.sum())
                continue
            idx = np.flatnonzero(usable & mask)
            taken[idx] = True
            raw = np.stack([counts[i : i + rounds].reshape(-1) for i in first[idx]]) if len(idx) else np.zeros((0, 0))
            spikes, why = _decoder_input(raw, ablation)
            missing = missing or why
            episodes.append(
                (
                    int(tables["episodes"]["episode"][row]),
                    {
                        "stim_class": _stim_class(stim["frequency_hz"][first[idx]], stim["amplitude_ua"][first[idx]]),
                        "raw_spikes": raw,
                        "spikes": spikes,
                        "action": steps["action"][idx],
                    },
                )
            )
        unfinished += int((~taken).sum())
        files.append(
            {
                "file": path.name,
                "closed": "closed_wall_time_s" in attrs,  # absent: the run was killed; its committed rows were read
                "steps": len(ends),
                "finished_episodes": len(tables["episodes"]["episode"]),
                "discarded_episodes": int(dropped.sum()),
            }
        )
    episodes = [(number, part) for number, part in sorted(episodes, key=lambda e: e[0]) if len(part["action"])]
    if not episodes:
        raise ReplayError(
            f"{trial_dir / RECORD_DIR}: the session record holds no finished episode ({unfinished} steps of an "
            "unfinished one); a trial needs at least one ended episode to replay"
        )
    return Session(
        trial_dir,
        RECORD,
        episode=np.concatenate([np.full(len(part["action"]), number) for number, part in episodes]),
        stim_class=np.concatenate([part["stim_class"] for _, part in episodes]),
        raw_spikes=np.concatenate([part["raw_spikes"] for _, part in episodes]),
        spikes=None if missing else np.concatenate([part["spikes"] for _, part in episodes]),
        action=np.concatenate([part["action"] for _, part in episodes]),
        spikes_missing=missing,
        files=files,
        unfinished_steps=unfinished,
        discarded_steps=discarded_steps,
    )


def _decoder_input(raw_spikes: np.ndarray, ablation: str) -> tuple[np.ndarray, str]:
    """What the decoder saw, from the culture's counts under the trial's ablation ("" or why it is not known)."""
    if ablation == "none":
        return raw_spikes, ""
    if ablation == "zero":
        return np.zeros_like(raw_spikes), ""
    return raw_spikes, (
        f"unavailable from the session record: under ablation {ablation!r} the decoder saw draws (Poisson "
        "counts, or the culture's answers to other stimulations) the record does not keep; replay the step log "
        "(--source steps) if the trial kept one"
    )


def _stim_class(frequencies_hz: np.ndarray, amplitudes_ua: np.ndarray) -> np.ndarray:
    return np.array([strongest_electrode(f, a) for f, a in zip(frequencies_hz, amplitudes_ua, strict=True)], dtype=int)


def _chunks(n: int) -> list[tuple[int, int]]:
    """Up to CHUNKS consecutive ranges of at least MIN_CHUNK_TICKS ticks (one, if the session is short)."""
    count = max(1, min(CHUNKS, n // MIN_CHUNK_TICKS))
    edges = np.linspace(0, n, count + 1).astype(int)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def information_over_session(session: Session) -> list[dict[str, Any]]:
    """The meter in chunks of consecutive ticks: bits about the stimulation's class and about the action."""
    rows = []
    for lo, hi in _chunks(len(session.action)):
        row: dict[str, Any] = {"first_tick": lo, "ticks": hi - lo}
        for name, labels in (("stimulation", session.stim_class), ("action", session.action)):
            if hi - lo >= 10 and len(np.unique(labels[lo:hi])) > 1:
                row[name] = decoded_information(session.raw_spikes[lo:hi], labels[lo:hi]).as_dict()
            else:
                row[name] = None  # one class only (or too few ticks): there is nothing to carry
        rows.append(row)
    return rows


def fresh_decoder(session: Session) -> dict[str, Any]:
    """A decoder trained on the first episodes, tested on the last ones (decoder input -> action taken)."""
    if session.spikes is None:
        return {"skipped": session.spikes_missing}
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
    if session.spikes is None:
        return {"skipped": session.spikes_missing}
    if not any(session.trial_dir.glob("checkpoint_*")):
        return {"skipped": "the trial kept no checkpoint"}  # said before importing Ray, which takes seconds
    from spikeloop.experiments.watch_checkpoint import resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(session.trial_dir)
    except FileNotFoundError:
        return {"skipped": "the trial kept no checkpoint"}
    module_dir = next(checkpoint.glob("learner_group/learner/rl_module/*/"), None)
    if module_dir is None:
        return {"skipped": f"{checkpoint}: no RL module in the checkpoint"}
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    from spikeloop.models import rllib_notices

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


def replay_trial(trial_dir: Path, source: str = AUTO) -> dict[str, Any]:
    """Replay one trial; write replay.json and replay.png into it; return the report."""
    session = load_session(trial_dir, source)
    report = {
        "trial": trial_dir.name,
        "source": session.source,
        "ticks": int(len(session.action)),
        "episodes": int(len(np.unique(session.episode))),
        **(
            {
                "record_files": session.files,
                "unfinished_steps": session.unfinished_steps,
                "discarded_steps": session.discarded_steps,
            }
            if session.files
            else {}
        ),
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
