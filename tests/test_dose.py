"""Stimulation dose and hard limits, through the commands a lab types.

`spikeloop device` runs as its own process with a small dose budget and a narrowed envelope; a real UDP client
on loopback stimulates it and asks for its status; the charge it books is compared with `stim_charge_nc` and
`burst_charge_nc`. `spikeloop check` is run against such a device with an experiment that asks for more than
it allows. The hard ceiling (the CL1 SDK's documented limits) is refused in the experiment, on the device's
command line and at the device on the wire.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.backends import burst_charge_nc, stim_charge_nc
from spikeloop.bridge.device.dose import DOSE_BIN_S, DOSE_WINDOW_S, DoseBudget, DoseMeter, DoseRefusal, status_metrics
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ENCODING
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    encode_feedback,
)
from spikeloop.bridge.wire.safety import CEILINGS
from spikeloop.bridge.wire.settings import DOSE_BUDGET_NC_PER_MIN
from spikeloop.experiments.commands import check
from spikeloop.experiments.schema import ExperimentError, load_experiment
from tests.support.device_client import TICK_HZ, Client, start_device, stop_device

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")
BUDGET_NC = 3.0
DEVICE_MAX_UA = 2.0


def entry(index: int, freq: float, amp: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A stimulation with only encoding entry `index` on."""
    freqs = tuple(freq if i == index else 0.0 for i in range(N_ENCODING))
    amps = tuple(amp if i == index else 0.0 for i in range(N_ENCODING))
    return freqs, amps


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client()
    yield c
    c.sock.close()


@pytest.mark.parametrize("budget", ["nc_per_min", "nc_per_session"])
def test_device_books_the_charge_refuses_past_its_budget_and_tells_the_trainer(client: Client, budget: str) -> None:
    # One budget per device process: the device's clock does not run a minute in a test, so of two budgets
    # only the smaller would ever bind (the minute's sliding is tested on DoseMeter below).
    flag = "--dose-budget-" + budget.replace("_", "-")
    # 100 ms of culture time per stimulation: each burst below has ended before the next starts, so it is booked
    # whole (a burst cut short is booked as far as it ran: tests/test_device_limits.py).
    windows = ("--artifact-wait-ms", "50", "--collect-window-ms", "50")
    proc = start_device(client, flag, str(BUDGET_NC), "--max-amplitude-ua", str(DEVICE_MAX_UA), *windows)
    try:
        # Entry 0 at 2 uA, 40 Hz: a 4-pulse burst, 0.96 nC; a 3 nC budget takes three of them.
        strong = stim_charge_nc(2.0, 40.0, TICK_HZ, "burst")
        # Entry 1 at 1 uA, 10 Hz: one pulse, 0.12 nC; six stay far inside the budget of their own electrode.
        weak = stim_charge_nc(1.0, 10.0, TICK_HZ, "burst")
        assert (strong, weak) == pytest.approx((0.96, 0.12))
        for i in range(5):
            client.stim(100 + i, *entry(0, 40.0, 2.0))  # the last two would pass 3 nC: refused, still answered
        for i in range(6):
            client.stim(200 + i, *entry(1, 10.0, 1.0))
        # The device's envelope bounds whatever the trainer asks: 2.5 uA is above its --max-amplitude-ua 2,
        # and 50 uA above the hard ceiling too. Refused as outside the envelope, not booked, answered.
        client.stim(300, *entry(2, 10.0, 2.5))
        client.stim(301, *entry(2, 10.0, 50.0))
        # Feedback on electrode 19: 10 pulses at 2 uA, 2.4 nC; a second would pass 3 nC/min.
        reward = FeedbackCommand(400, FeedbackType.REWARD, (19,), 20, 2.0, 10, False, "reward")
        for _ in range(2):
            client.sock.sendto(encode_feedback(reward), ("127.0.0.1", client.ports["feedback"]))
            client.stim(401, (0.0,) * 8, (0.0,) * 8)  # the device handles feedback before this stimulation
        status = client.status()
    finally:
        summary = stop_device(proc)

    booked_19 = burst_charge_nc(2.0, 10)
    assert status["dose_budget"] == {"nc_per_min": DOSE_BUDGET_NC_PER_MIN.default, "nc_per_session": None} | {
        budget: BUDGET_NC
    }
    assert status["refused"] == {
        "refused_stim": 2,
        "refused_feedback": 0,
        "dose_refused_stim": 2,
        "dose_refused_feedback": 1,
        "rate_refused_stim": 0,  # the stimulations here are spaced in culture time: none is too fast
        "rate_refused_feedback": 0,
    }
    dose = status["dose"]
    assert dose["max_nc_per_min"] == pytest.approx(3 * strong)
    assert dose["max_nc_per_min_electrode"] == ENCODING_ELECTRODES[0]
    assert dose["max_nc_session"] == pytest.approx(3 * strong)
    assert dose["total_nc_session"] == pytest.approx(3 * strong + 6 * weak + booked_19)
    assert status["envelope"]["max_amplitude_ua"] == DEVICE_MAX_UA
    # What the trainer reads off that status (bridge stats -> culture/device_dose_* in TensorBoard).
    metrics = status_metrics(status)
    assert metrics["device_dose_refused_stim"] == 2 and metrics["device_dose_refused_feedback"] == 1
    assert metrics["device_dose_max_nc_per_min"] == pytest.approx(3 * strong)
    # The same counts in what the device prints at exit.
    assert (summary["dose_refused_stim"], summary["dose_refused_feedback"], summary["refused_stim"]) == (2, 1, 2)
    assert summary["status_sent"] == 1
    assert summary["dose"]["total_nc_session"] == pytest.approx(dose["total_nc_session"])


def test_per_minute_budget_slides_over_the_last_60_seconds() -> None:
    meter = DoseMeter(DoseBudget(nc_per_min=1.0))
    charges = np.zeros(64)
    charges[ENCODING_ELECTRODES[0]] = 0.6
    meter.check(0.0, charges, "first")
    meter.deliver(0.0, charges)
    with pytest.raises(DoseRefusal, match="electrode 8 .*--dose-budget-nc-per-min 1"):
        meter.check(DOSE_WINDOW_S - 0.1, charges, "second")
    meter.check(DOSE_WINDOW_S + DOSE_BIN_S + 0.1, charges, "second, a minute later")  # its bin has left the window
    assert meter.per_min_nc(DOSE_WINDOW_S + DOSE_BIN_S + 0.1).sum() == 0.0
    assert meter.session_nc.sum() == pytest.approx(0.6)


def spikeloop(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    """`spikeloop ARGS...` from the repository root, output captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")} | {"RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_check_refuses_an_experiment_asking_more_than_the_device_allows(client: Client, capsys) -> None:
    proc = start_device(client, "--max-amplitude-ua", str(DEVICE_MAX_UA), "--forbid-electrode", "11")
    device = (
        f"devices=[{{device_id: narrow-cl1, backend: cl1, host: 127.0.0.1, stim_port: {client.ports['stim']}, "
        f"spike_port: {client.spike_port}, feedback_port: {client.ports['feedback']}, "
        f"event_port: {client.ports['event']}}}]"
    )
    client.sock.close()  # check binds the spike port itself
    try:
        result = spikeloop("check", QUICKSTART, "--exchanges", "4", "--set", device)
    finally:
        stop_device(proc)
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr
    assert "safety.max_amplitude_ua=3 asks for more than device 'narrow-cl1' (cl1) allows" in err
    assert "its --max-amplitude-ua is 2" in err
    assert "safety.forbidden_electrodes" in err and "[11]" in err
    # Within the device's limits the same device passes (in this process: the subprocess above was the user's).
    proc = start_device(client := Client(), "--max-amplitude-ua", str(DEVICE_MAX_UA))
    device = (
        f"devices=[{{device_id: narrow-cl1, backend: cl1, host: 127.0.0.1, stim_port: {client.ports['stim']}, "
        f"spike_port: {client.spike_port}, feedback_port: {client.ports['feedback']}, "
        f"event_port: {client.ports['event']}}}]"
    )
    client.sock.close()
    try:
        code = check.main(
            [QUICKSTART, "--exchanges", "4", "--set", device, "--set", f"safety.max_amplitude_ua={DEVICE_MAX_UA}"]
        )
    finally:
        stop_device(proc)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "device 'narrow-cl1' (cl1): its own envelope is" in out


def test_the_hard_ceiling_is_refused_in_the_experiment_with_its_key_path() -> None:
    result = spikeloop("check", QUICKSTART, "--set", "safety.max_amplitude_ua=50", timeout_s=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "safety.max_amplitude_ua=50.0: above the hard ceiling of 3 uA" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("key", sorted(CEILINGS))
def test_every_ceiling_is_refused_by_the_schema(key: str) -> None:
    over = {"max_amplitude_ua": 50, "max_charge_per_phase_nc": 6, "max_frequency_hz": 500}[key]
    ceiling, unit = CEILINGS[key]
    with pytest.raises(ExperimentError, match=rf"safety\.{key}=.*above the hard ceiling of {ceiling:g} {unit}"):
        load_experiment(QUICKSTART, [f"safety.{key}={over}"])
    load_experiment(QUICKSTART, [f"safety.{key}={ceiling}"])  # the ceiling itself is allowed


def test_the_hard_ceiling_is_refused_on_the_device_command_line() -> None:
    result = spikeloop("device", "--max-amplitude-ua", "50", timeout_s=60)
    assert result.returncode == 2
    assert "--max-amplitude-ua: max_amplitude_ua=50.0: above the hard ceiling of 3 uA" in result.stderr
    assert "Traceback" not in result.stderr
