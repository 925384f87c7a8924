"""ClosedLoopPPOConfig: RLlib's PPOConfig with the closed loop's learner settings and defaults.

Kept from the reference trainer: gamma 0.997, lambda 0.95, clip 0.2, value coefficient 0.3,
decoder entropy 0.02, encoder entropy 0 (the reference's -0.10 was never applied; settable),
4 epochs, the gradient norm clipped at 3 over all parameters together.

Changed from it, because with them nothing learned within 20k steps of `basic` (measurements
in docs/architecture.md, "The learner"): 512 env steps per update in minibatches of 128
(reference 2048 / 256), learning rates 3e-3 for the encoder and 1e-2 for the decoder and the
(normalised) value net (reference 1.2e-3 / 3e-4 / 3e-4), and the encoder's and decoder's
ratios clipped each on its own ("factored"; reference: one joint ratio). Every one of them is
a setting: the reference values can be set back per experiment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from spikeloop.models import rllib_notices
from spikeloop.models.learner import ClosedLoopPPOLearner
from spikeloop.models.ray_internals import NotProvidedType

# Every process that builds or unpickles this config (driver, trial, env runners, learners) imports this
# module first: the one place that reaches them all.
rllib_notices.install()


class ClosedLoopPPOConfig(PPOConfig):
    """PPO over the joint log-probability of stimulation and action, with the closed-loop module."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class)
        # Reference PPO settings.
        self.gamma = 0.997
        self.lambda_ = 0.95
        self.clip_param = 0.2
        self.vf_loss_coeff = 0.3
        self.vf_clip_param = float("inf")  # RLlib semantics (clamp on the squared error); inf = unclipped
        self.minibatch_size = 128  # type: ignore[assignment]  # RLlib sets it to None, unannotated
        self.num_epochs = 4
        self.train_batch_size_per_learner = 512
        self.lr = 1e-2  # the value net's rate; encoder and decoder get lr times their multipliers
        # The reference's max norm, over all parameters at once (see the learner).
        self.grad_clip = 3.0  # type: ignore[assignment]  # RLlib sets it to None, unannotated
        self.grad_clip_by = "global_norm"
        self.use_kl_loss = False
        self.entropy_coeff = 0.0  # unused: see encoder_entropy_coeff / decoder_entropy_coeff
        # One culture cannot serve two games: one env per env runner.
        self.num_envs_per_env_runner = 1

        # Closed-loop learner settings.
        self.encoder_entropy_coeff = 0.0
        """loss -= encoder_entropy_coeff * H(stim | obs); any sign (negative sharpens the stimulation)."""
        self.decoder_entropy_coeff = 0.02
        """loss -= decoder_entropy_coeff * H(action | spikes); any sign."""
        self.encoder_lr_multiplier = 0.3
        """Encoder learning rate = lr * this (its own optimizer; also scales an lr schedule)."""
        self.decoder_lr_multiplier = 1.0
        """Decoder learning rate = lr * this (its own optimizer; also scales an lr schedule)."""
        self.decoder_weight_l2_coeff = 0.0
        """loss += this * sum of squared decoder weights (effective weights if non-negative)."""
        self.ratio_clipping = "factored"
        """"joint": one clipped ratio over log p(stim) + log p(action); "factored": the encoder's and the
        decoder's ratios clipped each on its own, surrogates summed."""

        # The module-to-env piece that exchanges stim for spikes with the culture.
        self.culture_connector: Callable[[Any, Any], ConnectorV2] | None = None
        """(env, spaces) -> ConnectorV2; placed FIRST in the module-to-env pipeline (see build_module_to_env_connector)."""

    def training(
        self,
        *,
        encoder_entropy_coeff: float | NotProvidedType = NotProvided,
        decoder_entropy_coeff: float | NotProvidedType = NotProvided,
        encoder_lr_multiplier: float | NotProvidedType = NotProvided,
        decoder_lr_multiplier: float | NotProvidedType = NotProvided,
        decoder_weight_l2_coeff: float | NotProvidedType = NotProvided,
        ratio_clipping: str | NotProvidedType = NotProvided,
        **kwargs,
    ) -> Self:
        """PPOConfig.training plus the closed-loop settings."""
        super().training(**kwargs)
        if not isinstance(encoder_entropy_coeff, NotProvidedType):
            self.encoder_entropy_coeff = encoder_entropy_coeff
        if not isinstance(decoder_entropy_coeff, NotProvidedType):
            self.decoder_entropy_coeff = decoder_entropy_coeff
        if not isinstance(encoder_lr_multiplier, NotProvidedType):
            self.encoder_lr_multiplier = encoder_lr_multiplier
        if not isinstance(decoder_lr_multiplier, NotProvidedType):
            self.decoder_lr_multiplier = decoder_lr_multiplier
        if not isinstance(decoder_weight_l2_coeff, NotProvidedType):
            self.decoder_weight_l2_coeff = decoder_weight_l2_coeff
        if not isinstance(ratio_clipping, NotProvidedType):
            self.ratio_clipping = ratio_clipping
        return self

    def closed_loop(
        self, *, culture_connector: Callable[[Any, Any], ConnectorV2] | None | NotProvidedType = NotProvided
    ) -> Self:
        """Set the culture connector factory."""
        if not isinstance(culture_connector, NotProvidedType):
            self.culture_connector = culture_connector
        return self

    def build_module_to_env_connector(self, env=None, spaces=None) -> ConnectorV2:
        """RLlib's pipeline with the culture connector prepended.

        Why first: RLlib puts user pieces after GetActions, TensorToNumpy, UnBatchToIndividualItems
        and RemoveSingleTsTimeRankFromBatch; placed first, the culture piece sees the module's batched
        torch output and writes ACTIONS itself, so GetActions passes it through.
        """
        pipeline = super().build_module_to_env_connector(env=env, spaces=spaces)
        if self.culture_connector is not None:
            if not isinstance(pipeline, ConnectorPipelineV2):
                raise TypeError(f"RLlib's module-to-env connector is not a pipeline: {type(pipeline).__name__}")
            pipeline.prepend(self.culture_connector(env, spaces))
        return pipeline

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        """The closed-loop module (encoder, decoder, value net)."""
        from spikeloop.models.closed_loop_module import ClosedLoopRLModule

        return RLModuleSpec(module_class=ClosedLoopRLModule)

    def get_default_learner_class(self) -> type:
        """The joint-logp PPO learner."""
        return ClosedLoopPPOLearner

    def validate(self) -> None:
        """PPO's checks plus the closed-loop ones."""
        super().validate()
        if self.entropy_coeff != 0.0:
            self._value_error(
                "entropy_coeff is not used by the closed-loop learner: set encoder_entropy_coeff "
                "and decoder_entropy_coeff instead"
            )
        if self.encoder_lr_multiplier <= 0.0 or self.decoder_lr_multiplier <= 0.0:
            self._value_error("encoder_lr_multiplier and decoder_lr_multiplier must be > 0")
        if self.ratio_clipping not in ("joint", "factored"):
            self._value_error(f"ratio_clipping must be 'joint' or 'factored', got {self.ratio_clipping!r}")
        if self.decoder_weight_l2_coeff < 0.0:
            self._value_error("decoder_weight_l2_coeff must be >= 0")
        if self.num_envs_per_env_runner != 1:
            self._value_error("one culture serves one game: num_envs_per_env_runner must be 1")
        if self.framework_str != "torch":
            self._value_error("the closed-loop module and learner are torch-only")
