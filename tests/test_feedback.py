"""Feedback construction and surprise scaling against the spec's reference behaviour."""

from __future__ import annotations

import math

import pytest

from spikeloop.bridge.wire.channels import NEGATIVE_FEEDBACK_ELECTRODES, POSITIVE_FEEDBACK_ELECTRODES
from spikeloop.bridge.wire.protocol import FeedbackType, encode_feedback
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.models.closed_loop.feedback import (
    FeedbackPolicy,
    FeedbackSettings,
    RunningBaseline,
    SurpriseSettings,
    command_units,
    within_budget,
)


def test_first_surprise_has_ratio_one():
    _, s = FeedbackPolicy(FeedbackSettings(), gamma=0.997).for_step(2.0, {}, 0.0, 0.0, False)
    g = 1 - math.exp(-1.0)
    assert s.ratio == pytest.approx(1.0)
    assert s.frequency == pytest.approx(1 - 0.65 * g)
    assert s.amplitude == pytest.approx(1 + 0.35 * g)
    assert s.pulses == pytest.approx(1 + 0.65 * g)


def test_ratio_is_capped_and_scales_bounded():
    policy = FeedbackPolicy(FeedbackSettings(), gamma=0.997)
    policy.for_step(-0.1, {}, 0.0, 0.0, False)
    _, s = policy.for_step(-100.0, {}, 0.0, 0.0, False)  # a huge negative surprise
    g = 1 - math.exp(-2.0)
    assert s.ratio == 2.0
    assert s.frequency == pytest.approx(min(1 + 0.65 * g, 2.0))
    assert s.amplitude <= 1.5 and s.pulses <= 2.0


def test_baseline_is_an_ema_started_at_the_first_magnitude_and_floored():
    baseline = RunningBaseline(beta=0.5, floor=1e-3)
    assert baseline.value_or(4.0) == 4.0
    baseline.update(4.0)
    baseline.update(2.0)
    assert baseline.value == pytest.approx(3.0)
    baseline.update(0.0)
    baseline.update(0.0)
    baseline.update(0.0)
    baseline.update(0.0)
    assert baseline.value_or(5.0) == pytest.approx(3.0 / 16)
    assert RunningBaseline(beta=0.5, floor=1e-3).value_or(0.0) == 1e-3


def test_step_baseline_moves_with_beta_0999():
    """The reference's step baseline: read before this step's |TD| joins it, beta 0.999."""
    policy = FeedbackPolicy(FeedbackSettings(), gamma=0.997)
    policy.for_step(1.0, {}, 0.0, 0.0, False)
    policy.for_step(10.0, {}, 0.0, 0.0, False)
    _, s = policy.for_step(1.0, {}, 0.0, 0.0, False)
    assert s.ratio == pytest.approx(1.0 / (0.999 * 1.0 + 0.001 * 10.0))


def test_reward_against_the_td_error_shifts_the_frequency_less():
    """A positive reward whose TD error is negative: its size sets the surprise, 1 / (1 + |TD|) weights the shift."""
    policy = FeedbackPolicy(FeedbackSettings(), gamma=1.0)
    _, s = policy.for_step(1.0, {}, value_s=4.0, value_next=0.0, terminated=False)  # TD = -3
    g = 1 - math.exp(-1.0 / 3.0)  # magnitude |r| = 1 against the first baseline |TD| = 3
    assert s.frequency == pytest.approx(1 - 0.65 * g / 4.0)
    assert s.amplitude == pytest.approx(1 + 0.35 * g)


def test_surprise_off_gives_unit_scales():
    policy = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(enabled=False)), gamma=0.997)
    _, s = policy.for_step(5.0, {}, 0.0, 0.0, False)
    assert (s.frequency, s.amplitude, s.pulses) == (1.0, 1.0, 1.0)


def test_negative_step_feedback_is_interrupt_then_unpredictable_reward():
    policy = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(enabled=False)), gamma=0.997)
    commands, _ = policy.for_step(-5.0, {}, value_s=0.0, value_next=0.0, terminated=False)
    assert [c.feedback_type for c in commands] == [FeedbackType.INTERRUPT, FeedbackType.REWARD]
    assert commands[0].channels == NEGATIVE_FEEDBACK_ELECTRODES == commands[1].channels
    assert commands[1].unpredictable and commands[1].frequency_hz == 60 and commands[1].pulses == 90


def test_positive_step_feedback_reference_values():
    policy = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(enabled=False)), gamma=0.997)
    commands, _ = policy.for_step(1.0, {}, 0.0, 0.0, False)
    (cmd,) = commands
    assert cmd.channels == POSITIVE_FEEDBACK_ELECTRODES
    assert (cmd.frequency_hz, cmd.amplitude_ua, cmd.pulses, cmd.unpredictable) == (20, 2.0, 30, False)


def test_td_error_uses_gamma_and_terminal_flag():
    policy = FeedbackPolicy(FeedbackSettings(), gamma=0.5)
    _, scales = policy.for_step(1.0, {}, value_s=2.0, value_next=4.0, terminated=False)
    assert scales.td_error == pytest.approx(1.0 + 0.5 * 4.0 - 2.0)
    _, scales = policy.for_step(1.0, {}, value_s=2.0, value_next=4.0, terminated=True)
    assert scales.td_error == pytest.approx(-1.0)


def test_events_follow_the_table_and_unknown_events_are_ignored():
    settings = FeedbackSettings(surprise=SurpriseSettings(enabled=False), use_reward_feedback=False)
    policy = FeedbackPolicy(settings, gamma=0.997)
    commands, _ = policy.for_step(
        0.0, {"enemy_kill": 1, "armor_pickup": 1, "ammo_waste": 0, "bogus": 1}, 0.0, 0.0, False
    )
    assert [c.event_name for c in commands] == ["enemy_kill", "armor_pickup"]  # positive events: no interrupt
    assert [c.feedback_type for c in commands] == [FeedbackType.EVENT] * 2
    assert commands[0].amplitude_ua == 2.5 and commands[1].channels == (39, 40, 43)


def test_reward_feedback_or_the_event_table_never_both():
    """The reference trainer's switch: per-step reward feedback (default), or the event table instead."""
    events = {"took_damage": 1, "ammo_waste": 1}
    on = FeedbackPolicy(FeedbackSettings(), gamma=0.997)
    commands, _ = on.for_step(-15.0, events, 0.0, 0.0, False)
    assert [c.event_name for c in commands] == ["reward_negative"] * 2  # interrupt + reward, no events
    off = FeedbackPolicy(FeedbackSettings(use_reward_feedback=False), gamma=0.997)
    commands, _ = off.for_step(-15.0, events, 0.0, 0.0, False)
    assert [c.event_name for c in commands] == ["took_damage"] * 2 + ["ammo_waste"] * 2  # no reward feedback


def _named(names: str) -> list:
    """Commands by letter; a lower-case letter is an interrupt that goes with the next command."""
    from spikeloop.bridge.wire.protocol import FeedbackCommand

    return [
        FeedbackCommand(
            0, FeedbackType.INTERRUPT if n.islower() else FeedbackType.REWARD, (19,), 20, 2.0, 10, event_name=n
        )
        for n in names
    ]


def _letters(commands) -> str:
    return "".join(c.event_name for c in commands)


def test_budget_keeps_whole_commands_and_episode_feedback_first():
    assert [_letters(u) for u in command_units(_named("aAbBC"))] == ["aA", "bB", "C"]
    assert within_budget(_named("aAbB"), [], 2) == (_named("aA"), 2)  # the first whole command fits
    sent, dropped = within_budget(_named("aA"), _named("eE"), 2)
    assert (_letters(sent), dropped) == ("eE", 2)  # at an episode's end its feedback goes first
    sent, dropped = within_budget(_named("P"), _named("E"), 2)
    assert (_letters(sent), dropped) == ("PE", 0)  # both fit: sent in order, step then episode
    sent, dropped = within_budget(_named("aAP"), _named("eE"), 3)
    assert (_letters(sent), dropped) == ("PeE", 2)  # a command that no longer fits does not block a smaller one
    assert within_budget([], [], 2) == ([], 0)


def test_clamp_to_encoder_range_is_a_setting():
    off = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(enabled=False)), gamma=1.0)
    on = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(enabled=False), clamp_to_encoder_range=True), 1.0)
    assert off.for_episode(-10.0, 0.0)[0][-1].frequency_hz == 120
    assert on.for_episode(-10.0, 0.0)[0][-1].frequency_hz == 40


def test_feedback_disabled_sends_nothing_but_tracks_surprise():
    policy = FeedbackPolicy(FeedbackSettings(enabled=False), gamma=0.997)
    commands, scales = policy.for_step(-5.0, {"took_damage": 1}, 0.0, 0.0, False)
    assert commands == [] and scales.td_error == -5.0


def test_every_built_command_encodes_and_passes_the_envelope():
    policy = FeedbackPolicy(FeedbackSettings(), gamma=0.997)
    envelope = SafetyEnvelope()
    for reward, td_next in [(-5.0, 0.0), (100.0, 3.0), (-1000.0, -50.0)]:
        commands, _ = policy.for_step(reward, {"enemy_kill": 1, "took_damage": 2, "ammo_waste": 1}, 0.0, td_next, False)
        commands += policy.for_episode(reward, 0.0)[0]
        for cmd in commands:
            safe, _ = envelope.check_feedback(cmd, "clamp")
            assert safe is not None
            assert len(encode_feedback(safe)) == 120


def test_telemetry_counts_each_row_with_its_mean_scales_and_forgets_on_drain():
    policy = FeedbackPolicy(FeedbackSettings(use_reward_feedback=False), gamma=1.0)
    policy.for_step(0.0, {"enemy_kill": 1}, 0.0, 2.0, False)
    policy.for_step(0.0, {"enemy_kill": 1, "took_damage": 1}, 0.0, 2.0, False)  # took_damage: positive TD, nothing
    policy.for_episode(5.0, 0.0)
    drained = policy.telemetry.drain()
    assert drained["enemy_kill"]["count"] == 2 and "took_damage" not in drained
    assert drained["enemy_kill"]["frequency_scale"] < 1.0 < drained["enemy_kill"]["amplitude_scale"]
    assert drained["step"]["count"] == 2 and drained["episode_positive"]["count"] == 1
    assert drained["episode"]["frequency_scale"] == pytest.approx(1.65)
    assert policy.telemetry.drain() == {}


def test_reference_baselines_start_at_zero():
    """baseline_start zero (the reference's): the first step's baseline is the floor, the first episode's 0.1 x."""
    reference = FeedbackPolicy(FeedbackSettings(surprise=SurpriseSettings(baseline_start="zero")), gamma=1.0)
    own = FeedbackPolicy(FeedbackSettings(), gamma=1.0)
    _, first = reference.for_step(2.0, {}, 0.0, 0.0, False)  # |TD| 2 over the floor 1e-3: capped
    assert first.ratio == 2.0 and own.for_step(2.0, {}, 0.0, 0.0, False)[1].ratio == pytest.approx(1.0)
    _, second = reference.for_step(2.0, {}, 0.0, 0.0, False)  # read before it joins: 0.001 x 2, still capped
    assert second.ratio == 2.0 and reference.step_baseline.value == pytest.approx(0.002 * 0.999 + 0.002)
    # episode: updated first, from 0: 0.1 x 5 = 0.5, ratio 10, capped at 2 (spikeloop's start: ratio 1)
    assert reference.for_episode(5.0, 0.0)[1].frequency == pytest.approx(min(1 + 0.65 * 2.0, 2.0))
    assert own.for_episode(5.0, 0.0)[1].frequency == pytest.approx(1 + 0.65)
    assert reference.episode_baseline.value == pytest.approx(0.5)


@pytest.mark.parametrize("order", ["read_then_update", "update_then_read"])
def test_event_baseline_order_and_directions(order: str):
    """The reference's event baselines take the magnitude before they are read, one per direction of an event."""
    settings = FeedbackSettings(surprise=SurpriseSettings(event_baseline_order=order))
    policy = FeedbackPolicy(settings, gamma=1.0)
    spec = settings.events["enemy_kill"]  # ema_beta 0.99, frequency gain 0.2
    policy.event_scales("enemy_kill", spec, 1.0, step_baseline=1.0)
    scales, negative = policy.event_scales("enemy_kill", spec, 3.0, step_baseline=1.0)
    # read first: the baseline is still 1 (ratio 3); updated first: 0.99 x 1 + 0.01 x 3 = 1.02
    ratio = 3.0 if order == "read_then_update" else 3.0 / 1.02
    assert not negative and scales.ratio == pytest.approx(ratio)
    assert scales.frequency == pytest.approx(1 - 0.2 * (1 - math.exp(-ratio)))
    absolute = type(spec)(**{**spec.__dict__, "td_sign": "absolute"})
    policy.event_scales("either", absolute, 2.0, step_baseline=1e-3)
    policy.event_scales("either", absolute, -4.0, step_baseline=1e-3)
    keys = {k for k in policy.event_baselines if k.startswith("either")}
    if order == "read_then_update":
        assert keys == {"either"} and policy.event_baselines["either"].value == pytest.approx(0.99 * 2 + 0.01 * 4)
    else:
        assert keys == {"either/positive", "either/negative"}
        assert policy.event_baselines["either/negative"].value == pytest.approx(4.0)  # its own first magnitude


def test_reference_surprise_settings_are_schema_checked():
    from spikeloop.experiments.schema import ExperimentError, experiment_from_dict

    ok = experiment_from_dict(
        {"feedback": {"surprise": {"baseline_start": "zero", "event_baseline_order": "update_then_read"}}}
    )
    assert ok.feedback.surprise.baseline_start == "zero"
    for key, value in (("baseline_start", "one"), ("event_baseline_order", "sideways")):
        with pytest.raises(ExperimentError, match=rf"feedback\.surprise\.{key}"):
            experiment_from_dict({"feedback": {"surprise": {key: value}}})
