"""`spikeloop bench device`: reply latency of a real-time device and speed of the simulated culture.

Writes docs/benchmarks/device.json with
- `reply_latency_median_ms` (and p10/p90/max): stimulation-to-reply latency seen by a
  trainer over real UDP, sim backend in real time, 50 ms artifact wait + 50 ms
  collection window, 200 exchanges (target: 100-103 ms);
- `culture_realtime_factor`: seconds of culture time simulated per wall-clock second,
  default culture (1,000 neurons, STDP), as fast as possible on one core; and
  `culture_realtime_factor_by_plasticity`: the same for each plasticity rule.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import numpy as np

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.device.simulated_culture import (
    PLASTICITY_RULES,
    Plasticity,
    SimulatedCulture,
    SimulatedCultureConfig,
)
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import N_ENCODING
from spikeloop.bridge.wire.protocol import StimCommand, decode_spikes, encode_stim
from spikeloop.bridge.wire.settings import ARTIFACT_WAIT_MS, COLLECT_WINDOW_MS
from spikeloop.experiments.benchmarks.record import provenance, write_result


def measure_reply_latency_ms(exchanges: int, artifact_wait_ms: float, collect_window_ms: float) -> np.ndarray:
    """Stim-to-reply latencies (ms) against an in-process real-time sim device over UDP."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2.0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=rx.getsockname()[1])
    device = Device(
        DeviceConfig(
            address=address,
            backend="sim",
            realtime=True,
            artifact_wait_ms=artifact_wait_ms,
            collect_window_ms=collect_window_ms,
        )
    )
    thread = device.start()
    rng = np.random.default_rng(0)
    latencies = []
    try:
        time.sleep(0.5)
        for i in range(exchanges):
            stim = StimCommand(i + 1, tuple(rng.uniform(4, 40, N_ENCODING)), tuple(rng.uniform(1.0, 2.5, N_ENCODING)))
            t0 = time.perf_counter()
            tx.sendto(encode_stim(stim), ("127.0.0.1", device.stim_port))
            reply = decode_spikes(rx.recv(64))
            latencies.append((time.perf_counter() - t0) * 1e3)
            assert reply.timestamp_us == stim.timestamp_us
    finally:
        device.stop()
        thread.join(5)
        rx.close()
        tx.close()
    return np.array(latencies)


def measure_culture_realtime_factor(culture_s: float, plasticity: Plasticity = "stdp") -> float:
    """Culture seconds per wall second, default culture with this plasticity rule, as fast as possible."""
    culture = SimulatedCulture(SimulatedCultureConfig(plasticity=plasticity), seed=0)
    culture.advance(100)  # compile outside the timing
    t0 = time.perf_counter()
    culture.advance(culture_s * 1000.0)
    return culture_s / (time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    """Run both measurements and write the JSON file."""
    p = argparse.ArgumentParser(
        prog="spikeloop bench device", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--exchanges", type=int, default=200, help="stimulations for the latency measurement")
    p.add_argument("--artifact-wait-ms", type=float, default=ARTIFACT_WAIT_MS.default, help="device artifact wait")
    p.add_argument(
        "--collect-window-ms", type=float, default=COLLECT_WINDOW_MS.default, help="device collection window"
    )
    p.add_argument("--culture-seconds", type=float, default=60.0, help="culture time simulated for the speed figure")
    p.add_argument("--output", type=Path, default=Path("docs/benchmarks/device.json"), help="where to write")
    args = p.parse_args(argv)
    lat = measure_reply_latency_ms(args.exchanges, args.artifact_wait_ms, args.collect_window_ms)
    by_rule = {rule: measure_culture_realtime_factor(args.culture_seconds, rule) for rule in PLASTICITY_RULES}
    rtf = by_rule["stdp"]
    result = {
        "reply_latency_median_ms": round(float(np.median(lat)), 3),
        "reply_latency_p10_ms": round(float(np.percentile(lat, 10)), 3),
        "reply_latency_p90_ms": round(float(np.percentile(lat, 90)), 3),
        "reply_latency_max_ms": round(float(lat.max()), 3),
        "reply_latency_exchanges": int(lat.size),
        "artifact_wait_ms": args.artifact_wait_ms,
        "collect_window_ms": args.collect_window_ms,
        "culture_realtime_factor": round(rtf, 2),
        "culture_realtime_factor_by_plasticity": {rule: round(x, 2) for rule, x in by_rule.items()},
        "culture_seconds_simulated": args.culture_seconds,
        "culture": "1000 Izhikevich neurons, 60 synapses each, STDP on, 1 ms step",
    } | provenance("device", argv)
    write_result(args.output, result)
    print(json.dumps(result, indent=2))
    return 0
