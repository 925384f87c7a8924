"""The `protocol:` section of an experiment, and what it fixes in the rest of the experiment.

`protocol: {design: rest-play-rest, ...}` (or just `protocol: rest-play-rest`) runs each trial as a session
of three phases of set length in culture time: rest (record-only exchanges: no stimulation), play (the
training loop, with feedback), rest again. Culture time is counted in exchanges: each stimulation (or rest
tick) lasts the device's artifact wait plus collection window (100 ms at the reference timing), which is the
simulated culture's own clock and, at 10 exchanges a second, a CL1's wall clock while it plays.

So that only the culture can change, the protocol fixes the path from stimulation to action (`FROZEN_MODEL`):
the encoder is frozen and deterministic (each Beta's mean, log-probability 0) on raw features (no running
normalisation), the decoder is the fixed `motor_map` readout (models/decoder.py) on raw spike counts (no
running mean or std), never trained. The value net still learns: it is not on that path, and the feedback's
surprise scaling needs it (feedback answers |TD error| over its running baseline, as the reference trainer's
does). An experiment that sets any of these keys to another value is refused with the key path.

`condition` picks one of four paired conditions (the same seeds in each make the pairs):

- `feedback`: the culture plays and gets the experiment's feedback (the one that can learn);
- `no_feedback`: the culture plays, no feedback datagram is ever sent (as with `feedback.enabled: false`);
- `stimulus_only`: the culture is stimulated by the game exactly as in `feedback`, its answer is recorded but
  does not drive the game (the decoder sees zeros, `ablation: zero`, so every action is equally likely), and no
  feedback is sent: stimulation without a closed loop;
- `no_cells`: no culture at all: every simulated device becomes the `zero` backend (every count 0, so the
  actions are chance, as in `stimulus_only`), feedback as in `feedback`. With cl1 devices it is refused: there,
  run a dish without cells under `feedback`.

A condition's keys (`feedback.enabled`, `ablation`, the device backend) keep the values the file gives, and
the condition is applied where the run is built (`condition_*` below), so that one resolved experiment serves a
sweep over the conditions; a value that contradicts the condition (feedback off under `feedback`, an
`ablation`, a `zero` device, a cl1 device under `no_cells`) is refused. protocol.json records what ran
(`condition_applied`).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spikeloop.bridge.wire.settings import MAX_PROTOCOL_PHASE_S
from spikeloop.models.closed_loop.feedback import FeedbackSettings
from spikeloop.models.closed_loop.settings import DeviceSettings

DESIGN = "rest-play-rest"
Condition = Literal["feedback", "no_feedback", "stimulus_only", "no_cells"]
CONDITIONS: tuple[str, ...] = ("feedback", "no_feedback", "stimulus_only", "no_cells")

FROZEN_MODEL: dict[str, Any] = {
    "encoder_trainable": False,
    "decoder_frozen": True,
    "decoder_init": "motor_map",
    "decoder_type": "linear",
    "decoder_nonnegative": False,
    "decoder_bias": False,
    "spike_mean_mode": "off",
    "spike_scaling": False,
    "feature_normalization": False,
}
"""`model.*` values the protocol fixes: nothing on the path from stimulation to action adapts or learns."""

CONDITION_FEEDBACK = {"feedback": True, "no_feedback": False, "stimulus_only": False, "no_cells": True}
"""`feedback.enabled` under each condition."""
CONDITION_ABLATION = {"feedback": "none", "no_feedback": "none", "stimulus_only": "zero", "no_cells": "none"}
"""`ablation` (what the decoder sees) under each condition."""
NO_CELLS_BACKEND = "zero"

SIMULATED = ("sim", "random", "zero", "transparent")


class ProtocolSection(BaseModel):
    """A rest-play-rest session per trial; lengths in seconds of culture time (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    design: Literal["rest-play-rest"] = DESIGN
    condition: Condition = Field("feedback", description="feedback | no_feedback | stimulus_only | no_cells")
    rest_before_s: float = Field(
        300.0, gt=0, le=MAX_PROTOCOL_PHASE_S, description="spontaneous activity recorded before play"
    )
    play_s: float = Field(
        1200.0, gt=0, le=MAX_PROTOCOL_PHASE_S, description="play with the game (whole training iterations: rounded up)"
    )
    rest_after_s: float = Field(
        300.0, gt=0, le=MAX_PROTOCOL_PHASE_S, description="spontaneous activity recorded after play"
    )
    early_s: float = Field(
        300.0, gt=0, le=MAX_PROTOCOL_PHASE_S, description="episodes within the first early_s of play: early play"
    )
    late_s: float = Field(
        900.0, gt=0, le=MAX_PROTOCOL_PHASE_S, description="episodes within the last late_s of play: late play"
    )
    rest_settle_s: float = Field(
        10.0,
        ge=0,
        le=MAX_PROTOCOL_PHASE_S,
        description="the start of each rest, recorded but left out of the statistics: play's after-effects",
    )
    rest_block_s: float = Field(
        5.0,
        gt=0,
        le=MAX_PROTOCOL_PHASE_S,
        description="block length of the rest bootstrap: longer than the activity's memory",
    )
    bootstrap_resamples: int = Field(10000, ge=1000, le=1_000_000)

    @model_validator(mode="after")
    def _windows_fit(self) -> ProtocolSection:
        if self.early_s + self.late_s > self.play_s:
            raise ValueError(
                f"early_s + late_s ({self.early_s:g} + {self.late_s:g} s) is longer than play_s ({self.play_s:g} s): "
                "early and late play must not overlap"
            )
        shortest = min(self.rest_before_s, self.rest_after_s) - self.rest_settle_s
        if self.rest_block_s * 2 > shortest:
            raise ValueError(
                f"rest_block_s ({self.rest_block_s:g} s) must fit at least twice in each rest after its "
                f"rest_settle_s ({shortest:g} s left)"
            )
        return self


def _refuse(path: str, value: Any, wanted: Any, why: str) -> None:
    raise ValueError(f"{path}: {value!r} contradicts the protocol, which sets {wanted!r} ({why}); leave the key out")


def apply_protocol(data: Any) -> Any:
    """Raw experiment data with the protocol's model settings applied; ValueError (key path first) on a contradiction.

    Runs before validation, on what the file (and `--set`) wrote: only there can an explicit value be told from
    a default. The frozen model keys are written into the data, so the resolved experiment shows them and
    validates again unchanged. The condition's keys are left as written (checked here, applied where the run is
    built: `condition_ablation`, `condition_feedback`, `condition_devices`), so that one resolved experiment
    serves a sweep over every condition.
    """
    if not isinstance(data, dict) or data.get("protocol") is None:
        return data
    data = dict(data)
    protocol = data["protocol"]
    if protocol == DESIGN:
        protocol = {"design": DESIGN}
    if not isinstance(protocol, dict):
        raise ValueError(f"protocol: write `protocol: {DESIGN}` or a mapping of its settings (got {protocol!r})")
    data["protocol"] = protocol
    condition = protocol.get("condition", "feedback")
    if condition not in CONDITIONS:
        return data  # the section's own validation names the allowed values
    if data.get("policy", "closed_loop") != "closed_loop":
        raise ValueError("policy: the protocol measures a culture; policy direct has none (use closed_loop)")

    model = data.get("model") or {}
    if not isinstance(model, dict):
        return data
    for key, wanted in FROZEN_MODEL.items():
        if key in model and model[key] != wanted:
            _refuse(
                f"model.{key}",
                model[key],
                wanted,
                "the stimulation-to-action mapping is fixed: only the culture may change",
            )
    data["model"] = {**model, **FROZEN_MODEL}

    feedback = data.get("feedback")
    if isinstance(feedback, dict) and feedback.get("enabled", True) is not True and CONDITION_FEEDBACK[condition]:
        _refuse(
            "feedback.enabled",
            feedback["enabled"],
            True,
            f"protocol.condition {condition} sends feedback; no_feedback is the control without",
        )
    if data.get("ablation", "none") != "none":
        _refuse(
            "ablation",
            data["ablation"],
            "none",
            "protocol.condition decides what the decoder sees: stimulus_only is the control whose decoder sees zeros",
        )
    for i, dev in enumerate(data.get("devices") or []):
        backend = dev.get("backend", "sim") if isinstance(dev, dict) else None
        if backend == NO_CELLS_BACKEND:
            raise ValueError(
                f"devices.{i}.backend: {NO_CELLS_BACKEND} is the no-cells control; with the protocol, keep the "
                "culture's device and set protocol.condition: no_cells"
            )
        if condition == "no_cells" and backend is not None and backend not in SIMULATED:
            raise ValueError(
                f"devices.{i}.backend: protocol.condition no_cells replaces the culture with the {NO_CELLS_BACKEND} "
                f"backend, started here; a {backend} device is a real dish: run one without cells under condition "
                "feedback instead, or list a sim device"
            )

    stop = data.get("stop")
    if stop is not None:
        given_stop = {k: v for k, v in stop.items() if v is not None} if isinstance(stop, dict) else stop
        if not isinstance(given_stop, dict) or set(given_stop) - {"env_steps"}:
            raise ValueError(
                f"stop: {stop!r} contradicts the protocol, whose play lasts protocol.play_s of culture time (the "
                "run stops after it); set the play's length there and leave stop out"
            )
    return data


def condition_ablation(protocol: ProtocolSection | None, ablation: str) -> str:
    """What the decoder sees: the experiment's `ablation`, or the condition's under the protocol."""
    return ablation if protocol is None else CONDITION_ABLATION[protocol.condition]


def condition_feedback(protocol: ProtocolSection | None, feedback: FeedbackSettings) -> FeedbackSettings:
    """The feedback the run sends: none at all under no_feedback and stimulus_only."""
    if protocol is None or CONDITION_FEEDBACK[protocol.condition]:
        return feedback
    return replace(feedback, enabled=False)


def condition_devices(
    protocol: ProtocolSection | None, devices: tuple[DeviceSettings, ...]
) -> tuple[DeviceSettings, ...]:
    """The devices the run starts: under no_cells the zero backend in place of each (simulated) culture."""
    if protocol is None or protocol.condition != "no_cells":
        return devices
    # A simulated culture's own knobs, where the device holds them, do not apply to no culture.
    knobs = {"culture": None} if "culture" in {f.name for f in fields(devices[0])} else {}
    return tuple(replace(d, backend=NO_CELLS_BACKEND, **knobs) for d in devices)


def tick_s(devices) -> float:
    """Culture time of one exchange: the longest artifact wait + collection window of the experiment's devices."""
    return max(d.artifact_wait_ms + d.collect_window_ms for d in devices) / 1000.0


def whole(count: float) -> int:
    """A whole number of exchanges for a culture-time span (300 s / 0.1 s is 3000, not 3001)."""
    return max(1, math.ceil(count - 1e-9))


def play_env_steps(protocol: ProtocolSection, devices, rounds: int, env_runners: int) -> int:
    """The run's stop: env steps of all env runners together for `play_s` of culture time on each culture."""
    per_culture = whole(protocol.play_s / (tick_s(devices) * rounds))
    return per_culture * max(1, env_runners)


def check_timing(protocol: ProtocolSection, devices) -> None:
    """Culture time needs exchanges that last: refuse devices whose windows are 0 ms."""
    if tick_s(devices) <= 0:
        raise ValueError(
            "protocol: culture time is counted in exchanges of artifact_wait_ms + collect_window_ms, and the "
            "devices' windows are 0 ms; give them windows (the reference: 50 + 50 ms)"
        )
