"""Feedback stimulation: what the culture is told about rewards and game events.

Reference behaviour (shared/spec/cl1-wire-protocol.md, "Feedback reference
values" and "Surprise scaling"): step reward feedback on the positive or
negative channels (`use_reward_feedback`, the reference default) or, instead,
event feedback per game event, and episode feedback at the end, each scaled by
how surprising it was. Surprise is the TD error's magnitude over
a running baseline of |TD| (an EMA), capped, and squashed to g = 1 - exp(-ratio);
positive surprise lowers the frequency, negative raises it, and both raise
amplitude and pulse count. Negative feedback is preceded by an interrupt on its
channels and carries the unpredictable flag.

A device that reads one feedback datagram per hardware tick (the reference
device program does) falls behind for good if steps bring more datagrams than
it has ticks per step; at the reference 10 Hz tick and 50 + 50 ms windows a
step spans two ticks, so `max_datagrams_per_step` (2) bounds what leaves
between two stimulations (`within_budget`).

This module only *builds* commands; the bridge's safety envelope decides what
is actually sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bridge.channels import FEEDBACK_REFERENCE, STIM_FREQUENCY_RANGE_HZ
from bridge.protocol import FeedbackCommand, FeedbackType


@dataclass(frozen=True)
class FeedbackSpec:
    """One kind of feedback: where, how fast, how strong, how many pulses."""

    channels: tuple[int, ...]
    frequency_hz: float
    amplitude_ua: float
    pulses: int
    unpredictable: bool = False

    @classmethod
    def reference(cls, name: str) -> FeedbackSpec:
        """The spec's reference values for `name` (e.g. "step_reward_positive", "enemy_kill")."""
        channels, freq, amp, pulses, unpredictable = FEEDBACK_REFERENCE[name]
        return cls(tuple(channels), freq, amp, pulses, unpredictable)


def _reference_events() -> dict[str, FeedbackSpec]:
    return {name: FeedbackSpec.reference(name) for name in ("enemy_kill", "took_damage", "ammo_waste")}


@dataclass(frozen=True)
class SurpriseSettings:
    """How the TD error scales feedback (reference values)."""

    enabled: bool = True
    baseline_ema: float = 0.05
    """Weight of each new |TD| in the running baseline."""
    ratio_cap: float = 2.0
    frequency_gain: float = 0.65
    frequency_scale_range: tuple[float, float] = (0.5, 2.0)
    amplitude_gain: float = 0.35
    amplitude_scale_max: float = 1.5
    pulse_gain: float = 0.65
    pulse_scale_max: float = 2.0


@dataclass(frozen=True)
class FeedbackSettings:
    """All feedback an experiment sends (reference defaults)."""

    enabled: bool = True
    step_positive: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("step_reward_positive"))
    step_negative: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("step_reward_negative"))
    episode_positive: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("episode_reward_positive"))
    episode_negative: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("episode_reward_negative"))
    events: dict[str, FeedbackSpec] = field(default_factory=_reference_events)
    surprise: SurpriseSettings = field(default_factory=SurpriseSettings)
    clamp_to_encoder_range: bool = False
    """The reference trainer clamped every feedback frequency to the encoder's 4-40 Hz; off by default."""
    interrupt_before_negative: bool = True
    use_reward_feedback: bool = True
    """Per-step feedback is the reward's sign (step_positive/step_negative), as the reference trainer's default;
    false sends the event table (`events`) instead."""
    max_datagrams_per_step: int = 2
    """Most feedback datagrams sent between two stimulations (an interrupt counts); whole commands beyond it are
    dropped, step feedback before episode feedback, and counted (`feedback_dropped`)."""


@dataclass(frozen=True)
class SurpriseScales:
    """Multipliers applied to one feedback command."""

    frequency: float = 1.0
    amplitude: float = 1.0
    pulses: float = 1.0
    td_error: float = 0.0
    ratio: float = 0.0


class SurpriseTracker:
    """Running |TD| baseline and the scales it implies."""

    def __init__(self, settings: SurpriseSettings) -> None:
        self.settings = settings
        self.baseline: float | None = None

    def scales(self, td_error: float) -> SurpriseScales:
        """Update the baseline with `td_error` and return the feedback scales."""
        s = self.settings
        if not s.enabled or not math.isfinite(td_error):
            return SurpriseScales(td_error=td_error if math.isfinite(td_error) else 0.0)
        magnitude = abs(td_error)
        # Ratio against the baseline *before* this error, so a first surprise counts as one.
        baseline = magnitude if self.baseline is None else self.baseline
        ratio = min(magnitude / baseline, s.ratio_cap) if baseline > 1e-8 else (s.ratio_cap if magnitude > 0 else 0.0)
        self.baseline = baseline + s.baseline_ema * (magnitude - baseline)
        g = 1.0 - math.exp(-ratio)
        lo, hi = s.frequency_scale_range
        sign = -1.0 if td_error >= 0 else 1.0  # positive surprise -> lower frequency
        return SurpriseScales(
            frequency=min(max(1.0 + sign * s.frequency_gain * g, lo), hi),
            amplitude=min(1.0 + s.amplitude_gain * g, s.amplitude_scale_max),
            pulses=min(1.0 + s.pulse_gain * g, s.pulse_scale_max),
            td_error=td_error,
            ratio=ratio,
        )


def build_commands(
    spec: FeedbackSpec,
    scales: SurpriseScales,
    feedback_type: FeedbackType,
    name: str,
    settings: FeedbackSettings,
) -> list[FeedbackCommand]:
    """The datagrams for one piece of feedback: an interrupt first when it is unpredictable."""
    freq = spec.frequency_hz * scales.frequency
    if settings.clamp_to_encoder_range:
        freq = min(max(freq, STIM_FREQUENCY_RANGE_HZ[0]), STIM_FREQUENCY_RANGE_HZ[1])
    commands = []
    if spec.unpredictable and settings.interrupt_before_negative:
        commands.append(FeedbackCommand(0, FeedbackType.INTERRUPT, spec.channels, event_name=name))
    commands.append(
        FeedbackCommand(
            0,
            feedback_type,
            spec.channels,
            frequency_hz=float(int(freq)),
            amplitude_ua=spec.amplitude_ua * scales.amplitude,
            pulses=float(max(1, int(round(spec.pulses * scales.pulses)))),
            unpredictable=spec.unpredictable,
            event_name=name,
        )
    )
    return commands


class FeedbackPolicy:
    """Turns one step's reward, events and values into feedback commands."""

    def __init__(self, settings: FeedbackSettings, gamma: float) -> None:
        self.settings = settings
        self.gamma = gamma
        self.step_surprise = SurpriseTracker(settings.surprise)
        self.episode_surprise = SurpriseTracker(settings.surprise)

    def for_step(
        self, reward: float, events: dict[str, float], value_s: float, value_next: float, terminated: bool
    ) -> tuple[list[FeedbackCommand], SurpriseScales]:
        """Commands for step t (reward then events), scaled by r + gamma V(s') - V(s)."""
        td = reward + (0.0 if terminated else self.gamma * value_next) - value_s
        scales = self.step_surprise.scales(td)
        if not self.settings.enabled:
            return [], scales
        commands: list[FeedbackCommand] = []
        if self.settings.use_reward_feedback:
            if reward > 0:
                commands += build_commands(self.settings.step_positive, scales, FeedbackType.REWARD,
                                           "reward_positive", self.settings)
            elif reward < 0:
                commands += build_commands(self.settings.step_negative, scales, FeedbackType.REWARD,
                                           "reward_negative", self.settings)
            return commands, scales
        for name, count in events.items():
            spec = self.settings.events.get(name)
            if spec is not None and count > 0:
                commands += build_commands(spec, scales, FeedbackType.EVENT, name, self.settings)
        return commands, scales

    def for_episode(self, episode_return: float, value_s0: float) -> tuple[list[FeedbackCommand], SurpriseScales]:
        """Commands at episode end, scaled by episode return - V(s0)."""
        scales = self.episode_surprise.scales(episode_return - value_s0)
        if not self.settings.enabled or episode_return == 0:
            return [], scales
        spec = self.settings.episode_positive if episode_return > 0 else self.settings.episode_negative
        name = "episode_positive" if episode_return > 0 else "episode_negative"
        return build_commands(spec, scales, FeedbackType.REWARD, name, self.settings), scales


def command_units(commands: list[FeedbackCommand]) -> list[list[FeedbackCommand]]:
    """Commands grouped as they must travel: an interrupt together with the command that follows it."""
    units: list[list[FeedbackCommand]] = []
    opened = False
    for command in commands:
        if opened:
            units[-1].append(command)
        else:
            units.append([command])
        opened = command.feedback_type == FeedbackType.INTERRUPT and not opened
    return units


def within_budget(step: list[FeedbackCommand], episode: list[FeedbackCommand],
                  budget: int) -> tuple[list[FeedbackCommand], int]:
    """What leaves between two stimulations: at most `budget` datagrams, whole commands, episode feedback first.

    Returns the commands in sending order (step feedback, then episode feedback) and how many datagrams were
    dropped. Episode feedback goes first because it would interrupt a step burst on the same channels anyway.
    """
    kept: list[tuple[int, list[FeedbackCommand]]] = []
    room = budget
    ordered = list(enumerate(command_units(step)))
    episode_units = [(len(ordered) + i, unit) for i, unit in enumerate(command_units(episode))]
    for order, unit in episode_units + ordered:
        if len(unit) <= room:
            kept.append((order, unit))
            room -= len(unit)
    sent = [command for _, unit in sorted(kept, key=lambda item: item[0]) for command in unit]
    return sent, len(step) + len(episode) - len(sent)
