"""A 2-trial Tune sweep whose driver is SIGKILLed mid-sweep, then finished with `spikeloop tune --resume`.

The sweep (feedback on / off) runs as a user runs it: `spikeloop tune EXP.yaml`
in its own process group, starting its own local Ray. Once Tune has recorded a
trial checkpoint in its experiment state, the whole process group (driver, local
Ray, trials) is SIGKILLed: nothing gets to clean up. `spikeloop tune EXP.yaml
--resume` must then finish both trials from their checkpoints: the resumed
trials continue their iteration count where the checkpoint left it, both end
at stop.iterations, no trial errored, and each trial's episode log keeps one
unbroken numbering across the kill.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.process_tree import group_and_descendants, sigkill_all
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
def test_sweep_killed_mid_run_resumes_from_checkpoints(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path)
    root = tmp_path / "runs"
    first_log = tmp_path / "first.log"
    cmd = [sys.executable, "-m", "spikeloop.experiments.cli", "tune", str(exp)]
    with first_log.open("w") as log:
        driver = subprocess.Popen(
            cmd, cwd=REPO, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not recorded_checkpoint(sorted(root.glob("sweep_resume-*"))):
            assert driver.poll() is None, f"the sweep ended before it was killed:\n{first_log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"no checkpoint recorded in time:\n{first_log.read_text()[-6000:]}"
            time.sleep(0.5)
    finally:
        # Kill the driver and the local Ray it started (same process group), with no chance to clean up.
        sigkill_all(group_and_descendants(driver.pid))
        driver.wait(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    run_dir = next(iter(sorted(root.glob("sweep_resume-*"))))
    assert "run directory:" not in first_log.read_text()
    assert not (run_dir / "summary.yaml").exists()
    before = {
        t.name: len((t / "episodes.jsonl").read_text().splitlines()) if (t / "episodes.jsonl").exists() else 0
        for t in _trial_dirs(run_dir)
    }

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
    resumed = {Path(path).parent.name: int(it) for path, it in RESUMED.findall(output)}
    assert resumed, f"no trial was restored from a checkpoint:\n{output[-8000:]}"
    assert set(resumed) <= {t.name for t in trials}
    assert all(it >= 1 for it in resumed.values()), resumed  # from the checkpoint, not from iteration 0
    for trial in trials:
        # Tune's own count: the trial's reports end at the full iteration count and say so.
        results = [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line.strip()]
        assert results[-1]["training_iteration"] == ITERATIONS, (trial.name, results[-1])
        assert results[-1]["finished"] is True
        # The algorithm's count: progress lines of the resumed run carry on after the checkpoint's iteration.
        episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines() if line.strip()]
        assert max(e["iteration"] for e in episodes) == ITERATIONS
        # One unbroken numbering across the kill and the resume (RunLog counts the lines already there).
        assert [e["episode_index"] for e in episodes] == list(range(1, len(episodes) + 1))
        if resumed.get(trial.name, ITERATIONS) < ITERATIONS:
            after = episodes[before.get(trial.name, 0) :]
            assert after, trial.name
            assert min(e["iteration"] for e in after) == resumed[trial.name] + 1, (trial.name, resumed)
        assert any(p.name.startswith("checkpoint_") for p in trial.iterdir())
