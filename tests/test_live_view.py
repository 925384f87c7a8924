"""Live view: the server in process (frame dropping, lazy encoding, routes) and in a real run's env runner."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from spikeloop.bridge.trainer.causality import CausalityMeter
from spikeloop.bridge.wire.channels import LIVE_VIEW_PORT, SPIKE_GROUP_NAMES, STIM_FREQUENCY_RANGE_HZ
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.live_view.announce import LIVE_VIEW_FILE, announce
from spikeloop.experiments.live_view.progress import LearningLog
from spikeloop.experiments.live_view.publisher import Publisher
from spikeloop.experiments.live_view.runner_view import _bind, current_view
from spikeloop.experiments.live_view.server import LiveViewServer
from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.experiments.live_view.state import tick_state
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict
from spikeloop.models.closed_loop.meter import CultureMeter, MeterSettings
from tests.support.live_view_run import TINY_RUN, training_with_view


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def mjpeg_frames(url: str, count: int, timeout_s: float):
    """Up to `count` JPEG parts of a multipart/x-mixed-replace stream, read by their Content-Length."""
    frames: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        assert response.headers["Content-Type"].startswith("multipart/x-mixed-replace; boundary=")
        boundary = response.headers["Content-Type"].split("boundary=", 1)[1].encode()
        while len(frames) < count and time.monotonic() < deadline:
            line = response.readline()
            if line.strip() != b"--" + boundary:
                continue
            headers = {}
            while line := response.readline().strip():
                key, _, value = line.decode().partition(":")
                headers[key.strip().lower()] = value.strip()
            assert headers["content-type"] == "image/jpeg"
            frames.append(response.read(int(headers["content-length"])))
    return frames


def _publish(publisher: Publisher, value: int) -> None:
    """A tick whose frame is uniformly `value` (so a decoded frame tells which tick it was)."""
    publisher.publish(
        episode_key="episode-1",
        frame=np.full((240, 320, 3), value, np.uint8),
        stim=np.r_[np.linspace(4, 40, 8), np.linspace(1, 2.5, 8)].astype(np.float32),
        raw_spikes=np.arange(8, dtype=np.float32),
        decoder_spikes=np.zeros(8, np.float32),
        action=3,
        reward=1.0,
        exchange_ok=True,
        stim_timestamp_us=time.time_ns() // 1000,
    )


@pytest.fixture
def served():
    """A publisher with its server on a free port (no Ray: the same classes an env runner uses)."""
    publisher = Publisher(runner_index=1, device_id="sim-1", action_names=("a", "b", "c", "turn_left"))
    server = LiveViewServer(publisher, ViewSettings(enabled=True, port=0, max_fps=10), 0).start()
    yield publisher, server, f"http://127.0.0.1:{server.port}"
    server.close()


def test_frames_are_dropped_not_queued_and_encoded_only_for_viewers(served):
    publisher, server, base = served
    stop = threading.Event()

    def loop() -> None:  # a fast loop: ~500 ticks per second
        value = 0
        while not stop.is_set():
            value = (value + 1) % 250
            _publish(publisher, value)
            time.sleep(0.002)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert publisher.latest.seq > 50
        assert server.frames.encoded == 0, "nobody watches: nothing may be encoded"
        t0 = time.monotonic()
        frames = mjpeg_frames(base + "/doom.mjpeg", count=8, timeout_s=10)
        elapsed = time.monotonic() - t0
        seq_after = publisher.latest.seq
    finally:
        stop.set()
        thread.join()
    assert len(frames) == 8
    # max_fps=10: eight frames take ~0.7 s while the loop published hundreds of ticks; the stream skipped them.
    assert elapsed > 0.5
    assert seq_after > 8 * 10
    values = [int(np.asarray(Image.open(io.BytesIO(f))).mean().round()) for f in frames]
    # The brightness counts ticks modulo 250, and eight frames span more than 250 ticks: each part is a newer
    # tick when every step forward, taken modulo 250, is positive.
    steps = [(after - before) % 250 for before, after in zip(values, values[1:])]
    assert all(step > 0 for step in steps), f"each part is a newer tick, got {values}"
    assert server.frames.encoded <= len(frames) + 2, "frames are encoded once per sent tick, not per published one"


def test_routes_state_and_events(served):
    publisher, _server, base = served
    assert b'id="game"' in _get(base + "/") and b"doom.mjpeg" in _get(base + "/")
    assert b"EventSource" in _get(base + "/dashboard.js")
    layout = json.loads(_get(base + "/layout.json"))
    assert layout["runner"] == 1 and list(layout["spike_groups"]) == list(SPIKE_GROUP_NAMES)
    assert json.loads(_get(base + "/state.json"))["seq"] == 0
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "/frame.jpg")
    assert err.value.code == 503
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "/nothing")
    assert err.value.code == 404

    _publish(publisher, 7)
    _publish(publisher, 8)
    publisher.end_episode(2.0)
    state = json.loads(_get(base + "/state.json"))
    assert state["seq"] == 2
    assert state["stim"]["frequency_hz"][0] == 4.0 and state["stim"]["amplitude_ua"][-1] == 2.5
    assert state["spikes"]["counts"] == list(range(8))
    assert state["action"] == {"index": 3, "name": "turn_left"}
    assert state["reward"]["episode_return"] == 2.0 and state["recent_returns"] == [2.0]
    assert 0 <= state["loop"]["stim_to_frame_ms"] < 1000
    assert Image.open(io.BytesIO(_get(base + "/frame.jpg"))).size == (320, 240)
    with urllib.request.urlopen(base + "/events", timeout=10) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        line = response.readline()
    assert line.startswith(b"data: ") and json.loads(line[6:])["seq"] == 2


def test_state_carries_the_reply_check_when_a_culture_link_gives_one():
    # A late device's replies, through the meter the culture link keeps, as the server reads them.
    meter = CausalityMeter()
    drives = np.random.default_rng(0).permutation([240.0] * 20 + [4.0] * 20)
    for i, drive in enumerate(drives):
        meter.observe(drive, float(drives[i - 1]) if i else 0.0)  # each reply: the one before's response
    dose = {
        "device_dose_max_nc_per_min": 2.88,
        "device_dose_refused_stim": 2.0,
    }  # spikeloop.bridge.device.dose.status_metrics
    publisher = Publisher(
        runner_index=1,
        reply_check=lambda: {"causality": meter.snapshot().as_dict(), "unsolicited": 3, "dose": dose},
    )
    server = LiveViewServer(publisher, ViewSettings(enabled=True, port=0), 0).start()
    try:
        state = json.loads(_get(f"http://127.0.0.1:{server.port}/state.json"))
    finally:
        server.close()
    assert state["replies"]["unsolicited"] == 3 and state["replies"]["dose"] == dose
    causality = state["replies"]["causality"]
    assert causality["verdict"] == "late" and causality["late_by"] == 1
    assert causality["r_previous"] == 1.0 and abs(causality["r_current"]) < 0.5 and causality["n"] == 38
    assert "replies" not in json.loads(json.dumps(tick_state(Publisher(runner_index=2), 0, 0)))  # no link: none


def test_state_carries_the_information_meter_when_it_is_on():
    # The culture link's meter (here fed ticks whose counts follow the stimulation), as the server reads it.
    meter = CultureMeter(MeterSettings(window_ticks=100, every_ticks=100), feature_names=("kills", "health"))
    rng = np.random.default_rng(0)
    for tick in range(100):
        stim = np.r_[np.full(8, 4.0), np.full(8, 1.0)].astype(np.float32)
        stim[tick % 8] = 40.0  # the strongest electrode, which the counts below follow
        counts = rng.poisson(1.0, 8).astype(np.float32)
        counts[tick % 8] += 8
        meter.observe(stim, counts, np.array([0.0, rng.uniform(-1, 1)]), int(rng.integers(3)))
    assert meter.update_if_due()
    server = LiveViewServer(Publisher(runner_index=1, meter=meter.shown), ViewSettings(enabled=True, port=0), 0)
    server.start()
    try:
        shown = json.loads(_get(f"http://127.0.0.1:{server.port}/state.json"))["meter"]
    finally:
        server.close()
    assert shown["ticks"] == 100 and shown["window_ticks"] == 100 and shown["feature"] == "health"
    assert shown["stim"]["bits"] > 0.6 * shown["stim"]["ceiling"] == pytest.approx(0.6 * 3.0, abs=1e-3)
    assert abs(shown["action"]["bits"]) < max(4 * shown["action"]["sd"], 0.05), shown
    assert "meter" not in tick_state(Publisher(runner_index=2), 0, 0)  # the meter off: no panel figures


def test_busy_port_falls_back_to_a_free_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _bind(Publisher(runner_index=1), ViewSettings(enabled=True), port)
        try:
            assert server.port not in (port, 0)
        finally:
            server.server_close()


def test_view_settings_in_the_experiment_and_config():
    off = experiment_from_dict(TINY_RUN)
    assert off.view.enabled is False and off.view.port == LIVE_VIEW_PORT and off.view.host == "127.0.0.1"
    config = off.algorithm_config()
    assert "render_mode" not in config.env_config, "no view: the env keeps its cheap GRAY8 buffer"
    assert config.live_view is None

    on = experiment_from_dict(TINY_RUN, ["view.enabled=true", "view.host=0.0.0.0", "view.port=13000"])
    config = on.algorithm_config()
    assert config.env_config["render_mode"] == "rgb_array"
    settings = config.live_view
    assert (settings.host, settings.port) == ("0.0.0.0", 13000)
    assert [settings.port_for(i) for i in (0, 1, 2, 3)] == [13000, 13000, 13001, 13002]
    for bad in ("view.port=70000", "view.jpeg_quality=0", "view.max_fps=0", "view.colour=red"):
        with pytest.raises(ExperimentError, match="view"):
            experiment_from_dict(TINY_RUN, [bad])


@pytest.mark.slow
def test_real_run_streams_the_game(ray_session, tmp_path):
    port = free_port(kind="tcp")
    with training_with_view(port=port) as algo:
        views = announce(algo, tmp_path)
        assert current_view() is None, "the view runs in the env runner process, not in the driver"
        assert [v["env_runner"] for v in views] == [1]
        assert views[0]["url"] == f"http://127.0.0.1:{port}/" and views[0]["bind_host"] == "127.0.0.1"
        assert json.loads((tmp_path / LIVE_VIEW_FILE).read_text())["views"] == views

        frames = mjpeg_frames(views[0]["mjpeg"], count=40, timeout_s=90)
        decoded = {hashlib.sha1(f).hexdigest(): np.asarray(Image.open(io.BytesIO(f))) for f in frames}
        assert len(decoded) >= 10, f"only {len(decoded)} distinct frames of {len(frames)}"
        for image in decoded.values():
            assert image.shape == (240, 320, 3) and image.std() > 5, "an RGB game frame, not a blank"
        assert len({image.tobytes() for image in decoded.values()}) >= 10, "the decoded pictures differ"

        state = json.loads(_get(views[0]["url"] + "state.json"))
    assert state["runner"] == 1 and state["device"] == "sim-1" and state["seq"] > 10
    low, high = STIM_FREQUENCY_RANGE_HZ
    assert all(low - 1e-3 <= f <= high + 1e-3 for f in state["stim"]["frequency_hz"])
    assert len(state["spikes"]["counts"]) == len(SPIKE_GROUP_NAMES) and sum(state["spikes"]["counts"]) > 0
    assert state["action"]["name"] and state["loop"]["exchange_ok"] is True
    assert state["frames"]["encoded"] >= 10
    # The feedback panel: what was sent per name, in Hz and uA after the envelope (TINY_RUN keeps the defaults).
    envelope = SafetyEnvelope()
    assert state["feedback"], "no feedback shown (reward feedback goes out on every missed shot in basic)"
    for row in state["feedback"]:
        assert row["sent"] >= 1 and row["last_pulses"] >= 1, row
        assert envelope.min_frequency_hz <= row["mean_frequency_hz"] <= row["max_frequency_hz"], row
        assert row["max_frequency_hz"] <= envelope.max_frequency_hz, row
        assert envelope.min_amplitude_ua <= row["mean_amplitude_ua"] <= row["max_amplitude_ua"], row
        assert row["max_amplitude_ua"] <= envelope.effective_max_amplitude_ua, row
    # The reply check of the env runner's culture link: a correct simulated device, nothing unasked.
    replies = state["replies"]
    assert replies["unsolicited"] == 0
    # The device's dose, once it reported one (after an episode end): the simulated device refuses nothing.
    assert all(replies["dose"].get(k, 0.0) == 0.0 for k in ("device_dose_refused_stim", "device_refused_stim"))
    # A short run with 10 + 20 ms windows: the counts may not follow the policy's stimulation clearly yet, but
    # never an earlier one.
    assert replies["causality"]["n"] > 5 and replies["causality"]["verdict"] not in ("late", "mixed"), replies
    # The information meter's panel is fed (its first figures come after meter.every_ticks ticks).
    assert state["meter"]["window_ticks"] == MeterSettings().window_ticks, state["meter"]


def test_learning_curve_and_progress(served):
    """The learning log an env runner keeps: /learning.json after an episode number, the progress against each
    stop condition with its time left, and the budget an experiment gives its env runners."""
    publisher, _server, base = served
    budget = (
        experiment_from_dict(
            TINY_RUN | {"stop": {"env_steps": 1000, "episodes": 50, "iterations": 20}}, ["view.enabled=true"]
        )
        .algorithm_config()
        .live_view.budget
    )
    assert (budget.env_steps, budget.episodes, budget.iterations, budget.time_s) == (1000, 50, 20, None)
    assert budget.env_steps_per_iteration == TINY_RUN["ppo"]["train_batch_size_per_learner"]
    learning = publisher.learning = LearningLog(budget)
    taken = 0
    for iteration in range(3):  # three iterations of 100 env steps, the trial's count arriving after each
        for _ in range(100):
            taken += 1
            learning.count_step(iteration * 100, taken)
        learning.end_episode(2 * iteration + 1, -1.5 + iteration, iteration % 2)
        time.sleep(0.05)
    for _ in range(10):  # steps of the 4th iteration: the count of 3 iterations has not arrived yet
        taken += 1
        learning.count_step(200, taken)
    state = json.loads(_get(base + "/state.json"))
    progress = state["progress"]
    assert progress["env_steps"] == 310 and state["curve_last_episode"] == 5
    limits = {limit["name"]: limit for limit in progress["limits"]}
    assert limits.keys() == {"env_steps", "episodes", "iterations"}
    assert limits["env_steps"]["budget"] == 1000 and limits["env_steps"]["fraction"] == pytest.approx(0.31)
    assert limits["iterations"]["budget"] == 20 * budget.env_steps_per_iteration and limits["iterations"]["approximate"]
    assert limits["episodes"]["done"] == 5 and limits["episodes"]["budget"] == 50
    rate = progress["env_steps_per_s"]
    assert rate > 0 and limits["env_steps"]["time_left_s"] == pytest.approx(690 / rate, rel=0.01, abs=0.06)
    assert progress["first"] == min(progress["limits"], key=lambda limit: limit["time_left_s"])
    curve = json.loads(_get(base + "/learning.json?since=1"))
    assert curve["episode"] == [3, 5] and curve["return"] == [-0.5, 0.5] and curve["kills"] == [1, 0]
    assert curve["device"] == "sim-1" and curve["window"] == 1
    assert json.loads(_get(base + "/learning.json"))["episode"] == [1, 3, 5]
    with pytest.raises(urllib.error.HTTPError, match="400") as refused:
        _get(base + "/learning.json?since=-1")
    assert b"since must be an episode number" in refused.value.read()
