"""An ablation's run is the same against the `zero` backend as against a simulated culture.

`bench learning` runs `zero` and `random` against the `zero` backend (experiments/benchmarks/conditions.py,
`ABLATION_CONDITIONS`): their decoder reads zeros or the connector's Poisson noise, never the culture's counts, so
simulating a culture only costs time. This holds only while nothing the env, the learner or the feedback
reads depends on those counts; the check is one `spikeloop tune` of the `random` ablation with the device's
backend swept over `sim` and `zero`, same seed, two iterations each (the second samples with updated weights),
and the two trials' episodes.jsonl must be byte for byte the same.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from spikeloop.experiments.benchmarks.conditions import ABLATION_CONDITIONS, NO_CULTURE_DEVICE, experiment_dict
from tests.support.spikeloop_cli import run_spikeloop

SWEEP = textwrap.dedent("""\
    name: ablation-device
    seed: 0
    ablation: random
    devices:
      - {device_id: culture, backend: sim, realtime: false}
    env: {scenario: basic, frame_skip: 4}
    ppo: {train_batch_size_per_learner: 256, minibatch_size: 64}
    resources: {num_env_runners: 0}
    stop: {iterations: 2}
    checkpoint: {every_iterations: 100, keep: 1, at_end: false}
    tune:
      search_space:
        devices.0.backend: {grid: [sim, zero]}
      max_concurrent_trials: 2
      max_failures: 0
    """)


def test_the_benchmark_runs_its_ablations_without_a_culture() -> None:
    for ablation in ABLATION_CONDITIONS:
        data = experiment_dict(ablation, 3)
        assert data["ablation"] == ablation and data["devices"] == [NO_CULTURE_DEVICE]
    assert experiment_dict("sim", 3)["devices"][0]["backend"] == "sim"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_random_ablation_plays_the_same_episodes_with_or_without_a_culture(tmp_path: Path) -> None:
    config = tmp_path / "ablation-device.yaml"
    config.write_text(SWEEP)
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={tmp_path}"], timeout=840)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (run_dir,) = re.findall(r"run directory: (\S+)", proc.stdout)[-1:]
    trials = sorted(Path(run_dir).glob("*/episodes.jsonl"))
    assert len(trials) == 2, trials
    backends = [yaml.safe_load((t.parent / "experiment.yaml").read_text())["devices"][0]["backend"] for t in trials]
    assert sorted(backends) == ["sim", "zero"]
    lines = [json.loads(line) for line in trials[0].read_text().splitlines()]
    assert len(lines) >= 5 and {line["iteration"] for line in lines} == {1, 2}  # both iterations, some episodes
    assert len({line["episode_length"] for line in lines}) > 1  # different games, not one repeated
    assert sum(line["episode_feedback_commands"] for line in lines) > 0  # feedback went out in both
    assert trials[1].read_bytes() == trials[0].read_bytes()
