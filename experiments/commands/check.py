"""`spikeloop check EXP.yaml`: the preflight a lab runs before a culture is connected.

In order: the experiment validates; a trial fits this machine (what RLlib will
ask Tune for, against the CPUs, GPUs and the device resources spikeloop's own
local Ray advertises; skipped under RAY_ADDRESS); its scenario
loads (env built, reset, one step, closed); every device answers a short series of stimulations (latency and
timeouts printed); the safety envelope and every feedback row (channels, base
values, surprise settings, what it sends after the envelope, or which switch
keeps it off) are printed for review. No Ray is needed: cl1 devices are reached with a
`BridgeCore` in this process at the configured host and ports; sim, random and
zero devices are started here on free ports.

The probe stimulates only with the envelope's minimum settings (minimum
frequency and minimum amplitude on every encoding electrode) and sends no
feedback and no events (a `training_complete` would end a device's recording).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace

from bridge.channels import ENCODING_ELECTRODES, N_ENCODING, STIM_FREQUENCY_RANGE_HZ
from bridge.core import BridgeConfig, BridgeCore
from experiments.closed_loop.feedback import EventFeedbackSpec, feedback_rows, row_commands
from experiments.closed_loop.settings import DeviceSettings
from experiments.commands.common import add_experiment_arguments, load_or_exit
from experiments.schema import Experiment

DEFAULT_EXCHANGES = 20
SLOW_REPLY_SHARE = 0.8
"""A p99 latency above this share of loop.timeout_s is flagged: the loop would time out under load."""


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop check`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop check",
        description="Preflight an experiment before a culture is connected to it: validate the YAML, check that a "
        "trial fits this machine (CPUs, GPUs, and the device resources a local Ray advertises), load the "
        "scenario (reset and one step), send each device a short series of stimulations and print its reply "
        "latency (p50/p99/max) and timeouts, and print the safety envelope and every feedback row (what it "
        "sends, or which switch keeps it off) for review. cl1 devices are contacted at their configured host and ports; sim/random/zero devices "
        "are started locally on free ports. The probe stimulates ONLY at the envelope's minimum frequency and "
        "amplitude and sends no feedback or events. Exit status: 0 all good, 1 a check failed, 2 invalid "
        "experiment.",
    )
    add_experiment_arguments(parser)
    parser.add_argument(
        "--exchanges",
        type=int,
        default=DEFAULT_EXCHANGES,
        metavar="N",
        help=f"stimulations sent to each device (default {DEFAULT_EXCHANGES}); a device that does not answer the "
        "first one within loop.timeout_s is reported silent at once",
    )
    return parser


@dataclass
class DeviceProbe:
    """What one device's exchanges showed."""

    device_id: str
    where: str
    answered: int
    timeouts: int
    latency_ms: dict[str, float]
    correlation: str
    clamped: int
    foreign_source: str | None = None
    """The last reply refused for its source address (ip:port), if any."""
    reply_source: str = ""
    """Where replies were taken from (ip:port once an answer pinned it)."""

    @property
    def silent(self) -> bool:
        """True when the device answered nothing."""
        return self.answered == 0


# --- the checks, in the order they run -----------------------------------------------


def check_scenario(experiment: Experiment) -> str:
    """Build the env, reset, take one step, close; returns a one-line description."""
    from envs.doom_env import DoomEnv

    env = DoomEnv(**experiment.env)
    try:
        obs, _ = env.reset(seed=experiment.seed)
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        scenario = getattr(env.scenario, "name", env.scenario)
        return (
            f"scenario {scenario!r}: reset and one step ok (observation {_shape(obs)}, "
            f"{env.action_space}, step reward {float(reward):g}, terminated={terminated}, truncated={truncated})"
        )
    finally:
        env.close()


def check_fit(experiment: Experiment) -> tuple[str, str | None]:
    """(line to print, failure or None): can a local Ray place the trial? (No Ray is started to find out.)"""
    import os

    from experiments import fit

    if os.environ.get("RAY_ADDRESS"):
        return "[skip] resources: RAY_ADDRESS is set; spikeloop train checks the cluster's when it connects", None
    available = fit.local_resources(experiment)
    need = fit.trial_request(experiment)
    problem = fit.shortfall(experiment, available)
    if problem is None:
        wanted = ", ".join(f"{v:g} {k}" for k, v in need.items() if v > 0)
        devices = experiment.culture_settings().node_resources()
        owned = f"; its own Ray will advertise {', '.join(f'{v:g} {k}' for k, v in devices.items())}" if devices else ""
        return f"[ok]   resources: a trial needs {wanted}; this machine has {available['CPU']:g} CPU{owned}", None
    return f"[FAIL] resources: {problem}", "resources: " + problem.splitlines()[0]


def sampling_line(experiment: Experiment) -> str:
    """How long one iteration's sample takes at the devices' pace, and how long RLlib will wait for it."""
    pace = experiment.sample_pace()
    timeout_s = pace.timeout_s(experiment.loop.sample_timeout_s)
    runners = max(1, experiment.resources.num_env_runners)
    steps = f"{pace.rollout_steps} env steps per env runner ({runners} env runner(s)) per iteration"
    if pace.device_step_s is None:
        at_pace = "the culture is not paced (it runs as fast as it can)"
    else:
        at_pace = (
            f"at the devices' pace ({pace.rounds} x {pace.device_step_s * 1000:.0f} ms of windows a step, no faster "
            f"than {1 / (pace.rounds * pace.device_step_s):.0f} steps/s) a sample takes at least "
            f"{pace.nominal_sample_s():.0f} s"
        )
    return (
        f"[ok]   sampling: {steps}; {at_pace}; RLlib waits up to {timeout_s:g} s for it "
        f"(loop.sample_timeout_s: {experiment.loop.sample_timeout_s})"
    )


def _shape(obs) -> str:
    if isinstance(obs, dict):
        return "{" + ", ".join(f"{k}: {getattr(v, 'shape', '?')}" for k, v in obs.items()) + "}"
    return str(getattr(obs, "shape", type(obs).__name__))


def _bridge_config(experiment: Experiment, dev: DeviceSettings) -> BridgeConfig:
    # A timeout is a finding to report, not an exception; the probe's values are in the envelope anyway.
    return replace(experiment.culture_settings().bridge_config(dev), timeout_policy="zeros", envelope_policy="clamp")


def _start_local_device(dev: DeviceSettings, envelope):
    """A simulated/ablation device of this process on free ports (the trainer side binds its own)."""
    from bridge.device import Device

    device = Device(dev.device_config(spike_port=0, envelope=envelope))
    address = replace(
        dev.address,
        host=dev.address.bind_host,
        stim_port=device.stim_port,
        event_port=device.event_port,
        feedback_port=device.feedback_port,
        spike_port=0,
    )
    return device, replace(dev, address=address)


def probe_device(experiment: Experiment, dev: DeviceSettings, exchanges: int) -> DeviceProbe:
    """Send `exchanges` minimum-setting stimulations and measure the replies; stops early if the device is silent."""
    device = None
    if dev.simulated:
        device, dev = _start_local_device(dev, experiment.safety)
    envelope = experiment.safety
    frequencies_hz = [envelope.min_frequency_hz] * N_ENCODING
    amplitudes_ua = [envelope.min_amplitude_ua] * N_ENCODING
    try:
        with BridgeCore(_bridge_config(experiment, dev)) as bridge:
            if device is not None:
                device.spike_port = bridge.spike_port  # the device learns where replies go once we bound it
                device.start()
            for i in range(exchanges):
                reply = bridge.exchange(frequencies_hz, amplitudes_ua)
                if i == 0 and not reply.ok:
                    break  # silent: more tries would only multiply the wait
            stats = bridge.stats()
    finally:
        if device is not None:
            device.stop()
    return DeviceProbe(
        device_id=dev.device_id,
        where=f"{dev.address.host}:{dev.address.stim_port} (replies to {dev.address.bind_host}:{stats['spike_port']})",
        answered=stats["ok"],
        timeouts=stats["timeouts"],
        latency_ms=stats["latency_ms"],
        correlation=stats["correlation"],
        clamped=stats["clamped_commands"],
        foreign_source=stats.get("last_foreign_source"),
        reply_source=stats.get("reply_source", ""),
    )


def reply_source_line(experiment: Experiment, dev: DeviceSettings, probe: DeviceProbe) -> str:
    """Where the device's replies came from, and how to require that port from the first reply on."""
    index = experiment.devices.index(dev)
    port = probe.reply_source.split(" ", 1)[0].rsplit(":", 1)[-1]
    if dev.reply_port == "auto" and port.isdigit():
        advice = "stim_port" if int(port) == dev.address.stim_port else port
        return (
            f"[info] device {dev.device_id!r}: replies came from {probe.reply_source.split(' ', 1)[0]} "
            f"(reply_port auto pins it at the first answer; devices.{index}.reply_port: {advice} requires it "
            "from the first reply on)"
        )
    return f"[info] device {dev.device_id!r}: replies taken from {probe.reply_source} (reply_port {dev.reply_port})"


def _span(values: list[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low:g} {unit}" if low == high else f"{low:g}-{high:g} {unit}"


def feedback_lines(experiment: Experiment) -> list[str]:
    """Every feedback row: channels, base Hz/uA/pulses, its surprise settings, and what it sends past the envelope."""
    fb = experiment.culture_settings().feedback  # what the run sends (a protocol condition may turn it off)
    s = fb.surprise
    envelope = experiment.safety
    lines = [
        f"feedback {'ON' if fb.enabled else 'OFF (nothing below is sent)'}; step feedback: "
        f"{'reward sign (use_reward_feedback)' if fb.use_reward_feedback else 'event table'}; episode feedback "
        f"{'on' if fb.use_episode_feedback else 'off'} (use_episode_feedback), surprise-scaled "
        f"{'yes' if fb.episode_feedback_surprise_scaling and s.enabled else 'no'} "
        f"(episode_feedback_surprise_scaling); surprise scaling {'on' if s.enabled else 'off'} (baselines: step "
        f"beta {s.step_baseline_beta:g}, episode beta {s.episode_baseline_beta:g}); amplitude capped at "
        f"{fb.max_amplitude_ua:g} uA; clamp_to_encoder_range={fb.clamp_to_encoder_range} "
        f"({STIM_FREQUENCY_RANGE_HZ[0]:g}-{STIM_FREQUENCY_RANGE_HZ[1]:g} Hz); interrupt before negative "
        f"feedback: {fb.interrupt_before_negative}; at most {fb.max_datagrams_per_step} datagrams between two "
        "stimulations (max_datagrams_per_step)"
    ]
    for row in feedback_rows(fb):
        spec = row.spec
        checked = [envelope.check_feedback(commands[-1], "clamp") for commands in row_commands(fb, row)]
        sent = [command for command, _ in checked if command is not None]
        clamped = " (the envelope clamps it)" if any(fixes for _, fixes in checked) else ""
        if not sent:
            reach = "nothing (off, or every channel forbidden)"
        else:
            reach = (
                "  ".join(
                    _span(values, unit)
                    for unit, values in (
                        ("Hz", [c.frequency_hz for c in sent]),
                        ("uA", [round(c.amplitude_ua, 3) for c in sent]),
                        ("pulses", [c.pulses for c in sent]),
                    )
                )
                + clamped
            )
        first = {(False,): "", (True,): ", interrupt first"}.get(row.directions, ", interrupt first when negative")
        surprise = ""
        if isinstance(spec, EventFeedbackSpec):
            surprise = (
                f"  td_sign={spec.td_sign} gain/max Hz {spec.frequency_gain:g}/x{spec.frequency_scale_max:g} "
                f"uA {spec.amplitude_gain:g}/x{spec.amplitude_scale_max:g} pulses {spec.pulse_gain:g}/"
                f"x{spec.pulse_scale_max:g} ema_beta={spec.ema_beta:g}"
            )
        lines.append(
            f"  {row.kind:<8}{row.key.removeprefix('events.'):<18} channels {list(spec.channels)}  "
            f"{spec.frequency_hz:g} Hz  {spec.amplitude_ua:g} uA  {spec.pulses} pulses  "
            f"unpredictable={spec.unpredictable}{surprise}"
        )
        lines.append(
            f"  {'':<26}-> " + (f"sends {row.name!r}{first}: {reach}" if row.sent else f"NOT SENT ({row.why_not})")
        )
    return lines


# --- the command ---------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """Run `spikeloop check`."""
    args = build_parser().parse_args(argv)
    if args.exchanges < 1:
        print("spikeloop check: --exchanges must be >= 1", file=sys.stderr)
        return 2
    experiment = load_or_exit(args)
    failures: list[str] = []
    print(
        f"[ok]   config {args.experiment}: valid (name {experiment.name!r}, {len(experiment.devices)} device(s), "
        f"{experiment.resources.num_env_runners} env runner(s), ablation {experiment.ablation})",
        flush=True,
    )

    fit_line, fit_failure = check_fit(experiment)
    print(fit_line, flush=True)
    if fit_failure:
        failures.append(fit_failure)
    print(sampling_line(experiment), flush=True)

    try:
        print(f"[ok]   {check_scenario(experiment)}", flush=True)
    except Exception as exc:  # any failure to load the game is a finding, reported with its cause
        failures.append(f"scenario: {exc}")
        print(f"[FAIL] scenario {experiment.env.get('scenario', '(default)')!r}: {exc}", flush=True)

    envelope = experiment.safety
    print(
        f"probing devices with {args.exchanges} stimulation(s) each at the envelope MINIMUM only: "
        f"{envelope.min_frequency_hz:g} Hz, {envelope.min_amplitude_ua:g} uA on every encoding electrode "
        f"{list(ENCODING_ELECTRODES)}; no feedback, no events; timeout {experiment.loop.timeout_s * 1000:.0f} ms",
        flush=True,
    )
    # A simulated device is a template (one culture per env runner): probing one instance checks its backend.
    for dev in experiment.devices:
        label = f"device {dev.device_id!r} ({dev.backend})"
        t0 = time.monotonic()
        try:
            probe = probe_device(experiment, dev, args.exchanges)
        except OSError as exc:
            failures.append(f"{label}: {exc}")
            print(f"[FAIL] {label}: {exc}", flush=True)
            continue
        took = time.monotonic() - t0
        if probe.silent:
            message = (
                f"{label} at {probe.where} did not answer within "
                f"{experiment.loop.timeout_s * 1000:.0f} ms (gave up after {took:.2f} s): is the device "
                f"program running on {dev.address.host} port {dev.address.stim_port}, and does it send replies "
                "to this host?"
            )
            if probe.foreign_source is not None:
                index = experiment.devices.index(dev)
                port = probe.foreign_source.rsplit(":", 1)[1]
                message += (
                    f" A reply came from {probe.foreign_source}, which is not the device's stimulation port: "
                    f"if that is the device, set devices.{index}.reply_port: {port} (or any)"
                )
            failures.append(message)
            print(f"[FAIL] {message}", flush=True)
            continue
        lat = probe.latency_ms
        status = "ok" if probe.timeouts == 0 else "FAIL"
        print(
            f"[{status:<4}] {label} at {probe.where}: {probe.answered}/{probe.answered + probe.timeouts} answered, "
            f"{probe.timeouts} timeout(s); latency p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  "
            f"max {lat['max']:.2f} ms; correlation {probe.correlation}; {took:.1f} s",
            flush=True,
        )
        if probe.timeouts:
            failures.append(f"{label}: {probe.timeouts} of {probe.answered + probe.timeouts} stimulations timed out")
        if lat["p99"] > SLOW_REPLY_SHARE * experiment.loop.timeout_s * 1000:
            print(
                f"[warn] {label}: p99 latency is above {SLOW_REPLY_SHARE:.0%} of loop.timeout_s; "
                "expect timeouts during training",
                flush=True,
            )
        if probe.clamped:
            print(f"[warn] {label}: the envelope clamped {probe.clamped} probe command(s)", flush=True)
        if not dev.simulated:
            print(reply_source_line(experiment, dev, probe), flush=True)

    print(f"safety envelope (review): {envelope.describe()}; policy {experiment.loop.envelope_policy}", flush=True)
    for line in feedback_lines(experiment):
        print(line, flush=True)

    if failures:
        print(f"check FAILED ({len(failures)}):", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print("check passed: the experiment is ready for its culture", flush=True)
    return 0
