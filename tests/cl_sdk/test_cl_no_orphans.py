"""Nothing of cl-sdk's simulator outlives a `cl` device program, however the program ends.

cl-sdk runs its data producer (and recording writer, and visualisation server) as processes in sessions of
their own; they once ran on for hours, orphaned, after device programs that were killed. Each test starts
`spikeloop device --backend cl` as its own process with a marker in its environment (every process it starts
inherits it), waits for it to answer, ends it (training_complete, SIGTERM, SIGKILL) and then requires that no
process carrying the marker is left. The visualisation server is on, as a user gets it by default.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from spikeloop.bridge.device.backends.cl_reaper import CL_SDK_WORKER
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import EventMessage, StimCommand, decode_spikes, encode_event, encode_stim

ROOT = Path(__file__).resolve().parents[2]
MARK = "SPIKELOOP_TEST_DEVICE_MARK"
DEVICE = "import sys; from spikeloop.bridge.device.program import main; sys.exit(main(sys.argv[1:]))"


def _marked(token: str) -> dict[int, list[str]]:
    """Live (not zombie) processes whose environment carries MARK=token: pid -> argv."""
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={token}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = argv
    return found


def _left_after(token: str, wait_s: float) -> dict[int, list[str]]:
    """The marked processes still alive once they have had `wait_s` to end."""
    deadline = time.monotonic() + wait_s
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _start_answering_device(tmp_path: Path, token: str) -> tuple[subprocess.Popen[bytes], int, socket.socket]:
    """A cl device program that has answered one stimulation; its process, event port and reply socket.

    Its output goes to files: cl-sdk's workers inherit them, and orphans would hold a pipe open forever.
    """
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    stim_port, event_port, feedback_port = free_port(), free_port(), free_port()
    command = [
        *(sys.executable, "-c", DEVICE, "--backend", "cl", "--recording-path", str(tmp_path / "recording")),
        *("--stim-port", str(stim_port), "--event-port", str(event_port), "--feedback-port", str(feedback_port)),
        *("--spike-port", str(rx.getsockname()[1]), "--artifact-wait-ms", "5", "--collect-window-ms", "5"),
    ]
    env = os.environ | {MARK: token, "CL_SDK_VISUALISATION": "1", "PYTHONPATH": str(ROOT)}
    with (tmp_path / "stdout").open("wb") as stdout, (tmp_path / "stderr").open("wb") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.settimeout(1.0)
    deadline = time.monotonic() + 120.0  # cl.open() starts the producer and the visualisation server first
    try:
        while time.monotonic() < deadline:
            tx.sendto(encode_stim(StimCommand(7, (20.0,) * N_ENCODING, (2.0,) * N_ENCODING)), ("127.0.0.1", stim_port))
            try:
                if decode_spikes(rx.recv(64)).timestamp_us == 7:
                    return proc, event_port, rx
            except TimeoutError:
                assert proc.poll() is None, _tail(tmp_path / "stderr")
        raise AssertionError("the cl device never answered")
    except BaseException:
        proc.kill()
        proc.wait()
        rx.close()
        raise
    finally:
        tx.close()


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


def _names(token: str) -> list[str]:
    """The --process-name of each cl-sdk worker carrying the marker."""
    return sorted(argv[argv.index("--process-name") + 1] for argv in _marked(token).values() if CL_SDK_WORKER in argv)


@pytest.mark.parametrize("end", ["training_complete", "SIGTERM", "SIGKILL"])
def test_nothing_outlives_the_cl_device_program(tmp_path: Path, end: str) -> None:
    token = uuid.uuid4().hex
    left: dict[int, list[str]] = {}
    try:
        proc, event_port, rx = _start_answering_device(tmp_path, token)
        try:
            # What could be orphaned is there: the data producer and the visualisation server at least.
            names = _names(token)
            assert any(n.startswith("cl-data-producer") for n in names), names
            assert any(n.startswith("cl-websocket") for n in names), names
            if end == "training_complete":
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
                    tx.sendto(encode_event(EventMessage(8, end, {})), ("127.0.0.1", event_port))
            else:
                proc.send_signal(getattr(signal, end))
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            rx.close()
        if end == "SIGKILL":
            assert proc.returncode == -signal.SIGKILL
        else:
            stderr = _tail(tmp_path / "stderr")
            assert proc.returncode == 0 and f'"exit_reason": "{end}"' in stderr, stderr
        left = _left_after(token, wait_s=15.0)  # the reaper's grace (3 s) and the producers' own shutdown
    finally:
        for pid in _marked(token):  # never leave them running, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == {}, f"left behind after {end}: {left}"
