"""`spikeloop check EXP.yaml`: the preflight a lab runs before a culture is connected.

In order: the experiment validates; a trial fits this machine (what RLlib will
ask Tune for, against the CPUs, GPUs and the device resources spikeloop's own
local Ray advertises; skipped under RAY_ADDRESS); its scenario
loads (env built, reset, one step, closed); every device answers a short series of stimulations; the safety
envelope and every feedback row (channels, base values, surprise settings, what it sends after the envelope, or
which switch keeps it off) are printed for review. No Ray is needed: cl1 devices are reached with a
`BridgeCore` in this process at the configured host and ports; sim, random and
zero devices are started here on free ports.

The probe keeps the device's reply discipline in view (README, "What a device
must do"): one reply per stimulation, answering that stimulation, nothing
unasked. It sends a fixed pseudo-random order of "off" stimulations (the
envelope's minimum frequency and amplitude on every encoding electrode) and
"on" ones (a modest `PROBE_ON_FREQUENCY_HZ`, `PROBE_ON_AMPLITUDE_UA`, inside
the encoder's range and the envelope), printed exactly, and reports from the
replies: timeouts; replies per stimulation and unsolicited datagrams (any one
fails); the correlation of the counts with the stimulation they answer and
with the ones before it (`spikeloop.bridge.trainer.causality`: counts that follow an earlier
stimulation fail; counts that follow none, as the zero and random ablations',
pass with a note); latency against the configured windows. `--minimum-only`
stimulates at the envelope minimum only and skips the correlations. No
feedback and no events are sent (a `training_complete` would end a device's
recording).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from spikeloop.bridge.trainer.causality import ALPHA, MAX_LAG, MIN_PAIRS, Causality, CausalityMeter, stim_drive
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.channels import (
    ENCODING_ELECTRODES,
    N_ENCODING,
    STIM_AMPLITUDE_RANGE_UA,
    STIM_FREQUENCY_RANGE_HZ,
)
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.commands.common import add_experiment_arguments, load_or_exit
from spikeloop.experiments.exposure import exposure_lines
from spikeloop.experiments.schema import Experiment
from spikeloop.models.closed_loop.feedback import EventFeedbackSpec, feedback_rows, row_commands
from spikeloop.models.closed_loop.settings import DeviceSettings

DEFAULT_EXCHANGES = 40
"""Enough for the correlations to tell (ALPHA 0.001) a responding culture's own answer from a late one: a
response with r 0.6 or more, against about 4 s at 10 Hz."""
SLOW_REPLY_SHARE = 0.8
"""A p99 latency above this share of loop.timeout_s is flagged: the loop would time out under load."""
PROBE_ON_FREQUENCY_HZ = 20.0
PROBE_ON_AMPLITUDE_UA = 1.5
"""The probe's "on" stimulation: the middle of what the encoder sends in training (STIM_*_RANGE), 0.18 nC per
phase at 120 us; the simulated culture answers it with about 25 times its spontaneous count."""
PATTERN_SEED = 0
"""The probe's on/off order is a fixed shuffle of equally many of each: the same order every time, for review."""
MIN_EXCHANGES_FOR_CAUSALITY = MIN_PAIRS + MAX_LAG
EARLY_REPLY_SHARE = 0.9
"""Replies whose median latency is below this share of the configured windows are flagged: too soon to count them."""


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop check`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop check",
        description="Preflight an experiment before a culture is connected to it: validate the YAML, check that a "
        "trial fits this machine (CPUs, GPUs, and the device resources a local Ray advertises), load the "
        "scenario (reset and one step), for a sweep (tune.search_space, tune.seeds) print its trials, estimated "
        "wall time and the smallest difference its seeds can detect, probe each device, and print the safety envelope and every feedback row "
        "(what it sends, or which switch keeps it off) for review. cl1 devices are contacted at their configured "
        "host and ports; sim/random/zero devices are started locally on free ports. "
        "THE PROBE STIMULATES: --exchanges stimulations on every encoding electrode, half 'off' (the envelope's "
        f"minimum frequency and amplitude) and half 'on' ({PROBE_ON_FREQUENCY_HZ:g} Hz, {PROBE_ON_AMPLITUDE_UA:g} uA, "
        "inside the encoder's range, brought inside the envelope if it is narrower), in a fixed pseudo-random "
        "order that is printed before it is sent; --minimum-only sends only 'off'. No feedback or events are "
        "sent. From the replies it prints timeouts and latency (p50/p99/max, and against the configured "
        "windows), replies per stimulation, and the correlation of the spike counts with the stimulation each "
        "reply answers and with the ones before it. It fails a device that times out, sends datagrams nobody "
        "asked for, or whose counts follow an earlier stimulation than the one they answer (the README's 'What "
        "a device must do'); counts that follow no stimulation (the zero and random ablations) pass with a note. "
        "Exit status: 0 all good, 1 a check failed, 2 invalid experiment.",
    )
    add_experiment_arguments(parser)
    parser.add_argument(
        "--exchanges",
        type=int,
        default=DEFAULT_EXCHANGES,
        metavar="N",
        help=f"stimulations sent to each device (default {DEFAULT_EXCHANGES}: about 4 s at 10 Hz, enough for the "
        "correlations to tell a responding culture's own answer from a late one; fewer than "
        f"{MIN_EXCHANGES_FOR_CAUSALITY} decide nothing); a device that does not answer the first one within "
        "loop.timeout_s is reported silent at once",
    )
    parser.add_argument(
        "--minimum-only",
        action="store_true",
        help="stimulate only at the envelope's minimum frequency and amplitude (no 'on' stimulations); which "
        "stimulation the replies answer is then not checked",
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
    exchanges: int = 0
    received: int = 0
    """Well-formed datagrams from the device, answers or not."""
    stale: int = 0
    duplicates: int = 0
    causality: Causality | None = None
    """Which stimulation the counts follow (None with --minimum-only)."""
    device_status: dict[str, Any] | None = None
    """The device's answer to a status_request (its envelope, dose budget and dose), or None if it sent none."""

    @property
    def unsolicited(self) -> int:
        """Datagrams that answered no stimulation (the bridge's stale plus duplicates)."""
        return self.stale + self.duplicates

    @property
    def silent(self) -> bool:
        """True when the device answered nothing."""
        return self.answered == 0


# --- the checks, in the order they run -----------------------------------------------


def check_scenario(experiment: Experiment) -> str:
    """Build the env, reset, take one step, close; returns a one-line description."""
    from spikeloop.envs.doom_env import DoomEnv

    # The scenario is checked, not the pacing: no reset delay (env.reset_delay_s is bounded and shown in sampling).
    env = DoomEnv(**(experiment.env | {"reset_delay_s": 0.0}))
    try:
        obs, _ = env.reset(seed=experiment.seed)
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        scenario = getattr(env.scenario, "name", env.scenario)
        return (
            f"scenario {scenario!r}: reset and one step ok (observation {_shape(obs)}, "
            f"{env.action_space}, step reward {float(reward):g}, terminated={terminated}, truncated={truncated})"
            + scenario_files(env.scenario, env.reward_mode)
        )
    finally:
        env.close()


def scenario_files(scenario, reward_mode: str) -> str:
    """Continuation lines: the scenario's cfg and WAD, the rewards the cfg sets, and the lines vizdoom ignores."""
    from spikeloop.envs.scenarios import cfg_rewards, ignored_cfg_entries

    rewards = ", ".join(f"{name} {value:g}" for name, value in cfg_rewards(scenario.cfg_path).items()) or "none"
    used = (
        "not in the reward (env.reward_mode: shaped); in episode_end's game_reward_sum"
        if reward_mode == "shaped"
        else f"in the reward (env.reward_mode: {reward_mode}) and in episode_end's game_reward_sum"
    )
    lines = [
        f"\n       cfg {scenario.cfg_path}, map {scenario.wad_path or '(the game WAD)'}",
        f"\n       the cfg's rewards: {rewards} (the game's reward, with the map's own: {used})",
    ]
    ignored = ignored_cfg_entries(scenario.cfg_path)
    if ignored:
        listed = ", ".join(f"line {e.line} {e.key} = {e.value}" for e in ignored)
        lines.append(f"\n       vizdoom ignores (unknown key or value): {listed}")
    return "".join(lines)


def check_fit(experiment: Experiment) -> tuple[str, str | None]:
    """(line to print, failure or None): can a local Ray place the trial? (No Ray is started to find out.)"""
    import os

    from spikeloop.experiments import fit

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


def sweep_lines(experiment: Experiment) -> list[str]:
    """A sweep's trials, estimated wall time on this machine and smallest detectable difference (analysis/plan.py)."""
    from spikeloop.experiments import fit
    from spikeloop.experiments.analysis import plan

    if experiment.design is not None:
        from spikeloop.experiments.design import plan as design_plan

        return design_plan.lines(experiment)
    return plan.lines(experiment, cpus=fit.local_resources(experiment)["CPU"])


def _shape(obs) -> str:
    if isinstance(obs, dict):
        return "{" + ", ".join(f"{k}: {getattr(v, 'shape', '?')}" for k, v in obs.items()) + "}"
    return str(getattr(obs, "shape", type(obs).__name__))


def _bridge_config(experiment: Experiment, dev: DeviceSettings) -> BridgeConfig:
    # A timeout is a finding to report, not an exception; the probe's values are in the envelope anyway.
    return replace(experiment.culture_settings().bridge_config(dev), timeout_policy="zeros", envelope_policy="clamp")


def _start_local_device(dev: DeviceSettings, envelope):
    """A simulated/ablation device of this process on free ports (the trainer side binds its own)."""
    from spikeloop.bridge.device.program import Device

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


@dataclass(frozen=True)
class ProbePlan:
    """What the probe sends, in order: each stimulation is "off" or "on" on every encoding electrode."""

    off_hz: float
    off_ua: float
    on_hz: float
    on_ua: float
    pattern: tuple[bool, ...]
    """True: on."""

    @property
    def varies(self) -> bool:
        """Whether on differs from off at all (else which stimulation a reply answers cannot be told)."""
        return (self.on_hz, self.on_ua) != (self.off_hz, self.off_ua) and len(set(self.pattern)) == 2

    def stimulation(self, index: int) -> tuple[list[float], list[float]]:
        """Frequencies (Hz) and amplitudes (uA) of stimulation `index` on the encoding electrodes."""
        hz, ua = (self.on_hz, self.on_ua) if self.pattern[index] else (self.off_hz, self.off_ua)
        return [hz] * N_ENCODING, [ua] * N_ENCODING

    def describe(self) -> str:
        """Exactly what is sent, for the lab's review."""
        electrodes = f"on every encoding electrode {list(ENCODING_ELECTRODES)}"
        if not self.varies:
            return (
                f"{len(self.pattern)} stimulation(s) at the envelope MINIMUM only: {self.off_hz:g} Hz, "
                f"{self.off_ua:g} uA {electrodes}"
            )
        order = "".join("1" if on else "0" for on in self.pattern)
        return (
            f"{len(self.pattern)} stimulations, off and on in a fixed pseudo-random order, {electrodes}: off = the "
            f"envelope MINIMUM {self.off_hz:g} Hz, {self.off_ua:g} uA; on = {self.on_hz:g} Hz, {self.on_ua:g} uA "
            f"(encoder range {STIM_FREQUENCY_RANGE_HZ[0]:g}-{STIM_FREQUENCY_RANGE_HZ[1]:g} Hz, "
            f"{STIM_AMPLITUDE_RANGE_UA[0]:g}-{STIM_AMPLITUDE_RANGE_UA[1]:g} uA); order (1 = on): {order}"
        )


def probe_plan(envelope: SafetyEnvelope, exchanges: int, minimum_only: bool = False) -> ProbePlan:
    """The probe for this envelope: off at its minimum; on at the modest probe level, brought inside it."""
    off_hz, off_ua = envelope.min_frequency_hz, envelope.min_amplitude_ua
    if minimum_only:
        return ProbePlan(off_hz, off_ua, off_hz, off_ua, (False,) * exchanges)
    on_hz = min(max(PROBE_ON_FREQUENCY_HZ, off_hz), envelope.max_frequency_hz)
    on_ua = min(max(PROBE_ON_AMPLITUDE_UA, off_ua), envelope.effective_max_amplitude_ua)
    pattern = [True] * (exchanges // 2) + [False] * (exchanges - exchanges // 2)
    random.Random(PATTERN_SEED).shuffle(pattern)
    return ProbePlan(off_hz, off_ua, on_hz, on_ua, tuple(pattern))


def probe_device(experiment: Experiment, dev: DeviceSettings, plan: ProbePlan) -> DeviceProbe:
    """Send the plan's stimulations and measure the replies; stops early if the device is silent."""
    device = None
    if dev.simulated:
        device, dev = _start_local_device(dev, experiment.safety)
    meter = CausalityMeter()
    try:
        with BridgeCore(_bridge_config(experiment, dev)) as bridge:
            if device is not None:
                device.spike_port = bridge.spike_port  # the device learns where replies go once we bound it
                device.start()
            status = None
            for i in range(len(plan.pattern)):
                frequencies_hz, amplitudes_ua = plan.stimulation(i)
                reply = bridge.exchange(frequencies_hz, amplitudes_ua)
                meter.observe(
                    stim_drive(frequencies_hz, amplitudes_ua), float(reply.counts.sum()) if reply.ok else None
                )
                if i == 0 and not reply.ok:
                    break  # silent: more tries would only multiply the wait
            if bridge.stats()["ok"]:
                # The device's own limits, to compare with the experiment's (a silent device is not asked).
                status = bridge.device_status(wait_s=experiment.loop.timeout_s)
            stats = bridge.stats()
    finally:
        if device is not None:
            device.stop()
    return DeviceProbe(
        device_id=dev.device_id,
        where=f"{dev.address.host}:{dev.address.stim_port} (replies to {stats['bind_host']}:{stats['spike_port']})",
        answered=stats["ok"],
        timeouts=stats["timeouts"],
        latency_ms=stats["latency_ms"],
        correlation=stats["correlation"],
        clamped=stats["clamped_commands"],
        foreign_source=stats.get("last_foreign_source"),
        reply_source=stats.get("reply_source", ""),
        exchanges=stats["exchanges"],
        received=stats["received"],
        stale=stats["stale"],
        duplicates=stats["duplicates"],
        causality=meter.snapshot() if plan.varies else None,
        device_status=status,
    )


def device_limit_lines(
    label: str, envelope: SafetyEnvelope, status: dict[str, Any] | None
) -> tuple[list[str], list[str]]:
    """(lines, failures): every `safety` key that asks for more than the device's own envelope allows."""
    if status is None:
        return [
            f"[info] {label}: did not report its limits (no device_status answer to a status_request event; "
            "spikeloop device does); compare its envelope with the experiment's safety section by hand"
        ], []
    try:
        limits = device_envelope(status)
        budget = dose_budget(status)
    except (TypeError, ValueError, KeyError) as exc:
        return [], [
            f"{label}: its device_status cannot be read ({exc}); docs/protocol.md (Device status) gives its "
            "shape: the device program answering must be fixed, or run with status_requests: false and compare "
            "its limits by hand"
        ]
    failures = []
    for key, ours in dataclasses.asdict(envelope).items():
        theirs = getattr(limits, key)
        flag = "--" + key.replace("_", "-")
        if key == "forbidden_electrodes":
            missing = sorted(theirs - ours)
            if missing:
                failures.append(
                    f"safety.forbidden_electrodes: {label} never stimulates electrode(s) {missing} (its "
                    f"--forbid-electrode), which the experiment may send to; add them to safety.forbidden_electrodes"
                )
        elif key == "phase_width_us":
            if ours != theirs:
                failures.append(
                    f"safety.phase_width_us={ours:g}: {label} stimulates with {theirs:g} us phases; set {theirs:g}"
                )
        elif key.startswith("max_") and ours > theirs:
            failures.append(
                f"safety.{key}={ours:g} asks for more than {label} allows (its {flag} is {theirs:g}); "
                f"set safety.{key} to {theirs:g} or less, or have the lab raise the device's limit"
            )
        elif key.startswith("min_") and ours < theirs:
            failures.append(
                f"safety.{key}={ours:g} is below {label}'s lowest (its {flag} is {theirs:g}): the device refuses "
                f"such commands; set safety.{key} to {theirs:g} or more"
            )
    line = (
        f"[{'ok' if not failures else 'FAIL':<4}] {label}: its own envelope is {limits.describe()}; dose budget per "
        f"electrode {budget.get('nc_per_min')} nC/min, {budget.get('nc_per_session')} nC/session (None: no limit)"
    )
    return [line], failures


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def device_envelope(status: Any) -> SafetyEnvelope:
    """The SafetyEnvelope a device_status reports (ValueError, TypeError or KeyError if it is not one).

    A device is a program of someone else's: every value is checked for its type before it is compared."""
    if not isinstance(status, dict):
        raise ValueError(f"a JSON object was expected, got {type(status).__name__}")
    if "envelope" not in status:
        raise ValueError("it has no 'envelope'")
    reported = status["envelope"]
    if not isinstance(reported, dict):
        raise ValueError(f"its 'envelope' must be a JSON object, got {type(reported).__name__}")
    fields = {f.name for f in dataclasses.fields(SafetyEnvelope)}
    unknown = set(reported) - fields
    if unknown:
        raise ValueError(f"unknown envelope keys {sorted(unknown)}")
    for key, value in reported.items():
        if key == "forbidden_electrodes":
            if not isinstance(value, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in value):
                raise ValueError(f"its envelope's forbidden_electrodes must be a list of electrodes, got {value!r}")
        elif not _is_number(value):
            raise ValueError(f"its envelope's {key} must be a number, got {value!r}")
    return SafetyEnvelope(**reported)


def dose_budget(status: dict[str, Any]) -> dict[str, Any]:
    """The dose budget a device_status reports ({} if none; ValueError if it is not a mapping of numbers)."""
    budget = status.get("dose_budget")
    if budget is None:
        return {}
    if not isinstance(budget, dict) or not all(v is None or _is_number(v) for v in budget.values()):
        raise ValueError(f"its 'dose_budget' must be a JSON object of numbers or nulls, got {budget!r}")
    return budget


# --- what the replies say: reply discipline, causality, latency ------------------------

DEVICE_RULE = (
    "A device must send exactly one reply per stimulation, carrying the spikes counted in the windows after that "
    'stimulation (artifact wait, then collection window), and nothing unasked (README, "What a device must do").'
)


def unsolicited_line(label: str, probe: DeviceProbe) -> tuple[str, str | None]:
    """(line, failure or None): replies per stimulation, and any datagram that answered none."""
    per_stim = probe.received / probe.exchanges if probe.exchanges else 0.0
    counted = f"{probe.received} datagram(s) for {probe.exchanges} stimulation(s): {per_stim:.2f} per stimulation"
    if not probe.unsolicited:
        return f"[ok]   {label}: {counted}, none unsolicited", None
    failure = (
        f"{label} sent {probe.unsolicited} datagram(s) that answer no stimulation ({counted}; "
        f"{probe.stale} answering none, {probe.duplicates} copies of answered ones). The bridge cannot tell an "
        "unasked datagram from an answer: from a device that does not echo the stimulation's timestamp it takes "
        f"whichever comes first, so actions would be decoded from spikes that answer nothing. {DEVICE_RULE}"
    )
    return f"[FAIL] {failure}", failure


def _lag(k: int) -> str:
    return "the stimulation before it" if k == 1 else f"the stimulation {k} before it"


def _r(value: float) -> str:
    return "undefined" if value != value else f"{value:+.2f}"


def causality_lines(label: str, causality: Causality, plan: ProbePlan) -> tuple[list[str], str | None]:
    """(lines, failure or None): which stimulation the counts follow, decided with every lag (spikeloop.bridge.trainer.causality)."""
    c = causality
    before = ", ".join(f"{_r(r)} with {_lag(k)}" for k, r in enumerate(c.r_lags[1:], start=1))
    measured = f"r {_r(c.r_current)} with the stimulation each reply answers, {before} ({c.n:.0f} replies)"
    if c.verdict == "late":
        k = c.late_by
        failure = (
            f"{label} answers each stimulation with the counts evoked by {_lag(k)} (p {c.p_lags[k]:.1g}): "
            f"{measured}. Training would decode every action from the culture's answer to an earlier step, with "
            f"no timeout or error to show it. {DEVICE_RULE}"
        )
        return [f"[FAIL] {failure}"], failure
    if c.verdict == "current":
        lines = [f"[ok]   {label}: replies answer their own stimulation: {measured}"]
        carried = [k for k in range(1, len(c.r_lags)) if c.p_lags[k] < ALPHA]
        if carried:
            lines.append(
                f"[warn] {label}: the counts also follow {_lag(carried[0])} (r "
                f"{_r(c.r_lags[carried[0]])}): the culture's response outlasts an exchange, or the device mixes "
                "windows"
            )
        return lines, None
    if c.verdict == "mixed":
        return [
            f"[warn] {label}: the counts follow an earlier stimulation as well as the one each reply answers, "
            f"neither clearly more: {measured}. A culture whose response outlasts an exchange does this, and so "
            "does a device that mixes windows; more --exchanges decide it"
        ], None
    if c.verdict == "constant_counts":
        return [
            f"[info] {label}: every reply counted the same spikes, so they carry no stimulus and which stimulation "
            "they answer cannot be told (expected of the zero ablation)"
        ], None
    if c.verdict == "too_few":
        return [
            f"[warn] {label}: only {c.n:.0f} replies to correlate; which stimulation they answer is not checked "
            "(--exchanges 40 or more)"
        ], None
    return [
        f"[info] {label}: the counts show no sign of the stimulation ({measured}; none significant at "
        f"{ALPHA:g}), so which one they answer cannot be told: expected of the zero and random ablations; a "
        f"culture that does not respond to {plan.on_hz:g} Hz, {plan.on_ua:g} uA cannot show it either"
    ], None


def latency_line(label: str, dev: DeviceSettings, probe: DeviceProbe) -> str | None:
    """The median latency against the configured windows (None for a device simulated as fast as possible)."""
    if dev.simulated and not dev.realtime:
        return None  # its windows are culture time: the latency is only the simulation's speed
    windows_ms = dev.artifact_wait_ms + dev.collect_window_ms
    tick_ms = 1000.0 / dev.tick_frequency_hz
    p50 = probe.latency_ms["p50"]
    configured = (
        f"latency p50 {p50:.1f} ms against the configured windows {dev.artifact_wait_ms:g} + "
        f"{dev.collect_window_ms:g} ms (a reply is due {windows_ms:g} ms after its stimulation, up to "
        f"{windows_ms + tick_ms:g} ms on a device that works in {tick_ms:g} ms ticks)"
    )
    if p50 < EARLY_REPLY_SHARE * windows_ms:
        return (
            f"[warn] {label}: {configured}: replies come sooner than the windows allow, so they cannot count the "
            "spikes after their stimulation; if the device's windows are shorter, set devices.N.artifact_wait_ms "
            "and collect_window_ms to its values"
        )
    return f"[ok]   {label}: {configured}"


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

    for line in exposure_lines(experiment):  # what listens where, beyond loopback or not
        print(line, flush=True)
    fit_line, fit_failure = check_fit(experiment)
    print(fit_line, flush=True)
    if fit_failure:
        failures.append(fit_failure)
    print(sampling_line(experiment), flush=True)
    for line in sweep_lines(experiment):
        print(line, flush=True)

    try:
        print(f"[ok]   {check_scenario(experiment)}", flush=True)
    except Exception as exc:  # any failure to load the game is a finding, reported with its cause
        failures.append(f"scenario: {exc}")
        print(f"[FAIL] scenario {experiment.env.get('scenario', '(default)')!r}: {exc}", flush=True)

    envelope = experiment.safety
    plan = probe_plan(envelope, args.exchanges, args.minimum_only)
    print(
        f"probing each device with {plan.describe()}; no feedback; one status_request event (the device's "
        f"limits); timeout "
        f"{experiment.loop.timeout_s * 1000:.0f} ms",
        flush=True,
    )
    # A simulated device is a template (one culture per env runner): probing one instance checks its backend.
    for dev in experiment.devices:
        label = f"device {dev.device_id!r} ({dev.backend})"
        t0 = time.monotonic()
        try:
            probe = probe_device(experiment, dev, plan)
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
        line = latency_line(label, dev, probe)
        if line is not None:
            print(line, flush=True)
        line, failure = unsolicited_line(label, probe)
        print(line, flush=True)
        if failure:
            failures.append(failure)
        if probe.causality is not None:
            lines, failure = causality_lines(label, probe.causality, plan)
            for line in lines:
                print(line, flush=True)
            if failure:
                failures.append(failure)
        if probe.clamped:
            print(f"[warn] {label}: the envelope clamped {probe.clamped} probe command(s)", flush=True)
        if not dev.simulated:
            print(reply_source_line(experiment, dev, probe), flush=True)
        if dev.status_requests:
            lines, limit_failures = device_limit_lines(label, envelope, probe.device_status)
        else:
            lines, limit_failures = (
                [
                    f"[info] {label}: not asked for its limits (devices.{experiment.devices.index(dev)}.status_requests: "
                    "false); compare its "
                    "envelope with the experiment's safety section by hand"
                ],
                [],
            )
        for line in lines:
            print(line, flush=True)
        for failure in limit_failures:
            print(f"[FAIL] {failure}", flush=True)
        failures.extend(limit_failures)

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
