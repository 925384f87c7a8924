"""`spikeloop bench loop`: one function builds a paced condition's figures, under the committed file's keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spikeloop.experiments.benchmarks.loop import TICK10_RESULT, meter_cost, paced_figures
from spikeloop.models.closed_loop.meter import CultureMeter, MeterSettings

LOOP_JSON = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "loop.json"
METER_JSON = LOOP_JSON.with_name("loop-meter.json")
INTEL_JSON = LOOP_JSON.with_name("loop-intel-6dd0813.json")
"""The 2026-11-24 file, on another machine, quoted beside loop.json."""
DOC = LOOP_JSON.parents[1] / "benchmarks.md"


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(LOOP_JSON.read_text())


def test_sim_paced_figures_rebuild_the_committed_keys(committed):
    figures = paced_figures(committed["paced"], committed["limit_steps_per_s"], prefix="paced_")
    assert list(figures) == [
        "paced_steps_per_s",
        "limit_steps_per_s",
        "paced_fraction_of_limit",
        "paced_steps_per_s_range",
    ]
    assert figures == {k: committed[k] for k in figures}


@pytest.mark.parametrize("path", [LOOP_JSON, INTEL_JSON], ids=["loop", "intel"])
def test_tick10_figures_rebuild_the_committed_keys(path):
    tick10 = json.loads(path.read_text())[TICK10_RESULT]
    figures = paced_figures(tick10["measured"], tick10["limit_steps_per_s"])
    assert list(figures) == ["steps_per_s", "limit_steps_per_s", "fraction_of_limit", "steps_per_s_range"]
    assert figures == {k: tick10[k] for k in figures}


def test_a_single_window_has_a_range_of_one_value():
    figures = paced_figures({"steps_per_s": 4.0}, limit=5.0)
    assert figures == {
        "steps_per_s": 4.0,
        "limit_steps_per_s": 5.0,
        "fraction_of_limit": 0.8,
        "steps_per_s_range": [4.0, 4.0],
    }


def test_the_meter_cost_is_its_cpu_time_over_the_timed_ticks_only():
    meter = CultureMeter(MeterSettings(window_ticks=100, every_ticks=100))
    rng = np.random.default_rng(0)

    def ticks(n: int) -> None:
        for _ in range(n):
            meter.observe(rng.uniform(1, 40, 16), rng.poisson(2.0, 8), rng.uniform(-1, 1, 4), int(rng.integers(3)))
            meter.update_if_due()

    ticks(50)  # the warm-up: not timed
    before = meter.cost()
    ticks(150)
    cost = meter_cost(before, meter.cost())
    assert cost["meter_ticks"] == 150 and cost["meter_updates"] == 2 and cost["meter_cpu_ms_per_tick"] > 0
    # The committed measurement's headline figures come from its conditions' own.
    measured = json.loads(METER_JSON.read_text())
    assert measured["meter_fraction_of_10hz_tick"] == measured["paced"]["meter_cpu_ms_per_tick"] / 100.0
    assert measured["meter_cpu_ms_per_tick_unpaced"] == measured["unpaced"]["meter_cpu_ms_per_tick"]


def test_the_loop_table_is_the_committed_file(committed):
    """benchmarks.md's loop table, the commits it names and the tick10 counters are loop.json's; the quoted earlier
    tick10 figure is the Intel file's."""
    flat = " ".join(DOC.read_text().split())
    section = flat.split("## loop: closed-loop steps per second")[1].split("**The live information meter's cost**")[0]
    windows = ", ".join(f"{w:.3f}" for w in committed["paced"]["steps_per_s_each"])
    assert f"**{committed['paced_steps_per_s']:.2f}** (windows {windows})" in section
    assert (
        f"| {committed['view_on_paced_steps_per_s']:.2f} | {committed['view_on_paced_fraction_of_off']:.1%} of view off"
        in section
    )
    assert f"| {committed['unpaced_steps_per_s']:.0f} ({committed['unpaced_ms_per_step']:.2f} ms/step) |" in section
    assert f"| {committed['meter_off_unpaced_steps_per_s']:.0f} | the meter on at" in section
    assert f"{committed['meter_on_unpaced_fraction_of_off']:.1%} of it" in section
    assert (
        f"| {committed['view_on_unpaced_steps_per_s']:.0f} | {committed['view_on_unpaced_fraction_of_off']:.1%} of view off"
        in section
    )
    assert f"commit {committed['git']['commit'][:7]}" in section
    tick10 = committed[TICK10_RESULT]
    each = ", ".join(f"{w:.2f}" for w in tick10["measured"]["steps_per_s_each"])
    assert f"| **{tick10['steps_per_s']:.2f}** (windows {each}) |" in section
    assert f"at commit {tick10['git']['commit'][:7]}, after the fix below" in section
    counters = tick10["device_counters"]
    assert f"({counters['stim']} stimulations and {counters['replies']} replies" in section
    assert f"{counters['feedback']} feedback datagrams, {counters['event_episode_end']} episode ends)" in section
    assert f"{tick10['fraction_of_limit']:.0%} of that device's limit" in section
    intel = json.loads(INTEL_JSON.read_text())[TICK10_RESULT]
    assert f"{intel['steps_per_s']:.2f} steps/s in every window, 100% of that device's limit" in section
