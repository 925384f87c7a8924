"""The culture an env runner drives: which device, its bridge, its feedback policy.

Each env runner process holds exactly one `CultureLink` (one culture cannot
serve two games). It is opened when the env runner creates its environment
(`ClosedLoopCallbacks.on_environment_created`, which knows the runner's index)
and used by the culture connector (stimulation -> spikes) and the callbacks
(feedback and events). For `sim`, `random` and `zero` devices it also starts
the device itself, on the env runner's node, with free ports.

Every reply also feeds the link's reply check: running (partial) correlations
of each reply's total count with the drive of the stimulation it answers and of
the ones before it (`spikeloop.bridge.trainer.causality`), and the bridge's count of datagrams
that answered no stimulation (`SpikeReply.unsolicited`). `log_reply_check` puts them on
TensorBoard (`loop/causality_r_current`, `loop/causality_r_previous`,
`loop/unsolicited`); `reply_check` gives them to the live view. With `meter.enabled` the link also holds the
live information meter (`meter`, models/closed_loop/meter.py), which the culture connector feeds.

When a device stops answering (`max_consecutive_timeouts` in a row) and the
experiment says stop, the link raises `DeviceLost` with what was observed and
what to check, and leaves the same report in Ray's key-value store: RLlib ends
an env runner whose sampling raised by exiting its process, so the driver only
sees the actor die and reads the report from there (`device_loss_report`).

When the experiment says wait, the step that found the device lost blocks
instead: the link probes the device with stimulations of all zeros (which a
device answers without stimulating, docs/protocol.md) at most once every
`PROBE_INTERVAL_S`, and once one is answered it sends the step's own
stimulation again, so the step acts on the answer to it, never on zeros. Each
outage is counted with the time waited (`counts`: `device_outages`,
`device_outage_ms`, `device_probes`; TensorBoard's `device/outages` and
`device/outage_s`) and kept for the episode it fell in (`pop_episode_outages`). If no probe is answered within `max_wait_s`, the link
stops as with stop.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import ray

from spikeloop.bridge.trainer.actor import start_bridge
from spikeloop.bridge.trainer.causality import CausalityMeter, stim_drive
from spikeloop.bridge.trainer.client import BridgeClient
from spikeloop.bridge.trainer.core import BridgeConfig, SpikeReply
from spikeloop.bridge.wire.ports import free_port
from spikeloop.bridge.wire.protocol import FeedbackCommand
from spikeloop.models.closed_loop.feedback import FeedbackPolicy, within_budget
from spikeloop.models.closed_loop.meter import CultureMeter
from spikeloop.models.closed_loop.recorder import LinkRecorder
from spikeloop.models.closed_loop.sent_feedback import SentFeedback
from spikeloop.models.closed_loop.settings import CultureSettings, DeviceSettings
from spikeloop.models.ray_internals import kv_items, kv_put

log = logging.getLogger(__name__)

BRIDGE_START_WAIT_S = 60.0
"""How long an env runner waits for its device's bridge: the previous trial's may still be shutting down."""
CAUSALITY_WINDOW = 500
"""Stimulations the training-time correlations follow (exponentially weighted): about 50 s at 10 Hz, several
iterations' worth, so that they settle yet still show a device that turns late."""
PROBE_INTERVAL_S = 1.0
"""`on_device_loss: wait`: probes of a lost device start at most this often (each waits out a reply's horizon)."""
LOSS_KEY_PREFIX = "spikeloop/device-lost/"
"""Ray key-value keys of device-loss reports: prefix + placement group (the trial's) + device id."""


class DeviceLost(RuntimeError):
    """A device stopped answering and the experiment says to stop."""


class DeviceBusy(RuntimeError):
    """Another env runner already drives this device."""


class CultureLink:
    """This env runner's culture: stimulation and spikes (`tick.Culture`), feedback, events, statistics."""

    def __init__(self, settings: CultureSettings, runner_index: int, gamma: float) -> None:
        self.settings = settings
        self.runner_index = runner_index
        self.feedback_policy = FeedbackPolicy(settings.feedback, gamma)
        self.sent_feedback = SentFeedback(settings.envelope, settings.envelope_policy)
        self.counts: Counter[str] = Counter()
        self.consecutive_timeouts = 0
        self._episode_outages: list[dict[str, float]] = []  # outages since the last episode end (wait)
        self._stim = np.zeros(0, dtype=np.float32)  # the stimulation awaiting its reply (sent again after an outage)
        self._feedback_this_step = 0  # commands sent since the last stimulation (the per-step budget)
        self._latency_ms_by_stim: dict[int, float] = {}  # filled only with settings.step_log
        self._device_actor = None
        self._bridge_config: BridgeConfig | None = None
        self._loss_key = _loss_key_scope()
        self._busy_s = 0.0
        self._t_sent = 0.0
        self._stim_drive = 0.0  # the drive of the stimulation awaiting its reply (spikeloop.bridge.trainer.causality)
        self._stim_sent: tuple[np.ndarray, float] | None = None  # (stim, wall time) awaiting its reply, for the record
        self.last_stim_us = 0
        """The stamp of the last stimulation exchanged (probes aside): where a kept iteration ends on the device."""
        self.recorder: LinkRecorder | None = None
        """This env runner's session record (`output.record`), attached by the callbacks; None: off."""
        self.causality = CausalityMeter(window=CAUSALITY_WINDOW)
        self.meter: CultureMeter | None = CultureMeter(settings.meter) if settings.meter.enabled else None
        """The live information meter (`meter.enabled`), fed by the culture connector; None: off."""
        self.unsolicited = 0
        """Datagrams from the device that answered no stimulation, as of the last reply (the bridge's count)."""
        self.device_dose: dict[str, float] = {}
        """The device's own dose figures (spikeloop.bridge.device.dose.status_metrics) as of the last episode end; {}: none yet."""
        self._opened = time.monotonic()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._owner = f"env-runner-{runner_index}@{self._node_id[:8]}:{os.getpid()}"
        if settings.devices[0].simulated:
            self.device = settings.simulated_device_for(runner_index)
            self.bridge = self._claim(self._start_simulated(self.device))
        else:
            self.device, self.bridge = self._claim_device_on_this_node()
        log.info("env runner %d drives device %s (%s)", runner_index, self.device.device_id, self.device.backend)

    def _start_simulated(self, dev: DeviceSettings):
        """Start this runner's simulated device and its bridge, both on this node."""
        from spikeloop.bridge.trainer.device_actor import start_simulated_device

        spike_port = free_port(dev.address.bind_host)
        self._device_actor = start_simulated_device(
            dev.device_config(spike_port, self.settings.envelope), node_id=self._node_id
        )
        ports = ray.get(self._device_actor.ports.remote())
        # A fresh name per process: two trials must never share a simulated culture's bridge.
        # The device runs beside the bridge: it listens on the bind host, on the ports it bound.
        address = replace(dev.address, host=dev.address.bind_host, spike_port=spike_port, **ports)
        config = replace(
            self.settings.bridge_config(dev), device_id=f"{dev.device_id}-{uuid.uuid4().hex[:8]}", address=address
        )
        self._bridge_config = config
        return start_bridge(config, node_id=self._node_id)

    def _claim_device_on_this_node(self) -> tuple[DeviceSettings, BridgeClient]:
        """Take the first free hardware device whose resource this node advertises."""
        node = next(n for n in ray.nodes() if n["NodeID"] == self._node_id)
        candidates = self.settings.devices_on_node(node.get("Resources", {}))
        if not candidates:
            wanted = ", ".join(d.resource for d in self.settings.devices)
            raise RuntimeError(
                f"env runner {self.runner_index} landed on node {self._node_id[:8]} which owns none of the "
                f"experiment's devices ({wanted}); start each device's node with "
                f'`ray start --resources=\'{{"<device resource>": 1, "cl1_slot": 1}}\'`'
            )
        holders = []
        for dev in candidates:
            wanted = self.settings.bridge_config(dev)
            actor, running = _running_bridge(wanted, dev)
            if running != wanted:
                raise RuntimeError(
                    f"a bridge for device {dev.device_id!r} is already running with other settings "
                    f"({running}); stop the experiment that uses it first"
                )
            try:
                client = self._claim(actor)
            except DeviceBusy as exc:
                holders.append(str(exc))
                continue
            self._bridge_config = wanted
            return dev, client
        raise RuntimeError(f"every device on node {self._node_id[:8]} is taken: {'; '.join(holders)}")

    def _claim(self, actor) -> BridgeClient:
        """Take a bridge for this env runner (one culture serves one game)."""
        holder = ray.get(actor.claim.remote(self._owner))
        if holder is not None:
            raise DeviceBusy(f"the device is already driven by {holder}; one culture serves one game")
        return BridgeClient(actor, fast_path=self.settings.fast_path)

    # --- the tick ------------------------------------------------------------------

    def send_stim(self, stim: np.ndarray) -> None:
        """Send one stimulation ([16]: Hz then uA) and return at once; `receive_spikes` returns the answer."""
        self._feedback_this_step = 0  # a new step: the feedback budget starts again
        self._send(stim)

    def _send(self, stim: np.ndarray) -> None:
        self._t_sent = time.perf_counter()
        self._stim = stim
        half = len(stim) // 2
        self.bridge.send_exchange(stim[:half], stim[half:])
        self._stim_drive = stim_drive(stim[:half], stim[half:])  # while the culture answers
        if self.recorder is not None:
            self._stim_sent = (np.array(stim, dtype=np.float32), time.time())

    def receive_spikes(self) -> SpikeReply:
        """The culture's answer to the stimulation `send_stim` sent; counts timeouts and device loss.

        A lost device stops the trial (`DeviceLost`), is ridden through on zeros, or is waited for (see the module
        docstring), as `on_device_loss` says.
        """
        reply = self._receive()
        while self.consecutive_timeouts >= self.settings.max_consecutive_timeouts:
            self.counts["device_lost"] += 1
            message = self.loss_message()
            if self.settings.on_device_loss == "stop":
                message += " Stopping, as loop.on_device_loss is 'stop'."
                _report_loss(self._loss_key, self.device.device_id, message)
                raise DeviceLost(message)
            if self.settings.on_device_loss == "continue":
                log.error("%s Continuing, as loop.on_device_loss is 'continue'.", message)
                self.consecutive_timeouts = 0
                break
            self._wait_for_device(message)
            # Answering again: this step's own stimulation goes again and the step acts on its answer.
            self._send(self._stim)
            reply = self._receive()
        return reply

    def _receive(self) -> SpikeReply:
        """Take the reply of the stimulation in flight and count it."""
        reply = self.bridge.receive_reply()
        self._busy_s += time.perf_counter() - self._t_sent
        self.counts["exchanges"] += 1
        self.causality.observe(self._stim_drive, float(reply.counts.sum()) if reply.ok else None)
        self.unsolicited = reply.unsolicited
        self.last_stim_us = max(self.last_stim_us, reply.stim_timestamp_us)
        if self.recorder is not None and self._stim_sent is not None:
            self.recorder.exchange(*self._stim_sent, reply)
        if self.settings.step_log:
            self._latency_ms_by_stim[reply.stim_timestamp_us] = reply.latency_s * 1e3
        if reply.ok:
            self.consecutive_timeouts = 0
        else:
            self.counts["timeouts"] += 1
            self.consecutive_timeouts += 1
            log.warning(
                "device %s: stimulation %d timed out (%d in a row)",
                self.device.device_id,
                reply.stim_timestamp_us,
                self.consecutive_timeouts,
            )
        return reply

    def _wait_for_device(self, message: str) -> None:
        """Block, probing the lost device with stimulations of all zeros, until one is answered (`wait`).

        Raises DeviceLost, as with stop, when none is answered within `max_wait_s`.
        """
        max_wait_s = self.settings.max_wait_s
        device_id = self.device.device_id
        log.error(
            "%s Waiting up to %g s for it to answer again, as loop.on_device_loss is 'wait' (probing with a "
            "stimulation of all zeros, which stimulates nothing, about every %g s).",
            message,
            max_wait_s,
            max(PROBE_INTERVAL_S, self.settings.timeout_s),
        )
        lost_wall, started = time.time(), time.monotonic()
        zeros = np.zeros(len(self._stim) // 2, dtype=np.float32)
        probes = 0
        while True:
            probe_started = time.monotonic()
            self.bridge.send_exchange(zeros, zeros)
            answered = self.bridge.receive_reply().ok
            probes += 1
            self.counts["device_probes"] += 1
            waited_s = time.monotonic() - started
            if answered:
                break
            if waited_s >= max_wait_s:
                self._count_outage(lost_wall, waited_s, probes)
                message += (
                    f" It did not answer any of {probes} probes within loop.max_wait_s ({max_wait_s:g} s). Stopping, "
                    "as loop.on_device_loss 'wait' does after max_wait_s."
                )
                _report_loss(self._loss_key, device_id, message)
                raise DeviceLost(message)
            time.sleep(max(0.0, min(PROBE_INTERVAL_S - (time.monotonic() - probe_started), max_wait_s - waited_s)))
        self.consecutive_timeouts = 0
        self._count_outage(lost_wall, waited_s, probes)
        log.warning(
            "device %s answered again after %.1f s (%d probe(s)); the loop resumes with the stimulation of the step "
            "that found it lost",
            device_id,
            waited_s,
            probes,
        )

    def _count_outage(self, lost_wall: float, waited_s: float, probes: int) -> None:
        self.counts["device_outages"] += 1
        self.counts["device_outage_ms"] += round(waited_s * 1000)  # a Counter of whole numbers
        self._episode_outages.append({"lost_wall": lost_wall, "waited_s": waited_s, "probes": probes})

    def pop_episode_outages(self) -> list[dict[str, float]]:
        """The outages waited out since the last call (when each began, how long it lasted, the probes sent)."""
        outages, self._episode_outages = self._episode_outages, []
        return outages

    def loss_message(self) -> str:
        """What a lost device looks like from here: where it is, what was seen, what to check."""
        config = self._bridge_config
        try:
            stats = self.bridge.stats()
        except Exception as exc:  # the message must not hide the loss behind a second failure
            stats = {"error": f"{type(exc).__name__}: {exc}"}
        now = time.time()
        dev = self.device
        address = config.address if config else dev.address
        host, bind = address.host, address.bind_host
        ports = (address.stim_port, address.feedback_port, address.event_port)
        spike = stats.get("spike_port") or address.spike_port
        bind = stats.get("bind_host") or bind  # bind_host auto: where the bridge found the interface
        last = stats.get("last_reply_wall")
        seen = (
            f"the last reply came at {_clock(last)} ({now - last:.1f} s ago), after {stats.get('ok', 0)} answered"
            if last
            else "no reply came at all since this env runner opened the device"
        )
        heard = stats.get("last_heard_wall")
        if stats.get("last_foreign_source") and heard and (last is None or heard > last + 1e-3):
            seen += (
                f"; datagrams kept coming from {stats['last_foreign_source']}, refused as not from the reply "
                f"source {stats.get('reply_source')} (devices.N.reply_port)"
            )
        elif heard is None or last is None or heard <= last + 1e-3:
            seen += "; nothing at all has come from the device host since"
        timeout_ms = self.settings.timeout_s * 1000
        return (
            f"device {dev.device_id!r} did not answer {self.consecutive_timeouts} stimulations in a row "
            f"(timeout {timeout_ms:.0f} ms each): {dev.backend} at {host}, stimulation port {ports[0]}, feedback "
            f"port {ports[1]}, event port {ports[2]}, replies expected on {bind}:{spike}; {seen}. Check that the "
            f"device program is still running on {host} and listening on port {ports[0]}, that it sends its "
            f"replies to this machine's port {spike} (the device's --training-host and --spike-port), and that "
            f"nothing drops UDP between them; `spikeloop check EXP.yaml` probes the device."
        )

    def send_feedback(self, step: list[FeedbackCommand], episode: list[FeedbackCommand] = ()) -> None:
        """Send one step's feedback (and, when the episode ended, its episode feedback) ahead of the next stimulation.

        The one way feedback leaves: at most `feedback.max_datagrams_per_step` commands per step, the episode's
        kept first (`within_budget`); what is dropped is counted.
        """
        if not step and not episode:
            return
        budget = max(0, self.settings.feedback.max_datagrams_per_step - self._feedback_this_step)
        sent, dropped = within_budget(list(step), list(episode), budget)
        self._feedback_this_step += len(sent)
        self.counts["feedback_commands"] += len(sent)
        if dropped:
            self.counts["feedback_dropped"] += dropped
        self.bridge.send_feedback(sent)
        self.sent_feedback.record(sent)  # Hz and uA as they left (feedback/<name>/*_hz, *_ua)
        if self.recorder is not None:
            self.recorder.feedback(sent)

    def send_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Send events (`episode_end`, `training_complete`) now, after any feedback the bridge client holds back."""
        self.counts["events"] += len(events)
        self.bridge.send_events(events)
        if self.recorder is not None:
            self.recorder.events(events)

    def pop_latencies_ms(self, stim_timestamps_us: np.ndarray) -> np.ndarray:
        """The exchange latencies of these stimulations (NaN where unknown); forgets every kept latency."""
        kept, self._latency_ms_by_stim = self._latency_ms_by_stim, {}
        return np.array([kept.get(int(t), np.nan) for t in stim_timestamps_us], dtype=np.float32)

    def reply_check(self) -> dict[str, Any]:
        """Which stimulation the replies follow, how many datagrams answered none, the device's dose (live view)."""
        return {
            "causality": self.causality.snapshot().as_dict(),
            "unsolicited": self.unsolicited,
            "dose": dict(self.device_dose),
        }

    def duty(self) -> float:
        """Share of wall time spent in exchanges since the link opened."""
        wall = time.monotonic() - self._opened
        return self._busy_s / wall if wall > 0 else 0.0

    def stats(self) -> dict[str, Any]:
        """Bridge statistics plus this link's counters."""
        return self.bridge.stats() | {"link": dict(self.counts), "duty_link": self.duty()}

    def close(self) -> None:
        """Close the fast path and stop a simulated device (the bridge actor stays for other users)."""
        if self.recorder is not None:
            self.recorder.close()  # first: whatever fails below, the record is whole
        try:
            ray.get(self.bridge.actor.release.remote(self._owner), timeout=10)
        except Exception as exc:
            log.warning("could not release device %s: %s", self.device.device_id, exc)
        self.bridge.close()
        if not self.device.simulated:
            # Ray ends an actor once its creator holds no handle to it; a hardware device's bridge must
            # outlive this link (the next link, `spikeloop watch` and tools find it by name).
            _RETAINED_BRIDGES[self.device.device_id] = self.bridge.actor
        if self._device_actor is not None:
            try:
                ray.get(self._device_actor.stop.remote(), timeout=10)
            except Exception as exc:  # closing must not hide the error that led here
                log.warning("could not stop simulated device %s: %s", self.device.device_id, exc)


def log_reply_check(metrics_logger: Any, link: CultureLink) -> None:
    """The reply check's TensorBoard values (`loop/causality_r_current`, `_previous`, `loop/unsolicited`).

    The correlations are over about the last CAUSALITY_WINDOW stimulations (left out until defined: constant
    counts, as the zero ablation's, have none); `unsolicited` counts since the bridge started, as `loop/stale` does.
    """
    causality = link.causality.snapshot()
    for key, r in (("causality_r_current", causality.r_current), ("causality_r_previous", causality.r_previous)):
        if math.isfinite(r):
            metrics_logger.log_value(f"culture/{key}", r, window=1)
    metrics_logger.log_value("culture/unsolicited", link.unsolicited, reduce="max", window=1)


_LINK: CultureLink | None = None
_RETAINED_BRIDGES: dict[str, Any] = {}
"""Hardware bridge actors this process found or created, kept alive after their link closed."""


def _running_bridge(wanted: BridgeConfig, dev: DeviceSettings):
    """The device's bridge actor and its settings, started here if none runs.

    The previous trial's bridge may still be going away (Ray ends it with the env runner that created it) and
    hold the name or the spike port for a moment: wait for it, up to `BRIDGE_START_WAIT_S`.
    """
    deadline = time.monotonic() + BRIDGE_START_WAIT_S
    while True:
        actor = start_bridge(wanted, resource=dev.resource)
        try:
            return actor, ray.get(actor.get_config.remote(), timeout=BRIDGE_START_WAIT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the bridge for device {dev.device_id!r} ({dev.describe()}) did not start within "
                    f"{BRIDGE_START_WAIT_S:.0f} s: {exc}"
                ) from None
            time.sleep(0.5)


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 10)}"


def _loss_key_scope() -> str:
    """What names this env runner's trial in loss reports: its placement group (empty outside one)."""
    try:
        group = ray.util.get_current_placement_group()
    except Exception:
        group = None
    return group.id.hex() if group is not None else ""


def _report_loss(scope: str, device_id: str, message: str) -> None:
    """Leave a device-loss report where the driver finds it (see the module docstring)."""
    try:
        record = {"device_id": device_id, "message": message, "wall": time.time()}
        kv_put(f"{LOSS_KEY_PREFIX}{scope}/{device_id}", json.dumps(record))
    except Exception as exc:  # the raise that follows still names the device in this runner's log
        log.warning("could not leave the device-loss report for the driver: %s", exc)


def device_loss_report(since_wall: float) -> str | None:
    """The newest device-loss message of this process's trial (its placement group) since `since_wall`, if any."""
    records = []
    for raw in kv_items(f"{LOSS_KEY_PREFIX}{_loss_key_scope()}/").values():
        record = json.loads(raw)
        if record.get("wall", 0) >= since_wall:
            records.append(record)
    return max(records, key=lambda r: r["wall"])["message"] if records else None


def open_link(settings: CultureSettings, runner_index: int, gamma: float) -> CultureLink:
    """Open this process's culture link (once; later calls return the same link)."""
    global _LINK
    if _LINK is None:
        _LINK = CultureLink(settings, runner_index, gamma)
    return _LINK


def current_link() -> CultureLink:
    """This process's culture link; an error if the env runner never opened one."""
    if _LINK is None:
        raise RuntimeError(
            "no culture link in this process: ClosedLoopCallbacks must be the algorithm's callbacks "
            "(it opens the link when the env runner creates its environment)"
        )
    return _LINK


def close_link() -> None:
    """Close and forget this process's link."""
    global _LINK
    if _LINK is not None:
        _LINK.close()
        _LINK = None
