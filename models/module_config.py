"""Every setting of the closed-loop RLModule, with its default, in one place.

Pass them as `RLModuleSpec(model_config={...})` or `config.rl_module(model_config={...})`;
`ClosedLoopModelConfig.from_dict` reads that dict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Literal

from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

from spikeloop.bridge.wire.channels import STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ

AblationMode = Literal["none", "zero", "random", "shuffled"]
DecoderType = Literal["linear", "mlp"]
DecoderInit = Literal["random", "motor_map"]
ScreenCNNType = Literal["strided", "pooled"]
ScreenView = Literal["raw", "edge", "contrast"]
SCREEN_VIEWS: tuple[ScreenView, ...] = ("raw", "edge", "contrast")
MAX_SAME_FRAME_ROUNDS = 8
"""A step takes one culture exchange per round: 8 rounds at 10 Hz are already under 1.3 steps/s."""
EncoderParametrization = Literal["mode_concentration", "alpha_beta"]
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
    encoder_parametrization: EncoderParametrization = "mode_concentration"
    """How the encoder's head becomes Beta parameters: "mode_concentration" (where the stimulation sits and how
    noisy it is are separate outputs) or "alpha_beta" (models/distributions.py)."""
    encoder_head_init_std: float = 1.0
    """Init std of the head weights that set the modes (alpha and beta with "alpha_beta"): how much the first
    stimulation already depends on the observation."""
    encoder_init_concentration: float = 42.0
    """alpha + beta of every stimulation Beta at init: its noise (Beta std 0.076 of the range at 42 with the mode
    in the middle, 0.10 at 22, 0.24 at 3.39, the bare alpha = beta = softplus(0) + 1). Must be > 2."""
    encoder_trainable: bool = True
    """False: the encoder (trunk, screen CNN, heads) is never updated and stimulates deterministically (each
    Beta's mean) with log-probability 0, the reference trainer's frozen-encoder control: whatever improves
    is the decoder and the culture. Its input normalisation still follows the features (it feeds the value
    net too); set feature_normalization false to pin the observation-to-stimulation map exactly."""
    same_frame_rounds: int = 1
    """Stimulations per game frame (the reference trainer's same-frame encoding; experimental). With R > 1 each
    frame is encoded R times by the shared trunk with a head of its own per round (with a screen, round r sees
    the screen through same_frame_views[r]), each of the R stimulations gets its own spike reply from the
    culture, and the decoder reads the R replies side by side (8 R inputs, round-major). A step then takes R
    exchanges: R times the device time per step."""
    same_frame_views: tuple[ScreenView, ...] = SCREEN_VIEWS
    """How round r sees the screen: "raw", "edge" (Sobel magnitude) or "contrast" (tanh around the frame's mean);
    rounds beyond the list see it raw. Used only with same_frame_rounds > 1 and a screen."""
    screen_cnn: ScreenCNNType = "strided"
    """The CNN on the screen (used only if obs has a "screen", `env: {screen: true}`): "strided" (the
    screen_cnn_filters stack, projected to screen_embedding_dim) or "pooled" (the reference trainer's: three
    3x3 convs of C, 2C, 4C channels, C = screen_cnn_channels, max-pooled by 2 after the first two, averaged
    over the whole screen after the third: 4C features)."""
    screen_cnn_filters: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2))
    """(out_channels, kernel, stride) per conv layer of the "strided" screen CNN."""
    screen_embedding_dim: int = 128
    """Size of the "strided" screen CNN's output that is concatenated to the scalar features."""
    screen_cnn_channels: int = 64
    """C of the "pooled" screen CNN (the reference's 64)."""
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
    decoder_init: DecoderInit = "random"
    """How the linear readout starts: "random" (normal, std decoder_init_std) or "motor_map", a fixed, documented
    mapping: each action's logit is decoder_map_gain x the summed counts of the motor groups whose buttons the
    action presses (motor group k of spikeloop.bridge.wire.channels.SPIKE_GROUPS <-> the button of the same name; the encoding
    group and the no-op read nothing; with same-frame rounds every round's groups count). Meant to be frozen
    (decoder_frozen), as the culture protocol does, so that the mapping from spikes to action never changes."""
    decoder_map_gain: float = 1.0
    """Logit per spike count of the "motor_map" readout: at 1, one more count in a group makes its actions e times
    as likely."""

    # Observation features, as the encoder and the value net read them.
    feature_normalization: bool = True
    """Centre each observation feature and divide it by its running std (models/feature_norm.py)."""
    feature_norm_momentum: float = 0.1
    """Weight of each train batch in the running feature mean/std (the first batch sets them)."""
    feature_std_floor: float = 0.05
    """Smallest std a feature is divided by (features lie in [-1, 1]): a nearly constant one is not blown up."""
    feature_clip: float = 5.0
    """Normalised features are clipped to +-this."""

    # Value net: a separate MLP on the scalar observation features.
    value_hiddens: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the value MLP (SiLU)."""
    value_sees_screen: bool = False
    """The value MLP also reads the screen's pixels (scaled to [0, 1], flattened after the features), as the
    reference trainer's did; needs a screen in the observation (`env: {screen: true}`)."""
    value_normalization: bool = True
    """Train the value net on normalised targets (running mean/std, outputs preserved: models/value.py)."""
    value_norm_momentum: float = 0.1
    """Weight of each train batch's value targets in the running mean/std (the first batch sets them)."""

    # Ablation of the decoder input (the spikes): the science's control conditions.
    ablation: AblationMode = "none"
    """"none": real spikes; "zero": all zeros; "random": Poisson counts (ablation_poisson_rate); "shuffled": one of
    the culture's own recent answers, to another stimulation (models/closed_loop/shuffled_answers.py)."""
    ablation_poisson_rate: float = 1.0
    """Mean spike count per group per tick when ablation is "random"."""
    ablation_shuffle_pool: int = 256
    """How many of the culture's latest answers "shuffled" draws from (about 25 s of a CL1 at 10 steps/s)."""

    # Running spike mean used to centre the decoder input.
    spike_mean_mode: SpikeMeanMode = "ema"
    """"ema": exponential moving average over train batches; "cumulative": mean of all samples; "off": stays 0."""
    spike_mean_momentum: float = 0.1
    """EMA weight of each new train batch's mean (the first batch sets the mean outright)."""
    spike_scaling: bool = True
    """Also divide the centred spikes by their running std per group, so the decoder sees unit-scale inputs
    whatever a culture's count range (a group of the simulated culture ranges over ~65 counts, a perfect
    channel's over 10). Same running mode and momentum as the mean."""
    spike_std_floor: float = 1.0
    """Smallest std (counts) a group is divided by: a nearly silent group is not amplified into noise."""

    def __post_init__(self) -> None:
        for name, (lo, hi) in (
            ("stim_frequency_range_hz", self.stim_frequency_range_hz),
            ("stim_amplitude_range_ua", self.stim_amplitude_range_ua),
        ):
            if not lo < hi:
                raise ValueError(f"{name} must be (low, high) with low < high, got {(lo, hi)}")
        if self.ablation not in ("none", "zero", "random", "shuffled"):
            raise ValueError(f"ablation must be none, zero, random or shuffled, got {self.ablation!r}")
        if not 1 <= self.ablation_shuffle_pool <= 1_000_000:
            raise ValueError(f"ablation_shuffle_pool must be 1 to 1000000 answers, got {self.ablation_shuffle_pool}")
        if self.decoder_type not in ("linear", "mlp"):
            raise ValueError(f"decoder_type must be linear or mlp, got {self.decoder_type!r}")
        if self.decoder_nonnegative and self.decoder_type != "linear":
            raise ValueError("decoder_nonnegative applies to the linear decoder only")
        if self.decoder_init not in ("random", "motor_map"):
            raise ValueError(f"decoder_init must be random or motor_map, got {self.decoder_init!r}")
        if self.decoder_init == "motor_map" and (self.decoder_type != "linear" or self.decoder_nonnegative):
            raise ValueError(
                "decoder_init motor_map is a linear readout with weights 0 and the gain: use decoder_type linear "
                "and decoder_nonnegative false"
            )
        if not (math.isfinite(self.decoder_map_gain) and self.decoder_map_gain > 0.0):
            raise ValueError(f"decoder_map_gain must be a finite number > 0, got {self.decoder_map_gain!r}")
        if self.spike_mean_mode not in ("ema", "cumulative", "off"):
            raise ValueError(f"spike_mean_mode must be ema, cumulative or off, got {self.spike_mean_mode!r}")
        if not 0.0 < self.spike_mean_momentum <= 1.0:
            raise ValueError("spike_mean_momentum must lie in (0, 1]")
        if not self.spike_std_floor > 0.0:
            raise ValueError("spike_std_floor must be > 0 (counts)")
        if self.encoder_init_concentration <= 2.0:
            raise ValueError("encoder_init_concentration must be > 2 (alpha and beta are each > 1)")
        if self.encoder_parametrization not in ("mode_concentration", "alpha_beta"):
            raise ValueError(
                "encoder_parametrization must be mode_concentration or alpha_beta, "
                f"got {self.encoder_parametrization!r}"
            )
        if not 0.0 < self.feature_norm_momentum <= 1.0:
            raise ValueError("feature_norm_momentum must lie in (0, 1]")
        if not self.feature_std_floor > 0.0 or not self.feature_clip > 0.0:
            raise ValueError("feature_std_floor and feature_clip must be > 0")
        if not 0.0 < self.value_norm_momentum <= 1.0:
            raise ValueError("value_norm_momentum must lie in (0, 1]")
        if not 1 <= self.same_frame_rounds <= MAX_SAME_FRAME_ROUNDS:
            raise ValueError(f"same_frame_rounds must be 1-{MAX_SAME_FRAME_ROUNDS}, got {self.same_frame_rounds}")
        unknown_views = [v for v in self.same_frame_views if v not in SCREEN_VIEWS]
        if unknown_views:
            raise ValueError(f"same_frame_views: {unknown_views} unknown; each must be one of {list(SCREEN_VIEWS)}")
        if self.screen_cnn not in ("strided", "pooled"):
            raise ValueError(f"screen_cnn must be strided or pooled, got {self.screen_cnn!r}")
        if self.screen_cnn_channels < 1:
            raise ValueError("screen_cnn_channels must be >= 1")
        if self.ablation_poisson_rate < 0.0:
            raise ValueError("ablation_poisson_rate must be >= 0")

    @classmethod
    def from_dict(
        cls, model_config: dict[str, Any] | ClosedLoopModelConfig | DefaultModelConfig | None
    ) -> ClosedLoopModelConfig:
        """Read the module's model_config dict; unknown keys (typos) raise, RLlib's own keys are ignored."""
        if isinstance(model_config, ClosedLoopModelConfig):
            return model_config
        if isinstance(model_config, DefaultModelConfig):  # RLlib's own settings only: the defaults here
            model_config = dataclasses.asdict(model_config)
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
            "same_frame_views",
        ):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "screen_cnn_filters" in kwargs:
            kwargs["screen_cnn_filters"] = tuple(tuple(f) for f in kwargs["screen_cnn_filters"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for RLModuleSpec(model_config=...)."""
        return dataclasses.asdict(self)
