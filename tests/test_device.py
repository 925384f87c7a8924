"""The device program over real UDP: information flow, timestamps, fuzzing, events, recording, CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.backends.transparent import TRANSPARENT_MAX_COUNT, transparent_counts
from spikeloop.bridge.device.program import Device, DeviceConfig, build_parser
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    FEEDBACK_STRUCT,
    EventMessage,
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    decode_spikes,
    encode_event,
    encode_feedback,
    encode_stim,
)
from tests.support.loopback_trainer import LoopbackTrainer

N_PATTERNS = 8
TRAIN_PER_PATTERN = 100
TEST_PER_PATTERN = 50


@pytest.fixture
def trainer() -> Iterator[LoopbackTrainer]:
    t = LoopbackTrainer(timeout_s=5.0)
    yield t
    t.close()


def start_device(trainer: LoopbackTrainer, **kw: object) -> tuple[Device, object]:
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=trainer.spike_port)
    cfg = DeviceConfig(address=address, **kw)  # type: ignore[arg-type]
    device = Device(cfg)
    return device, device.start()


def pattern(k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pattern k: encoding electrode k driven hard (40 Hz, 2.5 uA), the others weakly (4 Hz, 1.0 uA)."""
    freqs = tuple(40.0 if i == k else 4.0 for i in range(N_ENCODING))
    amps = tuple(2.5 if i == k else 1.0 for i in range(N_ENCODING))
    return freqs, amps


def lda_accuracy(x: np.ndarray, y: np.ndarray, n_train: int) -> float:
    """Linear discriminant (shared covariance): a linear classifier in plain numpy."""
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    means = np.array([xtr[ytr == k].mean(axis=0) for k in range(N_PATTERNS)])
    resid = xtr - means[ytr]
    cov = resid.T @ resid / len(resid) + 1e-3 * np.eye(x.shape[1])
    w = means @ np.linalg.inv(cov)
    b = -0.5 * (w * means).sum(axis=1)
    return float(((xte @ w.T + b).argmax(axis=1) == yte).mean())


def classification_accuracy(trainer: LoopbackTrainer, **device_kw: object) -> float:
    device, thread = start_device(trainer, **device_kw)
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(N_PATTERNS), TRAIN_PER_PATTERN + TEST_PER_PATTERN))
    replies = np.array([trainer.exchange(device.stim_port, i + 1, *pattern(int(k))) for i, k in enumerate(labels)])
    device.stop()
    thread.join(5)  # type: ignore[attr-defined]
    return lda_accuracy(replies, labels, N_PATTERNS * TRAIN_PER_PATTERN)


def test_sim_culture_carries_stimulation_information_over_udp(trainer: LoopbackTrainer) -> None:
    # 1,200 exchanges through the real device, as fast as possible, default 50 + 50 ms windows.
    acc = classification_accuracy(trainer, backend="sim", seed=1, realtime=False)
    print(f"sim held-out accuracy {acc:.3f} (chance 0.125)")
    assert acc >= 0.80


@pytest.mark.parametrize("backend", ["random", "zero"])
def test_ablation_backends_carry_no_information(trainer: LoopbackTrainer, backend: str) -> None:
    acc = classification_accuracy(
        trainer, backend=backend, seed=1, artifact_wait_ms=0.0, collect_window_ms=0.0, random_spike_rate_hz=200.0
    )
    print(f"{backend} held-out accuracy {acc:.3f} (chance 0.125)")
    assert acc <= 0.30


def test_transparent_backend_replies_a_fixed_function_of_the_stimulation(trainer: LoopbackTrainer) -> None:
    # The perfect channel, over UDP as fast as possible: the reply is transparent_counts of this very stimulation.
    device, thread = start_device(trainer, backend="transparent", realtime=False)
    rng = np.random.default_rng(5)
    try:
        for i in range(50):
            freqs = tuple(float(f) for f in rng.uniform(4.0, 40.0, N_ENCODING))
            amps = tuple(float(a) for a in rng.uniform(1.0, 2.5, N_ENCODING))
            counts = trainer.exchange(device.stim_port, i + 1, freqs, amps)
            np.testing.assert_allclose(counts, transparent_counts(freqs, amps), rtol=1e-6)
        low = trainer.exchange(device.stim_port, 100, (4.0,) * N_ENCODING, (1.0,) * N_ENCODING)
        high = trainer.exchange(device.stim_port, 101, (40.0,) * N_ENCODING, (2.5,) * N_ENCODING)
        np.testing.assert_allclose(low, 0.0)
        np.testing.assert_allclose(high, TRANSPARENT_MAX_COUNT)
    finally:
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]
    assert classification_accuracy(trainer, backend="transparent", realtime=False) == 1.0


def test_answer_previous_fault_replies_with_the_counts_of_the_stimulation_before(trainer: LoopbackTrainer) -> None:
    # The perfect channel makes each window's counts a known function of its stimulation: reply n must carry
    # stimulation n-1's, on time and with stimulation n's stamp (the first one zeros).
    device, thread = start_device(trainer, backend="transparent", realtime=False, answer_previous=True)
    rng = np.random.default_rng(6)
    stims = [
        (tuple(float(f) for f in rng.uniform(4.0, 40.0, N_ENCODING)), tuple(float(a) for a in rng.uniform(1, 2.5, 8)))
        for _ in range(20)
    ]
    try:
        replies = [trainer.exchange(device.stim_port, i + 1, *stim) for i, stim in enumerate(stims)]
    finally:
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(replies[0], 0.0)
    for i in range(1, len(stims)):
        np.testing.assert_allclose(replies[i], transparent_counts(*stims[i - 1]), rtol=1e-6)
    assert device.counters["stim"] == device.counters["replies"] == 20


def test_chatty_fault_sends_datagrams_nobody_asked_for(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(trainer, backend="zero", chatty=True)
    try:
        unasked = decode_spikes(trainer.rx.recv(64))  # no stimulation was sent, yet a datagram comes
        assert unasked.timestamp_us == 0  # echoing the newest stimulation: none yet
        trainer.tx.sendto(encode_stim(StimCommand(77, *pattern(0))), ("127.0.0.1", device.stim_port))
        stamps: list[int] = []
        while stamps.count(77) < 4:  # unasked ones sent before the stimulation was taken in may come first
            stamps.append(decode_spikes(trainer.rx.recv(64)).timestamp_us)
    finally:
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]
    # One stimulation, one reply; every other datagram was unasked, the later ones echoing its stamp.
    assert set(stamps) == {0, 77} or set(stamps) == {77}, stamps
    assert device.counters["replies"] == 1 and device.counters["unsolicited_sent"] >= 4


def test_random_backend_counts_follow_the_configured_rate(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(
        trainer, backend="random", seed=2, artifact_wait_ms=0.0, collect_window_ms=20.0, random_spike_rate_hz=50.0
    )
    counts = np.array([trainer.exchange(device.stim_port, i + 1, *pattern(0)) for i in range(100)])
    device.stop()
    thread.join(5)  # type: ignore[attr-defined]
    # 50 Hz x 20 ms x 3 electrodes = 3 spikes per move_forward reply on average.
    assert 2.5 <= counts[:, 1].mean() <= 3.5


def test_fuzzed_datagrams_are_counted_and_skipped(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(
        trainer, backend="sim", seed=3, realtime=False, artifact_wait_ms=5.0, collect_window_ms=5.0
    )
    rng = np.random.default_rng(0)
    good = {
        device.stim_port: encode_stim(StimCommand(1, *pattern(0))),
        device.feedback_port: encode_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19, 20, 22), 20, 2.0, 30)),
        device.event_port: encode_event(EventMessage(1, "episode_end", {"episode": 1})),
    }
    sent = 0
    for port, valid in good.items():
        for n in range(150):
            junk = rng.bytes(int(rng.integers(0, 200))) if n % 2 else valid[: int(rng.integers(0, len(valid)))]
            trainer.tx.sendto(junk, ("127.0.0.1", port))
            sent += 1
    # Still alive and answering, one reply per stimulation, right timestamps.
    for i in range(20):
        trainer.exchange(device.stim_port, 1000 + i, *pattern(i % N_PATTERNS))
    time.sleep(0.05)  # the device counts a reply just after sending it
    malformed = sum(v for k, v in device.counters.items() if k.startswith("malformed_"))
    assert malformed == sent
    assert device.counters["replies"] == 20
    device.stop()
    thread.join(5)  # type: ignore[attr-defined]


def test_every_waiting_datagram_is_handled_and_feedback_interrupts(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(
        trainer, backend="sim", seed=4, realtime=False, artifact_wait_ms=0.0, collect_window_ms=1.0
    )
    dest = ("127.0.0.1", device.feedback_port)
    # A long burst, then an interrupt for it, then many feedbacks queued at once.
    trainer.tx.sendto(encode_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19,), 20, 2.0, 1000)), dest)
    trainer.tx.sendto(encode_feedback(FeedbackCommand(2, FeedbackType.INTERRUPT, (19,))), dest)
    for i in range(50):
        trainer.tx.sendto(
            encode_feedback(FeedbackCommand(3 + i, FeedbackType.EVENT, (35, 36, 38), 20, 2.5, 1, True, "enemy_kill")),
            dest,
        )
    time.sleep(0.3)
    trainer.exchange(device.stim_port, 99, *pattern(0))
    assert device.counters["feedback"] == 52
    culture = device.backend.culture  # type: ignore[attr-defined]
    assert culture._pulse_remaining[19] == 0  # the interrupt cancelled the 1000-pulse burst
    device.stop()
    thread.join(5)  # type: ignore[attr-defined]


def test_training_complete_stops_and_closes_the_recording(trainer: LoopbackTrainer, tmp_path: Path) -> None:
    device, thread = start_device(
        trainer, backend="zero", recording_path=tmp_path, artifact_wait_ms=1.0, collect_window_ms=1.0
    )
    for i in range(5):
        trainer.exchange(device.stim_port, i + 1, *pattern(i))
    trainer.tx.sendto(
        encode_event(EventMessage(7, "episode_end", {"episode": 0, "episode_reward": 1.5})),
        ("127.0.0.1", device.event_port),
    )
    time.sleep(0.1)
    trainer.tx.sendto(
        encode_event(EventMessage(8, "training_complete", {"reason": "done"})), ("127.0.0.1", device.event_port)
    )
    thread.join(5)  # type: ignore[attr-defined]
    assert not thread.is_alive()  # type: ignore[attr-defined]
    assert device.exit_reason == "training_complete"
    main_file, events_file = device.recording_files()
    kinds = [json.loads(line)["kind"] for line in main_file.read_text().splitlines()]
    assert kinds.count("stim") == 5 and kinds.count("spikes") == 5
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert [e["event_type"] for e in events] == ["episode_end", "training_complete"]
    assert events[0]["data"]["episode_reward"] == 1.5


def test_help_explains_every_flag() -> None:
    text = build_parser().format_help()
    for flag in (
        "--training-host",
        "--stim-port",
        "--spike-port",
        "--event-port",
        "--feedback-port",
        "--tick-frequency",
        "--artifact-wait-ms",
        "--collect-window-ms",
        "--recording-path",
        "--backend",
        "--seed",
        "--random-spike-rate-hz",
        "--realtime",
        "--as-fast-as-possible",
        "--bind-host",
        "--accept-from",
        "--max-amplitude-ua",
        "--max-frequency-hz",
        "--max-pulses",
        "--forbid-electrode",
        "--answer-previous",
        "--chatty",
        "--exit-on-error-complete",
    ):
        assert flag in text


def test_cli_process_exits_zero_on_sigterm_and_prints_counters(trainer: LoopbackTrainer, tmp_path: Path) -> None:
    stim_port, event_port, feedback_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spikeloop.experiments.cli",
            "device",
            "--backend",
            "random",
            "--stim-port",
            str(stim_port),
            "--event-port",
            str(event_port),
            "--feedback-port",
            str(feedback_port),
            "--spike-port",
            str(trainer.spike_port),
            "--artifact-wait-ms",
            "1",
            "--collect-window-ms",
            "1",
            "--recording-path",
            str(tmp_path),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:
            trainer.tx.sendto(encode_stim(StimCommand(5, *pattern(0))), ("127.0.0.1", stim_port))
            try:
                trainer.rx.settimeout(0.2)
                got = decode_spikes(trainer.rx.recv(64))
            except TimeoutError:
                pass
        assert got is not None and got.timestamp_us == 5
        trainer.tx.sendto(b"\x00" * 3, ("127.0.0.1", stim_port))
        time.sleep(0.2)
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0
    summary = json.loads(err.strip().splitlines()[-1])["spikeloop_device"]
    assert summary["exit_reason"] == "SIGTERM"
    assert summary["malformed_stim"] == 1
    assert len(summary["recording_files"]) == 2


def test_feedback_the_device_refuses_or_ignores_never_reaches_the_culture(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(
        trainer, backend="sim", seed=4, realtime=False, artifact_wait_ms=0.0, collect_window_ms=1.0
    )
    dest = ("127.0.0.1", device.feedback_port)
    culture = device.backend.culture  # type: ignore[attr-defined]
    try:
        for freq, amp, pulses in (
            (0, 2.0, 30),
            (20, -2.0, 30),
            (20, 2.0, 2**32 - 1),
            (2**32 - 1, 2.0, 30),
            (20, 3e38, 30),
        ):
            trainer.tx.sendto(encode_feedback(FeedbackCommand(1, FeedbackType.REWARD, (19,), 20, 2.0, 30)), dest)
            trainer.tx.sendto(encode_feedback(FeedbackCommand(2, FeedbackType.INTERRUPT, (19,))), dest)
            slots = [19] + [0xFF] * 63  # packed by hand: the encoder itself refuses negative pulses etc.
            trainer.tx.sendto(FEEDBACK_STRUCT.pack(1, 2, 1, *slots, freq, amp, pulses, 0, b"x"), dest)
        time.sleep(0.2)
        trainer.exchange(device.stim_port, 9, *pattern(0))
        assert culture._pulse_remaining[19] == 0  # no burst: not a 1 kHz one at 0 Hz, not |-2| uA, none too long
        assert device.counters["refused_feedback"] == 4 and device.counters["feedback"] == 15
    finally:
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]


def test_accept_from_spike_port_takes_commands_from_the_bridge_socket_only(trainer: LoopbackTrainer) -> None:
    device, thread = start_device(
        trainer, backend="zero", artifact_wait_ms=0.0, collect_window_ms=0.0, accept_from="spike_port"
    )
    try:
        stim = encode_stim(StimCommand(3, *pattern(1)))
        trainer.tx.sendto(stim, ("127.0.0.1", device.stim_port))  # same host, another port: refused
        trainer.rx.sendto(encode_stim(StimCommand(4, *pattern(1))), ("127.0.0.1", device.stim_port))
        assert decode_spikes(trainer.rx.recv(64)).timestamp_us == 4
        assert device.counters["foreign_stim"] == 1
    finally:
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tick_frequency_hz": 0.0}, "tick_frequency_hz"),
        ({"artifact_wait_ms": -1.0}, "artifact_wait_ms"),
        ({"address": ("127.0.0.1", 12345)}, "DeviceAddress"),
        ({"tick_frequency_hz": 0.5}, "max_pulses"),
        ({"accept_from": "everyone"}, "accept_from"),
        ({"chatty": True, "backend": "sim", "realtime": False}, "--chatty runs on the wall clock"),
    ],
)
def test_device_config_that_cannot_work_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceConfig(**kwargs)


def test_cli_refuses_an_envelope_that_contradicts_itself() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spikeloop.experiments.cli",
            "device",
            "--max-charge-per-phase-nc",
            "0.03",
            "--min-amplitude-ua",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 2
    assert "max_charge_per_phase_nc=0.03" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("accept_from", "answered"), [("host", False), ("any", True)])
def test_another_host_is_ignored_unless_the_device_is_opened(
    trainer: LoopbackTrainer, accept_from: str, answered: bool
) -> None:
    device, thread = start_device(
        trainer, backend="zero", artifact_wait_ms=0.0, collect_window_ms=0.0, accept_from=accept_from
    )
    other_host = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other_host.bind(("127.0.0.2", 0))
    try:
        other_host.sendto(encode_stim(StimCommand(8, *pattern(2))), ("127.0.0.1", device.stim_port))
        trainer.rx.settimeout(0.5)
        try:
            got = decode_spikes(trainer.rx.recv(64)).timestamp_us == 8
        except TimeoutError:
            got = False
        assert got == answered
        other_host.sendto(encode_event(EventMessage(9, "training_complete", {})), ("127.0.0.1", device.event_port))
        thread.join(1.0 if answered else 0.3)  # type: ignore[attr-defined]
        assert device.stopped == answered  # training_complete from another host stops only an opened device
    finally:
        other_host.close()
        device.stop()
        thread.join(5)  # type: ignore[attr-defined]


def test_accept_from_flag_reaches_the_config() -> None:
    from spikeloop.bridge.device.program import config_from_args

    args = build_parser().parse_args(["--accept-from", "spike-port", "--max-pulses", "50", "--forbid-electrode", "9"])
    config = config_from_args(args)
    assert config.accept_from == "spike_port" and config.envelope.max_pulses == 50
    assert 9 in config.envelope.forbidden_electrodes
