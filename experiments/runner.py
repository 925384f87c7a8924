"""The runner behind `spikeloop train` and `spikeloop tune`.

Both go through Ray Tune with one function trainable, so that a single run and
a sweep get the same things: a trial directory per run with the resolved
experiment, TensorBoard event files, episodes.jsonl and the learning curve;
checkpoints every N iterations (the best K by mean episode return and the
latest are kept) and at the end; retries of failed trials from their last
checkpoint; and resume after the driver is killed (`--resume`).

A running trial also saves when asked: `spikeloop checkpoint RUN_DIR` drops a
request file that the trial picks up after its current iteration.

Hardware (cl1) devices: a private local Ray advertises each device's resource
and one env-runner slot per device, so that `spikeloop train` and `tune` work
on the one machine beside a CL1; on a cluster the device nodes advertise them
(`ray start --resources`). One device serves one trial at a time, so the trials
of a sweep take turns. The device program exits on a `training_complete` that
says the run completed, so the driver sends it once, when the whole run has
ended, not each trial. A trial whose device is lost saves a checkpoint of its
last whole iteration and ends with the loss report (what was seen, what to
check); it is not retried (Tune would only wait out the same silence again),
but `--resume`, once the device answers again, continues it from that
checkpoint. A trial that ended for good (its budget, or a failure the same
settings would repeat) leaves `trial_ended.json`, and `--resume` leaves it be.
An unpaced simulated trial is not continued from a checkpoint (its cultures'
state is not in one) but started again from the start, on `--resume` and on a
retry alike, so that it stays the run its seed gives.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from spikeloop.experiments.design.block import Block
from spikeloop.experiments.design.sequence import culture_block, run_sequence, trial_name
from spikeloop.experiments.ray_session import init_ray
from spikeloop.experiments.run_log import DEVICE_LOST, FINISHED, NOTHING_TRAINED, SETUP_ERROR
from spikeloop.experiments.schema import Experiment, experiment_from_dict, set_path
from spikeloop.experiments.stop_signals import sigterm_as_ctrl_c
from spikeloop.experiments.trial_files import (
    ABANDONED_PREFIX,
    DESIGN_CULTURE,
    PROVENANCE_FILE,
    REPEATS_FILE,
    SCHEDULE_FILE,
    SEED_INDEX,
    SEQUENCE_FILE,
)
from spikeloop.models import rllib_notices

rllib_notices.install()  # in a trial's process too, before Tune's actor logs its setup time

EMPTY_ITERATIONS = "empty_iterations"
"""Result key: iterations of the trial (in this driver) in which the learner received no env steps."""
EPISODE_STEPS_LOGGED = "episode_steps_logged"
"""Result key: env steps of the episodes this driver wrote to episodes.jsonl (finished episodes, whole)."""
LEARNER_ENV_STEPS = "learner_env_steps"
"""Result key: env steps the learner received in this driver's iterations of the trial (what was trained on)."""
ACCOUNTING_KEYS = ("env_steps_taken", EPISODE_STEPS_LOGGED, "unfinished_episode_steps", LEARNER_ENV_STEPS)
"""Where a trial's env steps went (summary.yaml): taken by its env runners = in finished episodes + in the episodes
still going at the stop; reached the learner (less than taken only if a sample was given up on)."""
RESOLVED_FILE = "experiment.yaml"
START_FROM = "start_from"
"""Tune config key: the checkpoint a new run's trials start from (`--from`; experiments/start_from.py)."""
CHECKPOINT_REQUEST = "checkpoint.request"
ENDED_FILE = "trial_ended.json"
"""In a trial directory: the trial ended for good (why, in it); `--resume` continues every trial without one."""
SCORE_TAG = "episode/return_mean"
"""The default `tune.metric`: trials and checkpoints are ranked by it unless the experiment names another."""
SEARCH_FUNCTIONS = {
    "grid": "grid_search",
    "choice": "choice",
    "uniform": "uniform",
    "loguniform": "loguniform",
    "randint": "randint",
}


def seeded(data: dict[str, Any], k: int) -> dict[str, Any]:
    """Seed k of a configuration: the top-level seed and every device's seed moved on by k.

    The same k gives the same values in every configuration, so seed k of one configuration plays the
    same game (RLlib seeds the env, the module's initial weights and sampling from `seed`) against the
    same simulated culture (the device's `seed`) as seed k of any other.
    """
    data = copy.deepcopy(data)
    data["seed"] = int(data.get("seed", 0)) + k
    for device in data.get("devices") or []:
        device["seed"] = int(device.get("seed", 0)) + k
    return data


def _trial_experiment(tune_config: dict[str, Any]) -> Experiment:
    data = copy.deepcopy(tune_config["experiment"])
    for key, value in (tune_config.get("sweep") or {}).items():
        set_path(data, key, value)
    if tune_config.get(SEED_INDEX):
        data = seeded(data, int(tune_config[SEED_INDEX]))
    return experiment_from_dict(data, source="trial")


def _request_pending(trial_dir: Path) -> bool:
    """A checkpoint request for this trial (taken: removed) or for the whole run (each trial takes it once)."""
    own = trial_dir / CHECKPOINT_REQUEST
    if own.exists():
        own.unlink(missing_ok=True)
        return True
    shared = trial_dir.parent / CHECKPOINT_REQUEST
    seen = trial_dir / (CHECKPOINT_REQUEST + ".seen")
    if shared.exists():
        stamp = str(shared.stat().st_mtime_ns)
        if not seen.exists() or seen.read_text() != stamp:
            seen.write_text(stamp)
            return True
    return False


def _pull_episode_records(
    algo, accounting: dict[str, int] | None = None, last_stims: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """The episodes every env runner finished since the last pull; `accounting` gets where their steps went,
    `last_stims` each device's last stimulation stamp (models/closed_loop/discarded.py)."""
    from spikeloop.models.closed_loop.callbacks import pop_episode_records, step_accounting
    from spikeloop.models.closed_loop.discarded import last_stimulation

    pulled = algo.env_runner_group.foreach_env_runner(
        lambda _runner: (pop_episode_records(), step_accounting(), last_stimulation()), local_env_runner=True
    )
    if accounting is not None:
        for key in ("env_steps_taken", "unfinished_episode_steps"):
            accounting[key] = sum(steps[key] for _, steps, _ in pulled)
    if last_stims is not None:
        last_stims.update(dict(mark for _, _, mark in pulled if mark is not None))
    return [record for records, _, _ in pulled for record in records]


def _trial_dir() -> Path:
    """The trial's directory in the run directory (under output.root_dir), where its files belong.

    Not `get_trial_dir()`: that is Tune's driver staging directory in the Ray session's temp dir. It is
    on the node that runs the trial (so a trial on another node never reaches the run directory), it
    starts empty after a resume (episodes.jsonl would restart at 1 and then overwrite the earlier
    episodes when Tune syncs it up), and `spikeloop checkpoint RUN_DIR` requests never show up there.
    """
    from pyarrow.fs import LocalFileSystem
    from ray import tune

    context = tune.get_context()
    storage = context.get_storage()
    if isinstance(storage.storage_filesystem, LocalFileSystem):
        path = Path(storage.trial_fs_path)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(context.get_trial_dir())  # remote storage (s3:// ...): stage locally, Tune uploads


def score_of(tune_config_or_experiment: dict[str, Any] | Experiment) -> tuple[str, str, float]:
    """The Tune metric key of the experiment's `tune.metric`, its mode, and the worst value it can take."""
    from spikeloop.experiments.run_log import metric_key

    if isinstance(tune_config_or_experiment, Experiment):
        section = tune_config_or_experiment.tune.model_dump()
    else:
        section = (tune_config_or_experiment.get("experiment") or {}).get("tune") or {}
    tag, mode = section.get("metric", SCORE_TAG), section.get("mode", "max")
    return metric_key(tag), mode, float("-inf") if mode == "max" else float("inf")


def sweep_trials(experiment: Experiment) -> int:
    """How many trials `spikeloop tune` runs: grid points (less those that repeat another) x seeds x samples;
    with a design, one per culture."""
    from spikeloop.experiments.analysis.plan import configurations_run

    if experiment.design is not None:
        return len(experiment.design.cultures)
    return configurations_run(experiment) * experiment.tune.seeds * experiment.tune.num_samples


def _sweep_tag(tune_config: dict[str, Any], print_settings: bool = False) -> str:
    """`[trial N] ` before a sweep trial's lines; print_settings prints its settings too (once, at its start)."""
    from ray import tune

    from spikeloop.experiments.tune_logging import trial_label, trial_number

    if "sweep" not in tune_config and SEED_INDEX not in tune_config:
        return ""
    number = trial_number(tune.get_context().get_trial_id() or "")
    tag = f"[trial {number}] " if number is not None else ""
    if print_settings:
        print(f"{tag}{trial_label(tune_config)}", flush=True)
    return tag


def train_trial(tune_config: dict[str, Any]) -> None:
    """The Tune function trainable: build, (restore,) train, log, checkpoint, finish.

    A trial that fails before its first iteration, with no checkpoint to continue from, is not retried: the same
    settings would fail the same way (a device that cannot be bound, a setting only the built algorithm refuses).
    It reports the error (`SETUP_ERROR`) and ends; `run` raises it. Later failures are Tune's to retry from the
    last checkpoint (`tune.max_failures`).
    """
    from ray import tune

    from spikeloop.models.closed_loop.link import DeviceLost

    if DESIGN_CULTURE in tune_config:
        _train_sequence(tune_config)
        return
    start = tune.get_checkpoint()
    # iterations: reported to Tune; trained: returned from algo.train() (a stop can come between the two).
    progress: dict[str, Any] = {"iterations": 0, "trained": 0, "device_lost": False}
    score, _, worst = score_of(tune_config)
    ended = _trial_dir() / ENDED_FILE
    if ended.exists():  # `--resume` restarts finished trials too (a device loss finishes one): this one is done
        print(f"trial ended before ({ended.read_text().strip()}): nothing to resume", flush=True)
        return
    start = _restart_if_repeatable(tune_config, start, ended.parent)
    try:
        _train(tune_config, start, progress)
    except DeviceLost as exc:  # lost before the first iteration: nothing to save
        print(f"DeviceLost: {exc}", file=sys.stderr, flush=True)
        tune.report({DEVICE_LOST: str(exc), score: worst, FINISHED: True})
        return
    except Exception as exc:
        if start is not None or progress["trained"]:  # it trained: not a setup error; Tune's to retry
            raise
        traceback.print_exc()  # the trial's log keeps the whole story
        tune.report({SETUP_ERROR: f"{type(exc).__name__}: {exc}", score: worst, FINISHED: True})
        ended.write_text(json.dumps({"reason": SETUP_ERROR}) + "\n")
        return
    if not progress["device_lost"]:
        ended.write_text(json.dumps({"reason": "stopped", "iterations_this_driver": progress["iterations"]}) + "\n")


def _train_sequence(tune_config: dict[str, Any]) -> None:
    """A design's trial: one culture's blocks in order (experiments/design/sequence.py), each trained by `_train`.

    A lost device ends the trial with its block unfinished, for `--resume` to start again; a failure before any
    block trained is a setup error, as in `train_trial`; later failures are Tune's to retry, and the retry goes
    on from the first block not in the culture's record.
    """
    from ray import tune

    from spikeloop.models.closed_loop.link import DeviceLost

    trial_dir = _trial_dir()
    ended = trial_dir / ENDED_FILE
    if ended.exists():
        print(f"trial ended before ({ended.read_text().strip()}): nothing to resume", flush=True)
        return
    score, _, worst = score_of(tune_config)
    trained = {"blocks": 0}

    def train_block(block_config: dict[str, Any], block, progress: dict[str, Any]) -> None:
        _train(block_config, None, progress, block)
        trained["blocks"] += progress["trained"] > 0

    try:
        complete = run_sequence(tune_config, trial_dir, train_block)
    except DeviceLost as exc:  # lost before a block's first iteration: nothing to save
        print(f"DeviceLost: {exc}", file=sys.stderr, flush=True)
        tune.report({DEVICE_LOST: str(exc), score: worst, FINISHED: True})
        return
    except Exception as exc:
        if trained["blocks"] or (trial_dir / SEQUENCE_FILE).exists():
            raise
        traceback.print_exc()
        tune.report({SETUP_ERROR: f"{type(exc).__name__}: {exc}", score: worst, FINISHED: True})
        ended.write_text(json.dumps({"reason": SETUP_ERROR}) + "\n")
        return
    if complete:
        ended.write_text(json.dumps({"reason": "sequence complete"}) + "\n")


TUNE_OWN_FILES = ("checkpoint_", "params.", "result.json", "progress.csv", "error.")
"""Name prefixes of what Tune keeps in a trial directory (its checkpoints and logs): left where Tune expects them."""


def _restart_if_repeatable(tune_config: dict[str, Any], start, trial_dir: Path):
    """The checkpoint to continue from; always None for an unpaced simulated trial, which starts again.

    Continuing such a trial from a checkpoint would give a run no seed gives: its cultures restart from their seed
    while the agent goes on (their weights and state are not in the checkpoint). It is started again from the
    start instead, so that it is the run its seed gives and pairs with the other trials of that seed. What the
    earlier attempt wrote (episodes, event files, session records) moves to `abandoned-<time>/`, nothing deleted;
    Tune's own files and checkpoints stay where Tune keeps them.
    """
    # experiment.yaml stays (the same settings are written again): `spikeloop analyze` finds trials by it, and
    # an abandoned attempt is not a trial of the run.
    kept = (*TUNE_OWN_FILES, ABANDONED_PREFIX, RESOLVED_FILE)
    ours = [p for p in trial_dir.iterdir() if not p.name.startswith(kept)]
    if not _trial_experiment(tune_config).repeats_bit_for_bit():
        return start
    if not ours:  # nothing written yet: a first start, or a restart killed before it wrote anything
        if start is not None:
            print(f"{_sweep_tag(tune_config)}started again from the start, not from its checkpoint", flush=True)
        return None
    stamp = ABANDONED_PREFIX + time.strftime("%Y%m%d-%H%M%S")
    aside = trial_dir / stamp
    for n in range(2, 1000):  # a retry within the same second gets a folder of its own
        if not aside.exists():
            break
        aside = trial_dir / f"{stamp}-{n}"
    aside.mkdir()
    for path in ours:
        path.rename(aside / path.name)
    instead_of = "from its checkpoint" if start is not None else "where it stopped"
    print(
        f"{_sweep_tag(tune_config)}started again from the start, not {instead_of}: "
        "an unpaced simulated culture's state is not in a checkpoint, so only a whole run is the run its seed "
        f"gives; the earlier attempt's files are in {aside.name}/",
        flush=True,
    )
    return None


def _train(
    tune_config: dict[str, Any],
    start,
    progress: dict[str, int],
    block: Block | None = None,
) -> None:
    """Build, (restore,) train to the stop, log, checkpoint, finish: one trial, or one block of a design's
    sequence (`block`: its directory, what to do before play, and whether it is the sequence's last)."""
    import ray
    from ray import tune

    from spikeloop.experiments.checkpoint_upgrade import raise_if_old_name
    from spikeloop.experiments.live_view.announce import announce
    from spikeloop.experiments.run_log import (
        EPISODES_FILE,
        RunLog,
        empty_iteration_cause,
        last_episode_index,
        metric_key,
    )
    from spikeloop.models.closed_loop.discarded import note_kept, tell_discarded_at_start
    from spikeloop.models.closed_loop.episode_numbers import start_counter
    from spikeloop.models.closed_loop.link import DeviceLost
    from spikeloop.models.closed_loop.ppo import finish, restore
    from spikeloop.models.closed_loop.session_record import RecordSettings

    experiment = _trial_experiment(tune_config)
    score, _, worst = score_of(experiment)
    trial_dir = block.directory if block is not None else _trial_dir()
    (trial_dir / RESOLVED_FILE).write_text(experiment.to_yaml())
    # Episodes are numbered across the trial's env runners and resumes (episode_end events, episodes.jsonl).
    first_episode = last_episode_index(trial_dir / EPISODES_FILE) + 1
    counter, counter_name = start_counter(first_episode - 1)
    config = experiment.algorithm_config()
    record = (
        RecordSettings(str(trial_dir), experiment.output.record_flush_s, experiment.to_yaml())
        if experiment.output.record
        else None
    )  # each env runner's session record (spikeloop.models.closed_loop.session_record), into the trial directory
    config.experiment(episode_counter_name=counter_name, session_record=record)
    try:
        algo = config.build_algo()
    except BaseException:
        ray.kill(counter)
        raise
    if experiment.view.enabled:
        announce(algo, trial_dir)  # live_view.json: the URL each env runner serves, on its own node
    if start is not None:
        with start.as_directory() as path:
            try:
                restore(algo, path)
            except ModuleNotFoundError as exc:  # one line naming the upgrade, not RLlib's traceback
                raise_if_old_name(exc, Path(start.path))
                raise
        print(f"resumed from {start.path} at iteration {algo.iteration}", flush=True)
    elif tune_config.get(START_FROM):  # `--from`: a new trial on another run's weights (retries take their own)
        from spikeloop.experiments.start_from import start_trial

        start_trial(algo, Path(tune_config[START_FROM]), trial_dir)
    # What a device saw since the last logged iteration no longer stands: tell it (unpaced simulations never continue).
    keeps_note = not experiment.repeats_bit_for_bit()
    if keeps_note:
        told = tell_discarded_at_start(algo, trial_dir, first_episode, resumed=start is not None)
        if told:
            print(told, flush=True)
    log = RunLog(trial_dir)
    tag = _sweep_tag(tune_config, print_settings=True)
    if start is None:  # a resumed trial's first event file has its HPARAMS session already
        log.start_session(experiment, base_seed=int(tune_config["experiment"].get("seed", 0)))
    stop = experiment.stop
    t0 = time.monotonic()
    reason = "completed"
    # Restored from the final checkpoint (driver killed before the trial was marked finished): nothing to train.
    steps_done = int(algo.metrics.peek("num_env_steps_sampled_lifetime", default=0)) if start is not None else 0
    finished = start is not None and stop_reached(stop, algo.iteration, steps_done, log.episodes_logged)
    protocol = None
    if experiment.protocol is not None:  # rest, play, rest (experiments/protocol/session.py)
        from spikeloop.experiments.protocol.session import ProtocolSession

        protocol = ProtocolSession(experiment, trial_dir)
    # This driver's iterations only: what reached the learner, and where the env runners' steps went.
    trained = {LEARNER_ENV_STEPS: 0, EMPTY_ITERATIONS: 0, "env_steps_taken": 0, "unfinished_episode_steps": 0}
    leaving: BaseException | None = None  # the exception the trial is leaving with, if any
    try:
        if protocol is not None and not finished:
            protocol.before_play(algo, resumed=start is not None)
        if block is not None:
            block.before_play(algo)
        while not finished:
            result = _train_iteration(algo)
            progress["trained"] += 1
            last_stims: dict[str, int] = {}
            values = log.log_iteration(result, _pull_episode_records(algo, trained, last_stims))
            if keeps_note:
                note_kept(trial_dir, algo.iteration, last_stims)
            empty = empty_iteration_cause(result, config.sample_timeout_s)
            trained[LEARNER_ENV_STEPS] += int(values.get("ppo/env_steps_received", 0))
            trained[EMPTY_ITERATIONS] += empty is not None
            log.log_empty_iterations(result, trained[EMPTY_ITERATIONS])
            print(tag + log.progress_line(result, values, empty), flush=True)
            iteration = algo.iteration
            done = stop_reached(
                stop,
                iteration,
                int(result.get("num_env_steps_sampled_lifetime", 0) or 0),
                log.episodes_logged,
                elapsed_s=time.monotonic() - t0,
            )
            # Not "done": Tune reserves that key and stops the trial thread (SystemExit inside
            # tune.report) before the cleanup below can tell the culture training completed.
            # The tune.metric key is in every report (its worst value until it has one): Tune ranks checkpoints
            # and trials by it.
            metrics = (
                {score: worst, FINISHED: done and (block is None or block.last), "episodes_logged": log.episodes_logged}
                | trained
                | {EPISODE_STEPS_LOGGED: log.steps_logged}
                | {metric_key(k): v for k, v in values.items()}
            )
            if done and not trained[LEARNER_ENV_STEPS]:
                # Not "completed": the culture was stimulated, the learner got nothing (`run` fails the run).
                reason = "error: no env steps reached the learner"
                metrics[NOTHING_TRAINED] = (
                    f"the learner received 0 env steps in {progress['iterations'] + 1} iteration(s): {empty}"
                )
            if done and protocol is not None:  # play is over: rest after play, statistics in the last report
                outcome = protocol.after_play(algo, trial_dir / EPISODES_FILE)
                metrics |= {metric_key(k): v for k, v in outcome.items()}
            requested = _request_pending(trial_dir)  # first, so a request is taken even when a save is due anyway
            save = (
                requested
                or iteration % experiment.checkpoint.every_iterations == 0
                or (done and experiment.checkpoint.at_end)
            )
            if save:
                with tempfile.TemporaryDirectory() as tmp:
                    algo.save_to_path(tmp)
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
            else:
                tune.report(metrics)
            progress["iterations"] += 1
            if done:
                break
    except DeviceLost as exc:
        reason = "error: device lost"
        progress["device_lost"] = True
        lost = {score: worst, FINISHED: True, "episodes_logged": log.episodes_logged} | trained
        _report_device_loss(algo, exc, lost | {EPISODE_STEPS_LOGGED: log.steps_logged})
    except BaseException as exc:
        reason = f"error: {type(exc).__name__}"
        leaving = exc
        raise
    finally:
        log.close()
        try:
            # Simulated devices end with the trial; hardware ones hear training_complete from the driver at the end.
            finish(
                algo,
                reason=reason,
                total_steps=trained[LEARNER_ENV_STEPS],
                total_episodes=log.episodes_logged,
                hardware=False,
            )
        except Exception as finish_exc:
            # A stopped trial (Tune's SystemExit in tune.report, after the driver's Ctrl-C) may find its env runners
            # already gone; that must not replace why the trial is leaving (it once made a stop a setup error).
            if leaving is None:
                raise
            print(f"could not finish the env runners while leaving ({finish_exc!r})", file=sys.stderr, flush=True)
        finally:
            algo.stop()
            ray.kill(counter)


def _report_device_loss(algo, exc: Exception, metrics: dict[str, Any]) -> None:
    """Report the loss with a checkpoint of the last whole iteration, which `--resume` continues from.

    The failed iteration never reached the learner and its episodes were never logged, so the checkpoint holds
    exactly what episodes.jsonl and TensorBoard hold: the resumed trial repeats nothing and skips nothing.
    """
    from ray import tune

    print(f"DeviceLost: {exc}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        try:
            algo.save_to_path(tmp)
            checkpoint = tune.Checkpoint.from_directory(tmp)
        except Exception as save_exc:  # the loss report matters more; --resume takes the last periodic checkpoint
            print(f"no checkpoint at the device loss ({type(save_exc).__name__}: {save_exc})", file=sys.stderr)
        tune.report(metrics | {DEVICE_LOST: str(exc)}, checkpoint=checkpoint)
    print(f"checkpoint at iteration {algo.iteration}: `--resume` continues from it", flush=True)


def stop_reached(stop, iteration: int, env_steps: int, episodes: int, elapsed_s: float | None = None) -> bool:
    """Whether any stop condition the experiment sets is reached (the ones it leaves unset never apply).

    `episodes` counts the trial's finished episodes across resumes (its episodes.jsonl), like the reference
    trainer's `--max-episodes`, which also counts the episodes restored with a checkpoint; `elapsed_s` is this
    driver's training time (None: not checked, as on a restore).
    """
    return (
        (stop.iterations is not None and iteration >= stop.iterations)
        or (stop.env_steps is not None and env_steps >= stop.env_steps)
        or (stop.episodes is not None and episodes >= stop.episodes)
        or (stop.time_s is not None and elapsed_s is not None and elapsed_s >= stop.time_s)
    )


def _train_iteration(algo) -> dict[str, Any]:
    """`algo.train()`, with a lost device named: RLlib ends the env runner, so only its report says what happened."""
    from spikeloop.models.closed_loop.link import DeviceLost, device_loss_report

    started = time.time()
    try:
        return algo.train()
    except Exception as exc:
        try:
            report = device_loss_report(since_wall=started - 1.0)
        except Exception:
            report = None
        if report is not None:
            raise DeviceLost(report) from exc
        raise


def _search_space(experiment: Experiment, run_dir: Path | None = None) -> Any:
    """Tune's search space; an all-grid one without the points that repeat another (listed in repeats.json)."""
    from ray import tune

    from spikeloop.experiments.sweep_repeats import reasons, thin_grid

    points, repeats = thin_grid(experiment.plain(), experiment.tune.search_space)
    if repeats:
        if run_dir is not None:
            (run_dir / REPEATS_FILE).write_text(json.dumps([r.to_json() for r in repeats], indent=2) + "\n")
        print(
            f"sweep: {len(points)} of {len(points) + len(repeats)} configurations run; {len(repeats)} repeat "
            f"another exactly and are read as it ({reasons(repeats)}; each in {REPEATS_FILE})",
            flush=True,
        )
        return tune.grid_search(points)
    return {
        key: getattr(tune, SEARCH_FUNCTIONS[kind])(arg)
        for key, spec in experiment.tune.search_space.items()
        for kind, arg in spec.items()
    }


def _resources(experiment: Experiment):
    config = experiment.algorithm_config()
    return config.algo_class.default_resource_request(config)


DEVICE_HOLD = 0.9
"""The share of its culture's device resource a design trial holds: over half, so no two trials hold one device;
the rest for the tiny shares the device's bridge, the trial's env runner and the driver's last task ask."""


def _culture_resources(tune_config: dict[str, Any]):
    """A design trial's request: its culture's block, holding most of the culture's device while it runs, so
    that the cultures on one device take turns."""
    from ray.tune import PlacementGroupFactory

    block = culture_block(tune_config["experiment"], tune_config[DESIGN_CULTURE])
    request = _resources(block)
    hardware = block.culture_settings().hardware
    if not hardware:
        return request
    head, *rest = request.bundles
    return PlacementGroupFactory([head | {hardware[0].resource: DEVICE_HOLD}, *rest], strategy=request.strategy)


def _tell_hardware(experiment: Experiment, reason: str, results) -> None:
    """The run is over: tell each hardware device `training_complete` (its program stops its recording and exits)."""
    culture = experiment.culture_settings()
    if not culture.hardware or experiment.policy == "direct":
        return
    # total_steps: the env steps that reached the learner (what was trained on), not what was sampled.
    totals = {"total_episodes": 0, "total_steps": 0}
    for r in results:
        metrics = r.metrics or {}
        totals["total_episodes"] += int(metrics.get("episodes_logged", 0) or 0)
        totals["total_steps"] += int(metrics.get(LEARNER_ENV_STEPS, 0) or 0)
    from spikeloop.models.closed_loop.ppo import tell_devices_training_complete

    for line in tell_devices_training_complete(culture, totals | {"reason": reason}):
        print(line, flush=True)


def record_provenance(run_dir: Path, resumed: bool, command: str | None = None) -> None:
    """Write (or, on a resume, extend) the run's provenance: which code ran its trials, from which command."""
    from spikeloop.experiments.benchmarks.record import SOURCE_TREE, git_state, machine, utc_now

    entry = {
        "command": command,  # None when started from Python rather than the CLI
        "cwd": os.getcwd(),
        "git": git_state(SOURCE_TREE),
        "machine": machine(),
        "at": utc_now(),
    }
    path = run_dir / PROVENANCE_FILE
    try:
        record = json.loads(path.read_text()) if resumed and path.is_file() else {}
    except (OSError, ValueError):
        record = {}  # an unreadable record is replaced by what is known now, not allowed to stop the run
    if not isinstance(record, dict) or "started" not in record:
        record = {"started": entry, "resumed": []} if not resumed else {"started": None, "resumed": []}
    if resumed:
        record.setdefault("resumed", []).append(entry)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def latest_run_dir(experiment: Experiment) -> Path | None:
    """The newest run directory of this experiment's name (for --resume)."""
    root = Path(experiment.output.root_dir).resolve()
    runs = sorted(root.glob(f"{experiment.name}-*/tuner.pkl"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else None


class DoesNotFit(ValueError):
    """The experiment's trial can never be scheduled where it would run."""


def check_fit(experiment: Experiment) -> None:
    """Before Ray starts: refuse a trial this machine's local Ray could never place (DoesNotFit says how to fit)."""
    import ray

    from spikeloop.experiments import fit

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return  # a cluster: checked against it once connected (`_check_cluster_fit`)
    problem = fit.shortfall(experiment, fit.local_resources(experiment))
    if problem:
        raise DoesNotFit(problem)
    for i, dev in enumerate(experiment.devices):
        if dev.simulated:  # started on this machine: its address must be one of this machine's
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    sock.bind((dev.address.bind_host, 0))
                except OSError as exc:
                    raise DoesNotFit(
                        f"devices.{i}.bind_host: cannot bind {dev.address.bind_host!r} on this machine "
                        f"({exc.strerror or exc}); a simulated device runs here: use 127.0.0.1"
                    ) from None


def _check_cluster_fit(experiment: Experiment) -> None:
    from spikeloop.experiments import fit

    problem = fit.shortfall(experiment, fit.cluster_resources(), where="the Ray cluster (all nodes together)")
    if problem:
        raise DoesNotFit(problem)


def run(
    experiment: Experiment,
    *,
    sweep: bool,
    resume: bool = False,
    start_from: Path | None = None,
    command: str | None = None,
) -> Path:
    """Train (one trial) or sweep (the tune section), returning the run directory.

    `start_from`: a checkpoint (checked by `spikeloop.experiments.start_from.check_start`) whose weights every new trial
    starts from. `command`: the command line that started it, for the run's provenance record.
    """
    import ray
    from ray import tune

    from spikeloop.experiments.checkpoint_upgrade import refuse_old
    from spikeloop.experiments.tune_logging import NoTuneTensorBoard, SweepProgress

    if resume and (earlier := latest_run_dir(experiment)) is not None:
        refuse_old(earlier)  # before Ray: a run written before `spikeloop.*` is upgraded first, not half restored

    rllib_notices.quiet_tune_output()
    design = experiment.design is not None and sweep
    plan = None
    blocks = [experiment]
    if design:  # each culture's trial asks Ray for what its first block needs
        from spikeloop.experiments.design.plan import design_schedule

        plan = design_schedule(experiment)
        plain = experiment.plain()
        blocks = [culture_block(plain, culture) for culture in plan.cultures]
    for each in blocks:
        check_fit(each)
    culture = experiment.culture_settings()
    started_ray = not ray.is_initialized()
    init_ray(resources=culture.node_resources())  # this machine owns the devices when no cluster is named
    for each in blocks:
        _check_cluster_fit(each)
    trainable = tune.with_resources(train_trial, _culture_resources if design else _resources(experiment))
    score, mode, _ = score_of(experiment)
    root = Path(experiment.output.root_dir).resolve()
    if resume:
        run_dir = latest_run_dir(experiment)
        if run_dir is None:
            raise FileNotFoundError(f"no earlier run of {experiment.name!r} under {root} to resume")
        print(f"resuming {run_dir}", flush=True)
        record_provenance(run_dir, resumed=True, command=command)
        # Finished trials too: a trial stopped by a device loss is finished for Tune; one that ended for good
        # returns at once (ENDED_FILE). Errored ones continue from their last checkpoint.
        again = tune.ResumeConfig.ResumeType.RESUME
        resume_config = tune.ResumeConfig(finished=again, unfinished=again, errored=again)
        tuner = tune.Tuner.restore(str(run_dir), trainable=trainable, _resume_config=resume_config)
    else:
        run_name = f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = root / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RESOLVED_FILE).write_text(experiment.to_yaml())
        record_provenance(run_dir, resumed=False, command=command)
        param_space: dict[str, Any] = {"experiment": experiment.plain()}
        if start_from is not None:
            param_space[START_FROM] = str(start_from)
        if plan is not None:
            (run_dir / SCHEDULE_FILE).write_text(json.dumps(plan.to_json(), indent=2) + "\n")
            param_space[DESIGN_CULTURE] = tune.grid_search(plan.cultures)
        if sweep and experiment.tune.search_space:
            param_space["sweep"] = _search_space(experiment, run_dir)
        if sweep and experiment.tune.seeds > 1:
            param_space[SEED_INDEX] = tune.grid_search(list(range(experiment.tune.seeds)))
        t = experiment.tune
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                num_samples=t.num_samples if sweep else 1,
                max_concurrent_trials=t.max_concurrent_trials if sweep else 1,
                metric=score,
                mode=mode,
                trial_dirname_creator=trial_name if design else None,
            ),
            run_config=tune.RunConfig(
                name=run_name,
                storage_path=str(root),
                checkpoint_config=tune.CheckpointConfig(
                    num_to_keep=experiment.checkpoint.keep,
                    checkpoint_score_attribute=score,
                    checkpoint_score_order=mode,
                ),
                failure_config=tune.FailureConfig(max_failures=t.max_failures),
                # The trial writes its own tags (no ray/tune/* copies); a sweep prints its progress as trials end.
                callbacks=[NoTuneTensorBoard(), *([SweepProgress(sweep_trials(experiment))] if sweep else [])],
                verbose=0,
            ),
        )
    try:
        with sigterm_as_ctrl_c():
            results = tuner.fit()
    except BaseException:
        _tell_hardware(experiment, "error: the run was interrupted", [])
        raise
    errors = [r for r in results if r.error]
    setup_errors = [r.metrics[SETUP_ERROR] for r in results if r.metrics and SETUP_ERROR in r.metrics]
    lost = [r.metrics[DEVICE_LOST] for r in results if r.metrics and DEVICE_LOST in r.metrics]
    untrained = [r.metrics[NOTHING_TRAINED] for r in results if r.metrics and NOTHING_TRAINED in r.metrics]
    summary = {
        "run_dir": str(run_dir),
        "trials": len(results),
        "errored": len(errors) + len(setup_errors) + len(lost) + len(untrained),
        "learner_env_steps": sum(int((r.metrics or {}).get(LEARNER_ENV_STEPS, 0) or 0) for r in results),
        "empty_iterations": sum(int((r.metrics or {}).get(EMPTY_ITERATIONS, 0) or 0) for r in results),
    }
    if start_from is not None:
        summary["started_from"] = str(start_from)
    if setup_errors:
        summary["failed_before_first_iteration"] = setup_errors
    if lost:
        summary["device_lost"] = lost
    if untrained:
        summary["nothing_trained"] = untrained
    summary["env_steps"] = {
        Path(r.path).name: {key: int((r.metrics or {}).get(key, 0) or 0) for key in ACCOUNTING_KEYS}
        for r in results
        if r.path
    }
    failed = errors or setup_errors or lost or untrained
    # Ctrl-C: Tune saves the run and returns; trials that had not reached their stop (or not started) say so by
    # lacking FINISHED in their last report. The run is not complete, and a device must not be told it is.
    unfinished = [r for r in results if r.error is None and not (r.metrics or {}).get(FINISHED)]
    interrupted = bool(unfinished) and not failed
    if interrupted:
        summary["unfinished_trials"] = len(unfinished)
    _tell_hardware(
        experiment,
        "error: a trial failed" if failed else "error: the run was interrupted" if interrupted else "completed",
        results,
    )
    try:
        best = results.get_best_result(metric=score, mode=mode)
        summary["best"] = {
            "metric": experiment.tune.metric,
            "mode": mode,
            "value": float(best.metrics[score]) if best.metrics and score in best.metrics else None,
            "trial_dir": best.path,
        }
        if best.checkpoint is not None:
            summary["best_checkpoint"] = best.checkpoint.path
        summary["final_checkpoints"] = [r.checkpoint.path for r in results if r.checkpoint is not None]
    except (RuntimeError, ValueError):
        pass
    (run_dir / "summary.yaml").write_text(yaml.safe_dump(summary, sort_keys=False))
    if started_ray:
        ray.shutdown()  # its workers' last log lines arrive now, not after the verdict below
    for r in errors:
        print(f"trial failed: {r.error}", file=sys.stderr)
    print(f"run directory: {run_dir}", flush=True)
    if interrupted:
        if command:
            again = f"`{command}`" if "--resume" in command.split() else f"`{command} --resume`"
        else:
            again = "the same `spikeloop train` or `tune` command with --resume"
        how = (
            "(an unpaced simulated run repeats only whole: its unfinished trials start again from the start, and "
            "what they wrote so far is kept in each trial's abandoned-<time>/)"
            if experiment.repeats_bit_for_bit()
            else "(from their last checkpoints)"
        )
        print(
            f"interrupted: {len(unfinished)} of {len(results)} trial(s) had not finished; the run's state and "
            f"their last checkpoints are saved: continue it with {again} {how}",
            file=sys.stderr,
            flush=True,
        )
        raise KeyboardInterrupt
    if lost:
        raise RuntimeError(
            f"{len(lost)} of {len(results)} trial(s) stopped because a device was lost (not retried: "
            f"see {run_dir}): {lost[-1]}"
        )
    if setup_errors:
        raise RuntimeError(
            f"{len(setup_errors)} of {len(results)} trial(s) failed before their first iteration and were not "
            f"retried (the same settings would fail the same way): {setup_errors[0]}; see {run_dir}"
        )
    if untrained:
        raise RuntimeError(
            f"{len(untrained)} of {len(results)} trial(s) trained on nothing (see {run_dir}): {untrained[0]}"
        )
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(results)} trial(s) failed; see {run_dir}")
    if summary["empty_iterations"]:
        print(
            f"warning: in {summary['empty_iterations']} iteration(s) the learner received no env steps (their "
            "lines say why); ppo/empty_iterations in TensorBoard",
            flush=True,
        )
    return run_dir
