"""What a culture link writes into its env runner's session record (`spikeloop.models.closed_loop.session_record`).

The link calls it where things leave or arrive (each exchange, each feedback command, each event); the
callbacks add each env step and each episode's end. Values are recorded as they reached the wire: the
stimulation and the feedback pass through the same safety envelope, with the same policy, as in the bridge.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.device.backends.base import stim_pulses
from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.bridge.wire.channels import SPIKE_GROUPS
from spikeloop.bridge.wire.protocol import MAX_FEEDBACK_CHANNELS, FeedbackCommand, FeedbackType, StimCommand
from spikeloop.bridge.wire.safety import SafetyEnvelope, SafetyViolation
from spikeloop.models.closed_loop.session_record import RecordSettings, SessionRecord, record_path
from spikeloop.models.closed_loop.settings import DeviceSettings

log = logging.getLogger(__name__)


class LinkRecorder:
    """One env runner's session record, fed by its culture link and the callbacks."""

    def __init__(
        self,
        settings: RecordSettings,
        runner_index: int,
        device: DeviceSettings,
        envelope: SafetyEnvelope,
        envelope_policy: str,
        link_settings: Any = None,
    ) -> None:
        self.device = device
        self.envelope = envelope
        self.policy = envelope_policy
        attrs = {
            "runner_index": runner_index,
            "device_id": device.device_id,
            "device_backend": device.backend,
            "device_settings_json": json.dumps(dataclasses.asdict(device), default=str),
            "envelope_json": json.dumps(dataclasses.asdict(envelope), default=str),
            "envelope_policy": envelope_policy,
            "stim_mode": device.stim_mode,
            "tick_frequency_hz": float(device.tick_frequency_hz),
            "spike_group_names": json.dumps(list(SPIKE_GROUPS)),
            "experiment_yaml": settings.experiment_yaml,
        }
        if link_settings is not None:
            loop = {k: getattr(link_settings, k) for k in ("timeout_s", "timeout_policy", "max_consecutive_timeouts")}
            attrs["loop_json"] = json.dumps(loop | {"on_device_loss": link_settings.on_device_loss}, default=str)
        self.record = SessionRecord(record_path(Path(settings.trial_dir), runner_index), attrs, settings.flush_s)
        self.steps = 0
        log.info("env runner %d records the session into %s", runner_index, self.record.path)

    def exchange(self, stim: np.ndarray, sent_wall_s: float, reply: SpikeReply) -> None:
        """One stimulation ([16]: Hz then uA, as the encoder asked) and the reply (or timeout) that answered it."""
        half = len(stim) // 2
        freqs, amps = stim[:half], stim[half:]
        try:
            checked, _ = self.envelope.check_stim(
                StimCommand(reply.stim_timestamp_us, tuple(map(float, freqs)), tuple(map(float, amps))),
                self.policy,  # type: ignore[arg-type]
            )
            freqs, amps = np.asarray(checked.frequencies_hz), np.asarray(checked.amplitudes_ua)
        except (SafetyViolation, ValueError):
            pass  # the bridge refused it: the request is recorded as asked, and `clamped` says why not
        pulses = [stim_pulses(float(f), self.device.tick_frequency_hz, self.device.stim_mode) for f in freqs]
        self.record.append(
            "stim",
            wall_time_s=sent_wall_s,
            stim_timestamp_us=reply.stim_timestamp_us,
            frequency_hz=freqs,
            amplitude_ua=amps,
            pulses=pulses,
            clamped=reply.clamped,
        )
        self.record.append(
            "spikes",
            wall_time_s=time.time(),
            stim_timestamp_us=reply.stim_timestamp_us,
            reply_timestamp_us=reply.reply_timestamp_us or 0,
            counts=reply.counts,
            ok=int(reply.ok),
            latency_ms=reply.latency_s * 1e3,
        )

    def feedback(self, commands: list[FeedbackCommand]) -> None:
        """Feedback commands handed to the bridge, as the envelope lets them out."""
        now = time.time()
        for command in commands:
            sent: FeedbackCommand | None = command
            if command.feedback_type != FeedbackType.INTERRUPT:
                try:
                    sent, _ = self.envelope.check_feedback(command, self.policy)  # type: ignore[arg-type]
                except SafetyViolation:
                    sent = None
            shown = sent or command
            channels = np.full(MAX_FEEDBACK_CHANNELS, -1, dtype=np.int16)
            channels[: len(shown.channels)] = shown.channels
            self.record.append(
                "feedback",
                wall_time_s=now,
                timestamp_us=command.timestamp_us,
                kind=int(command.feedback_type),
                name=command.event_name,
                channels=channels,
                frequency_hz=float(shown.frequency_hz),
                amplitude_ua=float(shown.amplitude_ua),
                pulses=int(shown.pulses),
                unpredictable=int(command.unpredictable),
                sent=int(sent is not None),
            )

    def events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Events handed to the bridge (episode_end, training_complete)."""
        now = time.time()
        for kind, data in events:
            self.record.append("events", wall_time_s=now, type=kind, data_json=json.dumps(data, default=str))

    def step(self, episode_step: int, action: int, reward: float) -> None:
        """One env step: the action taken and the reward it got."""
        self.steps += 1
        self.record.append(
            "steps",
            wall_time_s=time.time(),
            step=self.steps,
            episode_step=episode_step,
            action=action,
            reward=reward,
            stim_rows=self.record.rows("stim"),
        )

    def episode_end(self, episode: int, length: int, episode_return: float, kills: int, terminated: bool) -> None:
        """An episode's end: its number in the trial and where its steps end."""
        self.record.append(
            "episodes",
            wall_time_s=time.time(),
            episode=episode,
            last_step=self.steps,
            length=length,
            **{"return": episode_return},
            kills=kills,
            terminated=int(terminated),
        )

    def close(self) -> None:
        """Flush and close the file."""
        self.record.close()
