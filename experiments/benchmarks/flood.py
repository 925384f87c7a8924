"""`spikeloop bench flood`: a device flooded with valid commands keeps every electrode under the pulse-rate
ceiling, its memory flat, and answers every stimulation.

`spikeloop device --backend sim --realtime` runs as its own process with a recording. For `--duration-s` seconds a
client on loopback sends it every command it can: stimulations inside the envelope (random frequency and amplitude
on every encoding electrode), and feedback as the trainer sends it, positive bursts on their own and negative ones
after an interrupt, each inside the envelope alone. Every second it samples the device's resident memory. At the end
it stops the device and rebuilds, from the device's recording, every pulse the simulated culture gave: each applied
command as the culture applies it (a burst starts on the first whole millisecond and replaces the one running on its
electrode; an interrupt, or a stimulation entry that is off, ends it). The result holds the fastest any electrode
was pulsed (closest two pulses, most pulses in any one second), the memory samples and their growth after a warm-up,
the device's counters, and pass/fail against the targets: no two pulses on an electrode closer than 1 / ceiling,
memory growth under `MAX_RSS_GROWTH_MB`, every stimulation the device took in answered by a reply it sent (loopback
drops what its socket cannot hold, and what a loaded client cannot read in time).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.device.backends.base import stim_pulses
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ELECTRODES, STIMULABLE_ELECTRODES
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    encode_feedback,
    encode_stim,
)
from spikeloop.bridge.wire.settings import MAX_PULSE_RATE_HZ, TICK_FREQUENCY_HZ
from spikeloop.experiments.benchmarks.record import provenance, write_result
from spikeloop.experiments.benchmarks.soak import memory_kb

DEFAULT_OUTPUT = Path("docs/benchmarks/flood.json")
MAX_RSS_GROWTH_MB = 20.0
"""Memory growth allowed from the end of the warm-up to the end of the flood."""
WARMUP_S = 10.0
POSITIVE = (19, 20, 22)
NEGATIVE = (23, 24, 26)
SEND_PAUSE_S = 0.0005
"""Between two sends: about 1,000 commands a second, far above any closed loop, below what loopback drops."""


def device_rss_mb(pid: int) -> float | None:
    """Resident memory of process `pid` in MB (None once it is gone)."""
    rss_kb, _ = memory_kb(pid)
    return rss_kb / 1024 if rss_kb else None


def pulses_from_recording(path: Path, stim_mode: str, tick_frequency_hz: float) -> list[np.ndarray]:
    """Every pulse the simulated culture gave, per electrode (seconds), rebuilt from the device's recording."""
    running: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * N_ELECTRODES  # start_ms, interval_ms, pulses
    given: list[list[float]] = [[] for _ in range(N_ELECTRODES)]

    def end(e: int, t_ms: float) -> None:  # the running burst gives its pulses before t_ms, then stops
        start, interval, n = running[e]
        given[e].extend(start + k * interval for k in range(n) if start + k * interval < t_ms)
        running[e] = (0.0, 0.0, 0)

    def start(e: int, t_ms: float, hz: float, n: int) -> None:
        end(e, t_ms)
        running[e] = (t_ms, max(1, round(1000.0 / hz)), n)

    with path.open(encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            if "refused" in entry or entry["kind"] not in ("stim", "feedback"):
                continue
            # The culture applies a command on the first whole millisecond at or after it.
            t_ms = math.ceil((entry["t_s"] + entry.get("deferred_ms", 0.0) / 1000.0) * 1000.0 - 1e-9)
            if entry["kind"] == "stim":
                if stim_mode == "reference":
                    for e in STIMULABLE_ELECTRODES:
                        end(e, t_ms)
                for e, hz, ua in zip(ENCODING_ELECTRODES, entry["frequencies_hz"], entry["amplitudes_ua"]):
                    n = stim_pulses(hz, tick_frequency_hz, stim_mode) if hz > 0 and ua > 0 else 0
                    if n:
                        start(e, t_ms, hz, n)
                    else:
                        end(e, t_ms)
            elif entry["type"] == "interrupt":
                for e in entry["channels"]:
                    end(e, t_ms)
            elif entry["frequency_hz"] > 0 and entry["amplitude_ua"] > 0 and entry["pulses"] >= 1:
                for e in dict.fromkeys(entry["channels"]):
                    start(e, t_ms, entry["frequency_hz"], int(entry["pulses"]))
    for e in range(N_ELECTRODES):
        end(e, math.inf)
    return [np.sort(np.asarray(times)) / 1000.0 for times in given]


def fastest(pulses: list[np.ndarray]) -> dict[str, Any]:
    """The closest two pulses on one electrode and the most pulses on one electrode in any one second."""
    closest_ms, closest_e, most, most_e = math.inf, None, 0, None
    for e, times in enumerate(pulses):
        if times.size > 1 and (gap := float(np.diff(times).min()) * 1000.0) < closest_ms:
            closest_ms, closest_e = gap, e
        if times.size:
            in_second = int((np.searchsorted(times, times + 1.0 - 1e-9, side="left") - np.arange(times.size)).max())
            if in_second > most:
                most, most_e = in_second, e
    return {
        "closest_pulses_ms": closest_ms if math.isfinite(closest_ms) else None,
        "closest_pulses_electrode": closest_e,
        "most_pulses_in_1_s": most,
        "most_pulses_electrode": most_e,
        "pulses_total": int(sum(t.size for t in pulses)),
    }


def flood(duration_s: float, stim_mode: str, seed: int, work: Path) -> dict[str, Any]:
    """Run the device, flood it for `duration_s`, stop it; the raw figures."""
    rng = random.Random(seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    ports = {name: free_port() for name in ("stim", "event", "feedback")}
    recording = work / "recording"
    # fmt: off
    argv = [sys.executable, "-m", "spikeloop.experiments.cli", "device", "--backend", "sim", "--realtime",
            "--stim-mode", stim_mode, "--recording-path", str(recording), "--stim-port", str(ports["stim"]),
            "--event-port", str(ports["event"]), "--feedback-port", str(ports["feedback"]),
            "--spike-port", str(sock.getsockname()[1])]
    # fmt: on
    device = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    sent = {"stim": 0, "feedback": 0}
    replies = 0
    samples: list[dict[str, float]] = []
    try:
        time.sleep(0.5)
        begin = time.monotonic()
        next_sample = begin
        while device.poll() is None and (now := time.monotonic()) < begin + duration_s + 3.0:
            if now >= next_sample:
                rss = device_rss_mb(device.pid)
                if rss is not None:
                    samples.append({"t_s": round(now - begin, 3), "rss_mb": round(rss, 3)})
                next_sample += 1.0
            while True:
                try:
                    sock.recv(4096)
                    replies += 1
                except BlockingIOError:
                    break
            if now >= begin + duration_s:  # the last replies come in; then stop
                time.sleep(0.05)
                if replies >= sent["stim"]:
                    break
                continue
            sent_at = int(time.time() * 1e6)
            freqs = tuple(rng.uniform(4.0, 40.0) for _ in ENCODING_ELECTRODES)
            amps = tuple(rng.uniform(1.0, 2.5) for _ in ENCODING_ELECTRODES)
            sock.sendto(encode_stim(StimCommand(sent_at, freqs, amps)), ("127.0.0.1", ports["stim"]))
            sent["stim"] += 1
            if sent["stim"] % 3 == 0:
                for cmd in feedback_commands(rng, sent_at):
                    sock.sendto(encode_feedback(cmd), ("127.0.0.1", ports["feedback"]))
                    sent["feedback"] += 1
            time.sleep(SEND_PAUSE_S)
    finally:
        if device.poll() is None:
            device.send_signal(signal.SIGTERM)
        _, err = device.communicate(timeout=60)
        sock.close()
    summary_lines = [line for line in err.splitlines() if line.startswith('{"spikeloop_device"')]
    counters = json.loads(summary_lines[-1])["spikeloop_device"] if summary_lines else {}
    files = sorted(recording.glob("device-sim-*.jsonl"))
    main_files = [f for f in files if not f.name.endswith(".events.jsonl")]
    pulses = pulses_from_recording(main_files[0], stim_mode, TICK_FREQUENCY_HZ.default) if main_files else []
    return {
        "sent": sent,
        "replies": replies,
        "samples": samples,
        "device_exit": device.returncode,
        "device_counters": counters,
        "fastest": fastest(pulses) if pulses else None,
    }


def feedback_commands(rng: random.Random, stamp_us: int) -> list[FeedbackCommand]:
    """One piece of feedback as a trainer sends it, inside the envelope: positive alone, negative after an interrupt."""
    scale = rng.uniform(0.5, 2.0)
    if rng.random() < 0.5:
        return [FeedbackCommand(stamp_us, FeedbackType.REWARD, POSITIVE, round(20 * scale), 2.0, 30, False, "reward")]
    return [
        FeedbackCommand(stamp_us, FeedbackType.INTERRUPT, NEGATIVE, 0, 0.0, 0, False, "reward_negative"),
        FeedbackCommand(stamp_us, FeedbackType.REWARD, NEGATIVE, round(60 * scale), 2.0, 90, True, "reward_negative"),
    ]


def summarize(raw: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The figures against the targets."""
    ceiling_hz = MAX_PULSE_RATE_HZ.default
    after = [s["rss_mb"] for s in raw["samples"] if s["t_s"] >= min(WARMUP_S, duration_s / 2)]
    growth = (max(after) - after[0]) if after else None
    top = raw["fastest"] or {}
    closest = top.get("closest_pulses_ms")
    counters = raw["device_counters"]
    checks = {
        "ceiling_held": closest is None or closest >= 1000.0 / ceiling_hz - 1e-6,
        "memory_flat": growth is not None and growth <= MAX_RSS_GROWTH_MB,
        # Loopback drops what the device's socket cannot hold, and what a loaded client cannot read in time: the
        # promise is the device's, so its own count of replies sent is compared with the stimulations it took in.
        "every_stim_answered": counters.get("replies", -1) >= counters.get("stim", math.inf),
        "device_exited_cleanly": raw["device_exit"] == 0,
    }
    return {
        "ceiling_hz": ceiling_hz,
        "commands_per_s": round((raw["sent"]["stim"] + raw["sent"]["feedback"]) / duration_s, 1),
        "stim_taken_in": counters.get("stim"),
        "feedback_taken_in": counters.get("feedback"),
        "replies_sent": counters.get("replies"),
        "replies_received": raw["replies"],
        "rss_growth_after_warmup_mb": None if growth is None else round(growth, 3),
        **top,
        "checks": checks,
        "passed": all(checks.values()),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spikeloop bench flood", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=60.0, help="how long to flood (default 60)")
    p.add_argument("--stim-mode", choices=("burst", "reference"), default="burst")
    p.add_argument("--seed", type=int, default=0, help="the flood's random commands")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result JSON (default {DEFAULT_OUTPUT})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (math.isfinite(args.duration_s) and 1.0 <= args.duration_s <= 3600.0):
        print(f"spikeloop bench flood: --duration-s {args.duration_s:g}: give 1 to 3600 seconds", file=sys.stderr)
        return 2
    result: dict[str, Any] = provenance("flood", argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="spikeloop-flood-") as tmp:
        raw = flood(args.duration_s, args.stim_mode, args.seed, Path(tmp))
    result |= {"settings": vars(args) | {"output": str(args.output)}, "summary": summarize(raw, args.duration_s)}
    result |= {"raw": raw}
    write_result(args.output, result)
    s = result["summary"]
    print(
        f"flood: {s['commands_per_s']} commands/s for {args.duration_s:g} s; closest pulses "
        f"{s.get('closest_pulses_ms')} ms, most in 1 s {s.get('most_pulses_in_1_s')} (ceiling {s['ceiling_hz']:g} Hz); "
        f"memory growth {s['rss_growth_after_warmup_mb']} MB; {'PASS' if s['passed'] else 'FAIL'} -> {args.output}"
    )
    return 0 if s["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
