"""The experiment YAML: schema, validation, `--set` overrides, and what it builds.

Every section is checked before Ray starts: unknown keys, wrong types and
out-of-range values fail with the key path and what is allowed. Defaults are
not retyped here: sections that mirror a settings dataclass (safety envelope,
feedback, devices, model, meter) validate straight into that dataclass, and the `env`
section is derived from `DoomEnv`'s constructor, so the code stays the one
source of truth for every default. A device's address (`spikeloop.bridge.wire.address.DeviceAddress`:
host, its ports, bind_host) is written flat under the device; the fields that
are nested into its `address` come from that dataclass, not from a list here.

Top-level sections: name, seed, devices, loop, safety, feedback, env, model,
ablation, policy, ppo, resources, stop, checkpoint, tune, output, view, meter, protocol
(experiments/protocol/settings.py: what it fixes in the other sections).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from spikeloop.bridge.device.simulated_culture import SimulatedCultureConfig
from spikeloop.bridge.wire.address import DeviceAddress
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ELECTRODES
from spikeloop.bridge.wire.safety import SafetyEnvelope, SafetyViolation
from spikeloop.bridge.wire.settings import (
    ENVELOPE_POLICY,
    FAST_PATH,
    MAX_CONSECUTIVE_TIMEOUTS,
    MAX_SAMPLE_TIMEOUT_S,
    MAX_WAIT_S,
    ON_DEVICE_LOSS,
    REPLY_SPIN_MS,
    SEED_LIMIT,
    TIMEOUT_POLICY,
    TIMEOUT_S,
    Setting,
)
from spikeloop.experiments import exposure
from spikeloop.experiments.design.settings import DesignSection
from spikeloop.experiments.dotted import get_path
from spikeloop.experiments.live_view.progress import RunBudget
from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.experiments.protocol import settings as protocol_settings
from spikeloop.experiments.schema_types import shown, shown_path, type_problems
from spikeloop.experiments.yaml_reader import KeyNotAName, load_yaml
from spikeloop.models.closed_loop.feedback import (
    EVENT_SURPRISE_REFERENCE,
    EventFeedbackSpec,
    FeedbackSettings,
    FeedbackSpec,
    SurpriseSettings,
    feedback_rows,
    row_commands,
)
from spikeloop.models.closed_loop.meter import MeterSettings
from spikeloop.models.closed_loop.sampling import SamplePace
from spikeloop.models.closed_loop.session_record import DEFAULT_FLUSH_S
from spikeloop.models.closed_loop.settings import (
    MAX_SEED,
    CultureSettings,
    DeviceSettings,
)
from spikeloop.models.module_config import ClosedLoopModelConfig

# No NaN or infinity anywhere: no setting means either, and YAML's `.inf` is one typo away.
STRICT = ConfigDict(extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)
# Settings dataclasses validate strictly too: a typo is an error, not a silent default.
for _cls in (
    SafetyEnvelope,
    FeedbackSettings,
    FeedbackSpec,
    EventFeedbackSpec,
    SurpriseSettings,
    DeviceSettings,
    DeviceAddress,
    SimulatedCultureConfig,
    ClosedLoopModelConfig,
):
    _cls.__pydantic_config__ = STRICT


class ExperimentError(ValueError):
    """An experiment file or override that cannot be used; the message names the key."""


# Sizes no run can use: each bound is far past any real experiment, and keeps a typo (1e20) from reaching Ray,
# where it would exhaust memory or wait for ever instead of failing with the key's name.
MAX_TRAIN_BATCH = 2**20
"""Env steps per learner per iteration: at the CL1's 10 Hz a culture needs 29 hours to give this many."""
MAX_NUM_EPOCHS = 1000
"""Passes over one train batch (PPO uses a handful)."""
MAX_ENV_RUNNERS = 10_000
"""Env runners: each is a process with its own game and culture (a cluster of 10,000 cores is far past any lab's)."""
MAX_LEARNERS = 256
MAX_GPUS_PER_LEARNER = 16
"""GPUs one learner may ask for: more than any one node has."""
MAX_LAYER_WIDTH = 8192
"""Units of one hidden layer, channels of one convolution, the screen embedding (the defaults are 64-128)."""
MAX_LAYERS = 32
"""Hidden layers of one network."""
MAX_SWEEP_SEEDS = 1000
MAX_TRIALS = 100_000
"""Trials of one sweep (configurations x tune.seeds x tune.num_samples): Tune holds every trial in memory."""
MAX_DEPTH = 32
"""Nesting levels of an experiment (sections, lists, values): the deepest setting is about 7 levels down."""
MAX_VALUES = 100_000
"""Values (mappings, lists, scalars) in one experiment; YAML aliases count once per use."""
MAX_EXACT_INT = 2**53
"""The largest whole number a float holds exactly: no setting takes more."""


def setting_field(setting: Setting, **overrides: Any) -> Any:
    """A pydantic Field from a declared setting (bridge/wire/settings.py): its default, bounds and meaning."""
    kwargs: dict[str, Any] = {"default": setting.default, **setting.bounds(), "description": setting.meaning}
    return Field(**(kwargs | overrides))


class LoopSection(BaseModel):
    """How env runners treat their device: timeouts, device loss, safety policy (declared in bridge/wire/settings.py)."""

    model_config = STRICT
    timeout_s: float = setting_field(TIMEOUT_S)
    timeout_policy: Literal[TIMEOUT_POLICY.choices] = setting_field(TIMEOUT_POLICY)  # type: ignore[valid-type]
    max_consecutive_timeouts: int = setting_field(MAX_CONSECUTIVE_TIMEOUTS)
    on_device_loss: Literal[ON_DEVICE_LOSS.choices] = setting_field(ON_DEVICE_LOSS)  # type: ignore[valid-type]
    # Unset unless on_device_loss is wait: then its declared default is written in (_default_wait).
    max_wait_s: float | None = setting_field(MAX_WAIT_S, default=None)
    envelope_policy: Literal[ENVELOPE_POLICY.choices] = setting_field(ENVELOPE_POLICY)  # type: ignore[valid-type]
    fast_path: bool = setting_field(FAST_PATH)
    reply_spin_ms: float = setting_field(REPLY_SPIN_MS)
    sample_timeout_s: float | Literal["auto"] = Field(
        "auto",
        description="how long RLlib waits for an env runner's sample before training without it; auto: the "
        "longest a sample can take while the loop still moves (models/closed_loop/sampling.py)",
    )

    @field_validator("sample_timeout_s")
    @classmethod
    def _positive_timeout(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 < value <= MAX_SAMPLE_TIMEOUT_S:
            raise ValueError(f"must be auto or a number of seconds > 0 and <= {MAX_SAMPLE_TIMEOUT_S:g} (a day)")
        return value

    @field_validator("max_wait_s")
    @classmethod
    def _only_with_wait(cls, value: float | None, info: ValidationInfo) -> float | None:
        loss = info.data.get("on_device_loss")
        if value is not None and loss is not None and loss != "wait":
            raise ValueError(
                f"bounds only loop.on_device_loss: wait, and on_device_loss is {loss}; set on_device_loss: wait, "
                "or remove max_wait_s"
            )
        return value

    @model_validator(mode="after")
    def _default_wait(self) -> LoopSection:
        if self.on_device_loss == "wait" and self.max_wait_s is None:
            self.max_wait_s = MAX_WAIT_S.default  # written out in the resolved experiment
        return self


class PPOSection(BaseModel):
    """PPO and closed-loop learner settings; None keeps the ClosedLoopPPOConfig default."""

    model_config = STRICT
    lr: float | list[tuple[int, float]] | None = Field(
        None, description="a rate, or a schedule [[env_steps, rate], ...] from 0, rates interpolated linearly"
    )
    gamma: float | None = Field(None, gt=0, le=1)
    lambda_: float | None = Field(None, ge=0, le=1)
    clip_param: float | None = Field(None, gt=0, le=1)
    vf_loss_coeff: float | None = Field(None, ge=0)
    vf_clip_param: float | None = Field(None, gt=0)
    grad_clip: float | None = Field(None, gt=0)
    minibatch_size: int | None = Field(None, ge=1, le=MAX_TRAIN_BATCH)
    num_epochs: int | None = Field(None, ge=1, le=MAX_NUM_EPOCHS)
    train_batch_size_per_learner: int | None = Field(
        None, ge=1, le=MAX_TRAIN_BATCH, description="env steps per learner per iteration"
    )
    encoder_entropy_coeff: float | None = None
    decoder_entropy_coeff: float | None = None
    encoder_lr_multiplier: float | None = Field(None, gt=0)
    decoder_lr_multiplier: float | None = Field(None, gt=0)
    decoder_weight_l2_coeff: float | None = Field(None, ge=0)
    ratio_clipping: Literal["joint", "factored"] | None = None

    @field_validator("lr")
    @classmethod
    def _rate_or_schedule(cls, lr: float | list[tuple[int, float]] | None) -> float | list[tuple[int, float]] | None:
        rates = [lr] if isinstance(lr, float) else [rate for _, rate in lr or []]
        if any(not 0 < rate < 1 for rate in rates):
            raise ValueError(f"every learning rate must lie in (0, 1), got {rates}")
        if isinstance(lr, list):
            steps = [step for step, _ in lr]
            if not lr or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
                raise ValueError(
                    f"a schedule is [[0, rate], [env_steps, rate], ...] with env_steps rising from 0, got {lr}"
                )
        return lr

    def training_kwargs(self) -> dict[str, Any]:
        """The keys that were set, as `config.training(...)` keyword arguments."""
        kwargs = {k: v for k, v in self.model_dump().items() if v is not None}
        if isinstance(kwargs.get("lr"), list):  # RLlib's schedule format: [[timestep, value], ...]
            kwargs["lr"] = [[int(step), float(rate)] for step, rate in kwargs["lr"]]
        return kwargs


class ResourcesSection(BaseModel):
    """Ray resources of the run."""

    model_config = STRICT
    num_env_runners: int = Field(1, ge=0, le=MAX_ENV_RUNNERS, description="one device (culture) per env runner")
    num_learners: int = Field(0, ge=0, le=MAX_LEARNERS)
    num_gpus_per_learner: float = Field(0, ge=0, le=MAX_GPUS_PER_LEARNER)


DEFAULT_STOP_ITERATIONS = 10
"""Iterations of a run whose file has no `stop` section at all."""


class StopSection(BaseModel):
    """When training stops (the first condition reached); only the conditions the file sets apply."""

    model_config = STRICT
    iterations: int | None = Field(None, ge=1)
    env_steps: int | None = Field(None, ge=1)
    episodes: int | None = Field(
        None,
        ge=1,
        description="finished episodes of the trial, counted across resumes "
        "(the reference trainer's --max-episodes); checked after each iteration",
    )
    time_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_condition(self) -> StopSection:
        if self.iterations is None and self.env_steps is None and self.episodes is None and self.time_s is None:
            raise ValueError("set at least one of iterations, env_steps, episodes, time_s")
        return self


class CheckpointSection(BaseModel):
    """When checkpoints are written and how many are kept."""

    model_config = STRICT
    every_iterations: int = Field(5, ge=1)
    keep: int = Field(3, ge=1, description="periodic checkpoints kept, besides the best and the final")
    at_end: bool = True


class TuneSection(BaseModel):
    """A Tune sweep: `search_space` maps dotted keys to grid/choice/uniform/loguniform."""

    model_config = STRICT
    search_space: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: int = Field(
        1,
        ge=1,
        le=MAX_SWEEP_SEEDS,
        description="seeds per configuration (grid point): seed k runs with seed + k and each simulated device's "
        "seed + k in every configuration, so configurations are compared seed by seed",
    )
    num_samples: int = Field(1, ge=1, le=MAX_TRIALS)
    max_concurrent_trials: int | None = Field(None, ge=1)
    max_failures: int = Field(2, ge=0, description="retries of a failed trial from its last checkpoint")
    metric: str = Field(
        "episode/return_mean",
        description="a TensorBoard tag of the trial (episode/return_mean, "
        "episode/kills, loop/latency_p50_ms, ...) or the RLlib result path it is read from: picks the "
        "best trial and the best checkpoints kept",
    )
    mode: Literal["max", "min"] = "max"

    @model_validator(mode="after")
    def _known_metric(self) -> TuneSection:
        from spikeloop.experiments.run_log import metric_tag

        self.metric = metric_tag(self.metric)  # raises ValueError naming the tags there are
        return self


class OutputSection(BaseModel):
    """Where runs are written."""

    model_config = STRICT
    root_dir: str = Field(
        "runs",
        min_length=1,
        description="a writable directory, or one that can be made (checked by experiments/paths.py)",
    )
    step_log: bool = Field(False, description="write the compact per-step stim/spike log")
    record: bool = Field(
        True, description="write each env runner's session record (record/*.h5 in the trial directory: HDF5)"
    )
    record_flush_s: float = Field(
        DEFAULT_FLUSH_S,
        gt=0,
        le=60,
        description="seconds between flushes of the session record: what a crash of the trainer can lose at most",
    )


class ViewSection(BaseModel):
    """The live view: each env runner serves its game, stimulation and spikes over HTTP (port + runner - 1)."""

    model_config = STRICT
    enabled: bool = ViewSettings.enabled
    host: str = Field(ViewSettings.host, min_length=1, description='"0.0.0.0" opens the view to the network')
    port: int = Field(ViewSettings.port, ge=0, le=65535, description="env runner i >= 1 serves on port + i - 1")
    jpeg_quality: int = Field(ViewSettings.jpeg_quality, ge=1, le=95)
    max_fps: float = Field(ViewSettings.max_fps, gt=0, le=120, description="frames per second per viewer at most")

    def settings(self, budget: RunBudget | None = None) -> ViewSettings:
        """The settings env runners receive (`budget`: the stop conditions the dashboard shows progress against)."""
        return ViewSettings(**self.model_dump(), budget=budget)


SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")


@functools.cache
def env_section_model() -> type[BaseModel]:
    """A strict model of the `env` section, built from DoomEnv's constructor."""
    from spikeloop.envs.doom_env import DoomEnv

    hints = typing.get_type_hints(DoomEnv.__init__)
    fields = {
        name: (hints.get(name, Any), param.default)
        for name, param in inspect.signature(DoomEnv.__init__).parameters.items()
        if name != "self" and name != "render_mode"  # the live view decides rendering, not the YAML
    }
    return create_model("EnvSection", __config__=STRICT, **fields)


class Experiment(BaseModel):
    """One experiment file."""

    model_config = STRICT
    name: str = Field("experiment", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = Field(0, ge=0, lt=SEED_LIMIT)  # the bound a run may start with: check_before_run
    devices: list[DeviceSettings] = Field(default_factory=lambda: [DeviceSettings()], min_length=1)
    loop: LoopSection = Field(default_factory=LoopSection)
    safety: SafetyEnvelope = Field(default_factory=SafetyEnvelope)
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    env: dict[str, Any] = Field(default_factory=dict)
    model: ClosedLoopModelConfig = Field(default_factory=ClosedLoopModelConfig)
    ablation: Literal["none", "zero", "random", "shuffled"] = "none"
    policy: Literal["closed_loop", "direct"] = Field(
        "closed_loop", description="direct: features straight to actions, no culture (the no-neurons control)"
    )
    ppo: PPOSection = Field(default_factory=PPOSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    stop: StopSection = Field(default_factory=lambda: StopSection(iterations=DEFAULT_STOP_ITERATIONS))
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    tune: TuneSection = Field(default_factory=TuneSection)
    output: OutputSection = Field(default_factory=OutputSection)
    view: ViewSection = Field(default_factory=ViewSection)
    meter: MeterSettings = Field(
        default_factory=MeterSettings,
        description="the live information meter: bits per tick the culture's counts carry about the stimulation, "
        "the observation and the action, over the last window_ticks ticks (models/closed_loop/meter.py)",
    )
    protocol: protocol_settings.ProtocolSection | None = Field(
        None, description="a rest-play-rest session per trial, with the stimulation-to-action mapping fixed"
    )
    design: DesignSection | None = Field(
        None, description="cultures as the units, each taking every condition in turn (experiments/design)"
    )

    @model_validator(mode="before")
    @classmethod
    def _protocol_fixes(cls, data: Any) -> Any:
        """The protocol's settings, over what the file left at default; an explicit contradiction is refused."""
        return protocol_settings.apply_protocol(data)

    @model_validator(mode="before")
    @classmethod
    def _env_and_ablation(cls, data: Any) -> Any:
        if isinstance(data, dict):
            model = data.get("model")
            if isinstance(model, dict) and "ablation" in model:
                raise ValueError("model.ablation: set the ablation with the top-level `ablation:` key")
            env = data.get("env", {})
            if env is not None and not isinstance(env, dict):
                raise ValueError("env must be a mapping of DoomEnv settings")
        return data

    @model_validator(mode="before")
    @classmethod
    def _device_addresses(cls, data: Any) -> Any:
        """A device's flat address keys (host, stim_port, ...) become its `address`."""
        devices = data.get("devices") if isinstance(data, dict) else None
        if isinstance(devices, list) and any(isinstance(dev, dict) for dev in devices):
            data = {
                **data,
                "devices": [nest_address(dev, i) if isinstance(dev, dict) else dev for i, dev in enumerate(devices)],
            }
        return data

    @model_validator(mode="before")
    @classmethod
    def _event_rows_over_reference(cls, data: Any) -> Any:
        """An event row the reference table has starts from that row: `{td_sign: absolute}` changes only that."""
        feedback = data.get("feedback") if isinstance(data, dict) else None
        events = feedback.get("events") if isinstance(feedback, dict) else None
        if isinstance(events, dict):
            data = {
                **data,
                "feedback": {
                    **feedback,
                    "events": {
                        name: {**dataclasses.asdict(EventFeedbackSpec.reference(name)), **row}
                        if name in EVENT_SURPRISE_REFERENCE and isinstance(row, dict)
                        else row
                        for name, row in events.items()
                    },
                },
            }
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> Experiment:
        try:
            env = env_section_model().model_validate(self.env)  # types and unknown keys of `env`
        except ValidationError as exc:
            first = exc.errors()[0]
            where = shown_path(first["loc"])
            what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
            raise ValueError(f"env.{where}: {what} (got {first.get('input')!r})") from None
        numbers = bool_as_number_problems(self.env, env, "env")  # `env` stays the file's mapping: checked here
        if numbers:
            raise ValueError(numbers[0])
        _check_env(self.env)
        _check_sizes(self)
        self.model = dataclasses.replace(
            self.model, ablation=protocol_settings.condition_ablation(self.protocol, self.ablation)
        )
        if self.policy == "direct" and self.model.same_frame_rounds != 1:
            raise ValueError(
                "model.same_frame_rounds: the direct policy stimulates nothing, so it has no rounds; "
                "use 1 (the default) with policy: direct"
            )
        if self.policy == "direct" and self.ablation != "none":
            raise ValueError(
                "ablation: the direct policy has no culture whose spikes could be ablated; "
                "use ablation: none with policy: direct"
            )
        forbidden = self.safety.forbidden_electrodes
        for path, spec in _feedback_specs(self.feedback):
            for channel in spec.channels:
                if not 0 <= channel < N_ELECTRODES:
                    raise ValueError(f"feedback.{path}.channels: {channel} is not an electrode (0-63)")
                if channel in forbidden:
                    raise ValueError(
                        f"feedback.{path}.channels: electrode {channel} is forbidden by the safety envelope "
                        f"(forbidden: {sorted(forbidden)})"
                    )
        _check_feedback(self.feedback)
        CultureSettings(devices=tuple(self.devices))  # device-list rules (unique ids, one sim template)
        for i, dev in enumerate(self.devices):
            problem = exposure.refusal(i, dev)  # a bind beyond loopback must be acknowledged
            if problem:
                raise ValueError(problem)
            if dev.simulated:  # the device program's own checks, here rather than inside Ray
                try:
                    dev.device_config(0, self.safety)
                except ValueError as exc:  # the one check DeviceSettings cannot make alone: tick vs max_pulses
                    # Both keys: either one can be what the user meant to change.
                    raise ValueError(f"devices.{i}.tick_frequency_hz and safety.max_pulses: {exc}") from None
        if self.loop.envelope_policy == "raise" and self.policy == "closed_loop":
            _check_reach(self)
        hardware = [d for d in self.devices if not d.simulated]
        if hardware and self.resources.num_env_runners > len(hardware):
            raise ValueError(
                f"resources.num_env_runners={self.resources.num_env_runners} but only {len(hardware)} cl1 "
                "device(s) are listed: one culture serves one game"
            )
        if self.resources.num_env_runners == 0 and hardware:
            raise ValueError(
                "resources.num_env_runners must be >= 1 with cl1 devices (env runners sit on device nodes)"
            )
        if self.protocol is not None:
            self._protocol_stop()  # before the sweep's values are checked against the resolved experiment
        for key, spec in self.tune.search_space.items():
            _check_search_entry(self, key, spec)
            if self.tune.seeds > 1 and (key == "seed" or re.fullmatch(r"devices\.\d+\.seed", key)):
                raise ValueError(
                    f"tune.search_space.{key}: tune.seeds already gives each configuration seeds {self.seed} to "
                    f"{self.seed + self.tune.seeds - 1}; sweep the seed with one or the other"
                )
        _check_trials(self.tune)
        saved = [i for i, d in enumerate(self.devices) if d.culture_state is not None]
        if saved and (self.resources.num_env_runners > 1 or self.tune.seeds > 1 or self.tune.search_space):
            raise ValueError(
                f"devices.{saved[0]}.culture_state: one file holds one culture, and this experiment would start "
                "several from it (env runners, sweep seeds or configurations); use one env runner and no sweep "
                "(a design gives each culture a file of its own)"
            )
        if self.design is not None:
            self._check_design()
        self.sample_pace().check(self.loop.sample_timeout_s)
        return self

    def _check_design(self) -> None:
        """A design's cultures sit on devices of the experiment, and its conditions are settings of it."""
        assert self.design is not None
        if self.tune.search_space or self.tune.seeds > 1:
            raise ValueError(
                "design: a design sweeps its own conditions over cultures; leave tune.search_space empty and "
                "tune.seeds at 1 (a seed is not a culture)"
            )
        if self.protocol is not None:
            raise ValueError(
                "design: a design's blocks and rests are its culture's sessions, and protocol: would give each block "
                "a session of its own; use one or the other"
            )
        devices = {d.device_id: d for d in self.devices}
        for i, culture in enumerate(self.design.cultures):
            device = devices.get(culture.device)
            if device is None:
                raise ValueError(
                    f"design.cultures.{i}.device: {culture.device!r} is not a device_id of `devices:` "
                    f"({', '.join(devices)})"
                )
            if culture.culture_seed is not None and not device.simulated:
                raise ValueError(
                    f"design.cultures.{i}.culture_seed: device {culture.device!r} is a {device.backend} device, "
                    "whose dish is real; give culture_seed only for simulated devices"
                )
        for key, values in self.design.conditions.items():
            if key.split(".")[0] == "design":
                raise ValueError(f"design.conditions.{key}: a condition sets the experiment, not the design")
            _check_search_entry(self, key, {"grid": values}, section="design.conditions")

    def _protocol_stop(self) -> None:
        """The run stops when the protocol's play is over: env steps for play_s of culture time per culture."""
        assert self.protocol is not None
        protocol_settings.check_timing(self.protocol, self.devices)
        steps = protocol_settings.play_env_steps(
            self.protocol, self.devices, self.model.same_frame_rounds, self.resources.num_env_runners
        )
        if self.stop.env_steps is not None and self.stop.env_steps != steps:
            raise ValueError(
                f"stop.env_steps: {self.stop.env_steps} contradicts the protocol, whose play of "
                f"{self.protocol.play_s:g} s of culture time is {steps} env steps; set protocol.play_s instead"
            )
        self.stop = StopSection(env_steps=steps)

    # --- what the experiment builds -------------------------------------------------

    def culture_settings(self) -> CultureSettings:
        """The settings every env runner uses to reach its culture."""
        return CultureSettings(
            devices=protocol_settings.condition_devices(self.protocol, tuple(self.devices)),
            envelope=self.safety,
            envelope_policy=self.loop.envelope_policy,
            timeout_s=self.loop.timeout_s,
            timeout_policy=self.loop.timeout_policy,
            max_consecutive_timeouts=self.loop.max_consecutive_timeouts,
            on_device_loss=self.loop.on_device_loss,
            max_wait_s=self.loop.max_wait_s or MAX_WAIT_S.default,
            feedback=protocol_settings.condition_feedback(self.protocol, self.feedback),
            fast_path=self.loop.fast_path,
            reply_spin_ms=self.loop.reply_spin_ms,
            step_log=self.output.step_log,
            meter=self.meter,
        )

    def rollout_steps_per_runner(self) -> int:
        """Env steps each env runner samples per iteration (RLlib's `rollout_fragment_length: auto`)."""
        from spikeloop.models.ppo_config import ClosedLoopPPOConfig

        per_learner = self.ppo.train_batch_size_per_learner or ClosedLoopPPOConfig().train_batch_size_per_learner
        batch = per_learner * max(1, self.resources.num_learners)
        return math.ceil(batch / max(1, self.resources.num_env_runners))

    def run_budget(self) -> RunBudget:
        """The stop conditions, for the live view's progress (an iteration is one train batch of env steps)."""
        return RunBudget(
            env_steps=self.stop.env_steps,
            episodes=self.stop.episodes,
            iterations=self.stop.iterations,
            time_s=self.stop.time_s,
            env_steps_per_iteration=self.rollout_steps_per_runner() * max(1, self.resources.num_env_runners),
        )

    def repeats_bit_for_bit(self) -> bool:
        """True when the same seed gives the same run: every device simulated and unpaced (or no culture in the loop).

        Such a run is only that experiment whole: its cultures' state (weights, membranes, noise) is not in a
        checkpoint, so a trial continued from one would not be the run its seed gives (runner.train_trial).
        """
        return self.policy == "direct" or all(d.simulated and not d.realtime for d in self.devices)

    def sample_pace(self) -> SamplePace:
        """What one env runner's sample asks of its culture: steps, stimulations, waits (`loop.sample_timeout_s`)."""
        culture = self.culture_settings()
        paced = [d for d in self.devices if not d.simulated or d.realtime]
        rounds = 1 if self.policy == "direct" else self.model.same_frame_rounds
        return SamplePace(
            rollout_steps=self.rollout_steps_per_runner(),
            rounds=rounds,
            reply_horizon_s=0.0
            if self.policy == "direct"
            # An unpaced culture's bridge waits out a starved CPU (UNPACED_REPLY_TIMEOUT_S); RLlib's guard against
            # a hung env runner keeps the horizon loop.timeout_s gives.
            else max(
                dataclasses.replace(culture.bridge_config(d), timeout_s=self.loop.timeout_s).horizon_s
                for d in culture.devices
            ),
            reset_delay_s=float(
                self.env.get("reset_delay_s", env_section_model().model_fields["reset_delay_s"].default)
            ),
            device_step_s=(
                max(d.artifact_wait_ms + d.collect_window_ms for d in paced) / 1000.0
                if paced and self.policy != "direct"
                else None
            ),
            device_wait_s=(culture.max_wait_s if culture.on_device_loss == "wait" and self.policy != "direct" else 0.0),
        )

    def algorithm_config(self):
        """The ClosedLoopPPOConfig this experiment trains with."""
        from spikeloop.models.closed_loop.ppo import closed_loop_config

        return closed_loop_config(
            sample_timeout_s=self.sample_pace().timeout_s(self.loop.sample_timeout_s),
            culture=self.culture_settings(),
            policy=self.policy,
            env_config=dict(self.env),
            model_config=dataclasses.asdict(self.model),
            num_env_runners=self.resources.num_env_runners,
            training=self.ppo.training_kwargs(),
            seed=self.seed,
            view=self.view.settings(self.run_budget()),
        ).learners(num_learners=self.resources.num_learners, num_gpus_per_learner=self.resources.num_gpus_per_learner)

    def plain(self) -> dict[str, Any]:
        """The resolved experiment as plain data that validates again (the ablation only at top level)."""
        data = self.model_dump(mode="json", exclude={"model": {"ablation"}})
        data["devices"] = [flatten_address(dev) for dev in data["devices"]]
        return data

    def to_yaml(self) -> str:
        """The fully resolved experiment, every default written out."""
        return yaml.safe_dump(_plain(self.plain()), sort_keys=False)


ADDRESS_KEYS = DeviceAddress.field_names()
"""The device keys that make up its address, flat in the YAML (from the dataclass, in its order)."""


def nest_address(device: dict[str, Any], index: int) -> dict[str, Any]:
    """A `devices:` entry as the YAML writes it -> DeviceSettings' shape: the address keys under `address`."""
    if "address" in device:
        raise ValueError(
            f"devices.{index}.address: unknown key; write {', '.join(ADDRESS_KEYS)} directly under the device"
        )
    nested = {k: v for k, v in device.items() if k not in ADDRESS_KEYS}
    address = {k: device[k] for k in ADDRESS_KEYS if k in device}
    return {**nested, "address": address} if address else nested


def flatten_address(device: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `nest_address`, on plain data: the address keys flat, where `address` stood."""
    flat: dict[str, Any] = {}
    for key, value in device.items():
        flat.update(value if key == "address" else {key: value})
    return flat


def _feedback_specs(feedback: FeedbackSettings):
    for name in ("step_positive", "step_negative", "episode_positive", "episode_negative"):
        yield name, getattr(feedback, name)
    for name, spec in feedback.events.items():
        yield f"events.{name}", spec


def _check_env(env: dict[str, Any]) -> None:
    """DoomEnv's own checks (scenario, frame skip, action set, ...) without starting a game."""
    from spikeloop.envs.doom_env import DoomEnv, check_env_settings

    parameters = inspect.signature(DoomEnv.__init__).parameters
    settings = {name: env.get(name, p.default) for name, p in parameters.items() if name != "self"}
    try:
        check_env_settings(**settings)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise ValueError(f"env.{exc}") from None


def _check_sizes(experiment: Experiment) -> None:
    """Sizes no machine can run: refused here, naming the bound, rather than inside Ray."""
    from spikeloop.models.ppo_config import ClosedLoopPPOConfig

    defaults = ClosedLoopPPOConfig()
    ppo = experiment.ppo
    batch = ppo.train_batch_size_per_learner or defaults.train_batch_size_per_learner
    minibatch = ppo.minibatch_size or defaults.minibatch_size
    if minibatch > batch:
        raise ValueError(
            f"ppo.minibatch_size: {minibatch} is larger than ppo.train_batch_size_per_learner ({batch}"
            + ("" if ppo.train_batch_size_per_learner else ", the default")
            + f"), which is split into minibatches; use a minibatch_size of at most {batch}, or a larger batch"
        )
    model = experiment.model
    layers = {name: getattr(model, name) for name in ("encoder_hiddens", "decoder_hiddens", "value_hiddens")}
    layers["screen_cnn_filters"] = tuple(
        f[0] if isinstance(f, (tuple, list)) and f else 0 for f in model.screen_cnn_filters
    )
    for name, widths in layers.items():
        if len(widths) > MAX_LAYERS:
            raise ValueError(f"model.{name}: {len(widths)} layers; use at most {MAX_LAYERS}")
        for width in widths:
            if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_LAYER_WIDTH:
                raise ValueError(
                    f"model.{name}: a layer of {width!r} units (channels); each must have 1-{MAX_LAYER_WIDTH}"
                )
    for j, spec in enumerate(model.screen_cnn_filters):
        if len(spec) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in spec[1:]):
            raise ValueError(
                f"model.screen_cnn_filters.{j}: must be [channels, kernel, stride], whole numbers >= 1, got {list(spec)}"
            )
    for name in ("screen_embedding_dim", "screen_cnn_channels"):
        value = getattr(model, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LAYER_WIDTH:
            raise ValueError(f"model.{name}: must be a whole number 1-{MAX_LAYER_WIDTH}, got {value!r}")
    view = experiment.view
    last_port = view.port + experiment.resources.num_env_runners - 1
    if view.enabled and view.port and last_port > 65535:
        raise ValueError(
            f"view.port: env runner {experiment.resources.num_env_runners} would serve on port {last_port}, "
            f"past 65535; use a view.port of at most {65536 - experiment.resources.num_env_runners}"
        )


def _check_trials(tune: TuneSection) -> None:
    """A sweep's trials (grid points x seeds x samples) must be few enough for Tune to hold."""
    points = math.prod(len(spec["grid"]) for spec in tune.search_space.values() if "grid" in spec)
    trials = points * tune.seeds * tune.num_samples
    if trials > MAX_TRIALS:
        raise ValueError(
            f"tune: {points} grid point(s) x tune.seeds {tune.seeds} x tune.num_samples {tune.num_samples} = "
            f"{trials} trials, more than {MAX_TRIALS}; sweep fewer values, seeds or samples"
        )


def check_before_run(experiment: Experiment, source: str = "experiment") -> None:
    """What a run can only be checked for where it starts: `output.root_dir` writable, seeds with room to grow.

    Asked by the commands that start a run (and `spikeloop check`) before Ray, not by the schema: a trial
    validates its experiment again on whichever node runs it, where the driver's directory need not exist,
    and with its seed already moved on by its sweep seed number.
    """
    from spikeloop.experiments.paths import runs_root_problem

    refused = runs_root_problem(experiment.output.root_dir, experiment.name)
    if refused:
        raise ExperimentError(f"{source}: 1 problem(s):\n  {refused[0]}: {refused[1]}")
    seeds = [("seed", experiment.seed)] + [(f"devices.{i}.seed", d.seed) for i, d in enumerate(experiment.devices)]
    for key, seed in seeds:
        if seed + experiment.tune.seeds - 1 > MAX_SEED:
            raise ExperimentError(
                f"{source}: 1 problem(s):\n  {key}: {seed}"
                + (f" plus tune.seeds {experiment.tune.seeds} - 1" if experiment.tune.seeds > 1 else "")
                + f" is past {MAX_SEED}; use a seed of at most {MAX_SEED - experiment.tune.seeds + 1} (numpy takes "
                "seeds below 2**32, and env runners add their index to a device's seed)"
            )


def _check_feedback(feedback: FeedbackSettings) -> None:
    """What the dataclasses do not check: values that would crash or silently mislead a run."""
    from spikeloop.envs.rewards import EVENTS

    for name in feedback.events:
        if name not in EVENTS:
            raise ValueError(
                f"feedback.events.{name}: not a game event, so it would never be sent; events are {', '.join(EVENTS)}"
            )
    if feedback.max_datagrams_per_step < 1:
        raise ValueError(
            f"feedback.max_datagrams_per_step: must be >= 1, got {feedback.max_datagrams_per_step} "
            "(to send no feedback, set feedback.enabled: false)"
        )
    if feedback.max_datagrams_per_step < 2 and feedback.interrupt_before_negative:
        raise ValueError(
            f"feedback.max_datagrams_per_step: {feedback.max_datagrams_per_step} cannot carry negative "
            "feedback, which is an interrupt and its command (2 datagrams); use 2 or more, or "
            "interrupt_before_negative: false"
        )
    if not feedback.max_amplitude_ua > 0:
        raise ValueError(f"feedback.max_amplitude_ua: must be > 0 uA, got {feedback.max_amplitude_ua}")
    s = feedback.surprise
    for name in ("step_baseline_beta", "episode_baseline_beta"):
        if not 0 <= getattr(s, name) < 1:
            raise ValueError(
                f"feedback.surprise.{name}: must be in [0, 1) (the old value's weight), got {getattr(s, name)}"
            )
    if not s.baseline_floor > 0:
        raise ValueError(
            f"feedback.surprise.baseline_floor: must be > 0 (a ratio divides by it), got {s.baseline_floor}"
        )
    for name in ("ratio_cap", "amplitude_scale_max", "pulse_scale_max"):
        if not getattr(s, name) > 0:
            raise ValueError(f"feedback.surprise.{name}: must be > 0, got {getattr(s, name)}")
    for name in ("frequency_gain", "amplitude_gain", "pulse_gain"):
        if getattr(s, name) < 0:
            raise ValueError(f"feedback.surprise.{name}: must be >= 0, got {getattr(s, name)}")
    low, high = s.frequency_scale_range
    if not 0 < low <= high:
        raise ValueError(
            f"feedback.surprise.frequency_scale_range: must be [low, high] with 0 < low <= high, "
            f"got {list(s.frequency_scale_range)}"
        )
    for name, row in feedback.events.items():
        where = f"feedback.events.{name}"
        if not 0 <= row.ema_beta < 1:
            raise ValueError(f"{where}.ema_beta: must be in [0, 1) (the old value's weight), got {row.ema_beta}")
        for gain in ("frequency_gain", "amplitude_gain", "pulse_gain"):
            if getattr(row, gain) < 0:
                raise ValueError(f"{where}.{gain}: must be >= 0, got {getattr(row, gain)}")
        for most in ("frequency_scale_max", "amplitude_scale_max", "pulse_scale_max"):
            if not getattr(row, most) > 0:
                raise ValueError(f"{where}.{most}: must be > 0, got {getattr(row, most)}")
    for path, spec in _feedback_specs(feedback):
        where = f"feedback.{path}"
        if not spec.channels:
            raise ValueError(f"{where}.channels: list at least one electrode")
        if not spec.frequency_hz > 0:
            raise ValueError(f"{where}.frequency_hz: must be > 0 Hz, got {spec.frequency_hz}")
        if spec.amplitude_ua < 0:
            raise ValueError(
                f"{where}.amplitude_ua: must be >= 0 uA (0 turns this feedback off), got "
                f"{spec.amplitude_ua}; a negative amplitude is not a polarity on the wire"
            )
        if spec.pulses < 1:
            raise ValueError(
                f"{where}.pulses: must be >= 1 (to turn this feedback off, set its amplitude_ua: 0 "
                f"or feedback.enabled: false), got {spec.pulses}"
            )
        most = (
            (spec.frequency_scale_max, spec.amplitude_scale_max, spec.pulse_scale_max)
            if isinstance(spec, EventFeedbackSpec)
            else (high, s.amplitude_scale_max, s.pulse_scale_max)
        )
        for name, scale in zip(("frequency_hz", "amplitude_ua", "pulses"), most, strict=True):
            if not math.isfinite(getattr(spec, name) * scale):
                raise ValueError(f"{where}.{name}: {getattr(spec, name)} times its surprise scale is not finite")


def _check_reach(experiment: Experiment) -> None:
    """With envelope_policy raise, a run stops at the first command outside the envelope: refuse one that must."""
    env = experiment.safety
    amp_max = env.effective_max_amplitude_ua
    advice = "narrow it, widen the safety envelope, or use loop.envelope_policy: clamp"
    model = experiment.model
    for name, (low, high), (lo_env, hi_env) in (
        ("stim_frequency_range_hz", model.stim_frequency_range_hz, (env.min_frequency_hz, env.max_frequency_hz)),
        ("stim_amplitude_range_ua", model.stim_amplitude_range_ua, (env.min_amplitude_ua, amp_max)),
    ):
        if low < lo_env or high > hi_env:
            raise ValueError(
                f"model.{name}: {low:g}-{high:g} leaves the safety envelope's {lo_env:g}-{hi_env:g}, "
                f"and loop.envelope_policy is raise: the run would stop at such a stimulation; {advice}"
            )
    driven = sorted(set(ENCODING_ELECTRODES) & env.forbidden_electrodes)
    if driven:
        raise ValueError(
            f"safety.forbidden_electrodes: includes encoding electrode(s) {driven}, which every "
            "stimulation drives; with loop.envelope_policy: raise every exchange would stop the run "
            "(clamp turns them off instead)"
        )
    fb = experiment.feedback
    if not fb.enabled:
        return
    # The commands the run itself would build, at no surprise and at the most surprise in each direction (the
    # scales are monotonic in the surprise), through the envelope exactly as the bridge would check them.
    for row in feedback_rows(fb):
        if not row.sent:
            continue
        for commands in row_commands(fb, row):
            command = commands[-1]
            try:
                env.check_feedback(command, "raise")
            except SafetyViolation as exc:
                raise ValueError(
                    f"feedback.{row.key}: surprise scaling can make it send {command.frequency_hz:g} Hz, "
                    f"{command.amplitude_ua:g} uA, {command.pulses:g} pulses: {exc}; loop.envelope_policy is "
                    f"raise, so the run would stop there: {advice}"
                ) from None


def _check_search_entry(experiment: Experiment, key: str, spec: Any, section: str = "tune.search_space") -> None:
    where = f"{section}.{shown(key)}"
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
        raise ValueError(f"{where}: use exactly one of {', '.join(SEARCH_KINDS)}, e.g. {{grid: [0.1, 0.2]}}")
    kind, arg = next(iter(spec.items()))
    try:
        get_path(experiment.plain(), key)
    except KeyError:
        raise ValueError(f"{where}: {key!r} is not a setting of the experiment") from None
    if kind in ("grid", "choice"):
        if not isinstance(arg, list) or not arg:
            raise ValueError(
                f"{where}.{kind}: must be a non-empty list of values, e.g. {{{kind}: [0.1, 0.2]}} (got {arg!r})"
            )
        seen = [json.dumps(v, sort_keys=True) for v in arg]
        repeated = [v for i, v in enumerate(arg) if seen[i] in seen[:i]]
        if kind == "grid" and repeated:  # each grid point is a configuration: two alike could not be told apart
            raise ValueError(f"{where}.grid: {json.dumps(repeated[0])} is listed twice; list each value once")
        values = arg
    else:
        numbers = (
            isinstance(arg, list)
            and len(arg) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in arg)
        )
        if not numbers or not arg[0] < arg[1]:
            raise ValueError(
                f"{where}.{kind}: must be [low, high], two finite numbers with low < high, "
                f"e.g. {{{kind}: [0.1, 0.5]}} (got {arg!r})"
            )
        if kind == "loguniform" and arg[0] <= 0:
            raise ValueError(f"{where}.loguniform: low must be > 0 (got {arg!r})")
        if kind == "randint" and not all(isinstance(v, int) for v in arg):
            raise ValueError(f"{where}.randint: must be [low, high] whole numbers, high excluded (got {arg!r})")
        values = [arg[0], arg[1] - 1] if kind == "randint" else list(arg)
    if key.split(".")[0] == "resources":
        raise ValueError(
            f"{where}: Tune places every trial with the base experiment's resources, so a trial drawing another "
            "would fail inside Tune; run one experiment per value instead"
        )
    # Every value a trial can get must make a valid experiment: a bad one would fail only after Ray starts.
    for value in values:
        data = experiment.plain()
        data["tune"]["search_space"] = {}
        data["design"] = None
        set_path(data, key, value)
        try:
            _validated(data)
        except ValidationError as exc:
            problem = format_validation_error(exc, "").splitlines()[1].strip()
            raise ValueError(f"{where}: the value {value!r} makes the experiment invalid: {problem}") from None
        except ValueError as exc:
            problem = str(exc).splitlines()[1].strip()
            raise ValueError(f"{where}: the value {value!r} makes the experiment invalid: {problem}") from None


def _plain(value: Any) -> Any:
    """YAML-friendly: tuples and sets become lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, (set, frozenset)) else items
    return value


def set_path(tree: dict[str, Any], dotted: str, value: Any, defaults: dict[str, Any] | None = None) -> None:
    """Set `a.b.c` (list items by index: `devices.0.seed`) in a nested dict.

    A section the tree lacks is filled from `defaults` (the default experiment), so
    overriding one field of e.g. a feedback spec keeps the spec's other defaults.
    """
    parts = dotted.split(".")
    node: Any = tree
    default: Any = defaults
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ExperimentError(f"--set {dotted}: {'.'.join(parts[: i + 1])} is not an index of that list")
            node = node[int(part)]
            default = default[int(part)] if isinstance(default, list) and int(part) < len(default) else None
        else:
            default = default.get(part) if isinstance(default, dict) else None
            if node.get(part) is None:
                node[part] = copy.deepcopy(default) if isinstance(default, (dict, list)) else {}
            node = node[part]
        if not isinstance(node, (dict, list)):
            raise ExperimentError(f"--set {dotted}: {'.'.join(parts[: i + 1])} is a value, not a section")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ExperimentError(f"--set {dotted}: {last!r} is not an index of that list")
        node[int(last)] = value
    else:
        node[last] = value


@functools.cache
def _default_tree_json() -> str:
    return json.dumps(Experiment().plain())


def default_experiment_tree() -> dict[str, Any]:
    """Every setting at its default, as plain data (a fresh copy)."""
    return json.loads(_default_tree_json())


def switch_problems(tree: Any, defaults: Any, path: str = "") -> list[str]:
    """Every setting whose default is true or false but whose value is not a boolean, as `key: problem` lines.

    Pydantic's lax booleans would read `y`, `n`, `t`, `f`, `on`, `1`, `0` (and more) as true or false; a switch
    takes only what YAML reads as a boolean (true/false, yes/no, on/off), as the declared settings do. The items
    of a list (devices) are checked against the default list's first item.
    """
    problems: list[str] = []
    if isinstance(tree, dict) and isinstance(defaults, dict):
        for key, value in tree.items():
            if key not in defaults:
                continue
            where = f"{path}.{shown(key)}" if path else shown(key)
            default = defaults[key]
            if isinstance(default, bool) and not isinstance(value, bool):
                problems.append(f"{where}: a switch: give true or false (got {value!r})")
            else:
                problems += switch_problems(value, default, where)
    elif isinstance(tree, list) and isinstance(defaults, list) and defaults:
        for i, item in enumerate(tree):
            problems += switch_problems(item, defaults[0], f"{path}.{i}")
    return problems


def bool_as_number_problems(data: Any, validated: Any, path: str = "") -> list[str]:
    """Every number given as true or false, as `key: problem` lines, read against what validation made of `data`.

    Pydantic's lax numbers read true as 1 and false as 0 (`num_epochs: yes` trained one epoch); where a value was
    a boolean and validation made it a number, the setting is a number and the file meant something else.
    """
    if isinstance(data, bool):
        if isinstance(validated, (int, float)) and not isinstance(validated, bool):
            return [f"{path}: a number, not a switch: give a number (got {data!r})"]
        return []
    problems: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            inner = (
                validated.get(key, _MISSING) if isinstance(validated, dict) else getattr(validated, str(key), _MISSING)
            )
            if inner is not _MISSING:
                problems += bool_as_number_problems(value, inner, f"{path}.{key}" if path else str(key))
    elif isinstance(data, (list, tuple)) and isinstance(validated, (list, tuple)) and len(data) == len(validated):
        for i, (value, inner) in enumerate(zip(data, validated, strict=True)):
            problems += bool_as_number_problems(value, inner, f"{path}.{i}")
    return problems


_MISSING = object()


def _validated(data: dict[str, Any]) -> Experiment:
    """`Experiment.model_validate`, refusing a value its declared type does not take (text or true for a number:
    schema_types) and a number given as true or false; ValueError names it."""
    problems = type_problems(data, Experiment) + type_problems(data.get("env"), env_section_model(), ("env",))
    if problems:
        raise ValueError("\n  ".join([f"{len(problems)} problem(s):", *problems]))
    experiment = Experiment.model_validate(data)
    problems = bool_as_number_problems(data, experiment)
    if problems:
        raise ValueError("\n  ".join([f"{len(problems)} problem(s):", *problems]))
    return experiment


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", c) with c parsed as a file's YAML is (numbers, booleans, lists)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ExperimentError(f"--set {text[:80]!r}: write KEY=VALUE, e.g. --set stop.iterations=2")
    key = key.strip()
    if key.count(".") >= MAX_DEPTH:
        raise ExperimentError(
            f"--set {key[:80]}...: a key {key.count('.') + 1} levels deep; no setting is more than {MAX_DEPTH} deep"
        )
    try:
        deep = yaml_nesting_problem(raw, key)
        if deep:
            raise ExperimentError(f"--set {deep}")
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ExperimentError(f"--set {text[:200]!r}: the value is not valid YAML: {exc}") from None
    return key, value


def yaml_nesting_problem(text: str, prefix: str = "") -> str | None:
    """Where YAML text nests more than MAX_DEPTH levels (its key path and the fix), or None.

    Read from the parser's events, which need no recursion: the loader itself recurses once per level and
    would stop with Python's RecursionError on a deep enough file.
    """
    frames: list[list[Any]] = []  # per open collection: [is_mapping, key or index, awaiting a key]

    def node_done() -> None:
        if frames:
            top = frames[-1]
            if top[0]:
                top[2] = not top[2]
            else:
                top[1] += 1

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(frames) >= MAX_DEPTH:
                where = ".".join([prefix] * bool(prefix) + [str(f[1]) for f in frames])
                return (
                    f"{where}: nested more than {MAX_DEPTH} levels deep; no setting is nested that deep "
                    "(see the example YAMLs in experiments/): flatten it"
                )
            if frames and frames[-1][0] and frames[-1][2]:
                frames[-1][1] = "?"  # a mapping used as a key: a mistake the schema names later
            frames.append([True, None, True] if isinstance(event, yaml.MappingStartEvent) else [False, 0, False])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            frames.pop()
            node_done()
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            if frames and frames[-1][0] and frames[-1][2]:
                frames[-1][1] = getattr(event, "value", None) or "*"
            node_done()
    return None


def tree_size_problem(data: Any) -> str | None:
    """Where parsed data nests more than MAX_DEPTH levels, holds more than MAX_VALUES values or a whole number past
    MAX_EXACT_INT; None if none of these.

    Walked without recursion, each use of a shared (aliased) value counted: a YAML alias bomb stops here.
    """
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    seen = 0
    while stack:
        node, path = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            return (
                f"more than {MAX_VALUES} values (YAML aliases count at every use); an experiment holds a few "
                "hundred: remove the repetition"
            )
        if isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_EXACT_INT:
            # A number setting holds floats: a larger whole number would be rounded without a word.
            return (
                f"{'.'.join(path)}: {node} is past 2**53, which no setting takes (and a number setting could not "
                "hold it exactly): use a smaller value"
            )
        if isinstance(node, (dict, list)):
            if len(path) >= MAX_DEPTH:
                return (
                    f"{'.'.join(path)}: nested more than {MAX_DEPTH} levels deep; no setting is nested that deep "
                    "(see the example YAMLs in experiments/): flatten it"
                )
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((value, (*path, str(key))) for key, value in items)
    return None


def _settings_fields() -> frozenset[str]:
    """Field names of the settings dataclasses, whose own checks start their messages with one."""
    return frozenset(
        f.name
        for cls in (
            SafetyEnvelope,
            FeedbackSettings,
            EventFeedbackSpec,
            SurpriseSettings,
            DeviceSettings,
            DeviceAddress,
            SimulatedCultureConfig,
            ClosedLoopModelConfig,
        )
        for f in dataclasses.fields(cls)
    )


def _is_union_tag(part: Any) -> bool:
    """A location part pydantic adds for one member of a union ("int", "literal['a','b']"), not a key."""
    return isinstance(part, str) and ("[" in part or part in ("int", "float", "str", "bool", "none", "list", "dict"))


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: the key path, what is wrong, and the input."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for err in exc.errors():
        path = shown_path([p for p in err["loc"] if not _is_union_tag(p)])
        path = re.sub(r"^(devices\.\d+)\.address(?=\.|$)", r"\1", path)  # the YAML writes the address flat
        grouped.setdefault(path, []).append(err)
    lines = [f"{source}: {len(grouped)} problem(s):"]
    for path, errors in grouped.items():
        err = errors[0]
        message = " or ".join(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors))
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            message = "unknown key (check the spelling; see the example YAMLs in experiments/)"
        given = err.get("input")
        if not path:  # a cross-section check: its message starts with the key path
            lines.append(f"  {message}")
        elif err["type"] == "missing":
            lines.append(f"  {path}: {message}")
        elif (
            err["type"] == "value_error"
            and re.match(r"[a-z_]+", message)
            and (re.match(r"[a-z_]+", message).group() in _settings_fields())
        ):
            lines.append(f"  {path}.{message}")  # a settings dataclass's own check names the field first
        elif isinstance(given, (dict, list)):
            lines.append(f"  {path}: {message}")
        else:
            lines.append(f"  {path}: {message} (got {given!r})")
    return "\n".join(lines)


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read, override and validate an experiment file; ExperimentError names what is wrong."""
    path = Path(path)
    if path.is_dir():
        raise ExperimentError(f"{path}: is a directory; give an experiment file (e.g. experiments/quickstart.yaml)")
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ExperimentError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExperimentError(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); save the file as UTF-8"
        ) from None
    try:
        deep = yaml_nesting_problem(text)
        if deep:
            raise ExperimentError(f"{path}: {deep}")
        data = load_yaml(text)
    except KeyNotAName as exc:
        raise ExperimentError(f"{path}: 1 problem(s):\n  {exc.where}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        raise ExperimentError(
            f"{path}: the file is empty (or only comments); an experiment file needs at least one "
            "section, e.g. `name: my-run` (see experiments/quickstart.yaml)"
        )
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: the top level must be a mapping of sections (name, devices, env, ...)")
    return experiment_from_dict(data, overrides, source=str(path))


def experiment_from_dict(data: dict[str, Any], overrides=(), source: str = "experiment") -> Experiment:
    """Validate a parsed experiment (with `--set` overrides applied first)."""
    problem = tree_size_problem(data)
    if problem:
        raise ExperimentError(f"{source}: {problem}")
    data = copy.deepcopy(data)
    defaults = default_experiment_tree() if overrides else None
    for text in overrides:
        key, value = parse_override(text)
        set_path(data, key, value, defaults)
    problem = tree_size_problem(data) if overrides else None
    if problem:
        raise ExperimentError(f"{source} with --set: {problem}")
    switches = switch_problems(data, defaults if defaults is not None else default_experiment_tree())
    if switches:
        raise ExperimentError("\n  ".join([f"{source}: {len(switches)} problem(s):", *switches]))
    try:
        return _validated(data)
    except ValidationError as exc:
        raise ExperimentError(format_validation_error(exc, source)) from None
    except ValueError as exc:
        raise ExperimentError(f"{source}: {exc}") from None
