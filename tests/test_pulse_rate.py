"""The pulse-rate ceiling across commands (bridge/device/pulse_rate.py), on the book alone.

The device-level cases (a flood through `spikeloop device` as its own process, a hypothesis command stream) are in
tests/test_device_limits.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spikeloop.bridge.device.pulse_rate import Burst, PulseBook, PulseRateRefusal

GAP_S = 1 / 200


def burst(electrode: int, start_s: float, hz: float, pulses: int) -> Burst:
    return Burst(electrode, start_s, 1.0 / hz, pulses)


def test_a_burst_faster_than_the_ceiling_is_refused() -> None:
    book = PulseBook(200.0, queues_bursts=False)
    with pytest.raises(PulseRateRefusal, match="electrode 19 every 4 ms"):
        book.plan(0.0, [burst(19, 0.0, 250.0, 3)], (), "feedback")
    assert book.plan(0.0, [burst(19, 0.0, 200.0, 3)], (), "feedback") == 0.0


def test_a_burst_restarted_at_once_waits_one_period_after_the_last_pulse() -> None:
    book = PulseBook(200.0, queues_bursts=False)
    book.deliver(0.0, [burst(8, 0.0, 40.0, 4)], ())  # pulses at 0, 25, 50, 75 ms
    # Replaced 27 ms in: the pulse at 25 ms was given, so the new burst starts at 30 ms, not 27.
    assert book.plan(0.027, [burst(8, 0.027, 40.0, 4)], (), "stimulation") == pytest.approx(0.003)
    # 31 ms in: 6 ms after that pulse, no wait.
    assert book.plan(0.031, [burst(8, 0.031, 40.0, 4)], (), "stimulation") == 0.0


def test_an_interrupt_cuts_the_running_burst() -> None:
    book = PulseBook(200.0, queues_bursts=True)
    book.deliver(0.0, [burst(23, 0.0, 40.0, 160)], ())  # four seconds of pulses
    with pytest.raises(PulseRateRefusal, match="queue it behind"):
        book.plan(0.1, [burst(23, 0.1, 40.0, 10)], (), "feedback")  # a CL1 would queue it: refused
    book.interrupt(0.1, (23,))  # the pulse at 100 ms counts as given (the safe side)
    assert book.plan(0.1, [burst(23, 0.1, 40.0, 10)], (), "feedback") == pytest.approx(GAP_S)
    assert book.busy_until_s(23) == pytest.approx(0.1)


def test_a_flood_never_pulses_an_electrode_above_the_ceiling() -> None:
    book = PulseBook(200.0, queues_bursts=False)
    pulses: list[float] = []  # every pulse given, rebuilt here from what the book accepted
    running: list[float] = []
    for i in range(2000):  # a stimulation every 0.7 ms
        at_s = i * 0.0007
        try:
            delay = book.plan(at_s, [burst(8, at_s, 40.0, 4)], (), "stimulation")
        except PulseRateRefusal:
            continue
        start = at_s + delay
        pulses.extend(t for t in running if t <= start)  # the replaced burst gave its pulses up to the new start
        running = [start + k * 0.025 for k in range(4)]
        book.deliver(start, [burst(8, start, 40.0, 4)], ())
    pulses.extend(running)
    given = sorted(set(pulses))
    assert len(given) > 100
    assert min(b - a for a, b in zip(given, given[1:])) >= GAP_S - 1e-9


@st.composite
def command_streams(draw: st.DrawFn) -> list[tuple[float, int, float, int, bool]]:
    """Commands in time order: (gap before it in s, electrode, frequency within the ceiling, pulses, interrupt first)."""
    return draw(
        st.lists(
            st.tuples(
                st.floats(0.0, 0.05),
                st.sampled_from((8, 9, 19, 23)),
                st.floats(1.0, 200.0),
                st.integers(1, 200),
                st.booleans(),
            ),
            max_size=300,
        )
    )


@settings(max_examples=200, deadline=None)
@given(stream=command_streams(), queues=st.booleans())
def test_no_command_stream_pulses_an_electrode_above_the_ceiling(stream: list, queues: bool) -> None:
    """Whatever arrives, the pulses given (rebuilt here from what the book accepted) are a period apart or more."""
    book = PulseBook(200.0, queues_bursts=queues)
    running: dict[int, list[float]] = {}
    given: dict[int, list[float]] = {}
    at_s = 0.0
    for gap_s, e, hz, pulses, interrupt_first in stream:
        at_s += gap_s
        cut = (e,) if interrupt_first else ()
        new = [burst(e, at_s, hz, pulses)]
        try:
            delay = book.plan(at_s, new, cut, "command")
        except PulseRateRefusal:
            continue
        start = at_s + delay
        # What ran there gives its pulses up to the new start (a queued burst would have been refused).
        given.setdefault(e, []).extend(t for t in running.get(e, []) if t <= start + 1e-12)
        running[e] = [start + k / hz for k in range(pulses)]
        book.deliver(start, [burst(e, start, hz, pulses)], cut)
    for e, times in running.items():
        given.setdefault(e, []).extend(times)
    for times in given.values():
        ordered = sorted(times)
        assert all(b - a >= GAP_S - 1e-9 for a, b in zip(ordered, ordered[1:]))
