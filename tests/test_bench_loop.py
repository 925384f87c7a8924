"""`spikeloop bench loop`: one function builds a paced condition's figures, under the committed file's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench_loop import TICK10_RESULT, paced_figures

LOOP_JSON = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "loop.json"


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


def test_tick10_figures_rebuild_the_committed_keys(committed):
    tick10 = committed[TICK10_RESULT]
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
