"""`spikeloop bench ablation`: does the decoder need the culture's spikes?

The learning benchmark (`experiments/benchmarks/learning.py`) restricted to the decoder input
set to the simulated culture's spikes (`sim`), to zeros (`zero`) and to Poisson noise
(`random`; these two need no culture: conditions.ABLATION_CONDITIONS): the same runs,
budget, statistics (one-sided exact Mann-Whitney against `zero` per seed) and figure,
written to docs/benchmarks/ablation.json.
A measurement, not a pass/fail test; the reading goes in docs/benchmarks.md.
"""

from __future__ import annotations

from pathlib import Path

from spikeloop.experiments.benchmarks.conditions import ABLATION_CONDITIONS
from spikeloop.experiments.benchmarks.learning import main as learning_main

DEFAULT_OUTPUT = Path("docs/benchmarks/ablation.json")
ABLATIONS = ("sim", *ABLATION_CONDITIONS)


def main(argv: list[str] | None = None) -> int:
    """Run the ablation conditions of the learning benchmark and write their JSON and figure."""
    return learning_main(
        argv, name="ablation", description=__doc__, default_conditions=ABLATIONS, default_output=DEFAULT_OUTPUT
    )
