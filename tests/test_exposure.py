"""Nothing spikeloop starts listens beyond loopback unless the experiment says so (issue 51, item 6).

`spikeloop check` (a subprocess, as a lab runs it) refuses a device whose `bind_host` leaves loopback without
`devices.N.allow_network_bind`, naming the key and what would listen where; with the key it prints what listens
where and probes a real `spikeloop device` through the wildcard bind. The shipped cl1.yaml's `bind_host: auto`
keeps a device on loopback on loopback. A Ray that spikeloop starts itself (`init_ray`, as train, tune and watch
do) listens on loopback only: the listening sockets of its processes, listed with psutil.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support.hardware_rig import REPO, DevicePorts, DeviceProgram, spikeloop_argv, user_env

CL1 = REPO / "experiments" / "cl1.yaml"
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
DEVICE = ["spikeloop", "device", "--realtime", "--backend", "sim"]
GENEROUS = ["--set", "loop.timeout_s=1.0"]
"""cl1.yaml's 0.35 s is for a quiet machine; what is tested here is where things listen, not the timeout."""


def experiment_file(tmp_path: Path, source: Path, **device: object) -> Path:
    """`source` with its first device's keys replaced (None: the key left out), written as a file of its own."""
    data = yaml.safe_load(source.read_text())
    for key, value in device.items():
        if value is None:
            data["devices"][0].pop(key, None)
        else:
            data["devices"][0][key] = value
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def check(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """`spikeloop check ARGV`, as a user types it."""
    return subprocess.run(
        spikeloop_argv(["spikeloop", "check", *argv]),
        cwd=REPO,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("source", "device", "listens", "advice"),
    [
        (
            CL1,
            {"bind_host": "0.0.0.0", "allow_network_bind": None},
            "the trainer's UDP spike port 12346 for device 'cl1-a' on every interface of the trainer's machine "
            "(0.0.0.0); replies are taken only from 192.168.1.50",
            "for a remote one use bind_host: auto",
        ),
        (
            CL1,
            {"allow_network_bind": None},  # as shipped, less the acknowledgement: auto towards a remote device
            "on the trainer's interface that faces 192.168.1.50 (bind_host: auto)",
            "acknowledge the exposure with devices.0.allow_network_bind: true",
        ),
        (
            QUICKSTART,
            {"bind_host": "0.0.0.0"},
            "simulated device 'sim': its command ports (taken only from the bridge's port) and the trainer's spike "
            "port, free UDP ports on every interface",
            "a simulated device runs beside the trainer: use bind_host: 127.0.0.1",
        ),
    ],
    ids=["wildcard", "auto-remote", "simulated-wildcard"],
)
def test_check_refuses_a_bind_beyond_loopback_without_the_key(
    source: Path, device: dict, listens: str, advice: str, tmp_path: Path
) -> None:
    result = check([str(experiment_file(tmp_path, source, **device))], timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out  # an invalid experiment: nothing was started, nothing stimulated
    assert "Traceback" not in out, out
    assert "devices.0.bind_host:" in out and "would listen beyond loopback" in out, out
    assert listens in out, out
    assert "devices.0.allow_network_bind is not set" in out and advice in out, out


def check_against_a_device(tmp_path: Path, experiment: Path, ports: DevicePorts) -> str:
    """`spikeloop check` of `experiment` against a device program on `ports`; its output, once it passed."""
    device = DeviceProgram(DEVICE + ports.device_flags(), tmp_path / "device.log")
    try:
        result = check([str(experiment), *ports.experiment_sets(), *GENEROUS])
    finally:
        device.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_check_prints_what_listens_where_when_the_bind_is_acknowledged(tmp_path: Path) -> None:
    """A wildcard bind with the key: check says what every interface exposes, then probes through it."""
    ports = DevicePorts()
    out = check_against_a_device(
        tmp_path, experiment_file(tmp_path, CL1, bind_host="0.0.0.0", allow_network_bind=True), ports
    )
    assert (
        f"[info] network: devices.0: the trainer's UDP spike port {ports.spike} for device 'cl1-a' on every "
        "interface of the trainer's machine (0.0.0.0); replies are taken only from 127.0.0.1" in out
    ), out
    assert "[warn] network: devices.0.bind_host 0.0.0.0 listens on every interface; bind_host: auto" in out, out
    assert "[ok]   network: Ray: spikeloop starts its own on this machine, on 127.0.0.1 only" in out, out
    assert "reachable from other hosts of their network (acknowledged by allow_network_bind" in out, out
    assert f"(replies to 0.0.0.0:{ports.spike})" in out, out  # the bridge listened where check said


def test_the_shipped_cl1_binds_the_interface_facing_a_loopback_device_on_loopback(tmp_path: Path) -> None:
    """cl1.yaml as shipped (bind_host auto), pointed at a device on this machine: everything stays on loopback."""
    ports = DevicePorts()
    out = check_against_a_device(tmp_path, CL1, ports)
    assert (
        f"[ok]   network: devices.0: the trainer's UDP spike port {ports.spike} for device 'cl1-a' on 127.0.0.1 "
        "(the trainer's interface that faces 127.0.0.1 (bind_host: auto)" in out
    ), out
    assert "[info] network" not in out and "[warn] network" not in out, out
    assert f"(replies to 127.0.0.1:{ports.spike})" in out, out  # the bridge bound loopback


# --- Ray, started the way spikeloop starts it ------------------------------------------------------------------


@pytest.fixture(scope="module")
def spikeloop_ray():
    """The module's one Ray session, started by `init_ray` with no RAY_ADDRESS (a local train, tune or watch)."""
    import ray

    from spikeloop.experiments.ray_session import init_ray

    assert not ray.is_initialized()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RAY_ADDRESS")}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    init_ray()
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.update(saved)


def _listening(proc: psutil.Process) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket it listens on and each UDP socket it has bound but not connected."""
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    return [
        (c.laddr.ip, c.laddr.port)
        for c in conns
        if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr)  # 2: SOCK_DGRAM
    ]


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's loopback
    return (mapped or address).is_loopback


def test_a_local_ray_started_by_spikeloop_listens_on_loopback_only(spikeloop_ray) -> None:
    ray = spikeloop_ray

    @ray.remote
    def worker_pid() -> int:
        return os.getpid()

    ray.get(worker_pid.remote())  # a worker process, with its own gRPC server, is up too
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    sockets = {(p.pid, p.name()): _listening(p) for p in processes}
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    assert any(port == gcs_port for found in sockets.values() for _, port in found), sockets  # the GCS was listed
    assert sum(bool(found) for found in sockets.values()) >= 4, sockets  # driver, GCS, raylet, agents, worker
    exposed = {proc: [s for s in found if not _loopback(s[0])] for proc, found in sockets.items()}
    assert not any(exposed.values()), {proc: found for proc, found in exposed.items() if found}
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
