"""Every broken experiment file is refused by `spikeloop check` and `spikeloop train`, before Ray starts.

The corpus is tests/broken_experiments/: each file's first line says what the refusal
must name (`# expect: KEY.PATH`, or `# fit: KEY` for a valid file no local Ray could
schedule). Each file goes through both commands, each in a process of its own
(tests/support/cli_batch.py forks them from one interpreter, with a tripwire on `ray.init`):
a non-zero exit, the key in the message, no traceback, Ray never started. A few also
run through a plain `python -m spikeloop.experiments.cli` subprocess, as a user runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spikeloop_cli import REPO, run_spikeloop

BROKEN = sorted((Path(__file__).parent / "broken_experiments").glob("*.yaml"))
COMMANDS = ("check", "train")
QUICKSTART = "experiments/quickstart.yaml"
BAD_OVERRIDES = {
    # --set on a valid file: (override, the key path the refusal must name)
    "device_id_slash": ("devices.0.device_id=../../tmp/x", "devices.0.device_id"),
    "spike_port_is_stim_port": ("devices.0.spike_port=12345", "devices.0.spike_port"),
    "scenario_system_file": ("env.scenario=../../../../../../etc/passwd", "env.scenario"),
    "root_dir_a_file": ("output.root_dir=/etc/passwd", "output.root_dir"),
    "batch_1e20": ("ppo.train_batch_size_per_learner=100000000000000000000", "ppo.train_batch_size_per_learner"),
    "nested_5000": ("env.reward_settings=" + "[" * 5000 + "]" * 5000, "env.reward_settings"),
    "deep_key": (".".join(["env"] * 5000) + "=1", "--set env.env.env"),
}


def _expected(path: Path) -> str:
    first = path.read_bytes().split(b"\n")[0].decode("ascii")
    return first.split(": ", 1)[1].strip()


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict[tuple[str, str], dict]:
    jobs = [
        [command, str(path), *(["--exchanges", "2"] if command == "check" else [])]
        for path in BROKEN
        for command in COMMANDS
    ] + [
        [command, QUICKSTART, "--set", override, *(["--exchanges", "2"] if command == "check" else [])]
        for override, _ in BAD_OVERRIDES.values()
        for command in COMMANDS
    ]
    jobs_file = tmp_path_factory.mktemp("cli") / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.cli_batch", str(jobs_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        (r["argv"][0], r["argv"][3] if r["argv"][2:3] == ["--set"] else Path(r["argv"][1]).name): r for r in results
    }


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_file_is_refused_with_a_message_before_ray_starts(batch, command, path):
    result = batch[(command, path.name)]
    output = result["stdout"] + result["stderr"]
    assert result["code"] != 99 and "RAY STARTED" not in output, f"Ray was started:\n{output[-3000:]}"
    assert result["code"] != 0, f"{command} accepted {path.name}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    expected = _expected(path)
    assert expected in output, f"{command} {path.name}: the message does not name {expected!r}:\n{output[-3000:]}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", sorted(BAD_OVERRIDES))
def test_a_bad_override_is_refused_with_its_key_before_ray_starts(batch, command, name):
    override, key = BAD_OVERRIDES[name]
    result = batch[(command, override)]
    output = result["stdout"] + result["stderr"]
    assert result["code"] not in (0, 99) and "RAY STARTED" not in output, output[-3000:]
    assert "Traceback" not in output and "RecursionError" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if key in line]
    assert lines and all(len(line) < 1000 for line in lines), (
        f"--set {override[:60]}: no line names {key!r}:\n{output[-3000:]}"
    )


def test_the_corpus_is_counted():
    """The figure for the closing note: files refused, times two commands."""
    print(f"\nbroken experiment files: {len(BROKEN)}, each refused by {' and '.join(COMMANDS)}")
    assert len(BROKEN) >= 45


@pytest.mark.parametrize("name", ["feedback_inf_frequency.yaml", "does_not_fit.yaml"])
@pytest.mark.parametrize("command", COMMANDS)
def test_as_a_user_runs_it(command, name):
    """The console entry point itself, in a fresh interpreter: refused, named, no traceback, no Ray."""
    path = Path(__file__).parent / "broken_experiments" / name
    result = run_spikeloop([command, str(path), *(["--exchanges", "2"] if command == "check" else [])], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 99), output[-3000:]
    assert _expected(path) in output and "Traceback" not in output, output[-3000:]
    assert "Started a local Ray instance" not in output and "ray.init" not in output
