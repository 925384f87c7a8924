"""`ray job submit` of the quickstart to a real `ray start --head` cluster, token authentication on.

The cluster is started the way the README tells users to: a token file, `ray
start --head` (Ray turns token authentication on because a token exists), and
clients that pass RAY_AUTH_MODE=token plus the token (`ray job submit`) or an
`Authorization: Bearer` header (the Python JobSubmissionClient). The test checks
that requests without the token are refused, that the submitted job trains to
SUCCEEDED, that its run directory is complete, and that `--working-dir .`
shipped the repository without the virtual environments.

Everything runs on loopback with ports of its own and its own --temp-dir, so
that other Ray instances on the machine are untouched; teardown kills exactly
the processes this cluster started (its process group and their descendants),
never `ray stop`, which stops every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from spikeloop.bridge.wire.ports import free_port
from tests.support.process_tree import group_and_descendants, kill_processes
from tests.support.ray_jobs import POLL_SCRIPT
from tests.support.spikeloop_cli import TWO_SMALL_ITERATIONS

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: `ray`, `spikeloop`, `python`
JOB_TIMEOUT_S = 420


def _http_status(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def head_node(tmp_path: Path):
    """`ray start --head` on loopback with token authentication; yields what clients need."""
    temp_dir = Path(tempfile.mkdtemp(prefix="sl-job-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 chars
    token = secrets.token_hex(32)
    token_file = tmp_path / "auth_token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    gcs_port, dashboard_port = free_port(kind="tcp"), free_port(kind="tcp")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base_env |= {"PATH": f"{BIN}{os.pathsep}{base_env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
    # The head only needs the token: `ray start` turns token authentication on when one exists.
    head_env = base_env | {"RAY_AUTH_TOKEN_PATH": str(token_file)}
    start = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(gcs_port),
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard_port),
            "--include-dashboard",
            "true",
            "--num-cpus",
            "2",
            "--temp-dir",
            str(temp_dir),
            "--disable-usage-stats",
            *(
                arg
                for flag in (
                    "--ray-client-server-port",
                    "--dashboard-agent-listen-port",
                    "--dashboard-agent-grpc-port",
                    "--runtime-env-agent-port",
                    "--metrics-export-port",
                )
                for arg in (flag, str(free_port(kind="tcp")))
            ),
        ],
        env=head_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the daemons it leaves behind keep this process group: teardown kills exactly them
    )
    try:
        out, _ = start.communicate(timeout=180)
        assert start.returncode == 0, out[-4000:]
        assert "Token authentication is enabled" in out, out[-4000:]
        yield {
            "address": f"http://127.0.0.1:{dashboard_port}",
            "token": token,
            "token_file": token_file,
            "temp_dir": temp_dir,
            "env": base_env,
            # What a user's shell needs for `ray job submit` / `ray job status` against this cluster.
            "client_env": base_env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)},
        }
    finally:
        if start.poll() is None:
            start.kill()
        kill_processes(group_and_descendants(start.pid))
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_job_submit_quickstart_with_token_auth(head_node, tmp_path: Path) -> None:
    address, token = head_node["address"], head_node["token"]

    # Authentication is on: the job API refuses a request without the token, and a wrong one.
    assert _http_status(f"{address}/api/jobs/") == 401
    assert _http_status(f"{address}/api/jobs/", token="0" * 64) == 403
    assert _http_status(f"{address}/api/jobs/", token=token) == 200
    # The CLI with the token file but without RAY_AUTH_MODE=token sends no token, and is refused.
    refused = _ray(
        ["job", "list", "--address", address], head_node["env"] | {"RAY_AUTH_TOKEN_PATH": str(head_node["token_file"])}
    )
    assert refused.returncode != 0 and "Authentication" in refused.stdout + refused.stderr

    root = tmp_path / "runs"  # absolute: the job runs in an unpacked copy of the working dir
    job_id = f"spikeloop-test-{secrets.token_hex(4)}"
    submitted = _ray(
        [
            "job",
            "submit",
            "--address",
            address,
            "--working-dir",
            ".",
            "--submission-id",
            job_id,
            "--no-wait",
            "--",
            "spikeloop",
            "train",
            "experiments/quickstart.yaml",
            *TWO_SMALL_ITERATIONS,
            "--set",
            f"output.root_dir={root}",
        ],
        head_node["client_env"],
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    try:
        poll = subprocess.run(
            [sys.executable, "-c", POLL_SCRIPT, address, token, job_id, str(JOB_TIMEOUT_S)],
            env=head_node["env"],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S + 60,
        )
        assert poll.returncode == 0, poll.stderr[-4000:]
        report = json.loads(poll.stdout.strip().splitlines()[-1])
        logs = report["logs"]
        assert report["status"] == "SUCCEEDED", logs[-6000:]
    finally:
        _ray(["job", "stop", "--address", address, "--no-wait", job_id], head_node["client_env"])

    # The job trained in the cluster and wrote its run directory where the experiment said.
    runs = sorted(root.glob("quickstart-*"))
    assert len(runs) == 1, logs[-4000:]
    run_dir = runs[0]
    assert f"run directory: {run_dir}" in logs
    assert "[iter 2]" in logs
    assert (run_dir / "experiment.yaml").is_file() and (run_dir / "summary.yaml").is_file()
    trial_dir = next(p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial"))
    assert (trial_dir / "episodes.jsonl").read_text().strip()
    assert list(trial_dir.glob("events.out.tfevents.*"))
    assert sorted(p.name for p in trial_dir.glob("checkpoint_*")) == ["checkpoint_000000", "checkpoint_000001"]

    # `--working-dir .` shipped the sources (the job imported them from its copy), not the venvs or .git.
    packages = [
        p for p in head_node["temp_dir"].glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*") if p.is_dir()
    ]
    assert packages, "no unpacked working_dir package found"
    shipped = {p.name for p in packages[0].iterdir()}
    assert {"experiments", "bridge", "envs", "models", "pyproject.toml"} <= shipped
    assert not shipped & {".venv", ".venv312", ".git", "runs"}, shipped
