"""Three real short runs (ablation none/zero/random, step log on), made once per session.

Read back by tests/test_analysis.py and drawn by the notebooks in tests/test_notebooks.py,
both through the `runs_root` fixture (tests/support/fixtures.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.spikeloop_cli import REPO, cli_env

ABLATIONS = ("none", "zero", "random")
SHORT_RUN_YAML = textwrap.dedent("""\
    name: analysis
    seed: 0
    devices:
      - {device_id: sim, backend: sim, realtime: false, artifact_wait_ms: 10, collect_window_ms: 20}
    env: {scenario: basic, frame_skip: 4}
    ppo: {train_batch_size_per_learner: 256, minibatch_size: 128, num_epochs: 1}
    resources: {num_env_runners: 0}
    stop: {iterations: 2}
    checkpoint: {every_iterations: 100, keep: 1, at_end: false}
    output: {step_log: true}
    """)


def short_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real runs, ablation none/zero/random (2 iterations of 256 steps each), once per session.

    Three `spikeloop train` processes at once, not one `spikeloop tune` over `ablation`: a sweep
    over the top-level ablation key fails validation (the resolved model section keeps its own).
    """
    root = tmp_path_factory.getbasetemp() / "analysis-runs"
    done = root / "done"
    if done.exists():
        return root
    root.mkdir(exist_ok=True)
    config = root / "short.yaml"
    config.write_text(SHORT_RUN_YAML)
    runs = {
        ablation: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spikeloop.experiments.cli",
                "train",
                str(config),
                "--set",
                f"output.root_dir={root}",
                "--set",
                f"ablation={ablation}",
                "--set",
                f"name=analysis-{ablation}",
            ],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for ablation in ABLATIONS
    }
    for ablation, proc in runs.items():
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{ablation}: {out[-4000:]}"
    done.write_text("ok")
    return root
