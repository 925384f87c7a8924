"""Absolute feedback figures: what the link hands its bridge, as the safety envelope lets it out, per name."""

from __future__ import annotations

import pytest

from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.live_view.publisher import Publisher
from spikeloop.experiments.live_view.state import feedback_rows, tick_state
from spikeloop.models.closed_loop.sent_feedback import SentFeedback


def command(name: str, hz: float, ua: float, pulses: float = 30, kind=FeedbackType.REWARD) -> FeedbackCommand:
    """A feedback command on the reference's negative reward electrodes."""
    if kind == FeedbackType.INTERRUPT:
        return FeedbackCommand(0, kind, (23, 24, 26), event_name=name)
    return FeedbackCommand(0, kind, (23, 24, 26), frequency_hz=hz, amplitude_ua=ua, pulses=pulses, event_name=name)


def test_figures_are_the_ones_sent_after_the_envelope():
    envelope = SafetyEnvelope(max_frequency_hz=40.0, max_amplitude_ua=2.5, max_pulses=100)
    sent = SentFeedback(envelope, "clamp")
    sent.record(
        [command("reward_negative", 0, 0, kind=FeedbackType.INTERRUPT), command("reward_negative", 60, 2.0, 90)]
    )
    sent.record([command("reward_negative", 20, 3.0, 500), command("reward_positive", 20, 2.0)])
    sent.record([command("took_damage", 90, 0.0)])  # no amplitude: nothing stimulates, the bridge sends nothing
    drained = sent.drain()
    assert set(drained) == {"reward_negative", "reward_positive"}  # interrupts and empty commands are not feedback
    negative = drained["reward_negative"]
    assert negative["sent"] == 2
    assert negative["max_frequency_hz"] == 40.0  # 60 Hz clamped to the envelope's 40
    assert negative["mean_frequency_hz"] == pytest.approx((40 + 20) / 2)
    assert negative["max_amplitude_ua"] == pytest.approx(2.5, abs=1e-6)  # 3 uA clamped to 2.5
    assert negative["mean_amplitude_ua"] == pytest.approx((2.0 + 2.5) / 2, abs=1e-6)
    assert negative["max_pulses"] == 100
    assert drained["reward_positive"]["mean_frequency_hz"] == 20.0
    assert sent.drain() == {}  # per iteration: a drain starts again


def test_commands_the_envelope_refuses_are_not_counted():
    sent = SentFeedback(SafetyEnvelope(max_frequency_hz=40.0), "raise")
    sent.record([command("reward_negative", 60, 2.0), command("reward_positive", 20, 2.0)])
    assert set(sent.drain()) == {"reward_positive"}  # in raise mode the bridge sends no 60 Hz burst


def test_the_panel_keeps_a_name_until_it_is_sent_again():
    sent = SentFeedback(SafetyEnvelope(), "clamp")
    publisher = Publisher(runner_index=1, device_id="dish", feedback_source=sent.shown)
    assert tick_state(publisher, 0, 0)["feedback"] == []
    sent.record([command("episode_positive", 40, 2.0, 80), command("episode_positive", 30, 1.5, 60)])
    sent.drain()  # the iteration ended: the panel still shows its figures
    sent.record([command("enemy_kill", 16, 2.5, 40)])
    rows = {r["name"]: r for r in feedback_rows(publisher)}
    assert rows["episode_positive"] == {
        "name": "episode_positive",
        "sent": 2,
        "last_pulses": 60,
        "mean_frequency_hz": 35.0,
        "max_frequency_hz": 40.0,
        "mean_amplitude_ua": 1.75,
        "max_amplitude_ua": 2.0,
        "last_frequency_hz": 30.0,
        "last_amplitude_ua": 1.5,
    }
    assert rows["enemy_kill"]["sent"] == 1 and rows["enemy_kill"]["max_amplitude_ua"] == 2.5
    sent.record([command("episode_positive", 20, 1.0, 10)])  # sent again: this iteration's figures replace them
    rows = {r["name"]: r for r in tick_state(publisher, 0, 0)["feedback"]}
    assert rows["episode_positive"]["sent"] == 1 and rows["episode_positive"]["max_frequency_hz"] == 20.0
