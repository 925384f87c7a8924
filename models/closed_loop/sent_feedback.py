"""What feedback actually reached the wire, in absolute units: Hz and uA per feedback name, after the envelope.

TensorBoard's other feedback tags are scales (how far surprise moved a row from its base values); what a lab
reads against its ethics approval is the frequency and amplitude the culture received. The link records every
command it hands its bridge (`CultureLink.send_feedback`, after the per-step budget), passed through the same
safety envelope with the same policy as the bridge does, so the figures are those of the datagrams sent.
Interrupts carry no stimulation and are left out.

Per iteration (drained in `on_sample_end`) and per feedback name (`reward_positive`, `reward_negative`, each
event, `episode_positive`, `episode_negative`): `feedback/<name>/mean_frequency_hz`, `max_frequency_hz`,
`mean_amplitude_ua`, `max_amplitude_ua` and `max_pulses`. The live view's feedback panel shows the same figures
for the iteration under way (a name keeps its last iteration's row until it is sent again).
"""

from __future__ import annotations

from types import MappingProxyType

from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType
from spikeloop.bridge.wire.safety import SafetyEnvelope, SafetyViolation

FEEDBACK_BY_NAME = "culture/feedback_by_name/"
"""Env-runner metrics prefix of the per-name feedback telemetry (run_log turns it into TensorBoard `feedback/...`)."""

MEAN_STATS = ("mean_frequency_hz", "mean_amplitude_ua")
MAX_STATS = ("max_frequency_hz", "max_amplitude_ua", "max_pulses")


class _Window:
    """Sums and maxima of one feedback name's sent commands."""

    __slots__ = ("count", "sum_hz", "max_hz", "sum_ua", "max_ua", "max_pulses", "last")

    def __init__(self) -> None:
        self.count = 0
        self.sum_hz = self.max_hz = self.sum_ua = self.max_ua = 0.0
        self.max_pulses = 0
        self.last: tuple[float, float, int] = (0.0, 0.0, 0)

    def add(self, hz: float, ua: float, pulses: int) -> None:
        self.count += 1
        self.sum_hz += hz
        self.sum_ua += ua
        self.max_hz = max(self.max_hz, hz)
        self.max_ua = max(self.max_ua, ua)
        self.max_pulses = max(self.max_pulses, pulses)
        self.last = (hz, ua, pulses)

    def stats(self) -> dict[str, float]:
        return {
            "sent": float(self.count),
            "mean_frequency_hz": self.sum_hz / self.count,
            "max_frequency_hz": self.max_hz,
            "mean_amplitude_ua": self.sum_ua / self.count,
            "max_amplitude_ua": self.max_ua,
            "max_pulses": float(self.max_pulses),
        }


class SentFeedback:
    """Per feedback name, the absolute frequency, amplitude and pulses of what was sent (after the envelope)."""

    def __init__(self, envelope: SafetyEnvelope, policy: str) -> None:
        self.envelope = envelope
        self.policy = policy
        self._window: dict[str, _Window] = {}
        self._shown: MappingProxyType[str, dict[str, float]] = MappingProxyType({})

    def record(self, commands: list[FeedbackCommand]) -> None:
        """Count the commands handed to the bridge, as the envelope lets them out (refused ones are not sent)."""
        changed = False
        for command in commands:
            if command.feedback_type == FeedbackType.INTERRUPT:
                continue
            try:
                sent, _ = self.envelope.check_feedback(command, self.policy)  # type: ignore[arg-type]
            except SafetyViolation:
                continue  # the bridge refuses it too
            if sent is None:
                continue  # nothing left to stimulate with: the bridge sends nothing
            window = self._window.setdefault(sent.event_name or "unnamed", _Window())
            window.add(float(sent.frequency_hz), float(sent.amplitude_ua), int(sent.pulses))
            changed = True
        if changed:  # one attribute store: the live view's server threads read either the old view or the new one
            shown = dict(self._shown)
            for name, window in self._window.items():
                hz, ua, pulses = window.last
                shown[name] = window.stats() | {"last_frequency_hz": hz, "last_amplitude_ua": ua, "last_pulses": pulses}
            self._shown = MappingProxyType(shown)

    def shown(self) -> MappingProxyType[str, dict[str, float]]:
        """Per name: this iteration's figures so far and the last command (the previous iteration's until sent)."""
        return self._shown

    def drain(self) -> dict[str, dict[str, float]]:
        """Per name: sent count, mean and max Hz and uA, max pulses since the last drain; then start again."""
        out = {name: window.stats() for name, window in self._window.items() if window.count}
        self._window = {}
        return out


def log_sent_feedback(metrics_logger, drained: dict[str, dict[str, float]]) -> None:
    """Log one drain: the means averaged and the maxima kept over the iteration (and over env runners).

    RLlib 2.60's mean and max statistics start empty after each reduce, i.e. each iteration (a name not sent in an
    iteration has no point there); merged over env runners, the mean is the mean of their means.
    """
    for name, stats in drained.items():
        for stat in MEAN_STATS:
            metrics_logger.log_value(f"{FEEDBACK_BY_NAME}{name}/{stat}", stats[stat], reduce="mean")
        for stat in MAX_STATS:
            metrics_logger.log_value(f"{FEEDBACK_BY_NAME}{name}/{stat}", stats[stat], reduce="max")
