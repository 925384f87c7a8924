"""`spikeloop bench learning --jobs 2`: runs side by side give the episodes that runs one after the other give.

Through the front door: the benchmark as a subprocess, each run a child process with its own Ray session,
VizDoom and a simulated culture; the shortest budget the benchmark takes (1,000 env steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spikeloop.experiments.benchmarks import parallel
from tests.support.spikeloop_cli import spikeloop_with_sigint

pytestmark = pytest.mark.timeout(900)


def _bench(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    command = [sys.executable, "-m", "spikeloop.experiments.cli", "bench", "learning", "--env-steps", "1000"]
    done = subprocess.run(
        [*command, "--seeds", "1", "--output", str(out), *extra], env=env, capture_output=True, text=True, timeout=800
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()) | {"stderr": done.stderr}


def test_runs_side_by_side_give_the_episodes_of_runs_one_after_the_other(tmp_path):
    alone = _bench(tmp_path, "alone", "--conditions", "direct", "sim")
    side = _bench(tmp_path, "side", "--conditions", "direct", "sim", "--jobs", "2")
    for condition in ("direct", "sim"):
        a, s = alone["runs"][condition]["100"], side["runs"][condition]["100"]
        assert len(a["return"]) >= 10, f"{condition}: too few episodes to compare ({len(a['return'])})"
        for key in ("env_steps", "return", "kill"):
            assert s[key] == a[key], f"{condition}: {key} differs side by side"
    assert "--jobs 2" in side["command"]
    assert "[learning]      direct seed 100:" in side["stderr"]  # each child's progress lines name the bench


def test_a_failing_run_stops_new_ones_and_names_itself(tmp_path):
    done: list = []
    spec = {"budget": 1000, "scenario": "basic", "culture": {}, "env": None, "bench": "learning"}
    with pytest.raises(parallel.RunFailed) as failure:
        parallel.run_side_by_side(
            [("no_such_condition", 1), ("no_such_condition", 2), ("direct", 3)],
            2,
            lambda c, s: spec | {"condition": c, "seed": s},
            lambda *run: done.append(run),
        )
    message = str(failure.value)
    assert "no_such_condition seed 1" in message and "no_such_condition seed 2" in message
    assert "1 not started" in message
    assert done == []


def test_jobs_must_be_positive(capsys):
    from spikeloop.experiments.benchmarks import learning

    with pytest.raises(SystemExit):
        learning.main(["--jobs", "0"])
    assert "--jobs must be >= 1 (got 0)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stop", "sigint"),
    [("SIGINT", "default"), ("SIGTERM", "ignored")],
    ids=["ctrl-c", "sigterm-from-a-background-start"],
)
def test_a_stop_signal_ends_the_runs_side_by_side_and_leaves_no_process(tmp_path, stop, sigint):
    """SIGINT (Ctrl-C, `kill -INT`) or a scheduler's SIGTERM to the benchmark stops both children, each closing its
    run; exit 130, none left. SIGTERM works also where the benchmark was started with SIGINT ignored."""
    import re
    import signal
    import time

    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "bench.log"
    args = ["bench", "learning", "--env-steps", "100000", "--seeds", "1", "--conditions", "direct", "sim"]
    args += ["--jobs", "2", "--output", str(tmp_path / "r.json")]
    with log.open("w") as sink:
        bench = subprocess.Popen(spikeloop_with_sigint(sigint, args), env=env, stderr=sink, stdout=sink)
        try:
            deadline = time.monotonic() + 300
            training = ("direct seed 100:", "sim seed 100:")  # progress lines: both children are training
            while not all(line in log.read_text() for line in training) and time.monotonic() < deadline:
                time.sleep(1)
            children = [int(pid) for pid in re.findall(r"\(process (\d+)\)", log.read_text())]
            assert len(children) == 2, log.read_text()[-3000:]
            for pid in children:
                # A process group of its own (a terminal's Ctrl-C reaches the benchmark alone), in the benchmark's
                # session: Linux shares the cores between sessions first, and runs that were sessions of their own
                # took 1.6-1.9 times as long side by side as alone (docs/benchmarks.md, "Side by side in one session").
                assert os.getpgid(pid) == pid and os.getsid(pid) == os.getsid(bench.pid), pid
            bench.send_signal(getattr(signal, stop))
            try:
                code = bench.wait(timeout=parallel.STOP_GRACE_S + 60)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"the benchmark still ran {parallel.STOP_GRACE_S + 60:.0f} s after {stop}:\n"
                    + log.read_text()[-3000:]
                )
            assert code == 130, log.read_text()[-3000:]
        finally:
            bench.kill()
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    said = log.read_text()
    assert "no run had finished, nothing was written" in said and "interrupted" in said
    # Each child closed its run (its Ray session too) rather than being killed at the end of the grace period.
    assert said.count("stopped, not kept") == 2 and "Traceback" not in said, said[-3000:]
    assert not (tmp_path / "r.json").exists()
