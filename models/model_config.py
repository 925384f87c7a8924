"""Every setting of the closed-loop RLModule, with its default, in one place.

Pass them as `RLModuleSpec(model_config={...})` or `config.rl_module(model_config={...})`;
`ClosedLoopModelConfig.from_dict` reads that dict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal

from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

from bridge.channels import STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ

AblationMode = Literal["none", "zero", "random"]
DecoderType = Literal["linear", "mlp"]
SpikeMeanMode = Literal["ema", "cumulative", "off"]

# RLlib merges its own model keys into every module's model_config (DefaultModelConfig
# fields plus PPO's auto-included "vf_share_layers"); these are tolerated and ignored.
_RLLIB_MODEL_KEYS = frozenset(f.name for f in fields(DefaultModelConfig)) | {"vf_share_layers"}


@dataclass(frozen=True)
class ClosedLoopModelConfig:
    """Settings of ClosedLoopRLModule (encoder, decoder, value net, ablation, spike mean)."""

    # Encoder: observation -> 16 Beta distributions over the stimulation.
    stim_frequency_range_hz: tuple[float, float] = STIM_FREQUENCY_RANGE_HZ
    """Frequency range of every encoding electrode; the Beta on [0, 1] is mapped onto it."""
    stim_amplitude_range_ua: tuple[float, float] = STIM_AMPLITUDE_RANGE_UA
    """Amplitude range of every encoding electrode."""
    encoder_hiddens: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the encoder's scalar-feature MLP trunk (SiLU)."""
    encoder_head_init_std: float = 0.5
    """Init std of the Beta heads' weights: how much the first stimulation already depends on the observation
    (0.5: it does from the start, so the decoder has something to read while the encoder learns)."""
    encoder_init_concentration: float = 3.39
    """alpha + beta of every stimulation Beta at init (head outputs 0); 3.39 is the bare softplus(0) + 1 each.
    Higher: a narrower first stimulation (Beta std 0.24 at 3.39, 0.15 at 10 in units of the range)."""
    screen_cnn_filters: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2))
    """(out_channels, kernel, stride) per conv layer of the screen CNN (used only if obs has a "screen")."""
    screen_embedding_dim: int = 128
    """Size of the screen CNN's output that is concatenated to the scalar features."""
    screen_layout: Literal["auto", "hwc", "chw"] = "auto"
    """Axis order of the screen; "auto": channels-last if the last axis has <= 4 entries."""

    # Decoder: spikes (8 groups) -> game action logits.
    decoder_type: DecoderType = "linear"
    """"linear" readout or a small "mlp"."""
    decoder_hiddens: tuple[int, ...] = (64,)
    """Hidden layer sizes of the MLP decoder (SiLU); ignored for "linear"."""
    decoder_bias: bool = False
    """Give the decoder layers a bias; off so that the action depends on the spikes alone."""
    decoder_nonnegative: bool = False
    """Linear readout weights are softplus(raw) >= 0 (only for "linear")."""
    decoder_frozen: bool = False
    """Decoder weights are not trained (requires_grad False): all learning is encoder + culture."""
    decoder_init_std: float = 0.3
    """Init std of the linear readout weights (raw weights if non-negative); about the reference's xavier scale."""

    # Value net: a separate MLP on the scalar observation features.
    value_hiddens: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the value MLP (SiLU)."""
    value_normalization: bool = True
    """Train the value net on normalised targets (running mean/std, outputs preserved: models/value.py)."""
    value_norm_momentum: float = 0.1
    """Weight of each train batch's value targets in the running mean/std (the first batch sets them)."""

    # Ablation of the decoder input (the spikes): the science's control conditions.
    ablation: AblationMode = "none"
    """"none": real spikes; "zero": all zeros; "random": Poisson counts (ablation_poisson_rate)."""
    ablation_poisson_rate: float = 1.0
    """Mean spike count per group per tick when ablation is "random"."""

    # Running spike mean used to centre the decoder input.
    spike_mean_mode: SpikeMeanMode = "ema"
    """"ema": exponential moving average over train batches; "cumulative": mean of all samples; "off": stays 0."""
    spike_mean_momentum: float = 0.1
    """EMA weight of each new train batch's mean (the first batch sets the mean outright)."""

    def __post_init__(self) -> None:
        for name, (lo, hi) in (
            ("stim_frequency_range_hz", self.stim_frequency_range_hz),
            ("stim_amplitude_range_ua", self.stim_amplitude_range_ua),
        ):
            if not lo < hi:
                raise ValueError(f"{name} must be (low, high) with low < high, got {(lo, hi)}")
        if self.ablation not in ("none", "zero", "random"):
            raise ValueError(f"ablation must be none, zero or random, got {self.ablation!r}")
        if self.decoder_type not in ("linear", "mlp"):
            raise ValueError(f"decoder_type must be linear or mlp, got {self.decoder_type!r}")
        if self.decoder_nonnegative and self.decoder_type != "linear":
            raise ValueError("decoder_nonnegative applies to the linear decoder only")
        if self.spike_mean_mode not in ("ema", "cumulative", "off"):
            raise ValueError(f"spike_mean_mode must be ema, cumulative or off, got {self.spike_mean_mode!r}")
        if not 0.0 < self.spike_mean_momentum <= 1.0:
            raise ValueError("spike_mean_momentum must lie in (0, 1]")
        if self.encoder_init_concentration <= 2.0:
            raise ValueError("encoder_init_concentration must be > 2 (alpha and beta are each > 1)")
        if not 0.0 < self.value_norm_momentum <= 1.0:
            raise ValueError("value_norm_momentum must lie in (0, 1]")
        if self.ablation_poisson_rate < 0.0:
            raise ValueError("ablation_poisson_rate must be >= 0")

    @classmethod
    def from_dict(cls, model_config: dict[str, Any] | ClosedLoopModelConfig | None) -> ClosedLoopModelConfig:
        """Read the module's model_config dict; unknown keys (typos) raise, RLlib's own keys are ignored."""
        if isinstance(model_config, ClosedLoopModelConfig):
            return model_config
        model_config = dict(model_config or {})
        own = {f.name for f in fields(cls)}
        unknown = set(model_config) - own - _RLLIB_MODEL_KEYS
        if unknown:
            raise ValueError(f"unknown closed-loop model_config keys: {sorted(unknown)}")
        kwargs = {k: v for k, v in model_config.items() if k in own}
        # YAML and RLlib's dataclass round-trips turn tuples into lists; the dataclass is frozen on tuples.
        for key in (
            "stim_frequency_range_hz",
            "stim_amplitude_range_ua",
            "encoder_hiddens",
            "decoder_hiddens",
            "value_hiddens",
        ):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "screen_cnn_filters" in kwargs:
            kwargs["screen_cnn_filters"] = tuple(tuple(f) for f in kwargs["screen_cnn_filters"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for RLModuleSpec(model_config=...)."""
        return dataclasses.asdict(self)
