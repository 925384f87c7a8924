"""`spikeloop train EXP --from CHECKPOINT` as a lab uses it: pre-train on the simulated culture, continue elsewhere.

Subprocesses throughout. A short run on the `sim` culture leaves a checkpoint; a new run starts from it with
another device (the `transparent` channel, another device id). The new run's trial records what it loaded, and
the test checks that against the checkpoint's module state as read from disk here (its own digest, not the
run's): the learner and every env runner held exactly the checkpoint's weights and running statistics before
the first stimulation. The new run has its own directory, iterations and episode numbers from 1, and the old
run is not touched. Bad starts (not a checkpoint, a model that does not fit, a direct-control checkpoint into a
closed loop) are refused before Ray starts, naming the problem and the fix.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support.spikeloop_cli import ONE_SMALL_ITERATION, run_spikeloop

pytestmark = pytest.mark.slow

SHORT = ONE_SMALL_ITERATION
MODULE_STATE = Path("learner_group/learner/rl_module/default_policy/module_state.pkl")


def digest(state: dict) -> str:
    """SHA-256 over every tensor, sorted by name: name, shape and values as float64 (exact for float32)."""
    h = hashlib.sha256()
    for name in sorted(state):
        values = np.ascontiguousarray(np.asarray(state[name], dtype=np.float64))
        h.update(name.encode() + b"\0" + repr(values.shape).encode() + b"\0" + values.tobytes())
    return h.hexdigest()


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under a directory with its size and mtime: to prove nothing was written there."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()}


def only_trial(run_dir: Path) -> Path:
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    return trial


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, Path]:
    """One short iteration on the simulated culture, with a checkpoint: run dir, trial dir, checkpoint."""
    root = tmp_path_factory.mktemp("pretrain")
    proc = run_spikeloop(["train", "experiments/quickstart.yaml", *SHORT, "--set", f"output.root_dir={root}"], 400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir,) = root.glob("quickstart-*")
    (checkpoint,) = run_dir.glob("*/checkpoint_*")
    return {"root": root, "run": run_dir, "trial": checkpoint.parent, "checkpoint": checkpoint}


@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_a_new_run_starts_from_the_checkpoint_on_another_device(pretrained, tmp_path):
    before = snapshot(pretrained["run"])
    wanted = pickle.loads((pretrained["checkpoint"] / MODULE_STATE).read_bytes())
    root = tmp_path / "continued"
    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            "--from",
            str(pretrained["run"]),  # a run directory: its best checkpoint
            "--set",
            "devices=[{device_id: dish-2, backend: transparent}]",
            *SHORT,
            "--set",
            f"output.root_dir={root}",
        ],
        400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"starting from {pretrained['checkpoint']}" in out
    assert "verified; fresh optimizer" in out

    (run_dir,) = root.glob("quickstart-*")
    assert run_dir != pretrained["run"]
    trial = only_trial(run_dir)
    record = yaml.safe_load((trial / "started_from.yaml").read_text())
    assert record["checkpoint"] == str(pretrained["checkpoint"])
    assert record["tensors"] == len(wanted)
    # The weights and statistics the new run started with are the checkpoint's, in the learner and the env runner.
    assert record["checkpoint_digest"] == digest(wanted)
    assert record["learner_digest"] == digest(wanted)
    assert record["env_runner_digests"] and all(d == digest(wanted) for d in record["env_runner_digests"])
    assert record["env_runner_tensors"] == [len(wanted)] * len(record["env_runner_digests"])
    assert {"spike_mean", "feature_norm.mean", "value_net.target_std"} <= set(wanted)  # the statistics are in it
    # ...and the new run trained from there: its own checkpoint differs.
    (own,) = trial.glob("checkpoint_*")
    assert digest(pickle.loads((own / MODULE_STATE).read_bytes())) != digest(wanted)

    # Its own iteration count and episode numbers, on the new device.
    progress = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in progress] == [1]
    episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines()]
    assert episodes and [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
    assert all(e["device_id"].startswith("dish-2") for e in episodes), episodes  # the template: dish-2-<runner>
    assert yaml.safe_load((run_dir / "summary.yaml").read_text())["started_from"] == str(pretrained["checkpoint"])

    assert snapshot(pretrained["run"]) == before, "the pre-training run was written to"


def refused(args: list[str], root: Path) -> str:
    """Run `spikeloop ARGS`, expecting a refusal before anything starts; returns the message."""
    proc = run_spikeloop([*args, "--set", f"output.root_dir={root}"], 300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert not root.exists() or not any(root.iterdir()), "a run directory was created"
    assert "[iter " not in out and "Traceback" not in out, out[-4000:]
    return out


def test_starts_that_name_no_checkpoint_are_refused_before_anything_runs(tmp_path):
    """No training run needed: the refusals that come before a checkpoint is read."""
    root = tmp_path / "never"
    empty = tmp_path / "empty"
    empty.mkdir()
    out = refused(["train", "experiments/quickstart.yaml", "--from", str(empty)], root)
    assert f"--from {empty}: not a checkpoint" in out and "Give a checkpoint_* directory" in out, out

    out = refused(["train", "experiments/quickstart.yaml", "--from", str(empty), "--resume"], root)
    assert "--from starts a new run and --resume continues an old one" in out

    out = refused(["tune", "experiments/sweep_feedback.yaml", "--from", str(tmp_path / "nowhere")], root)
    assert "not a checkpoint" in out


@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_starts_whose_model_does_not_fit_the_checkpoint_are_refused_before_anything_runs(pretrained, tmp_path):
    root = tmp_path / "never"
    checkpoint = str(pretrained["checkpoint"])

    out = refused(
        ["train", "experiments/quickstart.yaml", "--from", checkpoint, "--set", "model.same_frame_rounds=2"], root
    )
    assert "the checkpoint's model does not fit this experiment's" in out, out
    assert "spike_mean is [8] in the checkpoint, [16] here" in out, out
    assert "model.same_frame_rounds: 1 in the checkpoint, 2 here" in out, out
    assert "Set them as the checkpoint was trained" in out and str(pretrained["trial"] / "experiment.yaml") in out

    out = refused(
        [
            "train",
            "experiments/quickstart.yaml",
            "--from",
            checkpoint,
            "--set",
            "env.screen=true",
            "--set",
            "model.screen_cnn=pooled",
        ],
        root,
    )
    assert "the checkpoint's model does not fit" in out and "model.screen_cnn: 'strided' in the checkpoint" in out, out
    assert "env.screen: False in the checkpoint, True here" in out, out

    out = refused(["train", "experiments/quickstart.yaml", "--from", checkpoint, "--resume"], root)
    assert "--from starts a new run and --resume continues an old one" in out


@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_a_direct_control_checkpoint_cannot_start_a_closed_loop(tmp_path):
    pre = tmp_path / "direct"
    proc = run_spikeloop(
        ["train", "experiments/controls.yaml", "--set", "policy=direct", *SHORT, "--set", f"output.root_dir={pre}"],
        400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (run_dir,) = pre.glob("controls-*")
    out = refused(["train", "experiments/quickstart.yaml", "--from", str(run_dir)], tmp_path / "never")
    assert "the checkpoint is of the direct control" in out and "this experiment is a closed loop" in out, out
    assert (
        "Start from a checkpoint trained with policy: closed_loop, or run this experiment with --set policy=direct"
        in out
    )
