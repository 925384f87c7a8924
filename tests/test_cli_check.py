"""`spikeloop check`: the preflight, run as a lab runs it (a subprocess), against real UDP devices."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import decode_event, decode_stim
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.commands import check

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "experiments" / "quickstart.yaml")


def spikeloop_check(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`spikeloop check ...` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def cl1_device(
    device_id: str, stim_port: int, spike_port: int = 0, feedback_port: int | None = None, event_port: int | None = None
) -> str:
    """A --set that replaces the devices with one cl1 device on loopback (unbound free ports where none is given)."""
    feedback_port = free_port() if feedback_port is None else feedback_port
    event_port = free_port() if event_port is None else event_port
    return (
        f"devices=[{{device_id: {device_id}, backend: cl1, host: 127.0.0.1, stim_port: {stim_port}, "
        f"spike_port: {spike_port}, feedback_port: {feedback_port}, event_port: {event_port}}}]"
    )


def test_quickstart_passes_and_prints_latency_and_envelope():
    result = spikeloop_check(QUICKSTART, "--exchanges", "10")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(
        r"device 'sim' \(sim\) .*10/10 answered, 0 timeout\(s\); latency p50 [\d.]+ ms  "
        r"p99 [\d.]+ ms  max [\d.]+ ms",
        out,
    ), out
    assert "scenario 'basic': reset and one step ok" in out
    assert SafetyEnvelope().describe() in out
    assert re.search(r"off = the envelope MINIMUM 1 Hz, 0\.5 uA; on = 20 Hz, 1\.5 uA .*order \(1 = on\): [01]{10}", out)
    assert "replies answer their own stimulation" not in out  # 10 exchanges: too few to tell
    assert "only 8 replies to correlate" in out
    for group in (
        "step_positive",
        "step_negative",
        "episode_positive",
        "episode_negative",
        "enemy_kill",
        "armor_pickup",
        "took_damage",
        "ammo_waste",
    ):
        assert re.search(rf"{group}\s+channels \[[\d, ]+\]  [\d.]+ Hz  [\d.]+ uA  \d+ pulses", out), group
    assert "check passed" in out


def test_check_prints_every_feedback_row_what_it_sends_and_which_switch_keeps_it_off():
    from spikeloop.experiments.schema import load_experiment

    reference = ROOT / "experiments" / "reference.yaml"
    lines = check.feedback_lines(load_experiment(reference))
    rows = {
        "step_positive": "reward_positive",
        "step_negative": "reward_negative",
        "episode_positive": "episode_positive",
        "episode_negative": "episode_negative",
        "enemy_kill": None,
        "armor_pickup": None,
        "took_damage": None,
        "ammo_waste": None,
    }
    for key, name in rows.items():
        (i,) = [i for i, line in enumerate(lines) if re.search(rf"^  \w+\s+{key}\s+channels \[", line)]
        if name is None:  # the event table: off while reward feedback is on
            assert "NOT SENT (use_reward_feedback: true" in lines[i + 1], lines[i + 1]
            assert re.search(r"td_sign=\w+ gain/max Hz [\d.]+/x[\d.]+ .* ema_beta=", lines[i])
        else:
            assert f"sends '{name}'" in lines[i + 1], lines[i + 1]
            assert ("interrupt first" in lines[i + 1]) == key.endswith("negative")
            low, high = re.search(r"Hz  ([\d.]+)(?:-([\d.]+))? uA", lines[i + 1]).groups()
            assert float(low) == 2.0 and float(high) == 2.5  # base 2 uA; surprise scaling capped at 2.5 uA
    assert "step beta 0.999, episode beta 0.9" in lines[0] and "amplitude capped at 2.5 uA" in lines[0]
    switched = check.feedback_lines(
        load_experiment(reference, ["feedback.use_reward_feedback=false", "feedback.use_episode_feedback=false"])
    )
    text = "\n".join(switched)
    assert text.count("NOT SENT (use_reward_feedback: false") == 2
    assert text.count("NOT SENT (use_episode_feedback: false)") == 2
    assert "sends 'enemy_kill': " in text and "sends 'took_damage', interrupt first: " in text
    assert "sends 'armor_pickup': " in text


def test_silent_device_fails_within_its_timeout_naming_device_and_port():
    nobody = free_port()  # bound by no one: stimulations go nowhere
    t0 = time.monotonic()
    result = spikeloop_check(QUICKSTART, "--set", cl1_device("silent-cl1", nobody), "--set", "loop.timeout_s=0.2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - t0 < 60
    failure = result.stderr
    assert "silent-cl1" in failure and f"127.0.0.1:{nobody}" in failure, failure
    gave_up_s = float(re.search(r"gave up after ([\d.]+) s", failure).group(1))
    # One timeout, not one per planned exchange: 20 x 0.2 s would be 4 s. Half of that leaves a loaded machine
    # its margin (0.42 s was seen under load) and still tells the two apart.
    assert gave_up_s < 20 * 0.2 / 2, failure


def test_minimum_only_probe_stimulates_only_at_the_envelope_minimum():
    spike_port = free_port()
    with LoopbackDevice(spike_port=spike_port) as device:
        result = spikeloop_check(
            QUICKSTART,
            "--exchanges",
            "5",
            "--minimum-only",
            "--set",
            cl1_device("loop-cl1", device.stim_port, spike_port, device.feedback_port, device.event_port),
            "--set",
            "safety.min_frequency_hz=2",
            "--set",
            "safety.min_amplitude_ua=0.75",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "5 stimulation(s) at the envelope MINIMUM only: 2 Hz, 0.75 uA" in result.stdout
        assert "answer their own stimulation" not in result.stdout and "no sign" not in result.stdout
        stims = [decode_stim(d) for d in device.received_stims]
        assert len(stims) == 5
        assert all(s.frequencies_hz == (2.0,) * 8 and s.amplitudes_ua == (0.75,) * 8 for s in stims)
        assert device.received_feedback == []  # nothing but the probe, and the request for the device's limits
        assert [decode_event(e).event_type for e in device.received_events] == ["status_request"]
        assert "[info] device 'loop-cl1' (cl1): did not report its limits" in result.stdout


def test_status_requests_off_sends_the_device_no_status_request():
    """`devices.N.status_requests: false`: the device program sees no event at all from `check`, and says so."""
    spike_port = free_port()
    with LoopbackDevice(spike_port=spike_port) as device:
        result = spikeloop_check(
            QUICKSTART,
            "--exchanges",
            "3",
            "--minimum-only",
            "--set",
            cl1_device("loop-cl1", device.stim_port, spike_port, device.feedback_port, device.event_port),
            "--set",
            "devices.0.status_requests=false",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert len(device.received_stims) == 3
        assert device.received_events == []
        assert "not asked for its limits (devices.0.status_requests: false)" in result.stdout


def test_invalid_experiment_exits_2_naming_the_key(capsys):
    broken = str(Path(__file__).parent / "broken_experiments" / "forbidden_electrode.yaml")
    with pytest.raises(SystemExit) as info:
        check.main([broken])
    assert info.value.code == 2
    assert "feedback.events.enemy_kill.channels" in capsys.readouterr().err


def test_help_explains_every_flag():
    # argparse wraps to the terminal's width, so a phrase may break across lines anywhere.
    text = " ".join(check.build_parser().format_help().split())
    for flag in ("EXP.yaml", "--set", "--exchanges", "--minimum-only", "THE PROBE STIMULATES"):
        assert flag in text


def test_a_device_replying_from_another_port_works_and_check_names_the_port(capsys):
    """A third-party device answering from a socket of its own works by default (reply_port auto pins the port of
    its first answer); check names that port, and with reply_port: stim_port it is refused and named."""
    import socket
    import threading

    from spikeloop.bridge.wire.protocol import SpikeCounts, encode_spikes

    spike_port = free_port()
    stim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stim.bind(("127.0.0.1", 0))
    stim.settimeout(0.05)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a third-party device answering from another socket
    other.bind(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                data = stim.recv(4096)
            except (TimeoutError, OSError):
                continue
            reply = SpikeCounts(decode_stim(data).timestamp_us, (1.0,) * 8)
            other.sendto(encode_spikes(reply), ("127.0.0.1", spike_port))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    device = cl1_device("third-party", stim.getsockname()[1], spike_port)
    port = other.getsockname()[1]
    try:
        assert check.main([QUICKSTART, "--exchanges", "3", "--set", device, "--set", "loop.timeout_s=0.2"]) == 0
        out = capsys.readouterr().out
        assert "[ok]   resources:" in out and "its own Ray will advertise 1 cl1:third-party, 1 cl1_slot" in out
        assert (
            f"replies came from 127.0.0.1:{port} (reply_port auto pins it at the first answer; "
            f"devices.0.reply_port: {port} requires it from the first reply on)" in out
        )
        pinned = device.replace("}]", ", reply_port: stim_port}]")
        assert check.main([QUICKSTART, "--exchanges", "3", "--set", pinned, "--set", "loop.timeout_s=0.2"]) == 1
        err = capsys.readouterr().err
        assert f"A reply came from 127.0.0.1:{port}" in err
        assert f"devices.0.reply_port: {port}" in err
        exact = device.replace("}]", f", reply_port: {port}}}]")
        assert check.main([QUICKSTART, "--exchanges", "3", "--set", exact, "--set", "loop.timeout_s=0.2"]) == 0
    finally:
        stop.set()
        thread.join()
        stim.close()
        other.close()


def test_probe_plan_is_modest_fixed_balanced_and_inside_the_envelope():
    from spikeloop.bridge.wire.channels import STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ

    plan = check.probe_plan(SafetyEnvelope(), 40)
    assert STIM_FREQUENCY_RANGE_HZ[0] <= plan.on_hz <= STIM_FREQUENCY_RANGE_HZ[1]
    assert STIM_AMPLITUDE_RANGE_UA[0] <= plan.on_ua <= STIM_AMPLITUDE_RANGE_UA[1]
    assert (plan.off_hz, plan.off_ua) == (SafetyEnvelope().min_frequency_hz, SafetyEnvelope().min_amplitude_ua)
    assert sum(plan.pattern) == 20 and plan.pattern == check.probe_plan(SafetyEnvelope(), 40).pattern
    assert plan.stimulation(plan.pattern.index(True)) == ([plan.on_hz] * 8, [plan.on_ua] * 8)
    # A narrower envelope brings "on" inside it; one that allows a single level leaves nothing to compare.
    narrow = check.probe_plan(SafetyEnvelope(max_frequency_hz=10, max_charge_per_phase_nc=0.144), 40)
    assert (narrow.on_hz, narrow.on_ua) == (10, 1.2) and narrow.varies
    pinned = SafetyEnvelope(min_frequency_hz=5, max_frequency_hz=5, min_amplitude_ua=1, max_amplitude_ua=1)
    assert not check.probe_plan(pinned, 40).varies
    assert not check.probe_plan(SafetyEnvelope(), 40, minimum_only=True).varies


def _odd_status_device(status_data: dict, spike_port: int):
    """A device on loopback that answers each stimulation and answers a status_request with `status_data`."""
    import select
    import socket
    import threading

    from spikeloop.bridge.wire.protocol import EventMessage, SpikeCounts, encode_event, encode_spikes

    socks = {}
    for kind in ("stim", "feedback", "event"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        socks[kind] = sock
    stop = threading.Event()
    trainer = ("127.0.0.1", spike_port)

    def serve():
        while not stop.is_set():
            ready, _, _ = select.select(list(socks.values()), [], [], 0.05)
            for sock in ready:
                data = sock.recv(65536)
                if sock is socks["stim"]:
                    reply = SpikeCounts(decode_stim(data).timestamp_us, (1.0,) * 8)
                    socks["stim"].sendto(encode_spikes(reply), trainer)
                elif sock is socks["event"] and decode_event(data).event_type == "status_request":
                    status = EventMessage(decode_event(data).timestamp_us, "device_status", status_data)
                    socks["stim"].sendto(encode_event(status), trainer)  # replies leave from the stim socket

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        stop.set()
        thread.join()
        for sock in socks.values():
            sock.close()

    ports = {kind: sock.getsockname()[1] for kind, sock in socks.items()}
    return ports, close


@pytest.mark.parametrize(
    ("status", "named"),
    [
        ({"envelope": [1, 2]}, "its 'envelope' must be a JSON object, got list"),
        ({"envelope": {"max_pulses": "many"}}, "its envelope's max_pulses must be a number, got 'many'"),
        ({"envelope": {}, "dose_budget": "unlimited"}, "its 'dose_budget' must be a JSON object"),
        ({"dose": 1}, "it has no 'envelope'"),
    ],
    ids=["envelope_a_list", "limit_as_text", "budget_as_text", "no_envelope"],
)
def test_an_odd_device_status_fails_check_naming_what_is_odd(status, named):
    """A device status reply of another shape than docs/protocol.md's: check fails naming it, no traceback (it
    raised AttributeError on a dose budget that was text)."""
    spike_port = free_port()
    ports, close = _odd_status_device(status, spike_port)
    try:
        result = spikeloop_check(
            QUICKSTART,
            "--exchanges",
            "3",
            "--minimum-only",
            "--set",
            cl1_device("odd-cl1", ports["stim"], spike_port, ports["feedback"], ports["event"]),
        )
    finally:
        close()
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    assert f"device 'odd-cl1' (cl1): its device_status cannot be read ({named}" in result.stderr, output
    assert "docs/protocol.md (Device status)" in result.stderr
