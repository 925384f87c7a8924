"""Feedback as the device receives it: FeedbackPolicy -> per-step budget -> BridgeCore -> UDP -> loopback device.

Each test drives the feedback policy as an env runner does (step feedback queued, the budget applied, sent ahead
of the next stimulation) and reads the datagrams back from the device's feedback socket: what is checked is what
a culture would get. The reference values are bridge/wire/channels.py's (docs/protocol.md, channel map).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

import pytest

from spikeloop.bridge.device.loopback_device import LoopbackDevice
from spikeloop.bridge.trainer.core import BridgeConfig, BridgeCore
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import NEGATIVE_FEEDBACK_ELECTRODES, POSITIVE_FEEDBACK_ELECTRODES
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, decode_feedback
from spikeloop.envs.rewards import EVENTS
from spikeloop.experiments.schema import experiment_from_dict
from spikeloop.models.closed_loop.feedback import EventFeedbackSpec, FeedbackPolicy, FeedbackSettings, within_budget

INTERRUPT, EVENT, REWARD = FeedbackType.INTERRUPT, FeedbackType.EVENT, FeedbackType.REWARD
STIM = ([4.0] * 8, [1.0] * 8)  # the encoder's minimum: what is stimulated does not matter here
G1 = 1 - math.exp(-1.0)  # 1 - exp(-ratio) at ratio 1, a first surprise


class Wire:
    """One device, one bridge, one feedback policy: steps in, datagrams out."""

    def __init__(self, settings: FeedbackSettings, gamma: float = 1.0) -> None:
        self.device = LoopbackDevice()
        address = DeviceAddress(
            spike_port=0,
            stim_port=self.device.stim_port,
            feedback_port=self.device.feedback_port,
            event_port=self.device.event_port,
        )
        self.bridge = BridgeCore(BridgeConfig(address=address, timeout_s=1.0, device_reply_port="stim_port"))
        self.device.spike_port = self.bridge.spike_port
        self.device.start()
        self.settings = settings
        self.policy = FeedbackPolicy(settings, gamma)
        self.dropped = 0

    def exchange(self, step: list[FeedbackCommand], episode: list[FeedbackCommand] = ()) -> list[FeedbackCommand]:
        """Send step (and episode) feedback within the budget ahead of one stimulation; what the device got."""
        sent, dropped = within_budget(step, list(episode), self.settings.max_datagrams_per_step)
        self.dropped += dropped
        before = len(self.device.received_feedback)
        reply = self.bridge.exchange(*STIM, sent)
        assert reply.ok
        expected = self.bridge.stats()["feedback_sent"]
        deadline = time.monotonic() + 2.0
        while len(self.device.received_feedback) < expected and time.monotonic() < deadline:
            time.sleep(0.002)
        return [decode_feedback(data) for data in self.device.received_feedback[before:]]

    def step(
        self, reward: float, events: dict[str, float] | None = None, value_s: float = 0.0, value_next: float = 0.0
    ) -> list[FeedbackCommand]:
        """One game step's feedback, as the device receives it before the next stimulation."""
        commands, _ = self.policy.for_step(reward, events or {}, value_s, value_next, False)
        return self.exchange(commands)

    def episode_end(self, episode_return: float, value_s0: float = 0.0) -> list[FeedbackCommand]:
        """Episode feedback, as the device receives it."""
        commands, _ = self.policy.for_episode(episode_return, value_s0)
        return self.exchange([], commands)

    def close(self) -> None:
        """Stop the device and close the bridge."""
        self.device.stop()
        self.bridge.close()


@pytest.fixture
def wire():
    """A factory of Wires, closed after the test."""
    opened: list[Wire] = []

    def make(**settings) -> Wire:
        opened.append(Wire(FeedbackSettings(**settings)))
        return opened[-1]

    yield make
    for w in opened:
        w.close()


def kinds(datagrams: list[FeedbackCommand]) -> list[tuple[FeedbackType, str]]:
    """(type, event name) of each datagram."""
    return [(d.feedback_type, d.event_name) for d in datagrams]


def test_reward_feedback_by_default_and_the_event_table_only_when_it_is_off(wire):
    events = {"took_damage": 1, "ammo_waste": 1}
    on = wire()
    got = on.step(-10.0, events)
    assert kinds(got) == [(INTERRUPT, "reward_negative"), (REWARD, "reward_negative")]
    assert got[1].channels == NEGATIVE_FEEDBACK_ELECTRODES and got[1].unpredictable
    off = wire(use_reward_feedback=False)
    got = off.step(-10.0, events)
    # Two negative events: interrupt + event each; the 2-datagram budget lets the first whole one through.
    assert kinds(got) == [(INTERRUPT, "took_damage"), (EVENT, "took_damage")]
    assert off.dropped == 2
    assert off.step(5.0, {}) == []  # a reward alone sends nothing from the event table


def test_only_negative_feedback_is_interrupted(wire):
    w = wire(use_reward_feedback=False)
    got = w.step(100.0, {"enemy_kill": 1})  # positive, and flagged unpredictable as in the reference table
    assert kinds(got) == [(EVENT, "enemy_kill")]
    assert got[0].unpredictable
    positive = wire()
    assert kinds(positive.step(1.0)) == [(REWARD, "reward_positive")]
    assert kinds(positive.episode_end(3.0)) == [(REWARD, "episode_positive")]
    assert kinds(positive.episode_end(-3.0)) == [(INTERRUPT, "episode_negative"), (REWARD, "episode_negative")]


def test_td_sign_picks_the_part_of_the_td_error_an_event_answers(wire):
    w = wire(use_reward_feedback=False)
    assert w.step(0.0, {"took_damage": 1}, value_next=5.0) == []  # negative row, positive TD: nothing
    assert w.step(0.0, {"enemy_kill": 1}, value_s=5.0) == []  # positive row, negative TD: nothing
    absolute = {"took_damage": replace(EventFeedbackSpec.reference("took_damage"), td_sign="absolute")}
    a = wire(use_reward_feedback=False, events=absolute)
    up = a.step(0.0, {"took_damage": 1}, value_next=2.0)  # TD +2: a positive answer, frequency lowered
    assert kinds(up) == [(EVENT, "took_damage")] and up[0].frequency_hz == int(90 * (1 - 0.2 * G1))
    down = a.step(0.0, {"took_damage": 1}, value_s=2.0)  # TD -2: negative, interrupt first, frequency raised
    assert kinds(down) == [(INTERRUPT, "took_damage"), (EVENT, "took_damage")]
    assert down[1].frequency_hz == int(90 * (1 + 0.2 * G1))


def test_armor_pickup_row_reaches_the_wire_with_its_own_gains(wire):
    assert "armor_pickup" in EVENTS  # the env emits it
    w = wire(use_reward_feedback=False)
    (got,) = w.step(0.0, {"armor_pickup": 1}, value_next=3.0)  # first surprise: ratio 1
    assert (got.feedback_type, got.event_name, got.channels) == (EVENT, "armor_pickup", (39, 40, 43))
    delta = 0.3 * G1  # the row's gains: 0.3 for frequency, amplitude and pulses
    assert got.frequency_hz == int(20 * (1 - delta))
    assert got.amplitude_ua == pytest.approx(2.0 * (1 + delta), rel=1e-6)
    assert got.pulses == int(35 * (1 + delta))


def test_event_baseline_is_its_own_ema_floored_at_the_step_baseline(wire):
    w = wire(use_reward_feedback=False)
    w.step(0.0, {"enemy_kill": 1}, value_next=1.0)  # enemy_kill's baseline starts at 1, the step baseline too
    for _ in range(5):
        w.step(0.0, {}, value_next=10.0)  # the step baseline grows: 1 -> ~1.045; enemy_kill's stays at 1
    (got,) = w.step(0.0, {"enemy_kill": 1}, value_next=1.0)
    step_baseline = 1.0
    for _ in range(5):
        step_baseline = 0.999 * step_baseline + 0.001 * 10.0
    delta = 0.2 * (1 - math.exp(-1.0 / step_baseline))  # max(own 1.0, step) = the step baseline
    assert got.pulses == int(40 * (1 + delta))
    assert got.frequency_hz == int(20 * (1 - delta))


def test_step_and_episode_surprise_keep_separate_baselines(wire):
    w = wire()
    w.step(1.0)
    w.step(10.0)
    (got,) = w.step(1.0)  # baseline read before this step joins it: 0.999 * 1 + 0.001 * 10
    g = 1 - math.exp(-1.0 / 1.009)
    assert got.frequency_hz == int(20 * (1 - 0.65 * g))  # 11 Hz; one EMA of weight 0.05 would give 13
    first = w.episode_end(5.0)[-1]  # the episode baseline starts here, untouched by the steps
    assert (first.frequency_hz, first.pulses) == (int(40 * 1.65), int(80 * 1.65))  # raw ratio 1, not 1 - e^-1
    second = w.episode_end(6.0)[-1]  # baseline updated first: 0.9 * 5 + 0.1 * 6
    scale = 1 + 0.65 * 6.0 / 5.1
    assert (second.frequency_hz, second.pulses) == (int(40 * scale), int(80 * scale))
    negative = w.episode_end(-5.1)[-1]  # negative surprise raises the frequency too
    assert negative.frequency_hz > 120 and negative.channels == NEGATIVE_FEEDBACK_ELECTRODES


def test_episode_feedback_switches(wire):
    off = wire(use_episode_feedback=False)
    assert off.episode_end(5.0) == [] and off.episode_end(-5.0) == []
    assert kinds(off.step(1.0)) == [(REWARD, "reward_positive")]  # step feedback unaffected
    plain = wire(episode_feedback_surprise_scaling=False)
    for _ in range(2):
        (got,) = plain.episode_end(5.0, value_s0=-20.0)
        assert (got.channels, got.frequency_hz, got.amplitude_ua, got.pulses) == (
            POSITIVE_FEEDBACK_ELECTRODES,
            40,
            2.0,
            80,
        )
    assert kinds(wire().episode_end(0.0)) == []  # a return of 0 sends nothing


def test_scaled_amplitude_is_capped_at_2_5_ua_by_default(wire):
    w = wire(use_reward_feedback=False)
    (got,) = w.step(0.0, {"enemy_kill": 1}, value_next=1.0)  # 2.5 uA x (1 + 0.2 g): 2.82 uA uncapped
    assert got.amplitude_ua == pytest.approx(2.5)
    negative = wire()
    negative.step(-0.1)
    assert negative.step(-100.0)[-1].amplitude_ua == pytest.approx(2.5)  # 2.0 x 1.30 uncapped
    assert negative.episode_end(-10.0)[-1].amplitude_ua == pytest.approx(2.5)  # 2.0 x 1.35 uncapped
    raised = wire(use_reward_feedback=False, max_amplitude_ua=3.0)  # a setting: the envelope still applies
    (got,) = raised.step(0.0, {"enemy_kill": 1}, value_next=1.0)
    assert got.amplitude_ua == pytest.approx(2.5 * (1 + 0.2 * G1), rel=1e-6)


@pytest.mark.parametrize(
    "switches",
    [{}, {"use_reward_feedback": False}, {"use_episode_feedback": False, "episode_feedback_surprise_scaling": False}],
    ids=["reward", "events", "no-episode"],
)
def test_no_step_sends_more_than_the_budget(wire, switches):
    """A random game of rewards, events and episode ends: never more than 2 datagrams between stimulations."""
    w = wire(**switches)
    rng = random.Random(0)
    per_step = []
    for t in range(300):
        events = {name: float(rng.random() < 0.3) for name in EVENTS}
        commands, _ = w.policy.for_step(
            rng.choice([-10.0, -1.0, 0.0, 0.0, 1.0, 100.0]), events, rng.uniform(-5, 5), rng.uniform(-5, 5), False
        )
        episode = w.policy.for_episode(rng.uniform(-50, 50), rng.uniform(-5, 5))[0] if t % 30 == 29 else []
        got = w.exchange(commands, episode)
        per_step.append(len(got))
        assert all(d.amplitude_ua <= 2.5 + 1e-6 for d in got)
        negative = [i for i, d in enumerate(got) if d.feedback_type == INTERRUPT]
        assert all(got[i + 1].channels == got[i].channels for i in negative)  # each interrupt precedes its command
    assert max(per_step) == 2 and sum(per_step) > 0


def test_experiment_files_set_every_switch_and_row():
    """The YAML reaches the same settings: the switches, a row given in part keeps its reference values."""
    e = experiment_from_dict(
        {
            "feedback": {
                "use_reward_feedback": False,
                "use_episode_feedback": False,
                "episode_feedback_surprise_scaling": False,
                "max_amplitude_ua": 2.2,
                "events": {"took_damage": {"td_sign": "absolute", "ema_beta": 0.9}},
            }
        }
    )
    fb = e.feedback
    assert (fb.use_reward_feedback, fb.use_episode_feedback, fb.episode_feedback_surprise_scaling) == (False,) * 3
    row = fb.events["took_damage"]
    assert (row.td_sign, row.ema_beta, row.channels, row.frequency_hz, row.amplitude_gain) == (
        "absolute",
        0.9,
        (44, 47, 48),
        90.0,
        0.18,
    )
    assert list(fb.events) == ["took_damage"]  # the table is what the file lists
