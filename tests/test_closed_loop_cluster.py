"""Placement on a multi-node Ray cluster: each env runner drives the device of its own node.

A local `ray.cluster_utils.Cluster` stands in for a lab: a head node for the driver and
learner, and two device nodes, each advertising its own device resource (`cl1:dish-a`,
`cl1:dish-b`) and one `cl1_slot`. Two LoopbackDevices play the two CL1s (all nodes share
this machine, so loopback UDP reaches them). The test checks that every env runner and
the bridge actor of the device it drives run on the same node, the node that owns that
device, and that both cultures are sampled, directly and through `algo.train()`.
"""

from __future__ import annotations

import numpy as np
import pytest

from spikeloop.bridge.trainer.actor import device_resource, find_bridge
from spikeloop.models.closed_loop.ppo import closed_loop_config, finish
from spikeloop.models.closed_loop.settings import DEVICE_SLOT_RESOURCE, CultureSettings
from spikeloop.models.columns import EXCHANGE_OK, RAW_SPIKES, SPIKES, STIM
from tests.support.closed_loop_helpers import SMALL_MODEL, cl1_device, sample_and_replay, start_loopback

pytestmark = [pytest.mark.cluster, pytest.mark.long]  # minutes: the long tier

DEVICES = ("dish-a", "dish-b")


@pytest.fixture(scope="module")
def cluster():
    """Head node (1 CPU) plus one node per device, each with 1 CPU, its device resource and a slot."""
    import ray
    from ray.cluster_utils import Cluster

    lab = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {
        dev: lab.add_node(num_cpus=1, resources={device_resource(dev): 1, DEVICE_SLOT_RESOURCE: 1}) for dev in DEVICES
    }
    ray.init(address=lab.address, log_to_driver=False)
    lab.wait_for_nodes()
    yield ray, {dev: node.node_id for dev, node in nodes.items()}
    ray.shutdown()
    lab.shutdown()


def _runner_report(runner) -> dict:
    import ray

    from spikeloop.models.closed_loop.link import current_link

    steps = sample_and_replay(runner, 40, True)
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "device_id": current_link().device.device_id,
        "steps": steps,
    }


def test_env_runners_and_bridges_share_the_device_node(cluster):
    ray, node_of = cluster
    assert len(set(node_of.values())) == 2
    head = ray.get_runtime_context().get_node_id()
    assert head not in node_of.values()
    loopbacks = {dev: start_loopback() for dev in DEVICES}
    culture = CultureSettings(devices=tuple(cl1_device(dev, loopbacks[dev]) for dev in DEVICES), timeout_s=0.5)
    algo = closed_loop_config(
        culture=culture,
        env_config={"scenario": "basic"},
        model_config=SMALL_MODEL,
        num_env_runners=2,
        seed=3,
        training={"train_batch_size_per_learner": 128, "minibatch_size": 64, "num_epochs": 1},
    ).build_algo()
    try:
        reports = algo.env_runner_group.foreach_env_runner(_runner_report, local_env_runner=False)
        bridge_nodes = {dev: ray.get(find_bridge(dev).node_id.remote()) for dev in DEVICES}
        before = {dev: ray.get(find_bridge(dev).stats.remote())["exchanges"] for dev in DEVICES}
        result = algo.train()
        after = {dev: ray.get(find_bridge(dev).stats.remote())["exchanges"] for dev in DEVICES}
        told = finish(algo)
    finally:
        algo.stop()
        for device in loopbacks.values():
            device.stop()

    # Each env runner took the device of the node it landed on; the two took different devices.
    assert sorted(r["device_id"] for r in reports) == sorted(DEVICES)
    for report in reports:
        dev = report["device_id"]
        assert report["node_id"] == node_of[dev], f"env runner driving {dev} is on {dev}'s node"
        assert bridge_nodes[dev] == node_of[dev], f"bridge of {dev} is on {dev}'s node"
        # ... and it really played through that device: the loop holds there too.
        steps = report["steps"]
        assert len(steps[STIM]) >= 40 and steps[EXCHANGE_OK].all()
        np.testing.assert_array_equal(steps[RAW_SPIKES], steps[STIM][:, :8])
        np.testing.assert_array_equal(steps[SPIKES], steps[RAW_SPIKES])
    # Both cultures were stimulated, by sampling and by a training iteration.
    for dev in DEVICES:
        assert len(loopbacks[dev].received_stims) == after[dev] > before[dev] >= 40
    assert result["env_runners"]["num_env_steps_sampled"] >= 128
    assert told == 2
