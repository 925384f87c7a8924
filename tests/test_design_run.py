"""`experiments/sweep_cultures.yaml` as a lab runs it: four dishes, each a device program of its own.

The four CL1s are `spikeloop device --backend sim --culture-seed N` processes (unpaced, so the test is short;
each its own dish, kept in memory between blocks as a dish stays in its CL1). `spikeloop tune` runs the shipped
file with only the devices' ports, a small budget (blocks of 128 env steps, one pass) and the output directory
overridden. The driver is SIGKILLed (its whole process group: nothing cleans up) once a dish has finished a
block; `spikeloop tune --resume` goes on with each dish at the block it was in, never running a finished block
again. Then `spikeloop analyze` reports with the dish as the unit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.hardware_rig import REPO, DevicePorts, DeviceProgram, spikeloop_argv
from tests.support.process_tree import sigkill_group_once
from tests.support.spikeloop_cli import cli_env

pytestmark = pytest.mark.slow

SHIPPED = REPO / "experiments" / "sweep_cultures.yaml"
SMALL = {
    "design.block_env_steps": 128,
    "design.repeats": 1,
    "design.rest_s": 1,
    "ppo.train_batch_size_per_learner": 128,
    "ppo.minibatch_size": 64,
    "ppo.num_epochs": 1,
    "output.step_log": "false",
}


def _sequences(run_dir: Path) -> dict[str, dict]:
    records = [json.loads(p.read_text()) for p in run_dir.glob("culture-*/sequence.json")]
    return {r["culture_id"]: r for r in records}


TWO_DISHES = {
    "design.cultures": "[{culture_id: dish-01, device: cl1-a}, {culture_id: dish-02, device: cl1-b}]",
    "design.conditions": "{feedback.use_reward_feedback: [true, false]}",
}
"""The default suite's scale: two of the four dishes, the reward-feedback half of the grid (4 blocks)."""


@pytest.mark.parametrize(
    "scale",
    [
        pytest.param(TWO_DISHES, id="two-dishes"),
        pytest.param({}, id="as-shipped", marks=pytest.mark.long),  # 4 dishes x 4 conditions: 16 blocks
    ],
)
def test_the_shipped_design_runs_dish_by_dish_resumes_at_its_block_and_is_analysed_by_dish(
    tmp_path: Path, scale: dict[str, str]
) -> None:
    shipped = yaml.safe_load(SHIPPED.read_text())
    cultures = yaml.safe_load(scale["design.cultures"]) if scale else shipped["design"]["cultures"]
    conditions = 2 if scale else 4
    root = tmp_path / "runs"
    sets = [arg for key, value in (SMALL | scale).items() for arg in ("--set", f"{key}={value}")]
    sets += ["--set", f"output.root_dir={root}"]
    devices = []
    try:
        for i in range(len(shipped["devices"])):  # every CL1 of the file has its program, used or not
            ports = DevicePorts()
            flags = ["--backend", "sim", "--as-fast-as-possible", "--culture-seed", str(i)]
            devices.append(DeviceProgram(["spikeloop", "device", *flags, *ports.device_flags()], tmp_path / f"{i}.log"))
            sets += ports.experiment_sets(i)
            sets += ["--set", f"devices.{i}.bind_host=127.0.0.1", "--set", f"devices.{i}.allow_network_bind=false"]
        command = [*spikeloop_argv(["spikeloop", "tune", str(SHIPPED)]), *sets]
        first_log = tmp_path / "first.log"
        with first_log.open("w") as log:
            driver = subprocess.Popen(
                command, cwd=REPO, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        sigkill_group_once(
            driver,
            lambda: root.exists() and any(r["blocks"] for r in _sequences(_run_dir(root)).values()),
            first_log,
            600,
            "finished block",
        )
        assert driver.returncode == -signal.SIGKILL
        run_dir = _run_dir(root)
        before = {cid: [dict(b) for b in r["blocks"]] for cid, r in _sequences(run_dir).items()}
        # Blocks the kill cut short: begun (their directory made) but not in their dish's record.
        cut = {
            _culture_of(trial): block.name
            for trial in run_dir.glob("culture-*")
            for block in trial.glob("block-*")
            if block.name
            not in {b["directory"] for b in _sequences(run_dir).get(_culture_of(trial), {}).get("blocks", [])}
        }
        done_before = sum(len(b) for b in before.values())
        assert 0 < done_before < conditions * len(cultures), before

        resumed = subprocess.run(
            [*command, "--resume"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=900
        )
        output = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, output[-8000:]
        told = [device.summary() for device in devices]
    finally:
        for device in devices:
            device.stop()
    assert all(t["exit_reason"] == "training_complete" for t in told), told

    schedule = json.loads((run_dir / "schedule.json").read_text())
    sequences = _sequences(run_dir)
    assert sorted(sequences) == sorted(c["culture_id"] for c in cultures)
    for culture in schedule["cultures"]:
        record = sequences[culture["culture_id"]]
        # Every dish took its own order, block by block; what it had finished before the kill stands as it was.
        assert [b["condition"] for b in record["blocks"]] == culture["sequence"]
        assert [b["period"] for b in record["blocks"]] == list(range(conditions))
        assert record["blocks"][: len(before.get(culture["culture_id"], []))] == before.get(culture["culture_id"], [])
        assert all(b["episodes"] >= 1 and b["final_return"] is not None for b in record["blocks"])
        assert [b["rest_s"] > 0 for b in record["blocks"]] == [False] + [True] * (conditions - 1)
        trial = next(run_dir.glob(f"culture-{culture['culture_id']}-*"))
        for block in record["blocks"][1:]:
            assert (trial / block["directory"] / "rest_before.npz").is_file()
        # A block the kill cut short was kept aside, not deleted, and named in the dish's record.
        aside = [a["directory"] for a in record["abandoned"]]
        if culture["culture_id"] in cut:
            assert len(aside) == 1 and aside[0].endswith(cut[culture["culture_id"]]), (aside, cut)
        else:
            assert aside == []
        assert all((trial / name).is_dir() for name in aside)
    assert cut, "no block was cut short by the kill"
    # Each dish was its own device program all along: the resumed run told each one the run was over.

    analysis = subprocess.run(
        [*spikeloop_argv(["spikeloop", "analyze", str(run_dir)])],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert analysis.returncode == 0, analysis.stdout + analysis.stderr
    assert f"cultures: {len(cultures)} (the unit); blocks: {conditions * len(cultures)}" in analysis.stdout
    assert "orderings" in analysis.stdout and "seed" not in analysis.stdout
    written = json.loads((run_dir / "analysis.json").read_text())
    assert written["unit"] == "culture" and written["schedule"] == schedule


def _culture_of(trial: Path) -> str:
    """culture-<culture_id>-<tune trial id> -> culture_id (ids hold no '-' after the dish's own)."""
    return trial.name.removeprefix("culture-").rsplit("-", 1)[0]


def _run_dir(root: Path) -> Path:
    runs = sorted(root.glob("sweep-cultures-*"))
    assert len(runs) == 1, runs
    return runs[0]


def test_train_refuses_a_design_and_names_tune(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "train", str(SHIPPED)],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "use `spikeloop tune` for it" in done.stderr and "Traceback" not in done.stderr
