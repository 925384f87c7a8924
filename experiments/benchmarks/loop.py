"""`spikeloop bench loop`: closed-loop env steps per second while sampling.

Two conditions, each a real env runner driving a simulated culture through the
bridge, with feedback on:

* paced: the device runs in real time with the reference 50 + 50 ms artifact
  and collection windows, so one device allows at most 1 / (0.05 + 0.05) = 10
  steps/s; the question is how close the loop gets to that limit (timed over
  several windows: the median is the result, the range shows the spread);
* unpaced: zero windows, as fast as possible: what the software costs per tick;
* unpaced with the live view on and a viewer reading `/doom.mjpeg` throughout:
  the view must not slow the loop (frames are dropped, never queued).

Every condition runs with the live information meter on (models/closed_loop/meter.py) and reports its
CPU time per tick (`meter_cpu_ms_per_tick`: keeping each tick and recomputing every `meter.every_ticks`); one
more unpaced condition runs with it off, so the unpaced loop's speed with and without it is compared too.

`--device tick10` measures one more condition instead, and adds it to the same
file beside the others: the paced loop against a device that behaves like the
reference trainer's device program, run as its own process the way a lab runs
it (`spikeloop device --tick-quantised`: a 10 Hz hardware tick, 50 + 50 ms
windows, its own clock, replies from a socket of its own), reached as a `cl1`
device. A stimulation is taken on a tick and answered one tick later; the next
one, sent after the reply, waits for the tick after that, so such a device
allows at most 10 / 2 = 5 steps/s (`tick_loop_limit_steps_per_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from spikeloop.bridge.wire.ports import free_port
from spikeloop.experiments.benchmarks.record import provenance, write_result
from spikeloop.experiments.ray_session import private_ray

DEFAULT_OUTPUT = Path("docs/benchmarks/loop.json")
DEVICES = ("sim", "tick10")
"""sim: the simulated culture started per env runner (the paced, unpaced and view conditions); tick10: a
tick-quantised device program of its own (see the module docstring)."""
TICK10 = {"tick_frequency_hz": 10.0, "artifact_wait_ms": 50.0, "collect_window_ms": 50.0}
TICK10_RESULT = "tick10"
"""Key of the tick10 condition in the result file; a run of the other conditions keeps it (and the other way round)."""


def _experiment(paced: bool, scenario: str, extra: dict[str, Any] | None = None):
    from spikeloop.experiments.schema import experiment_from_dict

    device = {
        "device_id": "bench",
        "backend": "sim",
        "realtime": paced,
        "seed": 1,
        "artifact_wait_ms": 50.0 if paced else 0.0,
        "collect_window_ms": 50.0 if paced else 0.0,
    }
    data = {
        "name": "bench-loop",
        "devices": [device],
        "env": {"scenario": scenario},
        "resources": {"num_env_runners": 1},
        "loop": {"timeout_s": 1.0},
    } | (extra or {})
    return experiment_from_dict(data, source="bench loop")


def _watch_stream(url: str, stop: threading.Event, frames: list[int]) -> None:
    """A viewer: read the MJPEG stream until told to stop, counting JPEG frames."""
    import urllib.request

    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=5) as stream:
                while not stop.is_set():
                    chunk = stream.read(65536)
                    if not chunk:
                        break
                    frames[0] += chunk.count(b"\xff\xd8\xff")
        except OSError:
            time.sleep(0.2)  # the server is not up yet


def _sample_rate(experiment, steps: int, warmup_steps: int, repeats: int = 1) -> dict[str, Any]:
    """Steps/s over `repeats` timed windows of `steps` steps on one env runner; the median is the result."""
    import statistics

    from spikeloop.models.closed_loop.ppo import finish

    algo = experiment.algorithm_config().build_algo()
    stop, frames = threading.Event(), [0]
    if experiment.view.enabled:
        url = f"http://127.0.0.1:{experiment.view.port}/doom.mjpeg"
        threading.Thread(target=_watch_stream, args=(url, stop, frames), daemon=True).start()
    try:

        def timed(runner, n=steps, w=warmup_steps, k=repeats):
            from spikeloop.models.closed_loop.link import current_link

            runner.sample(num_timesteps=w, explore=True)
            meter = current_link().meter
            before = meter.cost() if meter is not None else None
            windows = []
            for _ in range(k):
                t0 = time.perf_counter()
                episodes = runner.sample(num_timesteps=n, explore=True)
                windows.append((sum(len(e) for e in episodes), time.perf_counter() - t0))
            return windows, before, meter.cost() if meter is not None else None

        ((windows, meter_before, meter_after),) = algo.env_runner_group.foreach_env_runner(
            timed, local_env_runner=False
        )
        rates = [n / elapsed for n, elapsed in windows]
        result = {
            "steps": sum(n for n, _ in windows),
            "seconds": sum(e for _, e in windows),
            "steps_per_s": statistics.median(rates),
        }
        if meter_before is not None and meter_after is not None:  # the live information meter's CPU time
            result |= meter_cost(meter_before, meter_after)
        if repeats > 1:
            result |= {"steps_per_s_each": rates, "steps_per_s_min": min(rates), "steps_per_s_max": max(rates)}
        return result | ({"frames_streamed": frames[0]} if experiment.view.enabled else {})
    finally:
        stop.set()
        finish(algo, reason="benchmark")
        algo.stop()


def meter_cost(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The live information meter's CPU time per tick between two of its `cost()` readings, and its recomputations."""
    ticks = after["meter_ticks"] - before["meter_ticks"]
    cpu_s = after["meter_cpu_s"] - before["meter_cpu_s"]
    return {
        "meter_ticks": ticks,
        "meter_updates": after["meter_updates"] - before["meter_updates"],
        "meter_cpu_ms_per_tick": 1e3 * cpu_s / ticks if ticks else 0.0,
    }


def paced_figures(measured: dict[str, Any], limit: float, prefix: str = "") -> dict[str, Any]:
    """A paced condition's headline figures from `_sample_rate`'s result, against its device's limit (steps/s).

    The sim run's file holds several conditions side by side, so its paced figures carry `prefix` "paced_"
    (the limit's key never does); the tick10 entry is a condition of its own and has none.
    """
    rate = measured["steps_per_s"]
    return {
        f"{prefix}steps_per_s": rate,
        "limit_steps_per_s": limit,
        f"{prefix}fraction_of_limit": rate / limit,
        f"{prefix}steps_per_s_range": [measured.get("steps_per_s_min", rate), measured.get("steps_per_s_max", rate)],
    }


def run(paced_steps: int, unpaced_steps: int, scenario: str, repeats: int = 3) -> dict[str, Any]:
    """Measure both conditions and return the results."""
    with private_ray():
        print(f"paced: {repeats} x {paced_steps} steps against 50 + 50 ms windows in real time...", file=sys.stderr)
        paced = _sample_rate(_experiment(True, scenario), paced_steps, warmup_steps=20, repeats=repeats)
        print(f"unpaced: {unpaced_steps} steps with zero windows...", file=sys.stderr)
        unpaced = _sample_rate(_experiment(False, scenario), unpaced_steps, warmup_steps=200)
        print(f"unpaced, the information meter off: {unpaced_steps} steps...", file=sys.stderr)
        unpaced_meter_off = _sample_rate(
            _experiment(False, scenario, {"meter": {"enabled": False}}), unpaced_steps, warmup_steps=200
        )
        print(f"paced, live view on and watched: {paced_steps} steps...", file=sys.stderr)
        paced_viewed = _sample_rate(
            _experiment(True, scenario, {"view": {"enabled": True, "port": free_port(kind="tcp")}}),
            paced_steps,
            warmup_steps=20,
        )
        print(f"unpaced, live view on and watched: {unpaced_steps} steps...", file=sys.stderr)
        viewed = _sample_rate(
            _experiment(False, scenario, {"view": {"enabled": True, "port": free_port(kind="tcp")}}),
            unpaced_steps,
            warmup_steps=200,
        )
    return paced_figures(paced, limit=1.0 / (0.050 + 0.050), prefix="paced_") | {
        "unpaced_steps_per_s": unpaced["steps_per_s"],
        "unpaced_ms_per_step": 1000.0 / unpaced["steps_per_s"],
        "view_on_paced_steps_per_s": paced_viewed["steps_per_s"],
        "view_on_paced_fraction_of_off": paced_viewed["steps_per_s"] / paced["steps_per_s"],
        "view_on_unpaced_steps_per_s": viewed["steps_per_s"],
        "view_on_unpaced_fraction_of_off": viewed["steps_per_s"] / unpaced["steps_per_s"],
        # The live information meter (on in every condition but unpaced_meter_off): its CPU time per tick, against
        # the 100 ms of a paced 10 Hz tick, and the unpaced loop's speed with it off.
        "meter_cpu_ms_per_tick_paced": paced["meter_cpu_ms_per_tick"],
        "meter_fraction_of_10hz_tick": paced["meter_cpu_ms_per_tick"] / 100.0,
        "meter_cpu_ms_per_tick_unpaced": unpaced["meter_cpu_ms_per_tick"],
        "meter_off_unpaced_steps_per_s": unpaced_meter_off["steps_per_s"],
        "meter_on_unpaced_fraction_of_off": unpaced["steps_per_s"] / unpaced_meter_off["steps_per_s"],
        "paced": paced,
        "paced_view_on": paced_viewed,
        "unpaced": unpaced,
        "unpaced_meter_off": unpaced_meter_off,
        "unpaced_view_on": viewed,
        "target": {"paced_steps_per_s": 9.5, "view_on_fraction_of_off": 0.95, "meter_fraction_of_10hz_tick": 0.02},
        "settings": {
            "scenario": scenario,
            "device": "sim backend via the device program and CL1Bridge actor",
            "env_runners": 1,
            "feedback": "on (reference)",
            "explore": True,
        },
    }


def start_tick_device(ports: dict[str, int], log_path: Path) -> subprocess.Popen:
    """`spikeloop device` as a third-party hardware loop, in its own process; returns once it serves."""
    argv = [
        sys.executable,
        "-m",
        "spikeloop.experiments.cli",
        "device",
        "--backend",
        "sim",
        "--realtime",
        "--tick-quantised",
        "--tick-frequency",
        f"{TICK10['tick_frequency_hz']:g}",
        "--artifact-wait-ms",
        f"{TICK10['artifact_wait_ms']:g}",
        "--collect-window-ms",
        f"{TICK10['collect_window_ms']:g}",
        "--own-clock",
        "--reply-from",
        "ephemeral",
        "--training-host",
        "127.0.0.1",
        *[arg for name, port in ports.items() for arg in (f"--{name.replace('_', '-')}", str(port))],
    ]
    log = log_path.open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while "device up" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the tick device did not start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def run_tick10(steps: int, scenario: str, repeats: int = 3) -> dict[str, Any]:
    """The paced loop against a 10 Hz tick-quantised device program with its own clock; returns its figures."""
    import tempfile

    from spikeloop.bridge.device.program import tick_loop_limit_steps_per_s
    from spikeloop.experiments.schema import experiment_from_dict

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ports = {name: free_port() for name in ("stim_port", "spike_port", "event_port", "feedback_port")}
    device = {"device_id": "bench-tick10", "backend": "cl1", "host": "127.0.0.1", "bind_host": "127.0.0.1", **ports}
    # A reply comes 100-200 ms after its stimulation: 1 s leaves a loaded machine room.
    experiment = experiment_from_dict(
        {
            "name": "bench-loop-tick10",
            "devices": [device],
            "env": {"scenario": scenario},
            "resources": {"num_env_runners": 1},
            "loop": {"timeout_s": 1.0},
        },
        source="bench loop --device tick10",
    )
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_tick_device(ports, Path(tmp) / "device.log")
        try:
            with private_ray(resources=experiment.culture_settings().node_resources()):
                print(
                    f"tick10: {repeats} x {steps} steps against a 10 Hz tick-quantised device (own clock)...",
                    file=sys.stderr,
                )
                measured = _sample_rate(experiment, steps, warmup_steps=20, repeats=repeats)
            proc.wait(timeout=30)  # the benchmark's training_complete ends the device program
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        device_log = (Path(tmp) / "device.log").read_text()
    summary = next(
        (
            json.loads(line)["spikeloop_device"]
            for line in reversed(device_log.splitlines())
            if line.startswith('{"spikeloop_device"')
        ),
        {},
    )
    return paced_figures(measured, limit=tick_loop_limit_steps_per_s(**TICK10)) | {
        "measured": measured,
        "device_counters": {k: v for k, v in summary.items() if k != "recording_files"},
        "target": {"fraction_of_limit": 0.97},
        "settings": {
            "scenario": scenario,
            "device": "spikeloop device --backend sim --realtime --tick-quantised "
            "--tick-frequency 10 --artifact-wait-ms 50 --collect-window-ms 50 --own-clock --reply-from "
            "ephemeral, its own process, reached as a cl1 device",
            "env_runners": 1,
            "feedback": "on (reference)",
            "explore": True,
            "loop.timeout_s": 1.0,
        },
    }


def _merge(path: Path, result: dict[str, Any], keep: str | None) -> dict[str, Any]:
    """`result`, plus the entry `keep` of the file already at `path` (the other device's figures), if any."""
    if keep is None or not path.is_file():
        return result
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return result
    if keep == TICK10_RESULT:
        return result | ({TICK10_RESULT: previous[TICK10_RESULT]} if TICK10_RESULT in previous else {})
    return {k: v for k, v in previous.items() if k != TICK10_RESULT} | result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(
        prog="spikeloop bench loop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paced-steps", type=int, default=300, help="steps timed against the paced device (300)")
    parser.add_argument("--unpaced-steps", type=int, default=3000, help="steps timed as fast as possible (3000)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed paced windows; the median is reported, with the range (default 3)"
    )
    parser.add_argument("--scenario", default="basic", help="VizDoom scenario (default basic)")
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="sim",
        help="sim: the paced, unpaced and live-view conditions (default); tick10: only the paced loop "
        "against a 10 Hz tick-quantised device program with its own clock, 50 + 50 ms windows, "
        "--paced-steps steps x --repeats, added to the output file beside the others",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    if args.paced_steps < 10 or args.unpaced_steps < 10:
        parser.error("time at least 10 steps per condition")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.device == "tick10":
        tick10 = run_tick10(args.paced_steps, args.scenario, args.repeats) | provenance("loop", argv)
        write_result(args.output, _merge(args.output, {TICK10_RESULT: tick10}, keep="all"))
        low, high = tick10["steps_per_s_range"]
        print(
            f"tick10 {tick10['steps_per_s']:.2f} steps/s (median of {args.repeats}, range {low:.2f}-{high:.2f}); "
            f"that device's limit {tick10['limit_steps_per_s']:.1f}: {tick10['fraction_of_limit']:.1%} of it "
            f"(target 97%); written to {args.output}"
        )
        return 0
    result = run(args.paced_steps, args.unpaced_steps, args.scenario, args.repeats)
    result |= provenance("loop", argv)
    write_result(args.output, _merge(args.output, result, keep=TICK10_RESULT))
    low, high = result["paced_steps_per_s_range"]
    print(
        f"paced {result['paced_steps_per_s']:.2f} steps/s (median of {args.repeats}, range {low:.2f}-{high:.2f}; "
        f"limit {result['limit_steps_per_s']:.1f}, target 9.5); "
        f"with the view on and watched {result['view_on_paced_steps_per_s']:.2f} "
        f"({result['view_on_paced_fraction_of_off']:.1%}); unpaced {result['unpaced_steps_per_s']:.1f} steps/s, "
        f"view on {result['view_on_unpaced_steps_per_s']:.1f} ({result['view_on_unpaced_fraction_of_off']:.1%}); "
        f"information meter {result['meter_cpu_ms_per_tick_paced']:.3f} ms CPU a paced tick "
        f"({result['meter_fraction_of_10hz_tick']:.2%} of a 10 Hz tick, target < 2%), unpaced "
        f"{result['meter_on_unpaced_fraction_of_off']:.1%} of the speed with it off; written to {args.output}"
    )
    return 0
