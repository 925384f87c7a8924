"""The cl backend against cl-sdk runs under Python 3.12 in its own venv; this runs that suite.

cl-sdk (non-commercial licence) needs Python 3.12, the project's main environment is 3.11:
`scripts/cl_sdk_tests.sh` builds `.venv312` and runs `tests/cl_sdk` there. Skipped, with the
script's reason, where no Python 3.12 exists.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_cl_backend_against_cl_sdk_under_python_312():
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "cl_sdk_tests.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    if proc.returncode == 0 and "SKIPPED" in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    # pytest's report is on stdout; pip's chatter on stderr would bury it.
    assert proc.returncode == 0, proc.stdout[-6000:] + "\n--- stderr (tail) ---\n" + proc.stderr[-1500:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-6000:]


DESIGN = {
    "name": "cl-design",
    "devices": [{"device_id": "cl1-a", "backend": "cl1", "host": "127.0.0.1"}],
    "resources": {"num_env_runners": 1},
    "env": {"scenario": "basic"},
    "ppo": {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1},
    "design": {
        "cultures": [{"culture_id": "cl-sdk-dish", "device": "cl1-a"}],
        "conditions": {"feedback.enabled": [True, False]},
        "block_env_steps": 64,
        "rest_s": 2,
    },
}


@pytest.mark.slow
def test_one_cultures_sequence_runs_against_cl_sdk_as_its_own_device_program(tmp_path: Path) -> None:
    """Two short blocks and a rest of one culture's design, `spikeloop tune` (3.11) against `spikeloop device
    --backend cl` (cl-sdk, 3.12) in its own process, at the simulator's own 10 Hz: the blocks in the dealt order,
    the rest recorded between them, the device told once at the end."""
    python312 = ROOT / ".venv312" / "bin" / "python"
    if not python312.is_file():
        pytest.skip("no .venv312: scripts/cl_sdk_tests.sh builds it where Python 3.12 exists")
    import json

    import yaml

    from tests.support.hardware_rig import DevicePorts, spikeloop_argv, user_env

    ports = DevicePorts()
    log = tmp_path / "device.log"
    env = user_env(CL_SDK_VISUALISATION="0", CL_SDK_RANDOM_SEED="1234", PYTHONPATH=str(ROOT))
    with log.open("w") as out:
        device = subprocess.Popen(
            [str(python312), "-m", "spikeloop.bridge.device", "--backend", "cl", *ports.device_flags()],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        data = DESIGN | {"output": {"root_dir": str(tmp_path / "runs")}}
        data["devices"] = [
            data["devices"][0]
            | {
                "stim_port": ports.stim,
                "spike_port": ports.spike,
                "event_port": ports.event,
                "feedback_port": ports.feedback,
            }
        ]
        path = tmp_path / "design.yaml"
        path.write_text(yaml.safe_dump(data))
        run = subprocess.run(
            spikeloop_argv(["spikeloop", "tune", str(path)]),
            cwd=ROOT,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        device.wait(timeout=60)  # it exits on the run's training_complete
    finally:
        if device.poll() is None:
            device.kill()
            device.wait(timeout=30)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:] + "\n--- device ---\n" + log.read_text()[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("cl-design-*")
    schedule = json.loads((run_dir / "schedule.json").read_text())
    (trial,) = run_dir.glob("culture-cl-sdk-dish-*")
    record = json.loads((trial / "sequence.json").read_text())
    assert [b["condition"] for b in record["blocks"]] == schedule["cultures"][0]["sequence"]
    assert (
        record["blocks"][1]["rest_s"] == pytest.approx(2.0)
        and (trial / record["blocks"][1]["directory"] / "rest_before.npz").is_file()
    )
    assert "training_complete" in log.read_text() and "Traceback" not in log.read_text()
