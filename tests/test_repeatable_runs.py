"""An unpaced simulated run repeats bit for bit: the same episodes.jsonl byte for byte.

In the default suite: one `spikeloop tune` of two identical trials side by side (the shipped sweep's trial
shape, two iterations), one with the live view on. In the long tier: `spikeloop train` twice, as below.

The quickstart experiment as a user runs it (a `sim` culture as fast as possible, one remote env runner, the
learner updating between iterations), cut to two iterations of 256 env steps. The second run has the live view
on, which must change nothing the culture or the learner sees. Two such runs used to part within a few
episodes: the device applied feedback after the stimulation sent behind it, and a reply that missed
`loop.timeout_s` on a loaded machine made a step act on zeros (docs/architecture.md, "Unpaced simulated runs
repeat bit for bit"). The check can fail for a reason: every episode's line carries its length, reward, kills,
feedback and surprise, which follow every stimulation, spike count and update before it.
"""

from __future__ import annotations

import json
import re
import socket
import textwrap
from pathlib import Path

import pytest
import yaml

from spikeloop.bridge.device.program import Device, DeviceConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import POSITIVE_FEEDBACK_ELECTRODES
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import (
    FeedbackCommand,
    FeedbackType,
    StimCommand,
    encode_feedback,
    encode_stim,
    now_us,
)
from spikeloop.experiments.schema import load_experiment
from spikeloop.models.closed_loop.settings import UNPACED_REPLY_TIMEOUT_S, CultureSettings, DeviceSettings
from tests.support.spikeloop_cli import REPO, run_spikeloop

QUICKSTART = "experiments/quickstart.yaml"
SHORT = [
    *("--set", "stop.env_steps=null"),
    *("--set", "stop.iterations=2"),
    *("--set", "ppo.train_batch_size_per_learner=256"),
    *("--set", "ppo.minibatch_size=64"),
    *("--set", "checkpoint.every_iterations=100"),
    *("--set", "checkpoint.at_end=false"),
]
"""Two iterations of 256 env steps: the second samples with the weights the first update left."""


RAY_START_TIMEOUT = "The current node timed out during startup"
"""Ray's error when its raylet does not register within its fixed 30 s, which a crowded machine can exceed."""


def train(root: Path, *extra: str) -> Path:
    """One `spikeloop train` of the short quickstart; the trial's episodes.jsonl."""
    args = ["train", QUICKSTART, *SHORT, "--set", f"output.root_dir={root}", *extra]
    proc = run_spikeloop(args, timeout=840)
    if proc.returncode != 0 and RAY_START_TIMEOUT in proc.stderr:
        proc = run_spikeloop(args, timeout=840)  # Ray's own start-up gave up on a crowded machine: not under test
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    found = re.findall(r"run directory: (\S+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    (episodes,) = Path(found[-1]).glob("*/episodes.jsonl")
    return episodes


# Two `spikeloop train` runs: over a minute on 2 idle cores, 10 minutes on a loaded one: the long tier.
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_two_runs_of_one_seed_write_the_same_episodes(tmp_path: Path) -> None:
    first = train(tmp_path / "first")
    view_port = free_port(kind="tcp")
    second = train(tmp_path / "second", "--set", "view.enabled=true", "--set", f"view.port={view_port}")
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(lines) >= 5 and {line["iteration"] for line in lines} == {1, 2}  # both iterations, some episodes
    assert len({line["episode_length"] for line in lines}) > 1  # different games, not one repeated
    assert sum(line["episode_feedback_commands"] for line in lines) > 0  # feedback reached the culture
    assert all(line["timeouts_in_episode"] == 0 for line in lines)
    assert "wall_time" not in lines[0]  # the one clock reading a record carried
    assert second.read_bytes() == first.read_bytes()


def _sweep_of_two_identical_runs(view_port: int) -> str:
    """The shipped feedback sweep's trial (sim culture unpaced, no env runners) cut to two iterations, run twice.

    The grid: the live view off and on, which must change nothing the culture or the learner sees, and the
    episode feedback's surprise scaling off and on, which does nothing while surprise scaling is off: two of
    the four points repeat the other two, so `spikeloop tune` runs two trials, the same experiment and seed,
    side by side on a loaded machine, one with the view on.
    """
    return textwrap.dedent(f"""\
        name: repeat
        seed: 0
        devices:
          - {{device_id: sim, backend: sim, realtime: false}}
        env: {{scenario: basic, frame_skip: 4}}
        feedback: {{surprise: {{enabled: false}}}}
        ppo: {{train_batch_size_per_learner: 256, minibatch_size: 64}}
        resources: {{num_env_runners: 0}}
        stop: {{iterations: 2}}
        checkpoint: {{every_iterations: 100, keep: 1, at_end: false}}
        view: {{port: {view_port}}}
        tune:
          search_space:
            view.enabled: {{grid: [false, true]}}
            feedback.episode_feedback_surprise_scaling: {{grid: [true, false]}}
          max_concurrent_trials: 2
          max_failures: 0
        """)


@pytest.fixture(scope="module")
def identical_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run directory of that sweep and what `spikeloop tune` printed."""
    root = tmp_path_factory.mktemp("repeat")
    config = root / "repeat.yaml"
    config.write_text(_sweep_of_two_identical_runs(free_port(kind="tcp")))
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={root}"], timeout=840)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    found = re.findall(r"run directory: (\S+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    return Path(found[-1]), proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_trials_of_one_seed_side_by_side_write_the_same_episodes(identical_sweep: tuple[Path, str]) -> None:
    """The default suite's check of repeatability: one `spikeloop tune`, two identical trials, byte-identical output.

    The trials share the machine's two cores (each starves the other now and then: the reply timeouts a loaded
    machine used to cause), learn between their iterations, and one serves the live view.
    """
    run_dir, output = identical_sweep
    trials = sorted(run_dir.glob("*/episodes.jsonl"))
    assert len(trials) == 2, trials
    views = [yaml.safe_load((t.parent / "experiment.yaml").read_text())["view"]["enabled"] for t in trials]
    assert sorted(views) == [False, True]
    assert "live view of env runner" in output  # the view did serve in one of them
    lines = [json.loads(line) for line in trials[0].read_text().splitlines()]
    assert len(lines) >= 5 and {line["iteration"] for line in lines} == {1, 2}  # both iterations, some episodes
    assert len({line["episode_length"] for line in lines}) > 1  # different games, not one repeated
    assert sum(line["episode_feedback_commands"] for line in lines) > 0  # feedback reached the culture
    assert all(line["timeouts_in_episode"] == 0 for line in lines)
    assert trials[1].read_bytes() == trials[0].read_bytes()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grid_points_that_repeat_another_are_not_run_and_are_read_as_it(identical_sweep: tuple[Path, str]) -> None:
    """The scaling swept while surprise is off: listed in repeats.json, not run, analysed as its twin."""
    run_dir, output = identical_sweep
    assert "sweep: 2 of 4 configurations run; 2 repeat another exactly" in output
    repeats = json.loads((run_dir / "repeats.json").read_text())
    scaling = "feedback.episode_feedback_surprise_scaling"
    assert [(r["configuration"]["view.enabled"], r["configuration"][scaling]) for r in repeats] == [
        (False, False),
        (True, False),
    ]
    assert all(r["same_as"] == r["configuration"] | {scaling: True} for r in repeats)
    assert all("feedback.surprise.enabled is false" in r["why"] for r in repeats)
    assert re.search(r"\[sweep\] 2/2 trials ended", output), output[-3000:]

    proc = run_spikeloop(["analyze", str(run_dir)], timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "Not run: 2 grid point(s)" in proc.stdout
    result = json.loads((run_dir / "analysis.json").read_text())
    finals = {c["label"]: c["final_return"]["per_seed"] for c in result["configurations"]}
    assert len(finals) == 4 and len({json.dumps(v) for v in finals.values()}) == 1  # one experiment, four names
    # Against the baseline (view off, scaling on): one test, the other run point; each repeat is reported as
    # the comparison it repeats, outside the Holm family (which would otherwise count one test two or three times).
    rows = result["comparisons"]["final_return"]
    (tested,) = [r for r in rows if "repeat_of" not in r]
    assert len(rows) == 3 and tested["family_size"] == 1
    assert sorted(r["repeat_of"] for r in rows if "repeat_of" in r) == sorted(
        [result["baseline"], tested["configuration"]]
    )
    assert all(r["p_holm"] is None for r in rows if r.get("repeat_of") == result["baseline"])


@pytest.mark.parametrize("realtime", [False, True])
def test_an_unpaced_device_applies_the_feedback_sent_before_a_stimulation_first(tmp_path: Path, realtime: bool) -> None:
    """The race, reproduced: feedback, then a stimulation, both waiting, and a wake-up that saw only the stimulation.

    Real sockets and a real `sim` device; the wake-up is the device's own drain of its stimulation port, called
    as its serving loop does when select reported that port alone.
    """
    trainer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    trainer.bind(("127.0.0.1", 0))
    address = DeviceAddress(stim_port=0, event_port=0, feedback_port=0, spike_port=trainer.getsockname()[1])
    device = Device(DeviceConfig(address=address, realtime=realtime, seed=3))
    device.backend.open(tmp_path)
    try:
        feedback = FeedbackCommand(now_us(), FeedbackType.REWARD, POSITIVE_FEEDBACK_ELECTRODES, 20.0, 1.0, 5)
        trainer.sendto(encode_feedback(feedback), ("127.0.0.1", device.feedback_port))
        stim = StimCommand(now_us() + 1, (20.0,) * 8, (2.0,) * 8)
        trainer.sendto(encode_stim(stim), ("127.0.0.1", device.stim_port))
        device._drain(device._stim_sock)  # the wake-up that saw the stimulation port readable, not the feedback's
        assert device.counters["stim"] == 1
        # Unpaced: the feedback sent first reached the culture first. Paced: it waits for the next wake-up, when
        # it takes effect on the wall clock, as on a CL1.
        assert device.counters["feedback"] == (0 if realtime else 1)
        device._drain(device._feedback_sock)
        assert device.counters["feedback"] == 1
        assert device.counters["feedback_after_later_stim"] == 0
    finally:
        device.close()
        trainer.close()
    (recording,) = [f for f in device.recording_files() if not f.name.endswith(".events.jsonl")]
    kinds = [json.loads(line)["kind"] for line in recording.read_text().splitlines()]
    assert kinds[:2] == (["stim", "feedback"] if realtime else ["feedback", "stim"])


def test_an_unpaced_simulated_device_waits_out_a_starved_cpu() -> None:
    """The reply timeout of an unpaced simulated device, and of the others; RLlib's sample timeout stays put."""
    culture = CultureSettings(timeout_s=0.5)
    unpaced, paced = DeviceSettings(backend="sim"), DeviceSettings(backend="sim", realtime=True)
    hardware = DeviceSettings(device_id="dish", backend="cl1")
    assert unpaced.unpaced and not paced.unpaced and not hardware.unpaced
    assert culture.bridge_config(unpaced).timeout_s == UNPACED_REPLY_TIMEOUT_S
    assert culture.bridge_config(paced).timeout_s == 0.5 and culture.bridge_config(hardware).timeout_s == 0.5
    quickstart = load_experiment(REPO / QUICKSTART, [])
    # Every step waiting out loop.timeout_s's horizon (2 x 0.5 s) plus the allowance: 512 x 1.25 s.
    assert quickstart.sample_pace().timeout_s("auto") == 640


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resuming_the_finished_sweep_trains_nothing_and_says_so(identical_sweep: tuple[Path, str]) -> None:
    """`--resume` of a sweep whose trials all ended: each says it ended before, and no time left is guessed.

    (Tune restarts finished trials on a resume, and each returns at once: their near-zero durations once made
    a resumed sweep's "time left" a fraction of the truth.) Last in the module: it appends to the run's files.
    """
    run_dir, _ = identical_sweep
    episodes = {p: p.read_text() for p in run_dir.glob("*/episodes.jsonl")}
    config = run_dir.parent / "repeat.yaml"
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={run_dir.parent}", "--resume"], timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    ended = re.findall(r"\[sweep\] \d+/\d+ trials ended.*", output)
    assert len(ended) == 2 and all(line.endswith("(it had ended before this resume)") for line in ended), ended
    assert "left at this pace" not in output
    assert {p: p.read_text() for p in run_dir.glob("*/episodes.jsonl")} == episodes
