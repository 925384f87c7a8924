"""The live view dashboard in a real headless Chromium, against a real training run.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on fds 3 and 4), so no websocket package is
needed and the page runs in real time with its endless MJPEG and event streams.
Screenshots and DOM dumps go to test-artifacts/live_view/.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from spikeloop.bridge.trainer.causality import CausalityMeter
from spikeloop.bridge.wire.channels import STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.safety import SafetyEnvelope
from spikeloop.experiments.live_view.announce import served_views
from spikeloop.experiments.live_view.publisher import Publisher
from spikeloop.experiments.live_view.server import LiveViewServer
from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.experiments.run_log import EPISODES_FILE, curve_window
from tests.support.live_view_run import training_with_view

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "live_view"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
    "--window-size=1280,1000",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]


class Chromium:
    """A headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, url: str, width: int = 1280, height: int = 1000) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="live-view-chromium-")
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # Numbers >= 10, so that placing them on 3 and 4 in the child cannot overwrite one another.
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        os.close(to_browser)
        os.close(from_browser)
        self.process = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$@" 3<&{ends[0]} 4>&{ends[1]} {ends[0]}<&- {ends[1]}>&-',
                "bash",
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={self._profile.name}",
            ],
            pass_fds=ends,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in ends:
            os.close(fd)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        threading.Thread(target=self._reader, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            self.session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.navigate", self.session, url=url)

    def _reader(self) -> None:
        buffer = b""
        with os.fdopen(self._read, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:  # replies; events are not needed here
                        with self._arrived:
                            self._replies[message["id"]] = message
                            self._arrived.notify_all()

    def call(self, method: str, session: str | None = None, timeout_s: float = 30, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and wait for its reply."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        with self._arrived:
            if not self._arrived.wait_for(lambda: self._next_id in self._replies, timeout_s):
                raise TimeoutError(f"chromium did not answer {method} within {timeout_s} s")
            reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        reply = self.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, path: Path) -> np.ndarray:
        """Save a PNG screenshot of the page and return its pixels."""
        data = base64.b64decode(self.call("Page.captureScreenshot", self.session, format="png")["data"])
        path.write_bytes(data)
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    def close(self) -> None:
        """Close the browser."""
        try:
            self.call("Browser.close", timeout_s=5)
        except (TimeoutError, OSError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        self._profile.cleanup()


def _cell(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*>([^<]*)<', dom)
    assert match, f"#{element_id} is not in the dashboard's DOM"
    return match.group(1)


def _game_pixels(screenshot: np.ndarray, box: dict[str, float]) -> np.ndarray:
    x, y, w, h = (int(round(box[k])) for k in ("x", "y", "width", "height"))
    return screenshot[y + 2 : y + h - 2, x + 2 : x + w - 2].astype(np.int16)


def test_dashboard_shows_the_game_and_the_culture(ray_session, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with training_with_view(tmp_path, {"env_steps": BUDGET_ENV_STEPS}, port=free_port(kind="tcp")) as algo:
        url = served_views(algo)[0]["url"]
        browser = Chromium(url)
        try:
            # Wait (real time) until the page has a decoded game frame and ticks arriving over /events.
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                ready = browser.evaluate(
                    "(() => { const game = document.getElementById('game');"  # null while loading
                    " return game ? [game.naturalWidth, Number(document.body.dataset.seq || 0)]"
                    " : [0, 0]; })()"
                )
                if ready[0] > 0 and ready[1] > 0:
                    break
                time.sleep(0.5)
            assert ready[0] == 320, f"the game image never loaded in the dashboard: {ready}"
            box = browser.evaluate(
                "(() => { const r = document.getElementById('game').getBoundingClientRect();"
                " return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
            )
            shots, doms = [], []
            for n in range(1, 4):  # two screenshots 2 s apart; a third if a learner update froze the game
                shots.append(browser.screenshot(ARTIFACTS / f"dashboard-{n}.png"))
                doms.append(browser.evaluate("document.documentElement.outerHTML"))
                (ARTIFACTS / f"dashboard-{n}.html").write_text(doms[-1])
                changed = (
                    len(shots) > 1 and np.abs(_game_pixels(shots[-1], box) - _game_pixels(shots[0], box)).mean() > 1
                )
                if changed:
                    break
                time.sleep(2)
            logged, shown = _learning_after_episodes(browser, tmp_path / EPISODES_FILE)
        finally:
            browser.close()

    game = [_game_pixels(shot, box) for shot in shots]
    assert game[0].std() > 10, "the game area of the screenshot is blank"
    assert changed, f"the game image did not change over {2 * (len(shots) - 1)} s"
    first, last = doms[0], doms[-1]
    assert int(_cell(last, "seq")) > int(_cell(first, "seq")), "the tick counter did not advance"
    for dom in (first, last):
        for i in range(8):
            freq, amp = float(_cell(dom, f"stim-freq-{i}")), float(_cell(dom, f"stim-amp-{i}"))
            assert STIM_FREQUENCY_RANGE_HZ[0] - 0.1 <= freq <= STIM_FREQUENCY_RANGE_HZ[1] + 0.1
            assert STIM_AMPLITUDE_RANGE_UA[0] - 0.01 <= amp <= STIM_AMPLITUDE_RANGE_UA[1] + 0.01
            assert float(_cell(dom, f"spike-{i}")) >= 0
        assert _cell(dom, "action") not in ("", "\u2013")
        assert float(_cell(dom, "tick-ms")) >= 0
        assert _cell(dom, "device") == "sim-1"
    assert sum(float(_cell(last, f"spike-{i}")) for i in range(8)) > 0, "no spikes shown"
    # The feedback panel: a row per feedback name sent, Hz and uA within the envelope.
    rows = re.findall(r'<tr id="fb-([A-Za-z0-9_-]+)"', last)
    assert rows, "the feedback panel shows no feedback"
    envelope = SafetyEnvelope()
    for name in rows:
        mean_hz, max_hz = float(_cell(last, f"fb-{name}-mean-hz")), float(_cell(last, f"fb-{name}-max-hz"))
        mean_ua, max_ua = float(_cell(last, f"fb-{name}-mean-ua")), float(_cell(last, f"fb-{name}-max-ua"))
        assert int(_cell(last, f"fb-{name}-sent")) >= 1
        assert envelope.min_frequency_hz - 0.1 <= mean_hz <= max_hz + 0.1 <= envelope.max_frequency_hz + 0.2
        assert envelope.min_amplitude_ua - 0.01 <= mean_ua <= max_ua + 0.01 <= envelope.max_amplitude_ua + 0.02
    # The reply check: which stimulation the counts follow, their correlations, nothing unasked.
    follows = _cell(last, "replies-follow")
    assert follows in ("its own stim", "no stim (no signal)", "too few replies yet"), follows  # never an earlier one
    assert re.fullmatch(r"[+-]\d\.\d\d / [+-]\d\.\d\d", _cell(last, "causality-r")), _cell(last, "causality-r")
    assert _cell(last, "unsolicited") == "0"
    _check_learning(logged, shown)


BUDGET_ENV_STEPS = 100_000
"""The test run's stop.env_steps: the dashboard's budget (the test trains on until it is done)."""
LEARNING_JS = """JSON.stringify({
  curve: window.spikeloopCurve, progress: window.spikeloopProgress,
  dots: (document.querySelector('#curve-return path.dots') || {getAttribute: () => ''}).getAttribute('d'),
  text: Object.fromEntries(['curve-device', 'curve-count', 'progress-env-steps', 'progress-budget', 'progress-limit',
    'progress-limits'].map((id) => [id, document.getElementById(id).textContent]))})"""


def _episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _learning_after_episodes(browser: Chromium, episodes_path: Path, count: int = 3) -> tuple[list, dict]:
    """Wait (real time) until `count` episodes are in episodes.jsonl and all of them on the page's curve, with
    the progress past the env steps of the iteration that logged them; screenshot the learning panel."""
    deadline = time.monotonic() + 120
    logged, shown = [], {}
    while time.monotonic() < deadline:
        logged, shown = _episodes(episodes_path), json.loads(browser.evaluate(LEARNING_JS))
        on_page = set((shown["curve"] or {}).get("episode", []))
        steps = (shown["progress"] or {}).get("env_steps", 0)
        if (
            len(logged) >= count
            and {e["episode_index"] for e in logged} <= on_page
            and steps >= logged[-1]["env_steps_lifetime"]
        ):
            break
        time.sleep(0.5)
    browser.evaluate("document.getElementById('learning').scrollIntoView()")
    browser.screenshot(ARTIFACTS / "dashboard-learning.png")
    (ARTIFACTS / "dashboard-learning.json").write_text(json.dumps(shown, indent=1))
    return logged, shown


def _check_learning(logged: list[dict[str, Any]], shown: dict[str, Any]) -> None:
    """The curve holds episodes.jsonl's returns and kills, its rolling mean is theirs; the progress shows the
    trial's env steps against the stop budget."""
    assert len(logged) >= 3, f"only {len(logged)} episodes logged in episodes.jsonl"
    curve = shown["curve"]
    points = dict(zip(curve["episode"], zip(curve["return"], curve["kills"], strict=True), strict=True))
    for episode in logged:
        assert episode["episode_index"] in points, f"episode {episode['episode_index']} is not on the curve"
        page_return, page_kills = points[episode["episode_index"]]
        assert page_return == pytest.approx(episode["episode_reward"], abs=1e-3), episode
        assert page_kills == episode["kill_count"], episode
    assert curve["device"] == logged[0]["device_id"] == "sim-1" == shown["text"]["curve-device"]
    assert shown["text"]["curve-count"] == str(len(curve["episode"]))
    assert shown["dots"].count("M") == len(curve["episode"]), "a dot per episode on the return plot"
    window = curve["window"]
    assert window == curve_window(len(curve["episode"]))
    assert curve["meanReturn"][-1] == pytest.approx(np.mean(curve["return"][-window:]), abs=1e-6)
    assert curve["killRate"][-1] == pytest.approx(np.mean(np.asarray(curve["kills"][-window:]) > 0), abs=1e-6)
    # Progress: the trial's env steps (at least those of the iteration that logged the last episode) of the budget.
    progress, text = shown["progress"], shown["text"]
    assert progress["env_steps"] >= logged[-1]["env_steps_lifetime"] > 0, (progress, logged[-1])
    assert int(text["progress-env-steps"].replace(",", "")) >= logged[-1]["env_steps_lifetime"], text
    assert text["progress-limit"] == "env steps" and text["progress-budget"] == f"{BUDGET_ENV_STEPS:,}", text
    assert f"of {BUDGET_ENV_STEPS:,} env steps" in text["progress-limits"], text


def test_dashboard_flags_a_late_and_chatty_device():
    """No Ray: the server and publisher an env runner uses, with a culture link's reply check of a device one
    stimulation late that also sent 3 datagrams unasked; the page must say so, in red."""
    meter = CausalityMeter()
    drives = np.random.default_rng(0).permutation([240.0] * 20 + [4.0] * 20)
    for i, drive in enumerate(drives):
        meter.observe(drive, float(drives[i - 1]) if i else 0.0)
    # The device's own account (spikeloop.bridge.device.dose.status_metrics of its device_status): 3 commands refused for its dose.
    dose = {
        "device_dose_max_nc_per_min": 2.88,
        "device_dose_max_nc_session": 4.0,
        "device_dose_refused_stim": 2.0,
        "device_dose_refused_feedback": 1.0,
        "device_refused_stim": 0.0,
        "device_refused_feedback": 0.0,
    }
    publisher = Publisher(
        runner_index=1,
        reply_check=lambda: {"causality": meter.snapshot().as_dict(), "unsolicited": 3, "dose": dose},
    )
    server = LiveViewServer(publisher, ViewSettings(enabled=True, port=0), 0).start()
    browser = Chromium(f"http://127.0.0.1:{server.port}/")
    try:
        deadline = time.monotonic() + 60
        shown = ""
        while time.monotonic() < deadline and shown in ("", "\u2013"):
            shown = browser.evaluate("(document.getElementById('replies-follow') || {}).textContent || ''")
            time.sleep(0.2)
        cells = browser.evaluate(
            "['replies-follow', 'causality-r', 'unsolicited', 'dose-per-min', 'dose-session', 'device-refused']"
            ".map((id) => {"
            " const el = document.getElementById(id); return [el.textContent, el.classList.contains('bad')]; })"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.screenshot(ARTIFACTS / "dashboard-late-device.png")
    finally:
        browser.close()
        server.close()
    follows, r_values, unsolicited, per_min, session, refused = cells
    assert follows == ["an EARLIER stim (1 before)", True], cells
    assert re.fullmatch(r"[+-]0\.\d\d / \+1\.00", r_values[0]) and r_values[1] is False, cells
    assert unsolicited == ["3", True], cells
    assert per_min == ["2.88", False] and session == ["4.00", False], cells
    assert refused == ["3 / 0", True], cells
