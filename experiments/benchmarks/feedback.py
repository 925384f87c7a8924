"""`spikeloop bench feedback`: does feedback change learning through the culture, and by which path?

The learning benchmark (`experiments/benchmarks/learning.py`) with its feedback controls:
the simulated culture with dopamine-modulated STDP (feedback releases dopamine: the
positive control, feedback should matter), with plain STDP and with fixed weights
(negative controls), each with feedback on and off; and with feedback on, the
device's `feedback_settle_ms`, which keeps feedback-evoked spikes out of the
collection windows (the direct path cut); and the positive control's culture with
its weights frozen, feedback on and settled (`dopamine_frozen_on_settle`: the plastic
path against the pulses alone). Same budget, seeds and statistics; `feedback_effects`
gives each comparison paired by seed with its 95% interval and the exact tests.
Writes docs/benchmarks/feedback.json and .png; the reading goes in docs/benchmarks.md.
"""

from __future__ import annotations

from pathlib import Path

from spikeloop.experiments.benchmarks.conditions import FEEDBACK_CONDITIONS
from spikeloop.experiments.benchmarks.learning import main as learning_main

DEFAULT_OUTPUT = Path("docs/benchmarks/feedback.json")


def main(argv: list[str] | None = None) -> int:
    """Run the feedback controls of the learning benchmark and write their JSON and figure."""
    return learning_main(
        argv,
        name="feedback",
        description=__doc__,
        default_conditions=tuple(FEEDBACK_CONDITIONS),
        default_output=DEFAULT_OUTPUT,
    )
