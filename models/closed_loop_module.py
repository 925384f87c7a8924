"""The closed-loop RLModule: encoder (obs -> stim), decoder (spikes -> action), value net.

The culture sits between encoder and decoder, outside this module: a module-to-env
connector samples `stim` from `encoder_distribution`, exchanges it with the culture for
`spikes`, and samples the game action from `decoder_distribution(decode(...))`. The module
therefore never sees spikes when acting, only in `forward_train`, where the stored
`"spikes"`, `"spike_mean"` and `"spike_std"` columns are replayed through the decoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import nn

from spikeloop.bridge.wire.channels import N_ENCODING, N_SPIKE_GROUPS
from spikeloop.models.columns import SPIKE_MEAN, SPIKE_STD, SPIKES, STIM_DIST_INPUTS
from spikeloop.models.decoder import SpikeDecoder
from spikeloop.models.distributions import FixedStimulation, TorchRangedBeta
from spikeloop.models.encoder import StimEncoder, features_and_screen, n_discrete_actions, split_observation_space
from spikeloop.models.feature_norm import FeatureNormalizer
from spikeloop.models.module_config import ClosedLoopModelConfig
from spikeloop.models.value import NormalizedValueNet

if TYPE_CHECKING:
    from spikeloop.models.closed_loop.shuffled_answers import ShuffledAnswers

MODE_DEPENDENT_LAYERS = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)
"""Layers whose output depends on train/eval mode; the module has none (see forward_exploration)."""


def feature_normalizer(observation_space, settings: ClosedLoopModelConfig) -> FeatureNormalizer:
    """The running normaliser of the observation's feature vector (the screen is scaled by the CNN itself)."""
    features_space, _ = split_observation_space(observation_space)
    return FeatureNormalizer(
        int(np.prod(features_space.shape)),
        enabled=settings.feature_normalization,
        momentum=settings.feature_norm_momentum,
        std_floor=settings.feature_std_floor,
        clip=settings.feature_clip,
    )


def build_value_net(observation_space, settings: ClosedLoopModelConfig) -> NormalizedValueNet:
    """The normalised value net on the observation's features (and its screen's pixels if value_sees_screen)."""
    features_space, screen_space = split_observation_space(observation_space)
    screen_size, screen_scale = 0, 1.0
    if settings.value_sees_screen:
        if screen_space is None:
            raise ValueError("model.value_sees_screen needs a screen in the observation: set env.screen: true")
        screen_size = int(np.prod(screen_space.shape))
        screen_scale = 1.0 / 255.0 if screen_space.dtype == np.uint8 else 1.0
    return NormalizedValueNet(
        int(np.prod(features_space.shape)),
        settings.value_hiddens,
        normalize=settings.value_normalization,
        momentum=settings.value_norm_momentum,
        screen_size=screen_size,
        screen_scale=screen_scale,
    )


class ClosedLoopRLModule(TorchRLModule, ValueFunctionAPI):
    """Encoder, decoder and value net of the closed loop; settings in ClosedLoopModelConfig."""

    @override(TorchRLModule)
    def setup(self) -> None:
        """Build the three networks and the spike-mean buffers from model_config."""
        self.settings = ClosedLoopModelConfig.from_dict(self.model_config)
        s = self.settings
        self.n_actions = n_discrete_actions(self.action_space)
        self.encoder = StimEncoder(self.observation_space, s)
        if not s.encoder_trainable:
            self.encoder.requires_grad_(False)
        self.n_rounds = s.same_frame_rounds
        self.n_decoder_inputs = N_SPIKE_GROUPS * self.n_rounds
        """One spike reply per same-frame round, side by side (round-major)."""
        self.decoder = SpikeDecoder(self.n_decoder_inputs, self.n_actions, s)
        self.feature_norm = feature_normalizer(self.observation_space, s)
        self.value_net = build_value_net(self.observation_space, s)
        # One stimulation per round, each N_ENCODING frequencies then N_ENCODING amplitudes.
        (f_low, f_high), (a_low, a_high) = s.stim_frequency_range_hz, s.stim_amplitude_range_ua
        stim_low = ([f_low] * N_ENCODING + [a_low] * N_ENCODING) * self.n_rounds
        stim_high = ([f_high] * N_ENCODING + [a_high] * N_ENCODING) * self.n_rounds
        # Non-persistent: ranges come from the config, a checkpoint must not override them.
        self.register_buffer("stim_low", torch.tensor(stim_low), persistent=False)
        self.register_buffer("stim_high", torch.tensor(stim_high), persistent=False)
        # Persistent buffers: in state_dict, hence in checkpoints and in the weights synced to env runners.
        self.register_buffer("spike_mean", torch.zeros(self.n_decoder_inputs))
        self.register_buffer("spike_mean_count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("spike_sq_mean", torch.zeros(self.n_decoder_inputs))
        mode_dependent = [type(m).__name__ for m in self.modules() if isinstance(m, MODE_DEPENDENT_LAYERS)]
        if mode_dependent:  # acting skips RLlib's train/eval switch (see forward_exploration)
            raise TypeError(f"layers that act differently in training are not supported here: {mode_dependent}")

    # ---- parameter groups (the learner gives the encoder its own learning rate) ----

    def encoder_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the stimulation encoder (trunk, screen CNN, Beta heads)."""
        return [p for p in self.encoder.parameters() if p.requires_grad]

    def decoder_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the spike decoder (empty if frozen)."""
        return [p for p in self.decoder.parameters() if p.requires_grad]

    def decoder_weight_l2(self) -> torch.Tensor:
        """Sum of the squared decoder weights (for the optional L2 term and its metric)."""
        return self.decoder.weight_l2()

    def value_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the value net."""
        return [p for p in self.value_net.parameters() if p.requires_grad]

    # ---- forward passes ----

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Acting pass: encoder Beta inputs and value predictions; no action (the culture decides)."""
        features, screen = features_and_screen(batch[Columns.OBS])
        features = self.feature_norm(features)
        return {
            STIM_DIST_INPUTS: self.encoder(features, screen),
            Columns.VF_PREDS: self.value_net(features, screen),
        }

    # RLlib's TorchRLModule switches to eval mode and back around every acting pass: two walks over all
    # submodules per game tick, on the tick's critical path. This module has no layer that behaves
    # differently in training (no dropout, no normalisation), so acting skips the switch.
    @override(TorchRLModule)
    def forward_exploration(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Acting pass while exploring (no train/eval switch: nothing here depends on the mode)."""
        return self._forward_exploration(batch, **kwargs)

    @override(TorchRLModule)
    def forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Acting pass without exploration (no train/eval switch: nothing here depends on the mode)."""
        return self._forward_inference(batch, **kwargs)

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Training pass: also replays the stored spikes through the decoder with the stored mean."""
        out = self._forward(batch)
        out[Columns.ACTION_DIST_INPUTS] = self.decode(batch[SPIKES], batch[SPIKE_MEAN], batch[SPIKE_STD])
        return out

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Value estimates [B] from the observation features (and screen) (ValueFunctionAPI, used by GAE)."""
        features, screen = features_and_screen(batch[Columns.OBS])
        return self.value_net(self.feature_norm(features), screen)

    # ---- pieces the culture connector calls ----

    def encoder_distribution(self, stim_dist_inputs: torch.Tensor) -> TorchRangedBeta | FixedStimulation:
        """Distribution over the stimulation [.., 16 R]: per round 8 frequencies (Hz), then 8 amplitudes (uA); a fixed
        one if the encoder is frozen."""
        beta = TorchRangedBeta.from_logits(
            stim_dist_inputs,
            low=self.stim_low,
            high=self.stim_high,
            parametrization=self.settings.encoder_parametrization,
        )
        return beta if self.settings.encoder_trainable else FixedStimulation(beta.deterministic_sample())

    def decode(
        self, spikes: torch.Tensor, spike_mean: torch.Tensor | None = None, spike_std: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Action logits from spike counts, centred by spike_mean and divided by spike_std (default: the running ones)."""
        if spike_mean is None:
            spike_mean = self.spike_mean
        if spike_std is None:
            spike_std = self.spike_std()
        device = spikes.device
        return self.decoder((spikes.float() - spike_mean.to(device).float()) / spike_std.to(device).float())

    @torch.no_grad()
    def spike_std(self) -> torch.Tensor:
        """The scale the centred spikes are divided by [n_decoder_inputs]: running std, floored (ones if off)."""
        s = self.settings
        if not s.spike_scaling:
            return torch.ones_like(self.spike_mean)
        variance = (self.spike_sq_mean - self.spike_mean.pow(2)).clamp_min(0.0)
        return variance.sqrt().clamp_min(s.spike_std_floor)

    def decoder_distribution(self, action_logits: torch.Tensor) -> TorchCategorical:
        """Categorical over the game actions."""
        return TorchCategorical(logits=action_logits)

    def act(self, action_logits: torch.Tensor, explore: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, its log-probability) from decoder logits: sampled, or the most likely when not exploring.

        The same Categorical as `decoder_distribution`, in four tensor ops: it runs on every tick
        between the culture's answer and the game step, where each microsecond counts.
        """
        logp_all = torch.log_softmax(action_logits, dim=-1)
        action = torch.multinomial(logp_all.exp(), 1).squeeze(-1) if explore else logp_all.argmax(-1)
        return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def ablate(
        self,
        spikes: torch.Tensor,
        generator: torch.Generator | None = None,
        answers: ShuffledAnswers | None = None,
    ) -> torch.Tensor:
        """The decoder input under this module's ablation setting; store what this returns. "shuffled" draws
        from `answers`, the env runner's pool of the culture's recent answers (and adds these to it)."""
        mode = self.settings.ablation
        spikes = torch.as_tensor(spikes, dtype=torch.float32)
        if mode == "none":
            return spikes
        if mode == "zero":
            return torch.zeros_like(spikes)
        if mode == "shuffled":
            if answers is None:
                raise ValueError("ablation shuffled: the tick needs its env runner's pool of answers (answers=)")
            return torch.from_numpy(answers.swap(spikes.numpy(), generator))
        rate = torch.full_like(spikes, self.settings.ablation_poisson_rate)
        return torch.poisson(rate, generator=generator)

    # ---- running spike mean ----

    @torch.no_grad()
    def update_spike_mean(self, spikes: torch.Tensor) -> None:
        """Fold a batch of used spike vectors [N, n_decoder_inputs] into the running mean and second moment."""
        mode = self.settings.spike_mean_mode
        spikes = torch.as_tensor(spikes, dtype=torch.float64, device=self.spike_mean.device)
        spikes = spikes.reshape(-1, self.n_decoder_inputs)
        n = spikes.shape[0]
        if mode == "off" or n == 0:
            return
        old_count = self.spike_mean_count.item()
        for buffer, batch_value in ((self.spike_mean, spikes.mean(0)), (self.spike_sq_mean, spikes.pow(2).mean(0))):
            if old_count == 0:
                # First batch sets the statistics outright (no bias towards the zero initial value).
                new_value = batch_value
            elif mode == "ema":
                m = self.settings.spike_mean_momentum
                new_value = (1.0 - m) * buffer.double() + m * batch_value
            else:
                new_value = (old_count * buffer.double() + n * batch_value) / (old_count + n)
            buffer.copy_(new_value)
        self.spike_mean_count.add_(n)
