"""ClosedLoopPPOLearner: PPO over the closed-loop policy log p(stim|obs) + log p(action|spikes).

Extends RLlib's PPOTorchLearner at its extension points only:
- `compute_loss_for_module`: the clipped surrogate (the encoder's and decoder's ratios clipped
  each on its own, or one joint ratio: `ratio_clipping`), the value loss in the value net's
  normalised units, separate encoder and decoder entropy bonuses, an optional decoder weight
  L2 term, and the metrics (both parts of the ratio included);
- `configure_optimizers_for_module`: three Adam optimizers, "encoder" (lr * encoder_lr_multiplier),
  "decoder" (lr * decoder_lr_multiplier) and the default one (value net, lr);
- `postprocess_gradients_for_module`: one clip of the global gradient norm over all of the
  module's parameters (the reference's max norm 3), not RLlib's clip per optimizer;
- `build`: prepends `CountEnvStepsReceived` (the env steps this update got) and appends
  `UpdateRunningStats` to the learner connector (spike mean and value-target
  statistics, once per train batch);
- `after_gradient_based_update`: folds the train batch into the observation-feature statistics
  (after the gradient steps, so the loss saw the ones the env runners acted with) and logs the
  running spike means and value-target scale.

A module without an encoder (`DirectRLModule`, the no-culture control) is trained by the
same loss with the stimulation term left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.common.numpy_to_tensor import NumpyToTensor
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import DEFAULT_OPTIMIZER, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.torch_utils import explained_variance
from ray.rllib.utils.typing import ModuleID, TensorType

from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import STIM, STIM_DIST_INPUTS, STIM_LOGP
from spikeloop.models.drop_columns import DropUnusedColumns
from spikeloop.models.env_steps_received import CountEnvStepsReceived
from spikeloop.models.running_stats_connector import UpdateRunningStats
from spikeloop.models.value import NormalizedValueNet

if TYPE_CHECKING:  # for types only: spikeloop.models.ppo_config imports this module to name its learner class
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from spikeloop.models.direct_module import DirectRLModule
    from spikeloop.models.ppo_config import ClosedLoopPPOConfig

ENCODER_OPTIMIZER = "encoder"
DECODER_OPTIMIZER = "decoder"
"""The value net keeps RLlib's DEFAULT_OPTIMIZER (base lr)."""

# Metric names (under the module id in the learner results).
ENCODER_ENTROPY_KEY = "encoder_entropy"
DECODER_ENTROPY_KEY = "decoder_entropy"
CLIP_FRACTION_KEY = "clip_fraction"
DECODER_WEIGHT_NORM_KEY = "decoder_weight_norm"
DECODER_BIAS_NORM_KEY = "decoder_bias_norm"
"""L2 norm of the decoder's biases (0 with the default zero-bias readout), beside its weight norm."""
ADVANTAGE_STD_KEY = "advantage_std"
DECODER_L2_LOSS_KEY = "decoder_l2_loss"
SPIKE_MEAN_KEY_PREFIX = "spike_mean_"
GRADIENT_NORM_KEY = "gradients_global_norm"
VALUE_TARGET_STD_KEY = "value_target_std"
VALUE_TARGET_MEAN_KEY = "value_target_mean"
CLOSED_LOOP_CONFIG_FIELDS = (
    "encoder_lr_multiplier",
    "decoder_lr_multiplier",
    "encoder_entropy_coeff",
    "ratio_clipping",
)
"""Fields only a ClosedLoopPPOConfig has, which the learner's hooks read."""
RATIO_PARTS = ("encoder", "decoder")
"""The joint ratio's two factors, logged each as <part>_ratio_mean / _std / _clip_fraction."""


def _scaled_lr(lr_or_schedule: Any, factor: float) -> Any:
    """A fixed learning rate or an RLlib [[t, lr], ...] schedule, multiplied by factor."""
    if isinstance(lr_or_schedule, (int, float)):
        return lr_or_schedule * factor
    return [[t, value * factor] for t, value in lr_or_schedule]


def _closed_loop_config(config: AlgorithmConfig | None) -> ClosedLoopPPOConfig:
    """The config RLlib hands the learner's hooks, as the ClosedLoopPPOConfig it must be."""
    # By its fields, not its class: spikeloop.models.ppo_config imports this module, and no import may go back.
    if not all(hasattr(config, name) for name in CLOSED_LOOP_CONFIG_FIELDS):
        raise TypeError(f"ClosedLoopPPOLearner needs a ClosedLoopPPOConfig, got {type(config).__name__}")
    return cast("ClosedLoopPPOConfig", config)


def _as_tensor(value: TensorType) -> torch.Tensor:
    """A batch column of a torch learner (always a tensor there), typed as one."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor batch column, got {type(value).__name__}")
    return value


class ClosedLoopPPOLearner(PPOTorchLearner):
    """PPO learner for ClosedLoopRLModule (joint stim + action log-probability)."""

    @override(PPOTorchLearner)
    def build(self) -> None:
        """PPO's build; then the env-step count first in the learner pipeline, the spike-mean connector last.

        The count goes before PPO's own first piece, which adds an artificial step to every episode chunk; the
        analysis-only columns are dropped before the batch becomes tensors (models/drop_columns.py: a uint64
        column breaks a CUDA learner).
        """
        super().build()
        if self._learner_connector is not None:
            self._learner_connector.prepend(CountEnvStepsReceived())
            if any(isinstance(piece, NumpyToTensor) for piece in self._learner_connector.connectors):
                self._learner_connector.insert_before(NumpyToTensor, DropUnusedColumns())
            self._learner_connector.append(UpdateRunningStats())

    @override(PPOTorchLearner)
    def configure_optimizers_for_module(self, module_id: ModuleID, config: AlgorithmConfig | None = None) -> None:
        """Three Adam optimizers: encoder (lr x encoder_lr_multiplier), decoder (lr x decoder_lr_multiplier), value (lr)."""
        config = _closed_loop_config(config)
        module = cast("ClosedLoopRLModule | DirectRLModule", self.module[module_id].unwrapped())
        # Frozen parameters are left out: TorchLearner.apply_gradients cannot handle a None gradient.
        groups = (
            (ENCODER_OPTIMIZER, module.encoder_parameters(), config.encoder_lr_multiplier),
            (DECODER_OPTIMIZER, module.decoder_parameters(), config.decoder_lr_multiplier),
            (DEFAULT_OPTIMIZER, module.value_parameters(), 1.0),
        )
        for name, params, factor in groups:
            if params:  # a frozen decoder has none
                optimizer = torch.optim.Adam(params)
                lr_or_schedule = _scaled_lr(config.lr, factor)
                self.register_optimizer(
                    module_id=module_id,
                    optimizer_name=name,
                    optimizer=optimizer,
                    params=params,
                    lr_or_lr_schedule=lr_or_schedule,
                )
                if not isinstance(lr_or_schedule, (int, float)):
                    # RLlib starts a schedule at its first rate as a float32 tensor (0.01 -> 0.0099999998) and
                    # sets Python floats only after the first update; the float itself keeps a schedule that
                    # holds a rate bit-identical to that rate given as a constant.
                    self._set_optimizer_lr(optimizer, lr=float(lr_or_schedule[0][1]))

    @override(PPOTorchLearner)
    def postprocess_gradients_for_module(
        self, *, module_id: ModuleID, config: AlgorithmConfig | None = None, module_gradients_dict: dict
    ) -> dict:
        """Clip the global norm of all the module's gradients at grad_clip, once (both optimizers together)."""
        config = _closed_loop_config(config)
        if not config.grad_clip:
            return dict(module_gradients_dict)
        # RLlib clips per optimizer; one clip over everything keeps the encoder, decoder and value
        # updates in proportion, as the reference trainer did (torch clip_grad_norm_ over all parameters).
        norm = self._get_clip_function()(module_gradients_dict, grad_clip=config.grad_clip, grad_clip_by="global_norm")
        self.metrics.log_value((module_id, GRADIENT_NORM_KEY), norm, window=1)
        return module_gradients_dict

    @override(PPOTorchLearner)
    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config: AlgorithmConfig,
        batch: dict[str, Any],
        fwd_out: dict[str, TensorType],
    ) -> torch.Tensor:
        """Clipped surrogate (factored or joint) + normalised value loss - entropy bonuses + decoder L2."""
        config = _closed_loop_config(config)
        module = cast("ClosedLoopRLModule | DirectRLModule", self.module[module_id].unwrapped())

        # PPO appends one bootstrap timestep per episode; the loss mask keeps it out of every mean.
        mask = batch.get(Columns.LOSS_MASK)
        if mask is not None:
            num_valid = torch.sum(mask)

            def masked_mean(x: torch.Tensor) -> torch.Tensor:
                return torch.sum(x[mask]) / num_valid
        else:

            def masked_mean(x: torch.Tensor) -> torch.Tensor:
                return torch.mean(x)

        # forward_train replayed the stored spikes with the stored (act-time) mean: same logits as when acting.
        action_dist = module.decoder_distribution(_as_tensor(fwd_out[Columns.ACTION_DIST_INPUTS]))
        logp_action = _as_tensor(action_dist.logp(batch[Columns.ACTIONS]))
        if STIM_DIST_INPUTS in fwd_out and isinstance(module, ClosedLoopRLModule):
            stim_dist = module.encoder_distribution(_as_tensor(fwd_out[STIM_DIST_INPUTS]))
            logp_stim = stim_dist.logp(batch[STIM])
            old_logp_stim = batch[STIM_LOGP]
            encoder_entropy = stim_dist.entropy()
        else:  # the direct control: no stimulation, the action is the whole policy
            logp_stim = old_logp_stim = encoder_entropy = torch.zeros_like(logp_action)
        # Spikes are data, not a function of the encoder: the encoder learns only through logp_stim
        # (score function), the decoder only through logp_action.
        log_ratio = logp_stim + logp_action - batch[Columns.ACTION_LOGP]
        ratio = torch.exp(log_ratio)
        part_log_ratios = {
            "encoder": logp_stim - old_logp_stim,
            "decoder": logp_action - (batch[Columns.ACTION_LOGP] - old_logp_stim),
        }

        advantages = batch[Postprocessing.ADVANTAGES]

        def clipped_surrogate(r: torch.Tensor) -> torch.Tensor:
            return torch.min(
                advantages * r, advantages * torch.clamp(r, 1.0 - config.clip_param, 1.0 + config.clip_param)
            )

        if config.ratio_clipping == "factored":
            # Each factor gets its own trust region: a stimulation that moved far (16 dimensions) no longer
            # zeroes the decoder's gradient on that step, and the other way round (docs/architecture.md).
            surrogate = sum(clipped_surrogate(torch.exp(part)) for part in part_log_ratios.values()) - advantages
        else:
            surrogate = clipped_surrogate(ratio)

        values = _as_tensor(fwd_out[Columns.VF_PREDS])
        # In the value net's normalised units (identity when value_normalization is off).
        normalize = module.value_net.normalize_targets
        vf_loss = torch.pow(normalize(values) - normalize(batch[Postprocessing.VALUE_TARGETS]), 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0.0, config.vf_clip_param)
        if not config.use_critic:
            # Keep the value net in the graph (zero gradient) so its optimizer never sees a None gradient.
            vf_loss_clipped = 0.0 * vf_loss_clipped

        decoder_entropy = _as_tensor(action_dist.entropy())

        total_loss = masked_mean(
            -surrogate
            + config.vf_loss_coeff * vf_loss_clipped
            # Both coefficients apply whatever their sign (a negative one is an entropy penalty).
            - config.encoder_entropy_coeff * encoder_entropy
            - config.decoder_entropy_coeff * decoder_entropy
        )
        decoder_l2 = module.decoder_weight_l2()
        if config.decoder_weight_l2_coeff:
            total_loss = total_loss + config.decoder_weight_l2_coeff * decoder_l2

        with torch.no_grad():
            # k3 estimator of KL(old || new) of the joint policy: non-negative, low variance.
            mean_kl = masked_mean(ratio - 1.0 - log_ratio)
            clip_fraction = masked_mean(((ratio - 1.0).abs() > config.clip_param).float())
            part_metrics = {}
            for part, part_log_ratio in part_log_ratios.items():
                part_ratio = torch.exp(part_log_ratio)
                part_mean = masked_mean(part_ratio)
                part_metrics[f"{part}_ratio_mean"] = part_mean
                part_metrics[f"{part}_ratio_std"] = masked_mean((part_ratio - part_mean) ** 2).sqrt()
                part_metrics[f"{part}_ratio_clip_fraction"] = masked_mean(
                    ((part_ratio - 1.0).abs() > config.clip_param).float()
                )
        if config.use_kl_loss:
            kl_coeff = _as_tensor(self.curr_kl_coeffs_per_module[module_id])
            total_loss = total_loss + kl_coeff * masked_mean(ratio - 1.0 - log_ratio)

        valid_targets, valid_values = batch[Postprocessing.VALUE_TARGETS], values.detach()
        if mask is not None:
            valid_targets, valid_values = valid_targets[mask], valid_values[mask]
        with torch.no_grad():
            # The advantages PPO uses are standardised per batch (std 1); the reference logs the spread before
            # that: value target - V(s) over this minibatch.
            raw_advantages = batch[Postprocessing.VALUE_TARGETS] - values.detach()
            advantage_std = masked_mean((raw_advantages - masked_mean(raw_advantages)) ** 2).sqrt()
            decoder = getattr(module, "decoder", None)
            biases = [] if decoder is None else [p for n, p in decoder.named_parameters() if n.endswith("bias")]
            decoder_bias_norm = torch.sqrt(sum((p.detach() ** 2).sum() for p in biases)) if biases else torch.zeros(())
        self.metrics.log_dict(
            {
                POLICY_LOSS_KEY: -masked_mean(surrogate),
                VF_LOSS_KEY: masked_mean(vf_loss_clipped),
                LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: masked_mean(vf_loss),
                LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(valid_targets, valid_values),
                ENCODER_ENTROPY_KEY: masked_mean(encoder_entropy),
                DECODER_ENTROPY_KEY: masked_mean(decoder_entropy),
                LEARNER_RESULTS_KL_KEY: mean_kl,
                CLIP_FRACTION_KEY: clip_fraction,
                DECODER_WEIGHT_NORM_KEY: decoder_l2.detach().sqrt(),
                DECODER_BIAS_NORM_KEY: decoder_bias_norm,
                ADVANTAGE_STD_KEY: advantage_std,
                DECODER_L2_LOSS_KEY: config.decoder_weight_l2_coeff * decoder_l2.detach(),
            }
            | part_metrics,
            key=module_id,
            window=1,  # one value per update, like PPO's own loss stats
        )
        return total_loss

    @override(PPOTorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """PPO's bookkeeping, fold the batch into the feature statistics, log the running statistics."""
        super().after_gradient_based_update(timesteps=timesteps)
        for module_id, module in self.module.items():
            module = module.unwrapped()
            feature_norm = getattr(module, "feature_norm", None)
            if feature_norm is not None:
                # After the gradient steps: the loss saw the normalisation the env runners acted with.
                feature_norm.commit()
            value_net = getattr(module, "value_net", None)
            if isinstance(value_net, NormalizedValueNet):
                self.metrics.log_value((module_id, VALUE_TARGET_STD_KEY), value_net.target_std.item(), window=1)
                self.metrics.log_value((module_id, VALUE_TARGET_MEAN_KEY), value_net.target_mean.item(), window=1)
            if not isinstance(module, ClosedLoopRLModule):
                continue
            # Same-frame rounds after the first are logged with their round number (spike_mean_attack_r2, ...).
            for i, value in enumerate(module.spike_mean.tolist()):
                round_index, group = divmod(i, len(SPIKE_GROUP_NAMES))
                suffix = f"_r{round_index + 1}" if round_index else ""
                self.metrics.log_value(
                    (module_id, SPIKE_MEAN_KEY_PREFIX + SPIKE_GROUP_NAMES[group] + suffix), value, window=1
                )
