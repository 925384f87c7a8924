"""`spikeloop bench bridge`: what the bridge actor adds to one exchange.

Two identical loopback devices run as separate processes replying at once (zero
windows). One is driven over bare sockets from this process (the baseline), the
other through the `CL1Bridge` actor (caller -> actor -> UDP -> device -> back).
Blocks of the two alternate so that machine load affects both alike.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from spikeloop.bridge.wire.ports import free_port
from spikeloop.experiments.benchmarks.record import provenance, write_result

DEFAULT_OUTPUT = Path("docs/benchmarks/bridge.json")


def _start_device(spike_port: int) -> tuple[subprocess.Popen, dict[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "spikeloop.bridge.device.loopback_device", "--spike-port", str(spike_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()
    ports = dict(item.split("=") for item in line.split())
    return proc, {k: int(v) for k, v in ports.items()}


def _percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(ms.max())}


def _task_exchange(ray, bridge):
    return lambda freqs, amps: ray.get(bridge.exchange.remote(freqs, amps))


def run(exchanges: int, blocks: int) -> dict:
    """Measure both paths and return the results dictionary."""
    import ray

    from spikeloop.bridge.device.loopback_device import raw_round_trip
    from spikeloop.bridge.trainer.actor import start_bridge
    from spikeloop.bridge.trainer.client import BridgeClient
    from spikeloop.bridge.trainer.core import BridgeConfig
    from spikeloop.bridge.wire.address import DeviceAddress

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    raw_port, actor_port = free_port(), free_port()
    raw_dev, raw_ports = _start_device(raw_port)
    actor_dev, actor_ports = _start_device(actor_port)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        bridge = start_bridge(
            BridgeConfig(
                device_id="bench",
                timeout_s=1.0,
                address=DeviceAddress(
                    spike_port=actor_port,
                    stim_port=actor_ports["stim_port"],
                    feedback_port=actor_ports["feedback_port"],
                    event_port=actor_ports["event_port"],
                ),
            )
        )
        client = BridgeClient(bridge)  # what env runners use: the local-socket fast path
        raw_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw_sock.bind(("127.0.0.1", raw_port))
        raw_sock.settimeout(1.0)
        freqs, amps = (10.0,) * 8, (1.5,) * 8
        for _ in range(100):  # warm-up: connections, code paths, caches
            client.exchange(freqs, amps)
            ray.get(bridge.exchange.remote(freqs, amps))
            raw_round_trip(("127.0.0.1", raw_ports["stim_port"]), raw_sock, freqs)
        raw_s: list[float] = []
        actor_s: list[float] = []
        task_s: list[float] = []
        per_block = max(1, exchanges // blocks)
        t_start = time.monotonic()
        for block in range(blocks):
            for _ in range(per_block):
                raw_s.append(raw_round_trip(("127.0.0.1", raw_ports["stim_port"]), raw_sock, freqs))
            for path, samples in ((client.exchange, actor_s), (_task_exchange(ray, bridge), task_s)):
                for _ in range(per_block):
                    t0 = time.perf_counter()
                    reply = path(freqs, amps)
                    samples.append(time.perf_counter() - t0)
                    if not reply.ok:
                        raise RuntimeError("the loopback device did not answer; the benchmark is void")
            print(f"block {block + 1}/{blocks}: {len(actor_s)} exchanges each way", file=sys.stderr)
        stats = client.stats()
        client.close()
        raw_sock.close()
    finally:
        ray.shutdown()
        for proc in (raw_dev, actor_dev):
            proc.terminate()
            proc.wait(timeout=5)
    raw, actor, task = _percentiles_ms(raw_s), _percentiles_ms(actor_s), _percentiles_ms(task_s)
    return {
        "added_p50_ms": actor["p50"] - raw["p50"],
        "added_p99_ms": actor["p99"] - raw["p99"],
        "raw_p50_ms": raw["p50"],
        "raw_p99_ms": raw["p99"],
        "actor_p50_ms": actor["p50"],
        "actor_p99_ms": actor["p99"],
        "actor_max_ms": actor["max"],
        "plain_actor_call_p50_ms": task["p50"],
        "plain_actor_call_p99_ms": task["p99"],
        "path": "BridgeClient (local Unix socket to the CL1Bridge actor); plain_* = ordinary actor task calls",
        "bridge_internal_p50_ms": stats["latency_ms"]["p50"],
        "exchanges_per_path": len(actor_s),
        "wall_s": time.monotonic() - t_start,
        "target": {"added_p50_ms": 1.0, "added_p99_ms": 3.0},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(
        prog="spikeloop bench bridge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exchanges", type=int, default=4000, help="exchanges per path (default 4000)")
    parser.add_argument("--blocks", type=int, default=8, help="alternating blocks per path (default 8)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    if args.exchanges < 100 or args.blocks < 1:
        parser.error("--exchanges must be >= 100 and --blocks >= 1 for percentiles to mean anything")
    result = run(args.exchanges, args.blocks)
    result |= provenance("bridge", argv)
    write_result(args.output, result)
    verdict = "meets" if result["added_p50_ms"] <= 1.0 and result["added_p99_ms"] <= 3.0 else "misses"
    print(
        f"added latency p50 {result['added_p50_ms']:.3f} ms, p99 {result['added_p99_ms']:.3f} ms "
        f"(raw p50 {result['raw_p50_ms']:.3f} ms, p99 {result['raw_p99_ms']:.3f} ms): {verdict} the target; "
        f"written to {args.output}"
    )
    return 0
