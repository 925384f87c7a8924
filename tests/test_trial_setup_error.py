"""A trial that fails before its first iteration is reported once, not retried by Tune (issue 14).

The failure is a real one that only shows inside Ray: the simulated device's address cannot be
bound where its env runner runs (the local preflight that would catch it is skipped when Ray is
already up, as on a cluster).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spikeloop.experiments.runner import SETUP_ERROR, run
from spikeloop.experiments.schema import load_experiment

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


def test_local_preflight_refuses_an_address_this_machine_does_not_have():
    import ray

    from spikeloop.experiments.runner import DoesNotFit, check_fit

    assert not ray.is_initialized()  # runs before the module's Ray session starts (file order)
    with pytest.raises(DoesNotFit, match=r"devices\.0\.bind_host: cannot bind '192\.0\.2\.1'.*use 127\.0\.0\.1"):
        check_fit(load_experiment(QUICKSTART, ["devices.0.bind_host=192.0.2.1", "devices.0.allow_network_bind=true"]))


def test_setup_error_is_raised_once_without_retries(ray_session, tmp_path):
    experiment = load_experiment(
        QUICKSTART,
        [
            "devices.0.bind_host=192.0.2.1",  # TEST-NET-1: never an address of this machine
            "devices.0.allow_network_bind=true",  # beyond loopback: acknowledged, so that Ray gets to try it
            "stop.iterations=1",
            "tune.max_failures=2",
            f"output.root_dir={tmp_path}",
            "view.enabled=false",
        ],
    )
    with pytest.raises(
        RuntimeError, match="failed before their first iteration and were not retried.*Cannot assign requested address"
    ):
        run(experiment, sweep=False)
    run_dir = next(tmp_path.glob("quickstart-*"))
    summary = yaml.safe_load((run_dir / "summary.yaml").read_text())
    assert len(summary["failed_before_first_iteration"]) == 1
    trial_dir = next(run_dir.glob("train_trial_*"))
    results = [line for line in (trial_dir / "result.json").read_text().splitlines() if line.strip()]
    assert len(results) == 1 and SETUP_ERROR in results[0]  # one attempt, not 1 + max_failures
    assert not list(trial_dir.glob("error.*"))  # Tune saw no error to retry
