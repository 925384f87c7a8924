"""A 2-trial Tune sweep whose driver is SIGKILLed mid-sweep, then finished with `spikeloop tune --resume`.

The sweep (feedback on / off) runs as a user runs it: `spikeloop tune EXP.yaml`
in its own process group, starting its own local Ray. Once Tune has recorded a
trial checkpoint in its experiment state, the whole process group (driver, local
Ray, trials) is SIGKILLed: nothing gets to clean up. `spikeloop tune EXP.yaml
--resume` must then finish both trials. The sweep's culture is simulated and
unpaced, so the rule of docs/architecture.md ("Unpaced simulated runs repeat bit
for bit": only a whole run is the run its seed gives) applies: a trial that had
not finished starts again from the start, not from its checkpoint, the earlier
attempt's files go to `abandoned-*/`, and the whole run repeats the abandoned
attempt's episodes byte for byte before it goes on to the full budget in one
driver, with no trial errored and one unbroken episode numbering.
(Continuing from a checkpoint, for runs whose devices are not unpaced
simulations, is tests/test_device_outage.py's stop-and-resume case.)
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.process_tree import group_and_descendants, sigkill_all, sigkill_group_once
from tests.support.spikeloop_cli import cli_env, recorded_checkpoint

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 4
STARTUP_TIMEOUT_S = 300
RESUMED = re.compile(r"resumed from (\S+) at iteration (\d+)")


def write_sweep(tmp_path: Path) -> Path:
    """The quickstart, shrunk to a 2-trial grid over feedback on/off, one process per trial."""
    data = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    data["name"] = "sweep_resume"
    data["ppo"] = {"train_batch_size_per_learner": 256, "minibatch_size": 64, "num_epochs": 1}
    data["resources"] = {"num_env_runners": 0}
    data["stop"] = {"iterations": ITERATIONS}
    data["checkpoint"] = {"every_iterations": 1, "keep": 2}
    data["tune"] = {"search_space": {"feedback.enabled": {"grid": [True, False]}}, "max_concurrent_trials": 2}
    data["output"] = {"root_dir": str(tmp_path / "runs")}
    path = tmp_path / "sweep_resume.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _trial_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial"))


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_sweep_killed_mid_run_is_finished_by_resume_each_trial_whole(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path)
    root = tmp_path / "runs"
    first_log = tmp_path / "first.log"
    cmd = [sys.executable, "-m", "spikeloop.experiments.cli", "tune", str(exp)]
    with first_log.open("w") as log:
        driver = subprocess.Popen(
            cmd, cwd=REPO, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    # Kill the driver and the local Ray it started (same process group), with no chance to clean up.
    sigkill_group_once(
        driver,
        lambda: recorded_checkpoint(sorted(root.glob("sweep_resume-*"))),
        first_log,
        STARTUP_TIMEOUT_S,
        "checkpoint recorded",
    )
    assert driver.returncode == -signal.SIGKILL
    run_dir = next(iter(sorted(root.glob("sweep_resume-*"))))
    assert "run directory:" not in first_log.read_text()
    assert not (run_dir / "summary.yaml").exists()
    unfinished = {t.name for t in _trial_dirs(run_dir) if not (t / "trial_ended.json").exists()}
    assert unfinished, "every trial had finished before the kill: nothing to resume"

    resume = subprocess.Popen(
        [*cmd, "--resume"],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = resume.communicate(timeout=480)
    finally:
        sigkill_all(group_and_descendants(resume.pid))  # leftovers of its local Ray, if any
    assert resume.returncode == 0, output[-8000:]
    assert f"resuming {run_dir}" in output
    assert f"run directory: {run_dir}" in output

    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert summary["trials"] == 2 and summary["errored"] == 0, summary
    assert len(summary["final_checkpoints"]) == 2

    trials = _trial_dirs(run_dir)
    assert len(trials) == 2
    # Tune hands each unfinished trial its checkpoint; the trial starts again from the start instead.
    assert not RESUMED.findall(output), output[-8000:]
    assert output.count("started again from the start, not ") == len(unfinished), output[-8000:]
    for trial in trials:
        results = [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line.strip()]
        assert results[-1]["finished"] is True, (trial.name, results[-1])
        # The algorithm's count: the whole budget, in one driver when the trial had not finished at the kill.
        episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines() if line.strip()]
        assert max(e["iteration"] for e in episodes) == ITERATIONS
        assert [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
        if trial.name in unfinished:
            ended = json.loads((trial / "trial_ended.json").read_text())
            assert ended["iterations_this_driver"] == ITERATIONS, (trial.name, ended)
            # The abandoned attempt, kept aside, is where the whole run began: byte for byte (when it wrote any).
            for aside in trial.glob("abandoned-*"):
                if (aside / "episodes.jsonl").exists():
                    before = (aside / "episodes.jsonl").read_text()
                    assert (trial / "episodes.jsonl").read_text().startswith(before), trial.name
        assert any(p.name.startswith("checkpoint_") for p in trial.iterdir())
