"""`spikeloop bench env`: flags and the JSON it writes (speed is not asserted here)."""

from __future__ import annotations

import json

import pytest

from spikeloop.experiments.benchmarks import env as bench


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    assert exit_info.value.code == 0
    assert "--steps" in capsys.readouterr().out


def test_short_run_writes_the_result(tmp_path):
    output = tmp_path / "env.json"
    assert bench.main(["--steps", "300", "--block", "100", "--scenario", "basic", "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["env_steps_per_s"] > 0 and result["raw_steps_per_s"] > 0
    assert result["overhead_fraction"] == pytest.approx(
        1 - result["env_steps_per_s"] / result["raw_steps_per_s"], abs=1e-3
    )
    assert result["settings"]["scenario"] == "basic" and result["settings"]["frame_skip"] == 4
