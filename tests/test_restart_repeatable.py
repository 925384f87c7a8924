"""Which resumed trials start again from the start (runner._restart_if_repeatable), on trial directories as a run
leaves them; the whole path through `spikeloop train --resume` is tests/test_train_run.py's Ctrl-C test."""

from __future__ import annotations

from pathlib import Path

import yaml

from spikeloop.experiments.runner import _restart_if_repeatable
from tests.support.spikeloop_cli import REPO

CHECKPOINT = object()  # stands for Tune's checkpoint: passed through or dropped, never opened


def _tune_config(**device) -> dict:
    experiment = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    experiment["devices"][0].update(device)
    return {"experiment": experiment}


def _trial_dir(tmp_path: Path) -> Path:
    trial = tmp_path / "train_trial_0"
    (trial / "record").mkdir(parents=True)
    (trial / "checkpoint_000001").mkdir()
    for name in ("episodes.jsonl", "events.out.tfevents.1.vm.1.0", "record/session.h5", "learning_curve.png"):
        (trial / name).write_text(name)
    for name in ("experiment.yaml", "params.json", "params.pkl", "result.json", "progress.csv"):
        (trial / name).write_text(name)
    return trial


def test_an_unpaced_simulated_trial_starts_again_and_keeps_what_it_wrote(tmp_path: Path) -> None:
    trial = _trial_dir(tmp_path)
    assert _restart_if_repeatable(_tune_config(), CHECKPOINT, trial) is None
    (aside,) = trial.glob("abandoned-*")
    assert sorted(p.name for p in aside.iterdir()) == [
        "episodes.jsonl",
        "events.out.tfevents.1.vm.1.0",
        "learning_curve.png",
        "record",
    ]
    assert (aside / "record" / "session.h5").read_text() == "record/session.h5"
    kept = {"abandoned", "checkpoint_000001", "experiment.yaml", "params.json", "params.pkl", "progress.csv"}
    assert {p.name.split("-")[0] for p in trial.iterdir()} == kept | {"result.json"}
    # Killed again before it wrote anything: nothing to move, and still not continued from the (old) checkpoint.
    assert _restart_if_repeatable(_tune_config(), CHECKPOINT, trial) is None
    assert len(list(trial.glob("abandoned-*"))) == 1
    (trial / "episodes.jsonl").write_text("again")
    assert _restart_if_repeatable(_tune_config(), CHECKPOINT, trial) is None  # the same second: its own folder
    assert len(list(trial.glob("abandoned-*"))) == 2


def test_a_paced_trial_continues_from_its_checkpoint(tmp_path: Path) -> None:
    trial = _trial_dir(tmp_path)
    assert _restart_if_repeatable(_tune_config(realtime=True), CHECKPOINT, trial) is CHECKPOINT
    assert not list(trial.glob("abandoned-*")) and (trial / "episodes.jsonl").is_file()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "params.json").write_text("{}")
    assert _restart_if_repeatable(_tune_config(), None, fresh) is None and not list(fresh.glob("abandoned-*"))
