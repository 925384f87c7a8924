"""What every command that starts a run (and `spikeloop check`) asks of an experiment before Ray starts.

The schema's run checks (`schema.check_before_run`: output.root_dir, seeds with room) of the experiment, then
of every experiment its sweep can draw (`sweep_draws.check_drawn`: each checked as the base one, and asking Ray
for what the base one asks). Kept apart from the schema, which the drawn experiments are built with.
"""

from __future__ import annotations

from spikeloop.experiments.schema import Experiment, check_before_run
from spikeloop.experiments.sweep_draws import check_drawn


def preflight(experiment: Experiment, source: str = "experiment") -> None:
    """Refuse (ExperimentError naming the key) what the experiment or any draw of its sweep cannot run."""
    check_before_run(experiment, source)
    check_drawn(experiment, source)
