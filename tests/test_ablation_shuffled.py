"""`ablation: shuffled` through the front door: `spikeloop train` on the simulated culture, read from its step log.

Each step the decoder must have read one of the culture's own recent answers (the pool's last
`model.ablation_shuffle_pool` of them), never the answer to that step's stimulation, while the batch keeps the
real answer. With one env runner the logged episodes follow each other, so their steps in order are the order in
which the culture answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.spikeloop_cli import run_spikeloop

POOL = 16


@pytest.mark.long  # about 35 s of Ray and training; the tick-level case is in test_tick.py
def test_a_shuffled_run_decodes_the_cultures_earlier_answers(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    proc = run_spikeloop(
        [
            "train",
            "experiments/ablation.yaml",
            *("--set", "ablation=shuffled"),
            *("--set", f"model.ablation_shuffle_pool={POOL}"),
            *("--set", "stop.iterations=1"),
            *("--set", "ppo.train_batch_size_per_learner=256"),
            *("--set", "ppo.minibatch_size=64"),
            *("--set", "output.step_log=true"),
            *("--set", f"output.root_dir={root}"),
        ],
        timeout=400,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (trial_dir,) = [p.parent for p in root.glob("*/*/episodes.jsonl")]
    episodes = [json.loads(line) for line in (trial_dir / "episodes.jsonl").read_text().splitlines()]
    raw, seen = [], []
    for episode in episodes:
        with np.load(trial_dir / episode["step_log"]) as log:
            raw.append(log["raw_spikes"])
            seen.append(log["spikes"])
    raw_steps, seen_steps = np.concatenate(raw), np.concatenate(seen)
    assert len(raw_steps) >= 100, len(raw_steps)
    assert not seen_steps[0].any()  # before the culture's first answer there is nothing to draw
    own = 0
    for t in range(1, len(raw_steps)):
        pool = raw_steps[max(0, t - POOL) : t]
        assert (pool == seen_steps[t]).all(axis=1).any(), f"step {t}: the decoder read no recent answer"
        own += bool((raw_steps[t] == seen_steps[t]).all())
    assert own < 0.1 * len(raw_steps), f"{own} steps decoded their own answer"
    assert raw_steps.std(axis=0).sum() > 0  # the culture answered: the check above was not over zeros
