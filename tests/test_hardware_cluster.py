"""Two CL1s on a `ray start` cluster, `ray job submit ... spikeloop train` with token auth (issue 13).

The lab of the README's "Running on a Ray cluster", on loopback: a head node
(`ray start --head`, token authentication on) and two device nodes, each
started with the README's device-node command and advertising its own device
(`cl1:cl1-a`, `cl1:cl1-b`) and one env-runner slot; two `spikeloop device`
programs that no experiment started play the two CL1s. The README's submit
command sends `experiments/multi_device.yaml` (host and ports pointed at the
device programs, short settings). The run must train under Tune, which puts
each trial in a placement group: each env runner and the bridge of the device
it drives must run on that device's node, both cultures must be played, and
each device program is told `training_complete` once, at the end.

Teardown kills exactly the processes this test started (their process groups
and descendants), never `ray stop`.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spikeloop.bridge.wire.ports import free_port
from tests.support.hardware_rig import BIN, REPO, DevicePorts, DeviceProgram, user_env
from tests.support.process_tree import group_and_descendants, kill_processes
from tests.support.ray_jobs import POLL_SCRIPT
from tests.support.readme_commands import readme_argv, split_env, with_options

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.long]  # minutes: the long tier

DEVICES = ("cl1-a", "cl1-b")  # the device ids of experiments/multi_device.yaml
HEAD = "ray start --head"
DEVICE_NODE = "RAY_AUTH_MODE=token ray start --address HEAD:6379"
DEVICE_PROGRAM = "spikeloop device --backend sim --realtime"
SUBMIT = "ray job submit --address http://HEAD:8265 --working-dir . -- spikeloop train experiments/multi_device.yaml"
JOB_TIMEOUT_S = 480
OBJECT_STORE_BYTES = "300000000"  # three nodes on one small machine

# Where the bridges and env runners ran: asked of the cluster's state API with the token.
PLACEMENT_SCRIPT = """
import json, sys
from ray.util.state import list_actors, list_nodes
address = sys.argv[1]
nodes = {n.node_id: sorted(k for k in (n.resources_total or {}) if k.startswith("cl1:")) for n in list_nodes(address)}
actors = [a for a in list_actors(address, detail=True, limit=10000)
          if a.class_name in ("CL1Bridge", "SingleAgentEnvRunner")]
print(json.dumps({"nodes": nodes, "actors": [{"class": a.class_name, "name": a.name, "node": a.node_id,
                                               "pid": a.pid} for a in actors]}))
"""


def _local_ports() -> list[str]:
    """Ports of one Ray node of its own, so that three nodes share one machine."""
    return [
        "--node-ip-address",
        "127.0.0.1",
        "--disable-usage-stats",
        "--object-store-memory",
        OBJECT_STORE_BYTES,
        *(
            arg
            for flag in (
                "--node-manager-port",
                "--object-manager-port",
                "--metrics-export-port",
                "--dashboard-agent-listen-port",
                "--dashboard-agent-grpc-port",
                "--runtime-env-agent-port",
            )
            for arg in (flag, str(free_port(kind="tcp")))
        ),
    ]


def _ray_start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(BIN / "ray"), *argv[1:]],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-4000:]
    proc.output = out
    return proc


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Head + one node per device (README commands), token auth on, and the two device programs."""
    tmp = tmp_path_factory.mktemp("lab")
    temp_dir = Path(tempfile.mkdtemp(prefix="sl-lab-", dir="/tmp"))  # Ray's socket paths must stay short
    token = secrets.token_hex(32)
    token_file = tmp / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    gcs_port, dashboard_port = free_port(kind="tcp"), free_port(kind="tcp")
    base_env = user_env()
    started: list[subprocess.Popen] = []
    devices: dict[str, DeviceProgram] = {}
    try:
        head = with_options(readme_argv(HEAD), {"--port": str(gcs_port), "--dashboard-host": "127.0.0.1"})
        started.append(
            _ray_start(
                head
                + _local_ports()
                + [
                    "--dashboard-port",
                    str(dashboard_port),
                    "--include-dashboard",
                    "true",
                    "--num-cpus",
                    "1",
                    "--temp-dir",
                    str(temp_dir),
                    "--ray-client-server-port",
                    str(free_port(kind="tcp")),
                ],
                base_env | {"RAY_AUTH_TOKEN_PATH": str(token_file)},
                tmp,
            )
        )
        assert "Token authentication is enabled" in started[-1].output, started[-1].output[-4000:]
        for n, device_id in enumerate(DEVICES):
            node_env, node = split_env(
                readme_argv(DEVICE_NODE, {"HEAD:6379": f"127.0.0.1:{gcs_port}", "<device_id>": device_id})
            )
            assert node_env == {"RAY_AUTH_MODE": "token"}
            # A temp dir of its own, as on a machine of its own: nodes sharing one would share (and garbage-
            # collect) each other's unpacked working directories, the job driver's current directory included.
            own_temp = temp_dir / f"n{n}"
            own_temp.mkdir()
            started.append(
                _ray_start(
                    node + _local_ports() + ["--num-cpus", "1", "--temp-dir", str(own_temp)],
                    base_env | node_env | {"RAY_AUTH_TOKEN_PATH": str(token_file)},
                    tmp,
                )
            )
        ports = {device_id: DevicePorts() for device_id in DEVICES}
        for device_id, device_ports in ports.items():
            devices[device_id] = DeviceProgram(
                readme_argv(DEVICE_PROGRAM) + device_ports.device_flags(), tmp / f"{device_id}.log"
            )
        yield {
            "address": f"http://127.0.0.1:{dashboard_port}",
            "token": token,
            "env": base_env,
            "client_env": base_env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)},
            "ports": ports,
            "devices": devices,
        }
    finally:
        for device in devices.values():
            device.stop()
        for proc in started:
            kill_processes(group_and_descendants(proc.pid))
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_multi_device_job_on_a_cluster_with_token_auth(lab, tmp_path: Path) -> None:
    root = tmp_path / "runs"  # absolute: the job runs in an unpacked copy of the working directory
    job_id = f"spikeloop-hw-{secrets.token_hex(4)}"
    submit = readme_argv(SUBMIT, {"http://HEAD:8265": lab["address"], "/shared/runs": str(root)})
    at = submit.index("--")
    submit[at:at] = ["--submission-id", job_id, "--no-wait"]
    overrides = [arg for i, device_id in enumerate(DEVICES) for arg in lab["ports"][device_id].experiment_sets(i)]
    overrides += [
        "--set",
        "stop.iterations=1",
        "--set",
        "ppo.train_batch_size_per_learner=64",
        "--set",
        "ppo.minibatch_size=32",
        "--set",
        "ppo.num_epochs=1",
        "--set",
        "loop.timeout_s=1.0",
    ]
    submitted = subprocess.run(
        [str(BIN / "ray"), *submit[1:], *overrides],
        env=lab["client_env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    try:
        poll = subprocess.run(
            [sys.executable, "-c", POLL_SCRIPT, lab["address"], lab["token"], job_id, str(JOB_TIMEOUT_S)],
            env=lab["env"],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S + 60,
        )
        assert poll.returncode == 0, poll.stderr[-4000:]
        report = json.loads(poll.stdout.strip().splitlines()[-1])
        logs = report["logs"]
        assert report["status"] == "SUCCEEDED", logs[-8000:]
    finally:
        subprocess.run(
            [str(BIN / "ray"), "job", "stop", "--address", lab["address"], "--no-wait", job_id],
            env=lab["client_env"],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )

    # The run trained, and each device program heard training_complete once, from the driver, at the end.
    (run_dir,) = root.glob("multi-device-*")
    assert "[iter 1]" in logs and f"run directory: {run_dir}" in logs
    for device_id in DEVICES:
        event_port = lab["ports"][device_id].event
        assert f"device '{device_id}' at 127.0.0.1:{event_port}: training_complete sent" in logs
        summary = lab["devices"][device_id].summary()
        assert summary["exit_reason"] == "training_complete" and summary["event_training_complete"] == 1
        assert summary["stim"] >= 16 and summary["replies"] + summary.get("replies_discarded", 0) == summary["stim"]

    # Placement: every bridge and env runner on the node that advertises its device, one device each.
    where = subprocess.run(
        [sys.executable, "-c", PLACEMENT_SCRIPT, lab["address"]],
        env=lab["client_env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr[-4000:]
    placement = json.loads(where.stdout.strip().splitlines()[-1])
    owner = {resources[0].split(":", 1)[1]: node for node, resources in placement["nodes"].items() if resources}
    assert sorted(owner) == sorted(DEVICES) and len(set(owner.values())) == 2
    bridges = {a["name"]: a["node"] for a in placement["actors"] if a["class"] == "CL1Bridge"}
    assert bridges == {f"cl1-bridge:{device_id}": owner[device_id] for device_id in DEVICES}, placement
    runners = sorted(a["node"] for a in placement["actors"] if a["class"] == "SingleAgentEnvRunner")
    assert runners == sorted(owner.values()), placement  # one env runner on each device node

    # Both cultures were played: the trial's episodes came from both devices.
    (trial,) = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial")]
    played = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines() if line.strip()]
    assert {e["device_id"] for e in played} <= set(DEVICES)  # (a 32-step share may end no episode)
