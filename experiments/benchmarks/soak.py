"""`spikeloop bench soak`: a long paced run with faults and a device restart, watched for leaks and mix-ups.

What a lab's session does over hours, in one command: `spikeloop train experiments/cl1.yaml` (a subprocess,
the front door) against a device program in its own process, `python -m spikeloop.bridge.device.loopback_device`, which
answers on 10 Hz ticks like a CL1 and injects faults at random (dropped, late, very late, duplicated, corrupt
and forged replies). Its replies encode the stimulation (count i = frequency i), and it keeps a truth record
(one JSON line per stimulation: its stamp, the stamp of its reply, the fault), so a reply the trainer matched to
the wrong stimulation shows up in the trainer's per-step log (`output.step_log`).

At half the duration the device is killed (SIGKILL), kept down past the device-loss threshold
(`loop.max_consecutive_timeouts` x `loop.timeout_s`) and started again on the same ports. With
`--on-device-loss stop` (the shipped setting) the trainer stops naming the device and the bench runs
`spikeloop train --resume`, as a lab would; each driver trains for half the duration. A policy in which the
trial recovers by itself (`wait`, where the schema knows it) needs only its entry in `RECOVERIES`.

Every `--sample-s` seconds it records the resident memory (RSS, and PSS which counts shared pages once) and the
open files and sockets of the trainer's whole process tree (the driver and Ray's processes, all descendants)
and of the device. At the end it checks the trial: misaligned replies (a reply used whose counts do not encode
its stimulation, or used where the device's record says it never answered), lost episodes (the numbering in
episodes.jsonl has a gap or a repeat across the restart and the resume), env steps, timeouts, and the outage.
The result file holds the command, the machine, start and end, the samples and a summary with pass/fail
against the targets: RSS growth under 50 MB per hour (a least-squares slope over each driver's samples after
its warm-up), 0 misaligned, 0 lost.

Stopped early (Ctrl-C, or a SIGTERM, also in a soak a script started in the background) it stops the trainer,
which saves its state, and the device, says how each exited, and leaves every log in its work dir.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, get_args

from spikeloop.bridge.device.loopback_device import PLAN_FAULTS
from spikeloop.bridge.wire.ports import DevicePorts
from spikeloop.experiments.benchmarks.record import provenance, write_result

DEFAULT_OUTPUT = Path("docs/benchmarks/soak.json")
EXPERIMENT = Path(__file__).resolve().parents[1] / "cl1.yaml"  # the shipped experiments/cl1.yaml
"""The shipped hardware experiment: the soak runs what a lab runs, pointed at the loopback device."""
DEFAULT_FAULTS = {"drop": 0.01, "late": 0.01, "very_late": 0.005, "duplicate": 0.01, "corrupt": 0.005, "foreign": 0.005}
TICK_S = 0.1  # a CL1's 10 Hz hardware loop
STOP_GRACE_S = 60.0  # a stopped trainer saves its state and tells the device before it exits
MAX_RSS_GROWTH_MB_PER_H = 50.0
MIN_FIT_SAMPLES = 3
PROGRESS = re.compile(r"\[iter (\d+)\]")
DEVICE_LOST = "stopped because a device was lost"
N_COUNTS = 8  # spike counts per reply; a stimulation is 8 frequencies then 8 amplitudes
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


# --- The recovery policy: what the bench does once the device is back -----------------------------------------


@dataclass(frozen=True)
class Recovery:
    """How a run gets past the outage under one `loop.on_device_loss` policy."""

    train_s: Callable[[float], float]
    """Each driver's training time (`stop.time_s`) for a soak of this duration."""
    trainer_stops: bool
    """The trainer exits on the loss (the bench waits for that, then resumes it)."""
    resume_args: tuple[str, ...]
    """Arguments that start the trainer again after the device is back (none: it carries on by itself)."""


RECOVERIES: dict[str, Recovery] = {
    "stop": Recovery(train_s=lambda d: d / 2, trainer_stops=True, resume_args=("--resume",)),
    "wait": Recovery(train_s=lambda d: d, trainer_stops=False, resume_args=()),
}


def known_policies() -> list[str]:
    """The policies both this bench and the experiment schema know."""
    from spikeloop.experiments.schema import LoopSection

    schema = get_args(LoopSection.model_fields["on_device_loss"].annotation)
    return [p for p in RECOVERIES if p in schema]


# --- Measuring processes (Linux /proc) ------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, int]]:
    """Every process's (parent, process group), from /proc/*/stat."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        except OSError:
            continue  # exited meanwhile
        table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def process_tree(leader: int) -> set[int]:
    """A process started as a group leader, its group and all their descendants.

    Ray's daemons under a driver leave its tree (they reparent to init) but keep its process group.
    """
    table = _process_table()
    found = {pid for pid, (_, group) in table.items() if group == leader} | {leader}
    while children := {pid for pid, (parent, _) in table.items() if parent in found} - found:
        found |= children
    return {pid for pid in found if pid in table}


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB; PSS shares pages among their users, so a tree's PSS counts them once."""
    try:
        rows = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        return int(rows["Rss"].split()[0]), int(rows["Pss"].split()[0])
    except (OSError, KeyError, ValueError):
        try:
            rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return 0, 0
        return rss_pages * PAGE_KB, rss_pages * PAGE_KB


def _descriptors(pid: int) -> tuple[int, int]:
    """(open descriptors, of which sockets) of one process."""
    files = sockets = 0
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            files += 1
            try:
                sockets += os.readlink(fd).startswith("socket:")
            except OSError:
                continue
    except OSError:
        pass
    return files, sockets


def measure_tree(pid: int | None) -> dict[str, Any] | None:
    """Memory and descriptors summed over a group leader's tree (`process_tree`; None: it is not running)."""
    if pid is None or not Path(f"/proc/{pid}").exists():
        return None
    totals = {"processes": 0, "rss_kb": 0, "pss_kb": 0, "open_files": 0, "sockets": 0}
    for p in process_tree(pid):
        rss, pss = memory_kb(p)
        files, sockets = _descriptors(p)
        totals["processes"] += 1
        totals["rss_kb"] += rss
        totals["pss_kb"] += pss
        totals["open_files"] += files
        totals["sockets"] += sockets
    return {
        "processes": totals["processes"],
        "rss_mb": round(totals["rss_kb"] / 1024, 1),
        "pss_mb": round(totals["pss_kb"] / 1024, 1),
        "open_files": totals["open_files"],
        "sockets": totals["sockets"],
    }


# --- The pure checks --------------------------------------------------------------------------------------------


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour; None with fewer than MIN_FIT_SAMPLES points."""
    if len(points) < MIN_FIT_SAMPLES:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def rss_growth(samples: list[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    """Per trainer driver (a resume starts a new one): the RSS slope while it trains, after its warm-up.

    A driver's samples count from `warmup_s` after its first iteration (Ray's start and the first build are
    not growth) until its last iteration's line (then it shuts down, or its device is gone).
    """
    last = {}
    for s in samples:
        last[s["driver"]] = max(last.get(s["driver"], 0), s["iteration"])
    segments: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        tree, training_s = s.get("trainer"), s.get("training_s")
        if tree is None or training_s is None or training_s < warmup_s or s["iteration"] >= last[s["driver"]]:
            continue
        segments.setdefault(s["driver"], []).append((s["t_s"], tree["rss_mb"]))
    return [
        {"driver": d, "samples": len(points), "rss_mb_per_h": slope_per_hour(points)}
        for d, points in sorted(segments.items())
    ]


def read_truth(path: Path) -> dict[int, str | None]:
    """The device's record: each stimulation stamp it took in, with the fault it injected (None: answered well)."""
    truth: dict[int, str | None] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                truth[int(row["stim_us"])] = row["fault"]
    return truth


def misaligned_steps(steps: dict[str, Any], truth: dict[int, str | None]) -> dict[str, int]:
    """Check one episode's step log: every reply the trainer used must encode its own stimulation.

    A used reply (`exchange_ok`) is misaligned when its counts are not its stimulation's frequencies, or when
    the device's truth record says the stimulation never reached it or was never answered (dropped).
    """
    import numpy as np

    stim = np.asarray(steps["stim"], dtype=np.float64)
    counts = np.asarray(steps["raw_spikes"], dtype=np.float64)
    used = np.asarray(steps["exchange_ok"]) > 0.5
    stamps = np.asarray(steps["stim_timestamp_us"], dtype=np.uint64)
    rounds = counts.shape[1] // N_COUNTS
    wrong_counts = np.zeros(len(used), dtype=bool)
    for r in range(rounds):
        sent_hz = stim[:, 2 * N_COUNTS * r : 2 * N_COUNTS * r + N_COUNTS]
        got = counts[:, N_COUNTS * r : N_COUNTS * (r + 1)]
        wrong_counts |= ~np.isclose(got, sent_hz, rtol=0, atol=1e-3).all(axis=1)
    unknown = np.array([int(t) not in truth for t in stamps], dtype=bool)
    dropped = np.array([truth.get(int(t)) == "drop" for t in stamps], dtype=bool)
    return {
        "steps": len(used),
        "used": int(used.sum()),
        "timeouts": int((~used).sum()),
        "wrong_counts": int((used & wrong_counts).sum()),
        "unknown_to_device": int((used & unknown).sum()),
        "used_but_dropped": int((used & dropped).sum()),
        "misaligned": int((used & (wrong_counts | unknown | dropped)).sum()),
    }


def episode_numbering(indices: list[int]) -> dict[str, Any]:
    """Gaps and repeats in a trial's episode numbers (1, 2, 3, ... across restarts and resumes)."""
    seen = set(indices)
    missing = sorted(set(range(1, max(indices, default=0) + 1)) - seen)
    repeated = len(indices) - len(seen)
    in_order = indices == sorted(indices)
    return {"episodes": len(indices), "missing": missing, "repeated": repeated, "in_order": in_order}


# --- The run ------------------------------------------------------------------------------------------------------


@dataclass
class Soak:
    """One soak: its settings, its processes and what it saw."""

    duration_s: float
    sample_s: float
    warmup_s: float
    policy: str
    faults: dict[str, float]
    train_batch: int
    work_dir: Path
    seed: int = 0
    ports: DevicePorts = field(default_factory=DevicePorts)  # fixed: the restarted device comes back on them
    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    outage: dict[str, Any] | None = None
    _device: subprocess.Popen | None = None
    _trainer: subprocess.Popen | None = None
    _trainer_log: Path | None = None
    _logs: list[IO[str]] = field(default_factory=list)
    _drivers: int = 0
    _driver_started: float = 0.0
    _first_iteration_at: float | None = None
    _t0: float = 0.0

    @property
    def recovery(self) -> Recovery:
        """What happens after the device is back."""
        return RECOVERIES[self.policy]

    @property
    def truth_path(self) -> Path:
        """The device's truth record (both device processes append to it)."""
        return self.work_dir / "device-truth.jsonl"

    def settings(self) -> list[str]:
        """The KEY=VALUE overrides that point experiments/cl1.yaml at the device and size it for the soak."""
        sets = {
            "devices.0.host": "127.0.0.1",
            "devices.0.stim_port": self.ports.stim,
            "devices.0.spike_port": self.ports.spike,
            "devices.0.event_port": self.ports.event,
            "devices.0.feedback_port": self.ports.feedback,
            "devices.0.reply_port": self.ports.stim,  # the loopback device answers from its stimulation port
            "ppo.train_batch_size_per_learner": self.train_batch,
            "ppo.minibatch_size": min(128, self.train_batch // 2),
            "loop.on_device_loss": self.policy,
            "stop.iterations": 1_000_000,
            "stop.time_s": round(self.recovery.train_s(self.duration_s), 1),
            "output.root_dir": str(self.work_dir / "runs"),
            "output.step_log": "true",
        }
        return [f"{key}={value}" for key, value in sets.items()]

    def loss_threshold_s(self) -> float:
        """How long the trainer waits before it counts the device as lost (from the experiment it runs)."""
        from spikeloop.experiments.schema import load_experiment

        loop = load_experiment(EXPERIMENT, self.settings()).loop
        return loop.max_consecutive_timeouts * loop.timeout_s

    def now(self) -> float:
        """Seconds since the soak began."""
        return time.monotonic() - self._t0

    def note(self, event: str, **data: Any) -> None:
        """Keep an event with its time and print it."""
        self.events.append({"t_s": round(self.now(), 1), "event": event} | data)
        print(f"[soak {_clock(self.now())}] {event} {json.dumps(data) if data else ''}".rstrip(), flush=True)

    def _log(self, name: str) -> IO[str]:
        handle = (self.work_dir / name).open("w")
        self._logs.append(handle)
        return handle

    def start_device(self, index: int) -> None:
        """Start the device program on the soak's ports and wait until it listens."""
        log_path = self.work_dir / f"device-{index}.log"
        argv = [sys.executable, "-m", "spikeloop.bridge.device.loopback_device", "--tick-s", str(TICK_S)]
        argv += ["--stim-port", str(self.ports.stim), "--spike-port", str(self.ports.spike)]
        argv += ["--event-port", str(self.ports.event), "--feedback-port", str(self.ports.feedback)]
        argv += ["--seed", str(self.seed + index), "--record", str(self.truth_path)]
        for kind, rate in self.faults.items():
            argv += ["--fault", f"{kind}={rate}"]
        self._device = subprocess.Popen(
            argv, stdout=self._log(log_path.name), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while "stim_port=" not in log_path.read_text():
            if self._device.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the loopback device did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        self.note("device_started", pid=self._device.pid)

    def kill_device(self) -> None:
        """SIGKILL the device program, as a crash or a pulled cable does."""
        assert self._device is not None
        os.killpg(self._device.pid, signal.SIGKILL)
        self._device.wait()
        self.note("device_killed")

    def start_trainer(self, extra: tuple[str, ...]) -> None:
        """`spikeloop train [extra] experiments/cl1.yaml --set ...` as a subprocess of its own session."""
        self._drivers += 1
        self._trainer_log = self.work_dir / f"train-{self._drivers}.log"
        sets = [arg for setting in self.settings() for arg in ("--set", setting)]
        argv = [*_spikeloop(), "train", *extra, str(EXPERIMENT), *sets]
        env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
        self._trainer = subprocess.Popen(
            argv, stdout=self._log(self._trainer_log.name), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self._driver_started = time.monotonic()
        self._first_iteration_at = None
        self.note("trainer_started", driver=self._drivers, args=list(extra), pid=self._trainer.pid)

    def iterations_logged(self) -> int:
        """The last training iteration the current driver reported (0 before its first)."""
        if self._trainer_log is None or not self._trainer_log.exists():
            return 0
        return max((int(n) for n in PROGRESS.findall(self._trainer_log.read_text())), default=0)

    def sample(self) -> None:
        """Measure both process trees now, keep the sample and print it."""
        trainer = measure_tree(self._trainer.pid if self._trainer and self._trainer.poll() is None else None)
        device = measure_tree(self._device.pid if self._device and self._device.poll() is None else None)
        iteration = self.iterations_logged()
        if iteration > 0 and self._first_iteration_at is None:
            self._first_iteration_at = time.monotonic()
        row = {
            "t_s": round(self.now(), 1),
            "driver": self._drivers,
            "driver_s": round(time.monotonic() - self._driver_started, 1),
            "training_s": None
            if self._first_iteration_at is None
            else round(time.monotonic() - self._first_iteration_at, 1),
            "iteration": iteration,
            "trainer": trainer,
            "device": device,
        }
        self.samples.append(row)
        t = (
            f"trainer {trainer['processes']} procs {trainer['rss_mb']:.0f} MB rss {trainer['pss_mb']:.0f} MB pss "
            f"{trainer['open_files']} fds {trainer['sockets']} sockets"
            if trainer
            else "trainer down"
        )
        d = f"device {device['rss_mb']:.0f} MB {device['open_files']} fds" if device else "device down"
        print(f"[soak {_clock(self.now())}] driver {self._drivers} iter {row['iteration']}: {t} | {d}", flush=True)

    def wait(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Sample on schedule until `done()`; fail naming `what` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"soak: {what} did not happen within {timeout_s:.0f} s (logs in {self.work_dir})")
            if not self.samples or self.now() - self.samples[-1]["t_s"] >= self.sample_s:
                self.sample()
            time.sleep(0.2)

    def trainer_exited(self) -> bool:
        """Whether the current driver has exited."""
        return self._trainer is not None and self._trainer.poll() is not None

    def run(self) -> None:
        """Train, kill the device at half time, bring it back, and train to the end, sampling throughout."""
        self._t0 = time.monotonic()
        down_s = self.loss_threshold_s() + 5.0  # past the loss threshold, whatever the policy
        slack_s = 600 + self.duration_s  # Ray's start, a checkpoint, a slow machine
        self.start_device(1)
        self.start_trainer(())
        # Mid-run, but after a whole iteration (so there is something to resume from).
        self.wait(
            lambda: self.trainer_exited() or (self.now() >= self.duration_s / 2 and self.iterations_logged() >= 1),
            slack_s,
            "the first training iteration",
        )
        if self.trainer_exited():
            raise RuntimeError(self._early_exit("before the device restart"))
        lost_at_iteration = self.iterations_logged()
        self.kill_device()
        killed = self.now()
        if self.recovery.trainer_stops:
            self.wait(self.trainer_exited, slack_s, "the trainer's stop on the device loss")
            text = self._trainer_log.read_text() if self._trainer_log else ""
            if DEVICE_LOST not in text:
                raise RuntimeError(self._early_exit("without naming the lost device"))
            self.note("trainer_stopped", returncode=self._trainer.returncode if self._trainer else None)
        self.wait(lambda: self.now() >= killed + down_s, slack_s, "the outage")
        self.start_device(2)
        restarted = self.now()
        if self.recovery.resume_args:
            self.start_trainer(self.recovery.resume_args)
        self.wait(
            lambda: self.iterations_logged() > lost_at_iteration or self.trainer_exited(),
            slack_s,
            "the first iteration after the outage",
        )
        self.note("first_iteration_after_outage", iteration=self.iterations_logged())
        self.outage = {
            "device_down_s": round(restarted - killed, 1),
            "training_interrupted_s": round(self.now() - killed, 1),
            "lost_at_iteration": lost_at_iteration,
            "loss_threshold_s": round(down_s - 5.0, 2),
        }
        self.wait(self.trainer_exited, slack_s + self.duration_s, "the end of training")
        self.sample()
        self.note("trainer_finished", returncode=self._trainer.returncode if self._trainer else None)
        if self._trainer is not None and self._trainer.returncode != 0:
            raise RuntimeError(self._early_exit("with an error"))

    def _early_exit(self, when: str) -> str:
        text = self._trainer_log.read_text()[-4000:] if self._trainer_log else ""
        return f"soak: the trainer exited {when} (log {self._trainer_log}):\n{text}"

    def close(self) -> None:
        """Stop whatever still runs (the device, a trainer left by an error or a stop) and close the logs."""
        for what, proc in (("trainer", self._trainer), ("device", self._device)):
            if proc is not None and proc.poll() is None:
                # SIGTERM, not SIGINT: both programs take it as a request to stop (the trainer saves its state and
                # tells the device; the device closes its record), and a soak started in the background by a
                # script passes SIGINT on ignored, so a SIGINT would only have run out the wait below. To the
                # program alone, not its group: the trainer's Ray processes share its group, and Tune cannot save
                # with them gone; the trainer shuts its Ray down itself.
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self.note("stopped", process=what, returncode=proc.returncode)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):  # anything of it still there (Ray's, after a kill)
                    os.killpg(proc.pid, signal.SIGKILL)
        for handle in self._logs:
            handle.close()

    def check_trial(self) -> dict[str, Any]:
        """Episodes, env steps, timeouts and alignment of the trial the soak trained."""
        import numpy as np

        trials = sorted((self.work_dir / "runs").glob("cl1-*/train_trial*"))
        if len(trials) != 1:
            raise RuntimeError(f"soak: expected one trial directory under {self.work_dir / 'runs'}, found {trials}")
        trial = trials[0]
        episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines() if line.strip()]
        truth = read_truth(self.truth_path)
        totals: dict[str, int] = {}
        missing_step_logs = 0
        for episode in episodes:
            if "step_log" not in episode:
                missing_step_logs += 1
                continue
            with np.load(trial / episode["step_log"]) as steps:
                for key, value in misaligned_steps(dict(steps), truth).items():
                    totals[key] = totals.get(key, 0) + value
        numbering = episode_numbering([int(e["episode_index"]) for e in episodes])
        injected: dict[str, int] = {}
        for fault in truth.values():
            injected[fault or "none"] = injected.get(fault or "none", 0) + 1
        return {
            "trial_dir": str(trial),
            "numbering": numbering,
            "lost_episodes": len(numbering["missing"]) + numbering["repeated"],
            "env_steps": int(episodes[-1]["env_steps_lifetime"]) if episodes else 0,
            "episode_steps": sum(int(e.get("episode_length", 0)) for e in episodes),
            "timeouts": sum(int(e.get("timeouts_in_episode", 0)) for e in episodes),
            "episodes_without_step_log": missing_step_logs,
            "alignment": totals,
            "device_stimulations": len(truth),
            "device_faults": injected,
        }


def _spikeloop() -> list[str]:
    """The `spikeloop` command of this environment (the console script beside this Python, else the module)."""
    script = Path(sys.executable).parent / "spikeloop"
    return [str(script)] if script.exists() else [sys.executable, "-m", "spikeloop.experiments.cli"]


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def summarize(soak: Soak, trial: dict[str, Any]) -> dict[str, Any]:
    """The figures and pass/fail against the targets."""
    growth = rss_growth(soak.samples, soak.warmup_s)
    slopes = [g["rss_mb_per_h"] for g in growth if g["rss_mb_per_h"] is not None]
    worst = max(slopes) if slopes else None
    misaligned = trial["alignment"].get("misaligned", 0) + trial["episodes_without_step_log"]
    checks = {
        "rss_growth": worst is not None and worst < MAX_RSS_GROWTH_MB_PER_H,
        "misaligned": misaligned == 0,
        "lost_episodes": trial["lost_episodes"] == 0,
    }
    return {
        "targets": {"rss_mb_per_h_below": MAX_RSS_GROWTH_MB_PER_H, "misaligned": 0, "lost_episodes": 0},
        "rss_growth": growth,
        "rss_mb_per_h": worst,
        "misaligned": misaligned,
        "lost_episodes": trial["lost_episodes"],
        "env_steps": trial["env_steps"],
        "timeouts": trial["timeouts"],
        "outage": soak.outage,
        "checks": checks,
        "passed": all(checks.values()),
    }


# --- The command ------------------------------------------------------------------------------------------------


def _fault(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if name not in PLAN_FAULTS:
        raise argparse.ArgumentTypeError(f"{text!r}: KIND must be one of {', '.join(PLAN_FAULTS)}")
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give KIND=RATE, e.g. drop=0.01") from None
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a rate is between 0 and 1")
    return name, rate


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop bench soak`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop bench soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration-s", type=float, default=3600.0, help="training time in all (default 3600)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples (default 30)")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=300.0,
        help="seconds after each driver's first iteration left out of the RSS slope (default 300)",
    )
    parser.add_argument(
        "--on-device-loss",
        default="stop",
        choices=list(RECOVERIES),
        help="the experiment's loop.on_device_loss: stop (default: the bench resumes the run, as a lab would); "
        "wait (the trial resumes by itself) where the experiment schema knows it",
    )
    parser.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=None,
        help=f"KIND=RATE injected by the device, repeatable (default {' '.join(f'{k}={v}' for k, v in DEFAULT_FAULTS.items())})",
    )
    parser.add_argument(
        "--train-batch",
        type=int,
        default=512,
        help="env steps per training iteration (default 512: ~2 min at 5 steps/s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the device's faults")
    parser.add_argument("--work-dir", type=Path, default=None, help="runs and logs (default runs/soak-DATE-TIME)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write its JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.duration_s < 60:
        parser.error(f"--duration-s {args.duration_s:g}: give at least 60 seconds (3600 for the soak's figures)")
    if args.sample_s <= 0 or args.warmup_s < 0:
        parser.error("--sample-s must be > 0 and --warmup-s >= 0")
    faults = dict(args.fault) if args.fault is not None else dict(DEFAULT_FAULTS)
    if sum(faults.values()) > 1:
        parser.error(f"--fault rates add up to {sum(faults.values()):g}: together at most 1")
    if args.train_batch < 16:
        parser.error("--train-batch must be at least 16")
    if not Path("/proc/self/fd").exists():
        parser.error("the soak reads process figures from /proc: run it on Linux")
    work_dir = args.work_dir or Path("runs") / time.strftime("soak-%Y%m%d-%H%M%S")
    work_dir = work_dir.resolve()
    if (work_dir / "runs").exists() and any((work_dir / "runs").iterdir()):
        parser.error(
            f"--work-dir {work_dir} holds an earlier soak's runs (--resume would pick them up): give a new one"
        )
    if args.on_device_loss not in known_policies():  # last: it imports the schema
        parser.error(
            f"--on-device-loss {args.on_device_loss}: this version's loop.on_device_loss does not know it; "
            f"choose from {', '.join(known_policies())}"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    soak = Soak(
        duration_s=args.duration_s,
        sample_s=args.sample_s,
        warmup_s=args.warmup_s,
        policy=args.on_device_loss,
        faults=faults,
        train_batch=args.train_batch,
        work_dir=work_dir,
        seed=args.seed,
    )
    soak.loss_threshold_s()  # the experiment with the soak's settings is valid, before anything starts
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"soak: {args.duration_s:g} s, device restart at half time, logs in {work_dir}", flush=True)
    try:
        soak.run()
    finally:
        soak.close()
    trial = soak.check_trial()
    summary = summarize(soak, trial)
    result = provenance("soak", argv) | {
        "started_at": started,
        "ended_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {
            "duration_s": args.duration_s,
            "sample_s": args.sample_s,
            "warmup_s": args.warmup_s,
            "on_device_loss": args.on_device_loss,
            "faults": faults,
            "train_batch": args.train_batch,
            "tick_s": TICK_S,
            "experiment": "experiments/cl1.yaml",
        },
        "trial": trial,
        "events": soak.events,
        "samples": soak.samples,
        "summary": summary,
    }
    write_result(args.output, result)
    rss = summary["rss_mb_per_h"]
    print(
        f"soak {'PASSED' if summary['passed'] else 'FAILED'}: RSS {'-' if rss is None else f'{rss:+.1f}'} MB/h "
        f"(target < {MAX_RSS_GROWTH_MB_PER_H:g}), {summary['misaligned']} misaligned, "
        f"{summary['lost_episodes']} lost episodes, {summary['env_steps']} env steps, {summary['timeouts']} timeouts, "
        f"outage {summary['outage']}; written to {args.output}",
        flush=True,
    )
    return 0  # the run completed; whether it met the targets is in the file and the line above
