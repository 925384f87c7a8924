"""Feedback stimulation: what the culture is told about rewards and game events.

Reference behaviour (the reference trainer's feedback rows and surprise
scaling; the rows' wire form: docs/protocol.md, the reference values the
README's "Differences from the reference trainer" table and bridge/wire/channels.py):

* Step feedback is either the reward's sign (`use_reward_feedback`, the
  reference default: `step_positive` / `step_negative` whenever the reward is
  not 0) or, instead, the event table (`events`, one row per game event with
  its own channels, base values, surprise gains and maximum scales, `td_sign`
  and baseline `ema_beta`). Never both.
* Episode feedback at an episode's end (`use_episode_feedback`), on the reward
  channels, by the sign of the episode return; none for a return of 0.
* Negative feedback (a negative reward or return, an event whose surprise is
  negative) is preceded by an interrupt on its channels; positive feedback is
  not, whether or not it carries the unpredictable flag.

Surprise scales each command (`surprise.enabled`). Three kinds of running
baseline of surprise magnitudes, each an EMA started at the first magnitude
(`surprise.baseline_start: first_magnitude`; `zero` starts them at 0, as the
reference trainer did) and floored at `surprise.baseline_floor`:

* step: |TD| with TD = r + gamma V(s') - V(s), beta `step_baseline_beta`
  (0.999), read before it takes this step's |TD|. Reward feedback measures the
  part of TD in the reward's direction (else |r|, with the frequency shift
  weighted by 1 / (1 + |TD|) since the TD disagrees); ratio = magnitude /
  baseline, capped at `ratio_cap`; g = 1 - exp(-ratio); frequency scale
  1 - gain g for a positive reward, 1 + gain g for a negative one (the shift at
  most 1, then clamped to `frequency_scale_range`); amplitude and pulse scales
  1 + gain g, clamped to [1, their maximum].
* event: per event, beta `ema_beta`, never below the step baseline, read
  before it takes this magnitude (`surprise.event_baseline_order:
  read_then_update`; `update_then_read` is the reference trainer's, which also
  keeps one baseline per direction of an event). The
  magnitude is the TD's part that `td_sign` names (positive: max(TD, 0);
  negative: max(-TD, 0); absolute: |TD|, its sign deciding the direction); an
  event whose magnitude is 0 sends nothing. ratio = magnitude / baseline
  (uncapped), delta = gain (1 - exp(-ratio)) per parameter with the row's own
  gains and maximum scales. With surprise scaling off an event sends its base
  values whatever the TD error (direction: its `td_sign`, or the TD's sign).
* episode: |return - V(s_0)|, beta `episode_baseline_beta` (0.9), updated
  before it is read; the scales use the raw ratio (capped, not squashed):
  frequency and pulses 1 + frequency_gain ratio, amplitude 1 + amplitude_gain
  ratio, both directions raising them (`episode_feedback_surprise_scaling`).

Every scaled amplitude is capped at `max_amplitude_ua` (2.5 uA, the top of the
encoder's range, as the reference); frequencies are whole Hz and, with
`clamp_to_encoder_range`, clamped to the encoder's 4-40 Hz (the reference
always did; off by default); pulses are whole and at least 1.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from spikeloop.bridge.wire.channels import FEEDBACK_REFERENCE, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType

TdSign = Literal["positive", "negative", "absolute"]
BaselineStart = Literal["first_magnitude", "zero"]
EventBaselineOrder = Literal["read_then_update", "update_then_read"]

EVENT_SURPRISE_REFERENCE: Mapping[str, tuple[str, tuple[float, float], tuple[float, float], tuple[float, float]]] = (
    MappingProxyType(
        {
            "enemy_kill": ("positive", (0.20, 2.5), (0.20, 1.6), (0.20, 2.5)),
            "armor_pickup": ("positive", (0.30, 2.0), (0.30, 1.4), (0.30, 2.0)),
            "took_damage": ("negative", (0.20, 2.5), (0.18, 1.7), (0.20, 2.5)),
            "ammo_waste": ("negative", (0.15, 1.8), (0.15, 1.3), (0.15, 1.8)),
        }
    )
)
"""The reference trainer's event table, surprise part: td_sign, then (gain, maximum scale) for frequency,
amplitude and pulses. Channels and base values are in spikeloop.bridge.wire.channels.FEEDBACK_REFERENCE."""

STEP_FEEDBACK_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "step_positive": "reward_positive",
        "step_negative": "reward_negative",
        "episode_positive": "episode_positive",
        "episode_negative": "episode_negative",
    }
)
"""Settings key -> the event name the command carries on the wire (as the reference trainer named them)."""


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
        """The spec's reference values for `name` (e.g. "step_reward_positive")."""
        channels, freq, amp, pulses, unpredictable = FEEDBACK_REFERENCE[name]
        return cls(tuple(channels), freq, amp, pulses, unpredictable)


@dataclass(frozen=True)
class EventFeedbackSpec(FeedbackSpec):
    """One row of the event table: base values plus the row's own surprise scaling (see the module docstring).

    Defaults are the reference trainer's per-row defaults; its four rows differ from them
    (`EventFeedbackSpec.reference`).
    """

    unpredictable: bool = True
    td_sign: TdSign = "positive"
    """Which part of the TD error this event answers: positive, negative, or absolute (both, its sign decides)."""
    frequency_gain: float = 0.9
    frequency_scale_max: float = 2.0
    amplitude_gain: float = 0.35
    amplitude_scale_max: float = 1.5
    pulse_gain: float = 0.5
    pulse_scale_max: float = 2.0
    ema_beta: float = 0.99
    """Weight of the old value in this event's running surprise baseline."""

    @classmethod
    def reference(cls, name: str) -> EventFeedbackSpec:
        """The reference trainer's row for event `name` (e.g. "enemy_kill")."""
        channels, freq, amp, pulses, unpredictable = FEEDBACK_REFERENCE[name]
        td_sign, (f_gain, f_max), (a_gain, a_max), (p_gain, p_max) = EVENT_SURPRISE_REFERENCE[name]
        return cls(
            tuple(channels),
            freq,
            amp,
            pulses,
            unpredictable,
            td_sign=td_sign,
            frequency_gain=f_gain,
            frequency_scale_max=f_max,
            amplitude_gain=a_gain,
            amplitude_scale_max=a_max,
            pulse_gain=p_gain,
            pulse_scale_max=p_max,
        )


def _reference_events() -> dict[str, EventFeedbackSpec]:
    return {name: EventFeedbackSpec.reference(name) for name in EVENT_SURPRISE_REFERENCE}


@dataclass(frozen=True)
class SurpriseSettings:
    """How the TD error scales feedback (reference values)."""

    enabled: bool = True
    step_baseline_beta: float = 0.999
    """Weight of the old value in the running |TD| baseline of step (and event) feedback."""
    episode_baseline_beta: float = 0.9
    """Weight of the old value in the running |return - V(s_0)| baseline of episode feedback."""
    baseline_floor: float = 1e-3
    """No baseline is taken as smaller than this (a surprise ratio must not divide by ~0)."""
    ratio_cap: float = 2.0
    frequency_gain: float = 0.65
    frequency_scale_range: tuple[float, float] = (0.5, 2.0)
    amplitude_gain: float = 0.35
    amplitude_scale_max: float = 1.5
    pulse_gain: float = 0.65
    pulse_scale_max: float = 2.0
    baseline_start: BaselineStart = "first_magnitude"
    """Where every baseline starts: at its first magnitude (a first surprise has ratio 1), or at 0 as the reference
    trainer's (the first step's baseline is then the floor, so its ratio is `ratio_cap`, and the step baseline needs
    about 1 / (1 - step_baseline_beta) = 1,000 steps to approach the mean |TD|: until then ratios run high)."""
    event_baseline_order: EventBaselineOrder = "read_then_update"
    """Whether an event's baseline is read before it takes this magnitude (as the step baseline is), or after
    (`update_then_read`, the reference trainer's, which keeps one baseline per direction of an event)."""


@dataclass(frozen=True)
class FeedbackSettings:
    """All feedback an experiment sends (reference defaults)."""

    enabled: bool = True
    step_positive: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("step_reward_positive"))
    step_negative: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("step_reward_negative"))
    episode_positive: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("episode_reward_positive"))
    episode_negative: FeedbackSpec = field(default_factory=lambda: FeedbackSpec.reference("episode_reward_negative"))
    events: dict[str, EventFeedbackSpec] = field(default_factory=_reference_events)
    surprise: SurpriseSettings = field(default_factory=SurpriseSettings)
    clamp_to_encoder_range: bool = False
    """The reference trainer clamped every feedback frequency to the encoder's 4-40 Hz; off by default."""
    max_amplitude_ua: float = STIM_AMPLITUDE_RANGE_UA[1]
    """No scaled feedback amplitude exceeds this (the reference capped at the encoder's 2.5 uA)."""
    interrupt_before_negative: bool = True
    """Negative feedback is preceded by an interrupt on its channels (positive feedback never is)."""
    use_reward_feedback: bool = True
    """Per-step feedback is the reward's sign (step_positive/step_negative), as the reference trainer's default;
    false sends the event table (`events`) instead."""
    use_episode_feedback: bool = True
    """Episode feedback (episode_positive/episode_negative) at each episode's end."""
    episode_feedback_surprise_scaling: bool = True
    """Scale episode feedback by its surprise (return - V(s_0)); false sends it at its base values."""
    max_datagrams_per_step: int = 2
    """Most feedback datagrams sent between two stimulations (an interrupt counts); whole commands beyond it are
    dropped, step feedback before episode feedback, and counted (`feedback_dropped`)."""


INERT_WHEN: dict[str, tuple[tuple[str, Any], ...]] = {
    "feedback.episode_feedback_surprise_scaling": (
        ("feedback.enabled", False),
        ("feedback.use_episode_feedback", False),
        ("feedback.surprise.enabled", False),
    ),
}
"""Settings that change nothing while any of the listed (setting, value) holds: `FeedbackPolicy` reads them only
past those checks (`episode_scales`, `for_episode`). A sweep runs such configurations once
(`spikeloop.experiments.sweep_repeats`). Measured as well: in an unpaced simulated sweep the scaling's on and off
wrote the same episodes byte for byte with episode feedback off, and with surprise off."""


@dataclass(frozen=True)
class SurpriseScales:
    """Multipliers applied to one feedback command, and the surprise behind them."""

    frequency: float = 1.0
    amplitude: float = 1.0
    pulses: float = 1.0
    td_error: float = 0.0
    ratio: float = 0.0


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


class RunningBaseline:
    """EMA of surprise magnitudes: value <- beta value + (1 - beta) magnitude, started at the first magnitude
    (`start="first_magnitude"`) or at 0 (`start="zero"`, the reference trainer's)."""

    def __init__(self, beta: float, floor: float, start: BaselineStart = "first_magnitude") -> None:
        self.beta = beta
        self.floor = floor
        self.value: float | None = 0.0 if start == "zero" else None

    def value_or(self, magnitude: float) -> float:
        """The baseline (floored); before any magnitude, `magnitude` itself (a first surprise has ratio 1)."""
        return max(magnitude if self.value is None else self.value, self.floor)

    def update(self, magnitude: float) -> None:
        """Fold one magnitude in."""
        self.value = magnitude if self.value is None else self.beta * self.value + (1.0 - self.beta) * magnitude


class FeedbackTelemetry:
    """What the policy built since the last `drain`: per feedback name, per step and per episode."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}

    def add(self, key: str, scales: SurpriseScales) -> None:
        """Count one use of `key` with these scales."""
        sums = self._sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((1.0, scales.frequency, scales.amplitude, scales.pulses, scales.ratio)):
            sums[i] += value

    def drain(self) -> dict[str, dict[str, float]]:
        """Per key: count and mean frequency, amplitude and pulse scales and surprise ratio; then forget them."""
        out = {
            key: {"count": n, "frequency_scale": f / n, "amplitude_scale": a / n, "pulse_scale": p / n, "ratio": r / n}
            for key, (n, f, a, p, r) in self._sums.items()
            if n
        }
        self._sums = {}
        return out


STEP_TELEMETRY = "step"
"""Telemetry key of every step's scales (1 where nothing was scaled), like culture/feedback_frequency_scale."""
EPISODE_TELEMETRY = "episode"
"""Telemetry key of each episode feedback's scales."""


def build_commands(
    spec: FeedbackSpec,
    scales: SurpriseScales,
    feedback_type: FeedbackType,
    name: str,
    settings: FeedbackSettings,
    negative: bool,
) -> list[FeedbackCommand]:
    """The datagrams for one piece of feedback: an interrupt first when it is negative."""
    freq = spec.frequency_hz * scales.frequency
    if settings.clamp_to_encoder_range:
        freq = _clamp(int(freq), *STIM_FREQUENCY_RANGE_HZ)
    commands = []
    if negative and settings.interrupt_before_negative:
        commands.append(FeedbackCommand(0, FeedbackType.INTERRUPT, spec.channels, event_name=name))
    commands.append(
        FeedbackCommand(
            0,
            feedback_type,
            spec.channels,
            frequency_hz=float(int(freq)),
            amplitude_ua=min(spec.amplitude_ua * scales.amplitude, settings.max_amplitude_ua),
            pulses=float(max(1, int(spec.pulses * scales.pulses))),
            unpredictable=spec.unpredictable,
            event_name=name,
        )
    )
    return commands


class FeedbackPolicy:
    """Turns one step's reward, events and values into feedback commands (see the module docstring)."""

    def __init__(self, settings: FeedbackSettings, gamma: float) -> None:
        self.settings = settings
        self.gamma = gamma
        s = settings.surprise
        self.step_baseline = RunningBaseline(s.step_baseline_beta, s.baseline_floor, s.baseline_start)
        self.episode_baseline = RunningBaseline(s.episode_baseline_beta, s.baseline_floor, s.baseline_start)
        self.event_baselines: dict[str, RunningBaseline] = {}
        """Per event (per event and direction with `update_then_read`), made at the event's first surprise."""
        self.telemetry = FeedbackTelemetry()

    # --- the scales -----------------------------------------------------------------------

    def reward_scales(self, reward: float, td: float, baseline: float) -> SurpriseScales:
        """Scales of step reward feedback for a non-zero reward, against the step baseline."""
        s = self.settings.surprise
        if not s.enabled:
            return SurpriseScales(td_error=td)
        along = td if reward > 0 else -td  # the part of the TD error in the reward's direction
        if along > 0:
            magnitude, weight = along, 1.0
        else:  # the TD error disagrees with the reward: the reward's size, a smaller frequency shift
            magnitude, weight = abs(reward), 1.0 / (1.0 + abs(td))
        ratio = min(magnitude / baseline, s.ratio_cap)
        g = 1.0 - math.exp(-ratio)
        shift = min(s.frequency_gain * g * weight, 1.0)
        return SurpriseScales(
            frequency=_clamp(1.0 - shift if reward > 0 else 1.0 + shift, *s.frequency_scale_range),
            amplitude=_clamp(1.0 + s.amplitude_gain * g, 1.0, s.amplitude_scale_max),
            pulses=_clamp(1.0 + s.pulse_gain * g, 1.0, s.pulse_scale_max),
            td_error=td,
            ratio=ratio,
        )

    def event_scales(
        self, name: str, spec: EventFeedbackSpec, td: float, step_baseline: float
    ) -> tuple[SurpriseScales, bool] | None:
        """(scales, negative) of one event's feedback, or None when its surprise is 0 (nothing is sent)."""
        s = self.settings.surprise
        if spec.td_sign == "positive":
            magnitude, negative = max(td, 0.0), False
        elif spec.td_sign == "negative":
            magnitude, negative = max(-td, 0.0), True
        else:
            magnitude, negative = abs(td), td < 0
        if not s.enabled:
            return SurpriseScales(td_error=td), negative  # base values, whatever the TD error
        if magnitude <= 0.0:
            return None
        reference_order = s.event_baseline_order == "update_then_read"
        key = f"{name}/{'negative' if negative else 'positive'}" if reference_order else name
        own = self.event_baselines.setdefault(key, RunningBaseline(spec.ema_beta, s.baseline_floor, s.baseline_start))
        if reference_order:
            own.update(magnitude)
        baseline = max(own.value_or(magnitude), step_baseline)
        if not reference_order:
            own.update(magnitude)
        ratio = magnitude / baseline
        squashed = 1.0 - math.exp(-ratio)
        shift = spec.frequency_gain * squashed
        return SurpriseScales(
            frequency=_clamp(
                1.0 + shift if negative else 1.0 - shift, s.frequency_scale_range[0], spec.frequency_scale_max
            ),
            amplitude=_clamp(1.0 + spec.amplitude_gain * squashed, 1.0, spec.amplitude_scale_max),
            pulses=_clamp(1.0 + spec.pulse_gain * squashed, 1.0, spec.pulse_scale_max),
            td_error=td,
            ratio=ratio,
        ), negative

    def episode_scales(self, td: float) -> SurpriseScales:
        """Scales of episode feedback for surprise `td` = return - V(s_0); updates the episode baseline first."""
        s = self.settings.surprise
        magnitude = abs(td)
        self.episode_baseline.update(magnitude)
        if not (s.enabled and self.settings.episode_feedback_surprise_scaling):
            return SurpriseScales(td_error=td)
        ratio = min(magnitude / self.episode_baseline.value_or(magnitude), s.ratio_cap)
        frequency = _clamp(1.0 + s.frequency_gain * ratio, *s.frequency_scale_range)
        return SurpriseScales(
            frequency=frequency,
            amplitude=_clamp(1.0 + s.amplitude_gain * ratio, 1.0, s.amplitude_scale_max),
            pulses=frequency,  # the reference scales episode pulses with the frequency
            td_error=td,
            ratio=ratio,
        )

    # --- the commands ---------------------------------------------------------------------

    def for_step(
        self, reward: float, events: dict[str, float], value_s: float, value_next: float, terminated: bool
    ) -> tuple[list[FeedbackCommand], SurpriseScales]:
        """Commands for step t (reward feedback or the event table), scaled by r + gamma V(s') - V(s).

        The scales returned are the reward feedback's (1 when nothing was scaled), with the step's TD error and its
        ratio to the step baseline.
        """
        td = reward + (0.0 if terminated else self.gamma * value_next) - value_s
        if not math.isfinite(td):
            scales = SurpriseScales()
            baseline = None
        else:
            baseline = self.step_baseline.value_or(abs(td))
            self.step_baseline.update(abs(td))  # after reading it, as the reference trainer
            scales = SurpriseScales(td_error=td, ratio=min(abs(td) / baseline, self.settings.surprise.ratio_cap))
        commands: list[FeedbackCommand] = []
        if self.settings.enabled and self.settings.use_reward_feedback and reward != 0:
            key = "step_positive" if reward > 0 else "step_negative"
            if baseline is not None:
                scales = self.reward_scales(reward, td, baseline)
            commands = build_commands(
                getattr(self.settings, key),
                scales,
                FeedbackType.REWARD,
                STEP_FEEDBACK_NAMES[key],
                self.settings,
                negative=reward < 0,
            )
            self.telemetry.add(STEP_FEEDBACK_NAMES[key], scales)
        elif self.settings.enabled and not self.settings.use_reward_feedback:
            for name, count in events.items():
                spec = self.settings.events.get(name)
                if spec is None or not count > 0:
                    continue
                if baseline is None:
                    found: tuple[SurpriseScales, bool] | None = (SurpriseScales(), spec.td_sign == "negative")
                else:
                    found = self.event_scales(name, spec, td, baseline)
                if found is None:
                    continue
                event_scales, negative = found
                commands += build_commands(spec, event_scales, FeedbackType.EVENT, name, self.settings, negative)
                self.telemetry.add(name, event_scales)
        self.telemetry.add(STEP_TELEMETRY, scales)
        return commands, scales

    def for_episode(self, episode_return: float, value_s0: float) -> tuple[list[FeedbackCommand], SurpriseScales]:
        """Commands at episode end, scaled by episode return - V(s0); none for a return of 0."""
        td = episode_return - value_s0
        if episode_return == 0 or not math.isfinite(td):
            return [], SurpriseScales(td_error=td if math.isfinite(td) else 0.0)
        scales = self.episode_scales(td)
        if not (self.settings.enabled and self.settings.use_episode_feedback):
            return [], scales
        key = "episode_positive" if episode_return > 0 else "episode_negative"
        commands = build_commands(
            getattr(self.settings, key),
            scales,
            FeedbackType.REWARD,
            STEP_FEEDBACK_NAMES[key],
            self.settings,
            negative=episode_return < 0,
        )
        self.telemetry.add(key, scales)
        self.telemetry.add(EPISODE_TELEMETRY, scales)
        return commands, scales


# --- the table as a whole (spikeloop check, the schema's envelope check) -----------------------


@dataclass(frozen=True)
class FeedbackRow:
    """One row of the feedback table as a run uses it."""

    kind: Literal["step", "episode", "event"]
    key: str
    """Where it is set: "step_positive", "events.enemy_kill", ..."""
    name: str
    """The event name its commands carry on the wire."""
    spec: FeedbackSpec
    directions: tuple[bool, ...]
    """Whether its feedback is negative (interrupt first): (False,), (True,) or both for an absolute event."""
    sent: bool
    why_not: str = ""


def feedback_rows(settings: FeedbackSettings) -> list[FeedbackRow]:
    """Every row of the feedback table, with whether a run sends it and, if not, which switch says so."""
    rows: list[FeedbackRow] = []
    off = "" if settings.enabled else "feedback.enabled: false"
    for key in ("step_positive", "step_negative"):
        why = off or ("" if settings.use_reward_feedback else "use_reward_feedback: false, the event table instead")
        rows.append(
            FeedbackRow(
                "step", key, STEP_FEEDBACK_NAMES[key], getattr(settings, key), (key == "step_negative",), not why, why
            )
        )
    for key in ("episode_positive", "episode_negative"):
        why = off or ("" if settings.use_episode_feedback else "use_episode_feedback: false")
        rows.append(
            FeedbackRow(
                "episode",
                key,
                STEP_FEEDBACK_NAMES[key],
                getattr(settings, key),
                (key == "episode_negative",),
                not why,
                why,
            )
        )
    for name, spec in settings.events.items():
        why = off or ("use_reward_feedback: true, reward feedback instead" if settings.use_reward_feedback else "")
        directions = {"positive": (False,), "negative": (True,)}.get(spec.td_sign, (False, True))
        rows.append(FeedbackRow("event", f"events.{name}", name, spec, directions, not why, why))
    return rows


def extreme_scales(settings: FeedbackSettings, row: FeedbackRow, negative: bool) -> list[SurpriseScales]:
    """The scales of a row at no surprise and at the most surprise its settings allow (they bound all others)."""
    s = settings.surprise
    unit = SurpriseScales()
    if not s.enabled or (row.kind == "episode" and not settings.episode_feedback_surprise_scaling):
        return [unit]
    if row.kind == "step":
        g = 1.0 - math.exp(-s.ratio_cap)
        shift = min(s.frequency_gain * g, 1.0)
        most = SurpriseScales(
            _clamp(1.0 + shift if negative else 1.0 - shift, *s.frequency_scale_range),
            _clamp(1.0 + s.amplitude_gain * g, 1.0, s.amplitude_scale_max),
            _clamp(1.0 + s.pulse_gain * g, 1.0, s.pulse_scale_max),
            ratio=s.ratio_cap,
        )
    elif row.kind == "episode":
        frequency = _clamp(1.0 + s.frequency_gain * s.ratio_cap, *s.frequency_scale_range)
        most = SurpriseScales(
            frequency,
            _clamp(1.0 + s.amplitude_gain * s.ratio_cap, 1.0, s.amplitude_scale_max),
            frequency,
            ratio=s.ratio_cap,
        )
    else:
        spec = row.spec
        assert isinstance(spec, EventFeedbackSpec)
        # The ratio is uncapped, so 1 - exp(-ratio) comes as close to 1 as a surprise wants.
        shift = spec.frequency_gain
        most = SurpriseScales(
            _clamp(1.0 + shift if negative else 1.0 - shift, s.frequency_scale_range[0], spec.frequency_scale_max),
            _clamp(1.0 + spec.amplitude_gain, 1.0, spec.amplitude_scale_max),
            _clamp(1.0 + spec.pulse_gain, 1.0, spec.pulse_scale_max),
            ratio=math.inf,
        )
    return [unit, most]


def row_commands(settings: FeedbackSettings, row: FeedbackRow) -> list[list[FeedbackCommand]]:
    """The commands a row can produce, at no surprise and at the most surprise, in each of its directions."""
    kind = FeedbackType.EVENT if row.kind == "event" else FeedbackType.REWARD
    return [
        build_commands(row.spec, scales, kind, row.name, settings, negative)
        for negative in row.directions
        for scales in extreme_scales(settings, row, negative)
    ]


# --- what leaves between two stimulations ---------------------------------------------------


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


def within_budget(
    step: list[FeedbackCommand], episode: list[FeedbackCommand], budget: int
) -> tuple[list[FeedbackCommand], int]:
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
