"""`spikeloop.bridge.trainer.reply_clock.ReplyClock` on stamps of known clocks: which it learns, and what a learnt one lets fit."""

from __future__ import annotations

import numpy as np
import pytest

from spikeloop.bridge.trainer.reply_clock import MIN_SAMPLES, ReplyClock

TIMEOUT_S, HORIZON_S = 0.05, 0.1
PACE_S = 0.1  # one stimulation every 100 ms, as against a CL1: 64 answers span 6.4 s, enough to see 200 ppm
T0 = 1000.0  # perf_counter seconds of the first send


def device_stamp(t_s: float, offset_s: float = -37.5, drift_ppm: float = 200.0, reply_s: float = 0.006) -> int:
    """What a device clock `offset_s` off and `drift_ppm` fast reads when it answers a stimulation sent at t_s."""
    made = t_s + reply_s
    return round((1.8e9 + made + offset_s + (made - T0) * drift_ppm * 1e-6) * 1e6)


def learnt(stamps, n: int = 64) -> ReplyClock:
    clock = ReplyClock(TIMEOUT_S, HORIZON_S)
    for i in range(n):
        t = T0 + i * PACE_S
        clock.observe(t, stamps(t, i))
    return clock


def test_an_offset_drifting_jittery_clock_is_learnt_and_names_its_own_stimulation() -> None:
    rng = np.random.default_rng(0)
    clock = learnt(lambda t, i: device_stamp(t, reply_s=0.005 + rng.uniform(0, 0.002)))
    assert clock.ready and abs(clock.describe()["drift_ppm"] - 200) < 100
    t_now = T0 + 64 * PACE_S
    reply = device_stamp(t_now, reply_s=0.006)
    assert clock.fits(reply, t_now) and clock.on_time(reply, t_now)
    # A stimulation a horizon and its margin earlier cannot have been answered by it, nor one sent after it was made.
    assert not clock.fits(reply, t_now - HORIZON_S - clock.margin_s)
    assert not clock.fits(reply, t_now + 0.02)
    # A reply held up for seconds on its way still names its own stimulation by its stamp.
    assert clock.fits(device_stamp(T0 + 10 * PACE_S), T0 + 10 * PACE_S)
    # Made later than the device usually answers: it fits, but is not on time.
    late = device_stamp(t_now, reply_s=0.006 + TIMEOUT_S)
    assert clock.fits(late, t_now) and not clock.on_time(late, t_now)


@pytest.mark.parametrize(
    "stamps",
    [
        lambda t, i: 1_000_000_000_000,  # constant
        lambda t, i: 10**15 - 1000 * i,  # backwards
        lambda t, i: device_stamp(t) // 1_000_000 * 1_000_000,  # 1 s resolution: coarser than the horizon
    ],
    ids=["constant", "backwards", "coarse-1s"],
)
def test_a_clock_that_cannot_tell_stimulations_apart_is_never_learnt(stamps) -> None:
    clock = learnt(stamps)
    assert not clock.ready and clock.margin_s == 0.0
    assert not clock.learning  # given up on after SAMPLES answers: arrival order decides
    with pytest.raises(RuntimeError, match="before the clock is ready"):
        clock.fits(stamps(T0, 0), T0)


def test_a_clock_is_learnt_from_a_few_answers_and_forgotten_on_request() -> None:
    clock = learnt(lambda t, i: device_stamp(t), n=MIN_SAMPLES)
    assert clock.ready
    clock.forget()
    assert not clock.ready and clock.describe() == {"ready": False, "samples": 0, "learning": True}
