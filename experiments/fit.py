"""Does an experiment's trial fit where it will run? Asked before Ray starts, so that it never waits forever.

Tune places a trial only once every resource it asks for is free at once; a local
Ray that can never offer them (two env runners on a two-core machine, a GPU
learner without a GPU) leaves the trial pending for ever, with Tune printing "No trial is running" every
minute. The request comes from RLlib itself (`default_resource_request`), so it
is what Tune will ask for, not a guess.
"""

from __future__ import annotations

import math
import os
from typing import Any

from spikeloop.experiments.schema import Experiment
from spikeloop.models.ray_internals import ray_cpu_count

LOCAL = "this machine (a local Ray started by spikeloop)"


def trial_request(experiment: Experiment) -> dict[str, float]:
    """What one trial asks Ray for in total: CPU, GPU and custom resources (e.g. cl1_slot)."""
    config = experiment.algorithm_config()
    return dict(config.algo_class.default_resource_request(config).required_resources)


def local_resources(experiment: Experiment | None = None) -> dict[str, float]:
    """What a local Ray started here would offer (the same CPU count Ray detects; GPUs CUDA can see).

    With an experiment, also the device resources spikeloop's local Ray advertises for its cl1 devices.
    """
    try:
        cpus = float(ray_cpu_count())
    except Exception:  # a Ray without that helper: the scheduler's view is then the affinity mask
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        import torch

        gpus = float(torch.cuda.device_count())
    except Exception:
        gpus = 0.0
    devices = experiment.culture_settings().node_resources() if experiment is not None else {}
    return {"CPU": cpus, "GPU": gpus} | devices


def short_of(need: dict[str, float], available: dict[str, float]) -> set[str]:
    """The resources of which `available` has less than `need`."""
    return {k for k, v in need.items() if v > 0 and v > available.get(k, 0.0) + 1e-9}


def shortfall(experiment: Experiment, available: dict[str, float], where: str = LOCAL) -> str | None:
    """None if a trial fits into `available`; otherwise what it needs, what there is, and how to make it fit."""
    need = {k: v for k, v in trial_request(experiment).items() if v > 0}
    short = short_of(need, available)
    if not short:
        return None
    r = experiment.resources
    have = ", ".join(f"{_fmt(available.get(k, 0.0))} {k}" for k in need)
    lines = [
        f"a trial of this experiment needs {', '.join(f'{_fmt(v)} {k}' for k, v in need.items())}; "
        f"{where} has {have}, so Tune would wait for ever."
    ]
    if "CPU" in short:
        cpu_per_runner = 1 if r.num_env_runners else 0
        deficit = math.ceil(need["CPU"] - available.get("CPU", 0.0))
        fit = max(0, r.num_env_runners - (math.ceil(deficit / cpu_per_runner) if cpu_per_runner else 0))
        lines.append(
            f"  CPU: 1 for the trial itself, 1 for each of resources.num_env_runners={r.num_env_runners}"
            + (f" and each of resources.num_learners={r.num_learners}" if r.num_learners else "")
            + f". To fit: resources.num_env_runners: {fit}"
            + (" (the trial then samples in its own process)" if fit == 0 else "")
            + (", resources.num_learners: 0" if r.num_learners else "")
            + ", or run on a cluster (RAY_ADDRESS)."
        )
    if "GPU" in short:
        lines.append(
            f"  GPU: resources.num_gpus_per_learner={_fmt(r.num_gpus_per_learner)} for each learner. To fit: "
            "resources.num_gpus_per_learner: 0, or run where GPUs are (RAY_ADDRESS)."
        )
    for name in sorted(short - {"CPU", "GPU"}):
        devices = [d for d in experiment.devices if not d.simulated]
        lines.append(
            f"  {name}: each env runner drives one cl1 device and runs on a node that advertises it. "
            "Start Ray on each device's node with `ray start --address=... --resources='{\""
            + (devices[0].resource if devices else "cl1:<device_id>")
            + '": 1, "cl1_slot": 1}\'`, or run without RAY_ADDRESS on the machine beside the '
            "devices (spikeloop's own Ray then advertises them)."
        )
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:g}"


def cluster_resources() -> dict[str, Any]:
    """What the connected Ray cluster has in total (after ray.init)."""
    import ray

    return dict(ray.cluster_resources())
