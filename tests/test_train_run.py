"""`spikeloop train` end to end, as a user runs it: a subprocess, a local Ray, the quickstart.

What a finished run leaves behind is checked by reading it back the way a user
would: the resolved config, TensorBoard event files (every tag group), the
episode log, the learning curve and the checkpoints. Then `--resume` on the
finished run returns at once without training or logging anything again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spikeloop.models.rllib_notices import NOTICES, TUNE_BANNER
from tests.support.spikeloop_cli import TWO_SMALL_ITERATIONS, run_spikeloop

TAG_GROUPS = ("episode/", "ppo/", "encoder/", "decoder/", "spikes/", "feedback/", "loop/", "culture/")


def event_tags(trial_dir: Path) -> set[str]:
    """Every scalar tag in the trial's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for path in trial_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def _only(paths: list[Path], what: str) -> Path:
    assert len(paths) == 1, f"expected one {what}, found {paths}"
    return paths[0]


@pytest.mark.slow
def test_train_quickstart_leaves_a_complete_run_directory(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        ["train", "experiments/quickstart.yaml", *TWO_SMALL_ITERATIONS, "--set", f"output.root_dir={root}"], timeout=400
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # The final report must not kill the trial thread (Tune's reserved "done" key did: SystemExit).
    assert "_report_training_result" not in output, output[-6000:]
    # Ray's and RLlib's notices a user cannot act on stay out of the terminal, from every process: among them
    # the private Ray's token-authentication notice (driver) and Tune's checkpoint lines (trial), and Tune's banner.
    for notice in (*(notice for _, notice in NOTICES), *TUNE_BANNER):
        assert notice not in output, [line for line in output.splitlines() if notice in line][:3]
    assert "[iter 1]" in output, output[-6000:]  # spikeloop's own progress still shows
    assert "deprecated" not in output, [line for line in output.splitlines() if "deprecated" in line][:3]

    run_dir = _only(sorted(root.glob("quickstart-*")), "run directory")
    assert f"run directory: {run_dir}" in proc.stdout

    # The resolved config: every default written out, the overrides applied.
    resolved = yaml.safe_load((run_dir / "experiment.yaml").read_text())
    assert resolved["stop"]["iterations"] == 2
    assert resolved["ppo"]["train_batch_size_per_learner"] == 256
    assert resolved["output"]["root_dir"] == str(root)
    assert {"devices", "loop", "safety", "feedback", "env", "model", "checkpoint"} <= set(resolved)
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert summary["trials"] == 1 and summary["errored"] == 0
    # Which code and command made the run: the commit this checkout is at, the command as typed.
    provenance = json.loads((run_dir / "provenance.json").read_text())
    started = provenance["started"]
    assert started["command"] == " ".join(
        ["spikeloop", "train", "experiments/quickstart.yaml", *TWO_SMALL_ITERATIONS, "--set", f"output.root_dir={root}"]
    )
    assert len(started["git"]["commit"]) == 40 and provenance["resumed"] == []

    trial_dir = _only([p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")], "trial")
    trial_resolved = yaml.safe_load((trial_dir / "experiment.yaml").read_text())
    assert {k: trial_resolved.get(k) for k in resolved} == resolved

    # TensorBoard: every tag group, and the counters (numpy ints in RLlib's result) among them.
    tags = event_tags(trial_dir)
    for group in TAG_GROUPS:
        assert any(t.startswith(group) for t in tags), f"no {group} tags in {sorted(tags)}"
    for tag in (
        "episode/return_mean",
        "ppo/policy_loss",
        "encoder/entropy",
        "encoder/lr",
        "decoder/weight_norm",
        "spikes/mean_attack",
        "feedback/sent",
        "loop/latency_p50_ms",
        "loop/timeouts",
        "loop/indistinct",  # every correlation counter (LOOP_COUNTERS), named once, reaches TensorBoard
        # The live information meter (on by default), over the last ticks of each sample: bits per tick and noise.
        "culture/info_stim",
        "culture/info_stim_sd",
        "culture/info_features",
        "culture/info_action",
    ):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"

    # episodes.jsonl: one line per finished episode, numbered 1..N.
    lines = (trial_dir / "episodes.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines if line.strip()]
    assert len(episodes) >= 2
    assert [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
    assert {e["iteration"] for e in episodes} <= {1, 2}
    assert all("episode_reward" in e for e in episodes)
    assert (trial_dir / "learning_curve.png").stat().st_size > 1000

    # Checkpoints every iteration (plus the final one), each a restorable RLlib checkpoint.
    checkpoints = sorted(p.name for p in trial_dir.glob("checkpoint_*"))
    assert checkpoints == ["checkpoint_000000", "checkpoint_000001"]
    for name in checkpoints:
        assert (trial_dir / name / "rllib_checkpoint.json").is_file()
    assert summary["final_checkpoints"] == [str(trial_dir / "checkpoint_000001")]
    progress = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert [r["training_iteration"] for r in progress] == [1, 2]
    assert progress[-1]["finished"] is True

    # --resume on a finished run: restores it, trains nothing, logs nothing twice.
    proc = run_spikeloop(
        ["train", "experiments/quickstart.yaml", *TWO_SMALL_ITERATIONS, "--set", f"output.root_dir={root}", "--resume"],
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert f"resuming {run_dir}" in proc.stdout
    resumed = json.loads((run_dir / "provenance.json").read_text())
    assert resumed["started"] == started and resumed["resumed"][0]["command"].endswith("--resume")
    assert "[iter " not in output
    assert (trial_dir / "episodes.jsonl").read_text().splitlines() == lines
    assert sorted(p.name for p in trial_dir.glob("checkpoint_*")) == checkpoints


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_train_the_direct_control_needs_no_culture(tmp_path: Path) -> None:
    # `policy: direct` through the front door: no device is started, episodes are logged like any run.
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/controls.yaml",
            "--set",
            "policy=direct",
            *TWO_SMALL_ITERATIONS,
            "--set",
            f"output.root_dir={root}",
        ],
        timeout=400,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    run_dir = _only(sorted(root.glob("controls-*")), "run directory")
    trial_dir = _only([p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")], "trial")
    assert yaml.safe_load((trial_dir / "experiment.yaml").read_text())["policy"] == "direct"
    episodes = [json.loads(line) for line in (trial_dir / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(e["device_id"] is None for e in episodes)  # a culture link would name its device
    tags = event_tags(trial_dir)
    assert {"episode/return_mean", "decoder/ratio_mean", "value/target_std"} <= tags, sorted(tags)


def _stopped_after_the_first_iteration(root: Path, sig: int, sigint: str = "default") -> tuple[list[str], Path, str]:
    """`spikeloop train` on the quickstart, sent `sig` after its first iteration: exit 130, how to continue, unfinished.

    `sigint`: how SIGINT stands when the command starts (`spikeloop_with_sigint`).

    Returns the command's arguments, the run directory and everything the command printed.
    """
    import subprocess
    import time

    from tests.support.spikeloop_cli import REPO, cli_env, spikeloop_with_sigint

    args = ["train", "experiments/quickstart.yaml", *TWO_SMALL_ITERATIONS, "--set", "stop.iterations=4"]
    args += ["--set", f"output.root_dir={root}"]
    proc = subprocess.Popen(
        spikeloop_with_sigint(sigint, args),
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    deadline = time.monotonic() + 400
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        if "[iter 1]" in line:
            proc.send_signal(sig)
            break
        assert time.monotonic() < deadline, "".join(output)[-3000:]
    rest, _ = proc.communicate(timeout=300)
    text = "".join(output) + rest
    assert proc.returncode == 130, text[-4000:]
    command = "spikeloop " + " ".join(args)
    assert "interrupted: 1 of 1 trial(s) had not finished" in text and f"`{command} --resume`" in text, text[-3000:]
    assert "Tuner.restore" not in text  # Tune's advice for its Python API is not what a spikeloop user types
    (run_dir,) = root.glob("quickstart-*")
    assert yaml.safe_load((run_dir / "summary.yaml").read_text())["unfinished_trials"] == 1
    return args, run_dir, text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_stops_the_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """A scheduler's SIGTERM: the run's state saved, the resume command printed, not Ray's signal dump.

    Started as a script starts a job in the background (SIGINT ignored), where a stop must still come from SIGTERM.
    """
    import signal

    _, _, text = _stopped_after_the_first_iteration(tmp_path / "runs", signal.SIGTERM, sigint="ignored")
    assert "SIGTERM received" not in text, text[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_stops_the_run_says_how_to_continue_and_does_not_call_it_complete(tmp_path: Path) -> None:
    """SIGINT after the first iteration: exit 130, spikeloop's own resume command, the run marked unfinished.

    Then that command: the quickstart is unpaced and simulated, so its trial starts again from the start rather
    than from its checkpoint, and so repeats the interrupted attempt's episodes byte for byte, which stay on disk.
    """
    import signal

    root = tmp_path / "runs"
    args, run_dir, text = _stopped_after_the_first_iteration(root, signal.SIGINT)  # what Ctrl-C sends the driver
    assert "start again from the start" in text, text[-3000:]

    resumed = run_spikeloop([*args, "--resume"], timeout=400)
    again = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, again[-4000:]
    # "not from its checkpoint", or "not where it stopped" when Ctrl-C came before the first checkpoint
    assert "started again from the start, not " in again, again[-4000:]
    trial_dir = _only([p.parent for p in run_dir.glob("*/" + "params.json")], "trial directory")
    aside = _only(list(trial_dir.glob("abandoned-*")), "abandoned attempt")
    before = (aside / "episodes.jsonl").read_text()
    after = (trial_dir / "episodes.jsonl").read_text()
    assert before and after.startswith(before) and len(after) > len(before)
    assert (aside / "record").is_dir() and list(aside.glob("events.out.tfevents.*"))
    assert yaml.safe_load((run_dir / "summary.yaml").read_text()).get("unfinished_trials", 0) == 0
