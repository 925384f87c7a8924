"""Culture knobs: one source (SimulatedCultureConfig), checked by the schema and the device CLI, and they arrive."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.program import Device
from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig, knob_table
from spikeloop.bridge.wire.channels import GOOD_NEWS_ELECTRODES, N_ENCODING, POSITIVE_FEEDBACK_ELECTRODES
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    decode_spikes,
    encode_feedback,
    encode_stim,
)
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict

ROOT = Path(__file__).resolve().parents[1]
STIM = (tuple([40.0] * N_ENCODING), tuple([2.5] * N_ENCODING))


def _experiment(**device: object):
    return experiment_from_dict({"devices": [{"device_id": "sim", "backend": "sim", **device}]})


@pytest.mark.parametrize(
    ("culture", "key", "what"),
    [
        ({"n_neurons": 0}, "devices.0.culture.n_neurons", "[2, 4000]"),
        ({"noise_probability_per_ms": 1.5}, "devices.0.culture.noise_probability_per_ms", "[0, 1]"),
        ({"dopamine_per_punishment_pulse": 0.1}, "devices.0.culture.dopamine_per_punishment_pulse", "[-10, 0]"),
        ({"n_neurons": "many"}, "devices.0.culture.n_neurons", "a whole number"),
        ({"plasticity": "hebbian"}, "devices.0.culture.plasticity", "dopamine_stdp"),
        ({"reward_electrodes": [19, 64]}, "devices.0.culture.reward_electrodes", "0-63"),
        ({"reward_electrodes": [8]}, "devices.0.culture.reward_electrodes", "encoding electrodes"),
        ({"punishment_electrodes": [19]}, "devices.0.culture.punishment_electrodes", "also release dopamine"),
        ({"stdp_tau_ms": float("nan")}, "devices.0.culture.stdp_tau_ms", ""),
        ({"synapses": 10}, "devices.0.culture.synapses", "unknown key"),
    ],
)
def test_schema_refuses_a_bad_culture_knob_with_its_key_path(culture: dict, key: str, what: str) -> None:
    with pytest.raises(ExperimentError) as info:
        _experiment(culture=culture)
    message = str(info.value)
    assert key in message and what in message, message


def test_schema_refuses_culture_settings_where_there_is_no_simulated_culture() -> None:
    with pytest.raises(ExperimentError, match=r"devices\.0\.culture: backend random has no simulated culture"):
        experiment_from_dict({"devices": [{"device_id": "r", "backend": "random", "culture": {"n_neurons": 50}}]})
    with pytest.raises(ExperimentError, match=r"devices\.0\.feedback_settle_ms: a cl1 device is a program"):
        experiment_from_dict(
            {"devices": [{"device_id": "lab", "backend": "cl1", "feedback_settle_ms": 100}], "resources": {}}
        )


def test_every_knob_reaches_the_device_config_and_survives_the_resolved_yaml() -> None:
    import yaml

    culture = {"plasticity": "dopamine_stdp", "n_neurons": 300, "reward_electrodes": [19, 20]}
    e = _experiment(culture=culture, feedback_settle_ms=120)
    config = e.devices[0].device_config(spike_port=4000)
    assert config.culture == SimulatedCultureConfig(
        plasticity="dopamine_stdp", n_neurons=300, reward_electrodes=(19, 20)
    )
    assert config.feedback_settle_ms == 120.0
    again = experiment_from_dict(yaml.safe_load(e.to_yaml()))
    assert again.devices[0] == e.devices[0]
    # The old boolean form is kept: false is the fixed-weight culture.
    assert _experiment(culture={"plasticity": False}).devices[0].culture.rule == "none"  # type: ignore[union-attr]


def test_the_docs_carry_the_knob_table_of_the_dataclass() -> None:
    table = knob_table()
    assert len(table.splitlines()) == 2 + len(dataclasses.fields(SimulatedCultureConfig))
    assert table in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"), (
        "docs/architecture.md must carry spikeloop.bridge.device.simulated_culture.knob_table() verbatim (regenerate it)"
    )


def _device_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "device", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=os.environ.copy(),
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--culture", "n_neurons=0"], "--culture: n_neurons=0: must be in [2, 4000]"),
        (["--culture", "neurons=10"], "unknown culture knob(s) neurons"),
        (["--culture", "plasticity"], "write KNOB=VALUE"),
        (["--backend", "random", "--culture", "n_neurons=50"], "backend 'random' has none"),
        (["--feedback-settle-ms", "-1"], "feedback_settle_ms=-1.0"),
    ],
)
def test_device_cli_refuses_bad_culture_settings(args: list[str], message: str) -> None:
    proc = _device_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_device_cli_lists_the_knobs() -> None:
    proc = _device_cli("--culture-help")
    assert proc.returncode == 0 and proc.stdout.strip() == knob_table()


def _replies(stim_port: int, rx: socket.socket, n: int, tx: socket.socket | None = None) -> np.ndarray:
    """`n` stimulations to a device on `stim_port` (sent from `tx`, else a socket of their own), the replies'
    counts; waits for a device program to start."""
    own = tx is None
    tx = tx or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out = []
    try:
        deadline = time.monotonic() + 60
        for ts in range(1, n + 1):
            while True:
                tx.sendto(encode_stim(StimCommand(ts, *STIM)), ("127.0.0.1", stim_port))
                try:
                    reply = decode_spikes(rx.recv(64))
                except TimeoutError:
                    assert time.monotonic() < deadline, "the device program never answered"
                    continue
                if reply.timestamp_us == ts:
                    break
            out.append(reply.counts)
    finally:
        if own:
            tx.close()
    return np.array(out)


def _program_replies(tmp_path: Path, *culture_args: str) -> np.ndarray:
    """Replies of `spikeloop device --backend sim` run as its own process with the given culture flags."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    ports = {"--stim-port": free_port(), "--event-port": free_port(), "--feedback-port": free_port()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spikeloop.experiments.cli", "device", "--backend", "sim", "--as-fast-as-possible"]
        + [x for flag, port in ports.items() for x in (flag, str(port))]
        + ["--spike-port", str(rx.getsockname()[1]), *culture_args],
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=os.environ.copy(),
    )
    try:
        return _replies(ports["--stim-port"], rx, 10)
    finally:
        proc.terminate()
        proc.wait(10)
        rx.close()


def test_culture_knobs_reach_the_culture_of_a_device_program(tmp_path: Path) -> None:
    # Maturation off keeps the start short; the stimulation drives every encoding electrode hard.
    default = _program_replies(tmp_path, "--culture", "maturation_ms=0")
    knobs = tmp_path / "culture.yaml"
    knobs.write_text("maturation_ms: 0\nnoise_probability_per_ms: 0.0\n", encoding="utf-8")
    numb = _program_replies(tmp_path, "--culture-file", str(knobs), "--culture", "stim_gain_mv_per_ua=0")
    assert default.sum() > 100  # the culture answers the stimulation
    assert numb.sum() == 0  # no stimulation reaches a neuron and nothing fires by itself


def _weights_after_feedback_and_stimulation(culture: dict) -> tuple[np.ndarray, np.ndarray]:
    """A device started from an experiment's device entry, driven over UDP: its weights before and after.

    Everything is sent from the spike-port socket: a device spikeloop starts takes commands from there only."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    dev = _experiment(culture={"maturation_ms": 2000.0, **culture}).devices[0]
    device = Device(dev.device_config(spike_port=rx.getsockname()[1]))
    thread = device.start()
    try:
        before = device.backend.culture.synaptic_weights()  # type: ignore[attr-defined]
        for ts in range(1, 21):
            rx.sendto(
                encode_feedback(FeedbackCommand(ts, FeedbackType.REWARD, POSITIVE_FEEDBACK_ELECTRODES, 20, 2.0, 30)),
                ("127.0.0.1", device.feedback_port),
            )
        _replies(device.stim_port, rx, 20, tx=rx)
        # The device thread is idle between datagrams (as fast as possible, nothing pending): safe to read.
        return before, device.backend.culture.synaptic_weights()  # type: ignore[attr-defined]
    finally:
        device.stop()
        thread.join(5)
        rx.close()


def test_plasticity_false_in_the_experiment_keeps_the_device_cultures_weights() -> None:
    frozen_before, frozen_after = _weights_after_feedback_and_stimulation({"plasticity": False})
    plastic_before, plastic_after = _weights_after_feedback_and_stimulation({"plasticity": "stdp"})
    assert np.array_equal(frozen_before, plastic_before)  # the same culture until hand-over
    assert np.array_equal(frozen_after, frozen_before)
    assert np.abs(plastic_after - plastic_before).sum() > 1.0


def test_reward_sites_default_to_where_good_news_lands() -> None:
    from spikeloop.models.closed_loop.feedback import EVENT_SURPRISE_REFERENCE, FeedbackSettings

    settings = FeedbackSettings()
    good = set(settings.step_positive.channels) | {
        e
        for name, spec in settings.events.items()
        if EVENT_SURPRISE_REFERENCE[name][0] == "positive"
        for e in spec.channels
    }
    bad = set(settings.step_negative.channels) | {
        e
        for name, spec in settings.events.items()
        if EVENT_SURPRISE_REFERENCE[name][0] != "positive"
        for e in spec.channels
    }
    config = SimulatedCultureConfig()
    assert set(config.reward_electrodes) == good == set(GOOD_NEWS_ELECTRODES)
    assert set(config.punishment_electrodes) == bad
