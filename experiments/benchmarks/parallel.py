"""Benchmark runs side by side, each in a process of its own (`spikeloop bench learning --jobs N`).

A run's episodes depend only on its condition, seed and settings, not on what else the machine
is doing (unpaced simulated devices; `tests/test_bench_parallel.py` checks it through the CLI).
So runs side by side give what runs one after the other give, in less wall time where cores are
left: a run's env runner, device and learner mostly take turns, about one core's work, so on 2
cores two at a time save about a third (docs/benchmarks.md, "Side by side in one session").

Each child is this module run as a program on a spec file (one run: condition, seed, budget,
scenario, culture knobs, curriculum env). It starts its own local Ray session, trains the run
and writes its episodes and facts beside the spec. The parent keeps `jobs` children going and
hands each finished run to a callback, which rewrites the result file, so a stopped benchmark
keeps every finished run for `--resume`. Children run in process groups of their own: Ctrl-C (or a
SIGTERM) reaches the parent only, which stops them once, and each saves nothing partial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

POLL_S = 0.5
"""How often the parent looks for a finished child."""
STOP_GRACE_S = 60.0
"""How long a stopped child may take to close its run before it is killed."""

RunDone = Callable[[str, int, list, dict[str, Any]], None]
"""on_done(condition, seed, episodes, facts)."""


class RunFailed(RuntimeError):
    """One or more runs ended with an error; the finished runs were handed on."""


def _start(spec: dict[str, Any], folder: Path) -> tuple[subprocess.Popen, Path]:
    """The child training one run, and the file it will write."""
    spec_path = folder / f"{spec['condition']}-{spec['seed']}.spec.json"
    spec_path.write_text(json.dumps(spec))
    # A process group of its own: a Ctrl-C at the terminal reaches the parent, which stops each child once. Not a
    # session of its own: Linux shares the cores out between sessions first, so two children would each get one core
    # for a learner with a torch thread per core, whose threads then wait on each other at every step (an update
    # took 7 times as long; docs/benchmarks.md, "Side by side in one session"). Fewer threads would change the learner's
    # arithmetic, and with it every episode.
    child = subprocess.Popen(
        [sys.executable, "-m", "spikeloop.experiments.benchmarks.parallel", str(spec_path)], process_group=0
    )
    return child, _result_path(spec_path)


def _result_path(spec_path: Path) -> Path:
    return spec_path.with_name(spec_path.name.replace(".spec.json", ".run.json"))


def _stop(children: Sequence[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_side_by_side(
    todo: Sequence[tuple[str, int]],
    jobs: int,
    spec: Callable[[str, int], dict[str, Any]],
    on_done: RunDone,
    label: str = "learning",
) -> None:
    """Train every (condition, seed) of `todo`, `jobs` at a time in that order, calling `on_done` as each ends."""
    from spikeloop.experiments.stop_signals import sigterm_as_ctrl_c

    pending = list(todo)
    running: dict[tuple[str, int], tuple[subprocess.Popen, Path]] = {}
    failed: list[str] = []
    started = 0
    with tempfile.TemporaryDirectory(prefix=f"spikeloop-bench-{label}-") as tmp, sigterm_as_ctrl_c():
        folder = Path(tmp)
        try:
            while pending or running:
                while pending and not failed and len(running) < jobs:
                    condition, seed = pending.pop(0)
                    started += 1
                    child, out = _start(spec(condition, seed), folder)
                    running[(condition, seed)] = child, out
                    print(
                        f"[{label}] run {started}/{len(todo)}: {condition} seed {seed} (process {child.pid})",
                        file=sys.stderr,
                        flush=True,
                    )
                if failed and not running:
                    break
                time.sleep(POLL_S)
                for (condition, seed), (child, out) in list(running.items()):
                    code = child.poll()
                    if code is None:
                        continue
                    del running[(condition, seed)]
                    if code != 0 or not out.is_file():
                        failed.append(f"{condition} seed {seed} (exit {code})")
                        continue
                    run = json.loads(out.read_text())
                    on_done(condition, seed, [tuple(e) for e in run["episodes"]], run["facts"])
        except BaseException:
            _stop([child for child, _ in running.values()])
            raise
    if failed:
        left = f"; {len(pending)} not started" if pending else ""
        raise RunFailed(f"run(s) failed: {', '.join(failed)} (each child's error is printed above){left}")


def _child(spec_path: Path) -> int:
    """Train the one run a spec file names and write its episodes and facts beside it."""
    from spikeloop.experiments.benchmarks.one_run import train_run
    from spikeloop.experiments.ray_session import private_ray

    spec = json.loads(spec_path.read_text())
    # The parent stops a child with SIGINT. A benchmark started in the background by a script inherits SIGINT
    # ignored, and so would its children, which the parent could then only kill: Ray left to itself, no line said.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with private_ray():
            episodes, facts = train_run(
                spec["condition"],
                spec["seed"],
                spec["budget"],
                spec["scenario"],
                spec["culture"],
                spec["env"],
                spec["bench"],
                spec.get("ppo"),
                model=spec.get("model"),
            )
    except KeyboardInterrupt:  # the parent stopped it: one line, not a traceback from inside Ray
        print(f"[bench] {spec['condition']} seed {spec['seed']}: stopped, not kept", file=sys.stderr, flush=True)
        return 130
    out = _result_path(spec_path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"episodes": episodes, "facts": facts}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
