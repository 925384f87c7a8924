"""Device programs as a lab runs them: `spikeloop device` in its own process, started by the test, not the experiment.

Shared by the hardware front-door tests (one machine and cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import spikeloop.bridge.wire.ports

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `spikeloop`, `ray`


def spikeloop_argv(argv: list[str]) -> list[str]:
    """A README `spikeloop ...` command as this environment runs it (the installed console script)."""
    assert argv[0] == "spikeloop", argv
    return [str(BIN / "spikeloop"), *argv[1:]]


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no cluster named, usage stats off, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return env | {"RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"} | extra


def wait_for_log_text(log: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Wait until `text` appears in a running process's log file; fail with the log's end if it exits or stalls."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()[-6000:]
        assert time.monotonic() < deadline, log.read_text()[-6000:]
        time.sleep(0.2)


class DevicePorts(spikeloop.bridge.wire.ports.DevicePorts):
    """The four ports of one device, chosen by the test, with the flags and overrides that name them."""

    def device_flags(self) -> list[str]:
        """What `spikeloop device` needs to use them."""
        return [
            "--stim-port",
            str(self.stim),
            "--spike-port",
            str(self.spike),
            "--event-port",
            str(self.event),
            "--feedback-port",
            str(self.feedback),
        ]

    def experiment_sets(self, index: int = 0, host: str = "127.0.0.1") -> list[str]:
        """`--set`s that point an experiment's device `index` at them."""
        sets = {
            "host": host,
            "stim_port": self.stim,
            "spike_port": self.spike,
            "event_port": self.event,
            "feedback_port": self.feedback,
        }
        return [arg for key, value in sets.items() for arg in ("--set", f"devices.{index}.{key}={value}")]


class DeviceProgram:
    """One `spikeloop device` process; its log (stderr) goes to a file, so that it can be read while it runs."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            spikeloop_argv(argv),
            cwd=REPO,
            env=user_env(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while "device up" not in self.text():
            assert self.proc.poll() is None, f"the device program exited:\n{self.text()}"
            assert time.monotonic() < deadline, f"the device program did not come up:\n{self.text()}"
            time.sleep(0.2)

    def text(self) -> str:
        """Its log so far."""
        return self.log.read_text()

    def summary(self, timeout: float = 60) -> dict:
        """Wait for it to exit by itself and return the counters it prints last."""
        self.proc.wait(timeout=timeout)
        self._log_file.close()
        lines = [line for line in self.text().splitlines() if line.startswith('{"spikeloop_device"')]
        assert lines, f"no exit summary in the device log:\n{self.text()[-3000:]}"
        return json.loads(lines[-1])["spikeloop_device"]

    def kill(self) -> None:
        """SIGKILL: the device vanishes as a crashed or unplugged one does."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Clean up after a test (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log_file.close()


def spikeloop_export_nwb(*args: str) -> subprocess.CompletedProcess:
    """`spikeloop export nwb ARGS` as a user types it, output captured."""
    return subprocess.run(
        spikeloop_argv(["spikeloop", "export", "nwb", *args]),
        cwd=REPO,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
