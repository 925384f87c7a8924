"""The closed-loop invariant, end to end: every action is decoded from the culture's answer to
*that* step's stimulation (docs/architecture.md, "One tick").

A `LoopbackDevice` (real UDP on loopback, started in the test process) answers each
stimulation with counts equal to the stimulation's 8 frequencies, so a step's spikes
show which stimulation they answer without trusting any timestamp. It drops and delays
replies past the bridge timeout at known points and sends duplicates, forged replies from
a foreign address and truncated datagrams. A real RLlib env runner, placed through the
device's node resource, plays real VizDoom through the real bridge actor; the test checks
every sampled step. Also here: `on_device_loss="stop"` ends sampling with an error that
names the device instead of hanging, and `on_device_loss="wait"` pauses the step, probes
the device with stimulations of all zeros, and goes on when it answers again, with the
step that found it lost acting on the answer to its own stimulation, sent again.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ray.rllib.core.columns import Columns

from spikeloop.bridge.trainer.actor import find_bridge
from spikeloop.bridge.wire.protocol import decode_event, decode_stim
from spikeloop.models.closed_loop.link import DeviceLost
from spikeloop.models.closed_loop.ppo import closed_loop_config, finish
from spikeloop.models.closed_loop.settings import DEVICE_SLOT_RESOURCE, CultureSettings
from spikeloop.models.columns import EXCHANGE_OK, RAW_SPIKES, SPIKE_MEAN, SPIKES, STIM, STIM_TIMESTAMP
from tests.support.closed_loop_helpers import SMALL_MODEL, cl1_device, sample_and_replay, start_loopback

DEVICE = "dish-inv"
DEAD = "dish-dead"
WAITED = "dish-wait"
TIMEOUT_S = 0.1
DELAY_S = 0.35  # a delayed reply comes well after the bridge gave up on it
MAX_CONSECUTIVE = 3
N_EXPLORE = 600
N_GREEDY = 60

# Fault schedule by device reply index (the i-th stimulation the device receives). Indices
# 300-302 are three drops in a row: with max_consecutive_timeouts=3 that is a "device lost"
# which on_device_loss="continue" rides through. 120/121 is a delay right after a drop.
DROPS = (25, 97, 120, 211, 300, 301, 302, 480)
DELAYS = (46, 121, 160, 333, 420)
FAULTS = (
    {i: "drop" for i in DROPS}
    | {i: "delay" for i in DELAYS}
    | {60: "duplicate", 250: "duplicate", 70: "foreign", 260: "foreign", 80: "corrupt", 270: "corrupt"}
)
TIMED_OUT = frozenset(DROPS + DELAYS)


@pytest.fixture(scope="module")
def ray_devices():
    """One Ray session whose only node owns both test devices and one device slot."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=True,
        resources={f"cl1:{DEVICE}": 1, f"cl1:{DEAD}": 1, f"cl1:{WAITED}": 1, DEVICE_SLOT_RESOURCE: 1},
    )
    yield ray
    ray.shutdown()


def _config(
    device_settings, *, on_device_loss: str, timeout_s: float = TIMEOUT_S, seed: int = 7, max_wait_s: float = 600.0
):
    culture = CultureSettings(
        devices=(device_settings,),
        timeout_s=timeout_s,
        max_consecutive_timeouts=MAX_CONSECUTIVE,
        on_device_loss=on_device_loss,
        max_wait_s=max_wait_s,
    )
    return closed_loop_config(
        culture=culture,
        env_config={"scenario": "basic"},
        model_config=SMALL_MODEL,
        num_env_runners=1,
        seed=seed,
        training={"train_batch_size_per_learner": 128, "minibatch_size": 64, "num_epochs": 1},
    )


def _run_on_runner(algo, fn):
    (result,) = algo.env_runner_group.foreach_env_runner(fn, local_env_runner=False)
    return result


def _link_counts(runner) -> dict:
    from spikeloop.models.closed_loop.link import current_link

    return dict(current_link().counts)


def test_every_action_decodes_this_steps_answer(ray_devices):
    ray = ray_devices
    device = start_loopback(fault_for=FAULTS.get, delay_s=DELAY_S)
    algo = _config(cl1_device(DEVICE, device), on_device_loss="continue").build_algo()
    try:
        steps = _run_on_runner(algo, lambda r: sample_and_replay(r, N_EXPLORE, True))
        greedy = _run_on_runner(algo, lambda r: sample_and_replay(r, N_GREEDY, False))
        link_counts = _run_on_runner(algo, _link_counts)
        time.sleep(DELAY_S + 0.1)  # the last delayed reply reaches the bridge
        bridge_stats = ray.get(find_bridge(DEVICE).stats.remote())
        told = finish(algo, total_steps=N_EXPLORE + N_GREEDY)
    finally:
        algo.stop()
        time.sleep(0.2)
        device.stop()

    n = len(steps[STIM])
    assert n >= N_EXPLORE >= 500
    assert len(greedy[STIM]) >= N_GREEDY

    # --- every step is exactly one stimulation on the wire, in device order --------------
    # (the explore phase ran first, so the device's first n stimulations are its steps)
    wire = [decode_stim(d) for d in device.received_stims]
    assert len(wire) == n + len(greedy[STIM]), "one stimulation per env step, no extra ones"
    index_of = {s.timestamp_us: i for i, s in enumerate(wire)}
    assert len(index_of) == len(wire), "stimulation timestamps name one stimulation each"
    idx = np.array([index_of[int(ts)] for ts in steps[STIM_TIMESTAMP]])
    assert sorted(idx.tolist()) == list(range(n))
    sent_freqs = np.array([wire[i].frequencies_hz for i in idx], dtype=np.float32)
    np.testing.assert_array_equal(sent_freqs, steps[STIM][:, :8], err_msg="the recorded stim is what was sent")

    # --- the invariant, per step ----------------------------------------------------------
    ok = steps[EXCHANGE_OK]
    assert set(np.unique(ok).tolist()) <= {0.0, 1.0}
    timed_out_steps = set(idx[ok == 0].tolist())
    assert timed_out_steps == set(TIMED_OUT), "exactly the dropped and delayed replies time out"
    good = ok == 1
    # The spikes the decoder used answer this step's own stimulation: the device echoes it.
    np.testing.assert_array_equal(steps[RAW_SPIKES][good], steps[STIM][good, :8])
    np.testing.assert_array_equal(steps[SPIKES], steps[RAW_SPIKES])  # ablation "none"
    assert not steps[RAW_SPIKES][~good].any() and not steps[SPIKES][~good].any(), "a timeout decodes zeros"
    # Right after every timeout (and after the delayed reply shows up late) the loop is aligned again.
    by_index = {int(i): k for k, i in enumerate(idx)}
    after = [i + 1 for i in TIMED_OUT if i + 1 not in TIMED_OUT]
    assert len(after) == 10
    for i in after:
        k = by_index[i]
        assert ok[k] == 1, f"step after the timeout at reply {i - 1} is ok"
        np.testing.assert_array_equal(steps[SPIKES][k], steps[STIM][k, :8])
        # ... and does not carry the late reply of the timed-out stimulation
        assert not np.array_equal(steps[SPIKES][k], steps[STIM][by_index[i - 1], :8])
    # The forged reply from a foreign address (counts 99) never reached the decoder.
    assert not (steps[SPIKES] == 99.0).all(axis=1).any()

    # --- the action came from those spikes ------------------------------------------------
    # The connector's joint log-probability, recomputed by the runner's own module from the
    # stored observation, stim, spikes, spike mean and action, is the one stored.
    np.testing.assert_allclose(steps["replay_joint_logp"], steps[Columns.ACTION_LOGP], rtol=1e-5, atol=1e-4)
    assert not steps[SPIKE_MEAN].any()  # no training yet: nothing to centre with
    # Greedy sampling: the action is the decoder's argmax on the step's spikes, the stim the encoder mean.
    assert greedy[EXCHANGE_OK].all()
    np.testing.assert_array_equal(greedy[RAW_SPIKES], greedy[STIM][:, :8])
    np.testing.assert_array_equal(greedy["action"], greedy["replay_decoder_logits"].argmax(-1))
    np.testing.assert_allclose(greedy[STIM], greedy["replay_encoder_mean"], rtol=1e-5, atol=1e-4)
    # A different action for different spikes somewhere: the decoder is not ignoring its input.
    assert len(np.unique(greedy["action"])) > 1 or len(np.unique(steps["action"])) > 1

    # --- counters: what was injected is what the loop saw ---------------------------------
    assert device.injected["drop"] == len(DROPS) and device.injected["delay"] == len(DELAYS)
    assert bridge_stats["timeouts"] == len(DROPS) + len(DELAYS)
    assert bridge_stats["late"] == len(DELAYS)
    assert bridge_stats["duplicates"] == 2 and bridge_stats["foreign"] == 2 and bridge_stats["malformed"] == 2
    assert bridge_stats["ok"] == n + len(greedy[STIM]) - len(TIMED_OUT)
    assert link_counts["timeouts"] == len(TIMED_OUT)
    assert link_counts["device_lost"] == 1, "three drops in a row: lost, and on_device_loss='continue' went on"

    # --- what left the bridge besides stimulation -----------------------------------------
    assert told == 1
    events = [decode_event(d) for d in device.received_events]
    kinds = [e.event_type for e in events]
    assert kinds[-1] == "training_complete" and kinds.count("training_complete") == 1
    assert kinds.count("episode_end") >= 1
    assert device.received_feedback, "reward/event feedback reached the device"


def test_device_loss_stop_raises_device_lost_naming_the_device(ray_devices):
    """The env runner's own `sample` fails with DeviceLost naming the device, promptly, no hang."""
    ray = ray_devices
    device = start_loopback(fault_for=lambda i: "drop")  # never answers
    algo = _config(cl1_device(DEAD, device), on_device_loss="stop", timeout_s=0.05).build_algo()
    try:
        # RLlib's foreach_env_runner wraps every call in `apply`, which turns any error into a
        # sys.exit of the actor (see the next test); the runner's method itself shows the error.
        (runner,) = algo.env_runner_group._worker_manager.actors().values()
        t0 = time.monotonic()
        with pytest.raises(DeviceLost, match=rf"device '{DEAD}' did not answer {MAX_CONSECUTIVE} stimulations"):
            ray.get(runner.sample.remote(num_timesteps=50, explore=True), timeout=60)
        assert time.monotonic() - t0 < 30
        assert len(device.received_stims) == MAX_CONSECUTIVE
        # The failing link was closed: the device is free for whoever runs next.
        assert ray.get(find_bridge(DEAD).claim.remote("someone-else")) is None
        ray.get(find_bridge(DEAD).release.remote("someone-else"))
    finally:
        algo.stop()
        device.stop()


def test_device_loss_stop_ends_training_instead_of_hanging(ray_devices, capfd):
    """Through `algo.train()`: the error ends the run at once and the runner's log names the device."""
    ray = ray_devices
    device = start_loopback(fault_for=lambda i: "drop")
    algo = _config(cl1_device(DEAD, device), on_device_loss="stop", timeout_s=0.05, seed=8).build_algo()
    try:
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError):
            algo.train()
        assert time.monotonic() - t0 < 30, "no restart loop, no hang"
        assert len(device.received_stims) == MAX_CONSECUTIVE
        logged = ""
        deadline = time.monotonic() + 15
        while f"DeviceLost: device '{DEAD}'" not in logged and time.monotonic() < deadline:
            time.sleep(0.5)
            out, err = capfd.readouterr()
            logged += out + err
        assert f"DeviceLost: device '{DEAD}' did not answer" in logged
    finally:
        t0 = time.monotonic()
        algo.stop()
        assert time.monotonic() - t0 < 20, "stopping the algorithm does not wait on a stuck env runner"
        device.stop()


# The device goes silent for stimulations 40-44: 40-42 are a step each (the third in a row makes it lost), 43 and 44
# are probes nobody answers, 45 is the probe answered and 46 is step 42's stimulation again.
SILENT = range(40, 45)
LOST_AT, ANSWERED_PROBE, RESENT = 42, 45, 46
WAIT_STEPS = 120


@pytest.mark.long  # about a minute on a loaded 2-core machine (an algorithm, 120 steps, two waits)
def test_device_loss_wait_pauses_probes_and_resumes_on_the_steps_own_answer(ray_devices):
    """`wait`: no step acts on the outage's zeros past the loss; silent past max_wait_s, it stops as `stop` does."""
    ray = ray_devices
    dead = {"from": None}  # the reply index from which the device stays silent (phase two)

    def fault_for(i: int):
        return "drop" if i in SILENT or (dead["from"] is not None and i >= dead["from"]) else None

    device = start_loopback(fault_for=fault_for)
    algo = _config(cl1_device(WAITED, device), on_device_loss="wait", max_wait_s=2.5, seed=9).build_algo()
    try:
        steps = _run_on_runner(algo, lambda r: sample_and_replay(r, WAIT_STEPS, True))
        link_counts = _run_on_runner(algo, _link_counts)
        n_wire = len(device.received_stims)
        dead["from"] = n_wire
        (runner,) = algo.env_runner_group._worker_manager.actors().values()
        with pytest.raises(DeviceLost, match=rf"device '{WAITED}' did not answer .* within loop.max_wait_s \(2.5 s\)"):
            ray.get(runner.sample.remote(num_timesteps=50, explore=True), timeout=120)
        after_loss = len(device.received_stims) - n_wire
        # The failing link was closed: the device is free for whoever runs next.
        assert ray.get(find_bridge(WAITED).claim.remote("someone-else")) is None
        ray.get(find_bridge(WAITED).release.remote("someone-else"))
    finally:
        algo.stop()
        time.sleep(0.2)
        device.stop()

    wire = [decode_stim(d) for d in device.received_stims[:n_wire]]
    n = len(steps[STIM])
    assert n >= WAIT_STEPS
    # One stimulation per step, plus three probes and the lost step's stimulation sent again.
    assert len(wire) == n + 4, (len(wire), n)
    for probe in wire[LOST_AT + 1 : ANSWERED_PROBE + 1]:
        assert not any(probe.frequencies_hz) and not any(probe.amplitudes_ua), "a probe stimulates nothing"
    assert wire[RESENT].frequencies_hz == wire[LOST_AT].frequencies_hz
    assert wire[RESENT].amplitudes_ua == wire[LOST_AT].amplitudes_ua
    assert wire[RESENT].timestamp_us != wire[LOST_AT].timestamp_us, "sent again as a stimulation of its own"

    index_of = {s.timestamp_us: i for i, s in enumerate(wire)}
    idx = np.array([index_of[int(ts)] for ts in steps[STIM_TIMESTAMP]])
    assert sorted(idx.tolist()) == sorted(set(range(len(wire))) - {LOST_AT, *range(LOST_AT + 1, ANSWERED_PROBE + 1)})
    ok = steps[EXCHANGE_OK]
    assert set(idx[ok == 0].tolist()) == {40, 41}, "only the timeouts before the loss was found reach a step"
    # Every answered step, the one that found the device lost included, decodes its own stimulation's answer.
    good = ok == 1
    np.testing.assert_array_equal(steps[RAW_SPIKES][good], steps[STIM][good, :8])
    k = int(np.flatnonzero(idx == RESENT)[0])
    assert ok[k] == 1 and steps[RAW_SPIKES][k].any()
    np.testing.assert_allclose(steps["replay_joint_logp"], steps[Columns.ACTION_LOGP], rtol=1e-5, atol=1e-4)

    assert link_counts["device_lost"] == 1 and link_counts["device_outages"] == 1, link_counts
    assert link_counts["device_probes"] == 3 and link_counts["device_outage_ms"] > 0, link_counts
    # Phase two: lost after three silent steps, then only probes until max_wait_s ran out: no step past the loss.
    probes = [decode_stim(d) for d in device.received_stims[n_wire + MAX_CONSECUTIVE :]]
    assert probes and not any(any(p.frequencies_hz) or any(p.amplitudes_ua) for p in probes), after_loss
