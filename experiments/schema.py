"""The experiment YAML: schema, validation, `--set` overrides, and what it builds.

Every section is checked before Ray starts: unknown keys, wrong types and
out-of-range values fail with the key path and what is allowed. Defaults are
not retyped here: sections that mirror a settings dataclass (safety envelope,
feedback, devices, model) validate straight into that dataclass, and the `env`
section is derived from `DoomEnv`'s constructor, so the code stays the one
source of truth for every default.

Top-level sections: name, seed, devices, loop, safety, feedback, env, model,
ablation, policy, ppo, resources, stop, checkpoint, tune, output, view.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from bridge.channels import N_ELECTRODES
from bridge.safety import SafetyEnvelope
from experiments.culture_link import CultureSettings, DeviceSettings
from experiments.feedback import FeedbackSettings, FeedbackSpec, SurpriseSettings
from experiments.live_view.settings import ViewSettings
from models.model_config import ClosedLoopModelConfig

STRICT = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
# Settings dataclasses validate strictly too: a typo is an error, not a silent default.
for _cls in (SafetyEnvelope, FeedbackSettings, FeedbackSpec, SurpriseSettings, DeviceSettings, ClosedLoopModelConfig):
    _cls.__pydantic_config__ = STRICT


class ExperimentError(ValueError):
    """An experiment file or override that cannot be used; the message names the key."""


class LoopSection(BaseModel):
    """How env runners treat their device: timeouts, device loss, safety policy."""

    model_config = STRICT
    timeout_s: float = Field(0.5, gt=0, le=10, description="wait for a spike reply this long")
    timeout_policy: Literal["zeros", "raise"] = "zeros"
    max_consecutive_timeouts: int = Field(20, ge=1)
    on_device_loss: Literal["continue", "stop"] = "stop"
    envelope_policy: Literal["clamp", "raise"] = "clamp"
    fast_path: bool = True
    reply_spin_ms: float = Field(
        1.0, ge=0, le=20, description="the bridge polls for a reply this long either side of its expected arrival"
    )


class PPOSection(BaseModel):
    """PPO and closed-loop learner settings; None keeps the ClosedLoopPPOConfig default."""

    model_config = STRICT
    lr: float | None = Field(None, gt=0, lt=1)
    gamma: float | None = Field(None, gt=0, le=1)
    lambda_: float | None = Field(None, ge=0, le=1)
    clip_param: float | None = Field(None, gt=0, le=1)
    vf_loss_coeff: float | None = Field(None, ge=0)
    vf_clip_param: float | None = Field(None, gt=0)
    grad_clip: float | None = Field(None, gt=0)
    minibatch_size: int | None = Field(None, ge=1)
    num_epochs: int | None = Field(None, ge=1)
    train_batch_size_per_learner: int | None = Field(None, ge=1)
    encoder_entropy_coeff: float | None = None
    decoder_entropy_coeff: float | None = None
    encoder_lr_multiplier: float | None = Field(None, gt=0)
    decoder_lr_multiplier: float | None = Field(None, gt=0)
    decoder_weight_l2_coeff: float | None = Field(None, ge=0)
    ratio_clipping: Literal["joint", "factored"] | None = None

    @model_validator(mode="after")
    def _minibatch_fits(self) -> PPOSection:
        if self.minibatch_size and self.train_batch_size_per_learner and self.minibatch_size > self.train_batch_size_per_learner:
            raise ValueError("minibatch_size is larger than train_batch_size_per_learner")
        return self

    def training_kwargs(self) -> dict[str, Any]:
        """The keys that were set, as `config.training(...)` keyword arguments."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ResourcesSection(BaseModel):
    """Ray resources of the run."""

    model_config = STRICT
    num_env_runners: int = Field(1, ge=0, description="one device (culture) per env runner")
    num_learners: int = Field(0, ge=0)
    num_gpus_per_learner: float = Field(0, ge=0)


DEFAULT_STOP_ITERATIONS = 10
"""Iterations of a run whose file has no `stop` section at all."""


class StopSection(BaseModel):
    """When training stops (the first condition reached); only the conditions the file sets apply."""

    model_config = STRICT
    iterations: int | None = Field(None, ge=1)
    env_steps: int | None = Field(None, ge=1)
    time_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some_condition(self) -> StopSection:
        if self.iterations is None and self.env_steps is None and self.time_s is None:
            raise ValueError("set at least one of iterations, env_steps, time_s")
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
    num_samples: int = Field(1, ge=1)
    max_concurrent_trials: int | None = Field(None, ge=1)
    max_failures: int = Field(2, ge=0, description="retries of a failed trial from its last checkpoint")
    metric: str = "env_runners/episode_return_mean"
    mode: Literal["max", "min"] = "max"


class OutputSection(BaseModel):
    """Where runs are written."""

    model_config = STRICT
    root_dir: str = "runs"
    step_log: bool = Field(False, description="write the compact per-step stim/spike log")


class ViewSection(BaseModel):
    """The live view: each env runner serves its game, stimulation and spikes over HTTP (port + runner - 1)."""

    model_config = STRICT
    enabled: bool = ViewSettings.enabled
    host: str = Field(ViewSettings.host, min_length=1, description='"0.0.0.0" opens the view to the network')
    port: int = Field(ViewSettings.port, ge=0, le=65535, description="env runner i >= 1 serves on port + i - 1")
    jpeg_quality: int = Field(ViewSettings.jpeg_quality, ge=1, le=95)
    max_fps: float = Field(ViewSettings.max_fps, gt=0, le=120, description="frames per second per viewer at most")

    def settings(self) -> ViewSettings:
        """The settings env runners receive."""
        return ViewSettings(**self.model_dump())


SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")


@functools.cache
def env_section_model() -> type[BaseModel]:
    """A strict model of the `env` section, built from DoomEnv's constructor."""
    from envs.doom_env import DoomEnv

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
    seed: int = 0
    devices: list[DeviceSettings] = Field(default_factory=lambda: [DeviceSettings()], min_length=1)
    loop: LoopSection = Field(default_factory=LoopSection)
    safety: SafetyEnvelope = Field(default_factory=SafetyEnvelope)
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    env: dict[str, Any] = Field(default_factory=dict)
    model: ClosedLoopModelConfig = Field(default_factory=ClosedLoopModelConfig)
    ablation: Literal["none", "zero", "random"] = "none"
    policy: Literal["closed_loop", "direct"] = Field(
        "closed_loop", description="direct: features straight to actions, no culture (the no-neurons control)")
    ppo: PPOSection = Field(default_factory=PPOSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    stop: StopSection = Field(default_factory=lambda: StopSection(iterations=DEFAULT_STOP_ITERATIONS))
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    tune: TuneSection = Field(default_factory=TuneSection)
    output: OutputSection = Field(default_factory=OutputSection)
    view: ViewSection = Field(default_factory=ViewSection)

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

    @model_validator(mode="after")
    def _cross_checks(self) -> Experiment:
        try:
            env_section_model().model_validate(self.env)  # types and unknown keys of `env`
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
            raise ValueError(f"env.{where}: {what} (got {first.get('input')!r})") from None
        self.model = dataclasses.replace(self.model, ablation=self.ablation)
        if self.policy == "direct" and self.ablation != "none":
            raise ValueError("ablation: the direct policy has no culture whose spikes could be ablated; "
                             "use ablation: none with policy: direct")
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
        CultureSettings(devices=tuple(self.devices))  # device-list rules (unique ids, one sim template)
        hardware = [d for d in self.devices if not d.simulated]
        if hardware and self.resources.num_env_runners > len(hardware):
            raise ValueError(
                f"resources.num_env_runners={self.resources.num_env_runners} but only {len(hardware)} cl1 "
                "device(s) are listed: one culture serves one game"
            )
        if self.resources.num_env_runners == 0 and hardware:
            raise ValueError("resources.num_env_runners must be >= 1 with cl1 devices (env runners sit on device nodes)")
        for key, spec in self.tune.search_space.items():
            _check_search_entry(self, key, spec)
        return self

    # --- what the experiment builds -------------------------------------------------

    def culture_settings(self) -> CultureSettings:
        """The settings every env runner uses to reach its culture."""
        return CultureSettings(
            devices=tuple(self.devices),
            envelope=self.safety,
            envelope_policy=self.loop.envelope_policy,
            timeout_s=self.loop.timeout_s,
            timeout_policy=self.loop.timeout_policy,
            max_consecutive_timeouts=self.loop.max_consecutive_timeouts,
            on_device_loss=self.loop.on_device_loss,
            feedback=self.feedback,
            fast_path=self.loop.fast_path,
            reply_spin_ms=self.loop.reply_spin_ms,
            step_log=self.output.step_log,
        )

    def algorithm_config(self):
        """The ClosedLoopPPOConfig this experiment trains with."""
        from experiments.loop import closed_loop_config

        return closed_loop_config(
            culture=self.culture_settings(),
            policy=self.policy,
            env_config=dict(self.env),
            model_config=dataclasses.asdict(self.model),
            num_env_runners=self.resources.num_env_runners,
            training=self.ppo.training_kwargs(),
            seed=self.seed,
            view=self.view.settings(),
        ).learners(num_learners=self.resources.num_learners, num_gpus_per_learner=self.resources.num_gpus_per_learner)

    def plain(self) -> dict[str, Any]:
        """The resolved experiment as plain data that validates again (the ablation only at top level)."""
        return self.model_dump(mode="json", exclude={"model": {"ablation"}})

    def to_yaml(self) -> str:
        """The fully resolved experiment, every default written out."""
        return yaml.safe_dump(_plain(self.plain()), sort_keys=False)


def _feedback_specs(feedback: FeedbackSettings):
    for name in ("step_positive", "step_negative", "episode_positive", "episode_negative"):
        yield name, getattr(feedback, name)
    for name, spec in feedback.events.items():
        yield f"events.{name}", spec


def _check_search_entry(experiment: Experiment, key: str, spec: dict[str, Any]) -> None:
    where = f"tune.search_space.{key}"
    if len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
        raise ValueError(f"{where}: use exactly one of {', '.join(SEARCH_KINDS)}, e.g. {{grid: [0.1, 0.2]}}")
    try:
        _get_path(experiment.plain(), key)
    except KeyError:
        raise ValueError(f"{where}: {key!r} is not a setting of the experiment") from None


def _plain(value: Any) -> Any:
    """YAML-friendly: tuples and sets become lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items) if isinstance(value, (set, frozenset)) else items
    return value


def _get_path(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(dotted)
    return node


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
                raise ExperimentError(f"--set {dotted}: {'.'.join(parts[:i + 1])} is not an index of that list")
            node = node[int(part)]
            default = default[int(part)] if isinstance(default, list) and int(part) < len(default) else None
        else:
            default = default.get(part) if isinstance(default, dict) else None
            if node.get(part) is None:
                node[part] = copy.deepcopy(default) if isinstance(default, dict) else {}
            node = node[part]
        if not isinstance(node, (dict, list)):
            raise ExperimentError(f"--set {dotted}: {'.'.join(parts[:i + 1])} is a value, not a section")
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


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", c) with c parsed as YAML (numbers, booleans, lists)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ExperimentError(f"--set {text!r}: write KEY=VALUE, e.g. --set stop.iterations=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ExperimentError(f"--set {text!r}: the value is not valid YAML: {exc}") from None
    return key.strip(), value


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: the key path, what is wrong, and the input."""
    lines = [f"{source}: {exc.error_count()} problem(s):"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            message = "unknown key (check the spelling; see the example YAMLs in experiments/)"
        if not err["loc"]:  # a cross-section check: its message starts with the key path
            lines.append(f"  {message}")
        elif err["type"] == "missing":
            lines.append(f"  {path}: {message}")
        else:
            lines.append(f"  {path}: {message} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read, override and validate an experiment file; ExperimentError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: the top level must be a mapping of sections (name, devices, env, ...)")
    return experiment_from_dict(data, overrides, source=str(path))


def experiment_from_dict(data: dict[str, Any], overrides=(), source: str = "experiment") -> Experiment:
    """Validate a parsed experiment (with `--set` overrides applied first)."""
    data = copy.deepcopy(data)
    defaults = default_experiment_tree() if overrides else None
    for text in overrides:
        key, value = parse_override(text)
        set_path(data, key, value, defaults)
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        raise ExperimentError(format_validation_error(exc, source)) from None
