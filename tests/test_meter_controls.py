"""The live information meter in training, against its controls: a silent culture and the perfect channel.

One `spikeloop tune` of two trials, as a user runs it: the `zero` device (a culture that never fires) and the
`transparent` device (a perfect channel: the reply is a fixed function of the stimulation), the same seed, two
iterations of 256 env steps, the meter recomputing every 100 ticks. Read back from the trials' TensorBoard event
files: the zero culture's figures are 0 (counts that never vary carry nothing), the perfect channel's figure about
the stimulation is far above its noise and above the zero culture's.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.spikeloop_cli import run_spikeloop
from tests.support.tensorboard_events import event_scalars

pytestmark = [pytest.mark.slow, pytest.mark.long]  # a minute or more on 2 cores: the long tier

SWEEP_YAML = textwrap.dedent("""\
    name: metered
    seed: 0
    devices:
      - {device_id: culture, backend: zero}
    env: {scenario: basic, frame_skip: 4}
    ppo: {train_batch_size_per_learner: 256, minibatch_size: 128, num_epochs: 1}
    resources: {num_env_runners: 0}
    stop: {iterations: 2}
    checkpoint: {every_iterations: 100, keep: 1, at_end: false}
    meter: {window_ticks: 500, every_ticks: 100}
    tune:
      search_space:
        devices.0.backend: {grid: [zero, transparent]}
      max_concurrent_trials: 2
      max_failures: 0
    """)
VARIABLES = ("stim", "features", "action")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[float]]]:
    root = tmp_path_factory.mktemp("meter")
    config = root / "metered.yaml"
    config.write_text(SWEEP_YAML)
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={root}"], timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = Path(re.findall(r"run directory: (\S+)", proc.stdout)[-1])
    out = {}
    for path in run_dir.glob("*/experiment.yaml"):
        backend = yaml.safe_load(path.read_text())["devices"][0]["backend"]
        scalars = event_scalars(path.parent)
        out[backend] = {tag: [value for _, value in points] for tag, points in scalars.items()}
    assert set(out) == {"zero", "transparent"}, out.keys()
    return out


def test_every_figure_reaches_tensorboard_with_its_noise(figures) -> None:
    for backend, scalars in figures.items():
        for variable in VARIABLES:
            for tag in (f"culture/info_{variable}", f"culture/info_{variable}_sd"):
                assert len(scalars.get(tag, [])) == 2, (backend, tag, sorted(scalars))  # one per iteration


def test_a_silent_culture_carries_nothing_and_the_perfect_channel_carries_the_stimulation(figures) -> None:
    zero, transparent = figures["zero"], figures["transparent"]
    for variable in VARIABLES:
        assert zero[f"culture/info_{variable}"] == [0.0, 0.0], (variable, zero[f"culture/info_{variable}"])
    bits, noise = transparent["culture/info_stim"][-1], transparent["culture/info_stim_sd"][-1]
    assert bits > max(5 * noise, 0.1), (bits, noise)  # about 0.5 of the 3 bits at 500 ticks, noise under 0.01
