"""Which grid points repeat another exactly (experiments/sweep_repeats.py): the shipped sweep, and the edges.

The run and the analysis through the CLI: tests/test_repeatable_runs.py (the points not run are read as their
twins) and tests/test_analysis_sweep.py (`spikeloop check`'s trial count).
"""

from __future__ import annotations

from spikeloop.experiments.schema import load_experiment
from spikeloop.experiments.sweep_repeats import grid_points, reasons, thin_grid
from spikeloop.models.closed_loop.feedback import INERT_WHEN
from tests.support.spikeloop_cli import REPO

SCALING = "feedback.episode_feedback_surprise_scaling"
EPISODE = "feedback.use_episode_feedback"
SURPRISE = "feedback.surprise.enabled"


def test_the_shipped_feedback_sweep_runs_ten_of_its_sixteen_points() -> None:
    experiment = load_experiment(REPO / "experiments" / "sweep_feedback.yaml")
    space = experiment.tune.search_space
    run, repeats = thin_grid(experiment.plain(), space)
    assert len(grid_points(space) or []) == 16 and len(run) == 10 and len(repeats) == 6
    # The scaling does something only with episode feedback and surprise both on: there both its values run.
    for r in repeats:
        point = r.configuration
        assert point[SCALING] is False and (point[EPISODE] is False or point[SURPRISE] is False)
        assert r.same_as == point | {SCALING: True} and r.same_as in run
    assert sum(p[EPISODE] and p[SURPRISE] for p in run) == 4  # 2 x 2 (reward x scaling), all run
    assert "use_episode_feedback is false" in reasons(repeats) and "surprise.enabled is false" in reasons(repeats)
    # The points run keep the grid's order (the first key varies slowest), so Tune's trial numbers follow it.
    assert run == [p for p in grid_points(space) or [] if p in run]


def test_only_settings_that_do_nothing_make_repeats() -> None:
    base = load_experiment(REPO / "experiments" / "quickstart.yaml").plain()
    # Keys without a rule, or a rule that does not hold: every point runs.
    assert thin_grid(base, {"ppo.lr": {"grid": [1e-4, 3e-4]}, SCALING: {"grid": [True, False]}})[1] == []
    # Feedback off: the scaling does nothing anywhere.
    off = base | {"feedback": base["feedback"] | {"enabled": False}}
    run, repeats = thin_grid(off, {SCALING: {"grid": [True, False]}})
    assert run == [{SCALING: True}] and [r.why for r in repeats] == [
        f"{SCALING} has no effect while feedback.enabled is false"
    ]
    # A key drawn at random: every trial differs anyway, nothing is thinned.
    assert thin_grid(off, {SCALING: {"grid": [True, False]}, "ppo.lr": {"uniform": [1e-4, 1e-3]}}) == ([], [])
    assert set(INERT_WHEN) == {SCALING}  # a new rule gets its own case above
