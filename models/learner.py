"""ClosedLoopPPOLearner: PPO with one clipped ratio over log p(stim|obs) + log p(action|spikes).

Extends RLlib's PPOTorchLearner at its extension points only:
- `compute_loss_for_module`: the joint-logp surrogate, the value loss, separate encoder
  and decoder entropy bonuses, an optional decoder weight L2 term, and the metrics;
- `configure_optimizers_for_module`: two Adam optimizers, "encoder" (lr * encoder_lr_multiplier)
  and the default one (decoder + value net, lr); each is gradient-clipped on its own;
- `build`: appends `UpdateSpikeMean` to the learner connector (spike-mean update, once per train batch);
- `after_gradient_based_update`: logs the running spike means.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import DEFAULT_OPTIMIZER, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance
from ray.rllib.utils.typing import ModuleID

from bridge.channels import SPIKE_GROUP_NAMES
from models.closed_loop_module import STIM, STIM_DIST_INPUTS, ClosedLoopRLModule
from models.config import ClosedLoopPPOConfig
from models.spike_mean_connector import UpdateSpikeMean

ENCODER_OPTIMIZER = "encoder"

# Metric names (under the module id in the learner results).
ENCODER_ENTROPY_KEY = "encoder_entropy"
DECODER_ENTROPY_KEY = "decoder_entropy"
CLIP_FRACTION_KEY = "clip_fraction"
DECODER_WEIGHT_NORM_KEY = "decoder_weight_norm"
DECODER_L2_LOSS_KEY = "decoder_l2_loss"
SPIKE_MEAN_KEY_PREFIX = "spike_mean_"


def _scaled_lr(lr_or_schedule: Any, factor: float) -> Any:
    """A fixed learning rate or an RLlib [[t, lr], ...] schedule, multiplied by factor."""
    if isinstance(lr_or_schedule, (int, float)):
        return lr_or_schedule * factor
    return [[t, value * factor] for t, value in lr_or_schedule]


class ClosedLoopPPOLearner(PPOTorchLearner):
    """PPO learner for ClosedLoopRLModule (joint stim + action log-probability)."""

    def build(self) -> None:
        """PPO's build, then the spike-mean connector after GAE at the end of the learner pipeline."""
        super().build()
        if self._learner_connector is not None:
            self._learner_connector.append(UpdateSpikeMean())

    def configure_optimizers_for_module(self, module_id: ModuleID, config: ClosedLoopPPOConfig = None) -> None:
        """Encoder optimizer at lr * encoder_lr_multiplier; decoder + value net at lr."""
        module: ClosedLoopRLModule = self._module[module_id].unwrapped()
        # Frozen parameters are left out: TorchLearner.apply_gradients cannot handle a None gradient.
        encoder_params = module.encoder_parameters()
        rest_params = module.decoder_parameters() + module.value_parameters()
        self.register_optimizer(
            module_id=module_id,
            optimizer_name=ENCODER_OPTIMIZER,
            optimizer=torch.optim.Adam(encoder_params),
            params=encoder_params,
            lr_or_lr_schedule=_scaled_lr(config.lr, config.encoder_lr_multiplier),
        )
        self.register_optimizer(
            module_id=module_id,
            optimizer_name=DEFAULT_OPTIMIZER,
            optimizer=torch.optim.Adam(rest_params),
            params=rest_params,
            lr_or_lr_schedule=config.lr,
        )

    def compute_loss_for_module(
        self,
        *,
        module_id: ModuleID,
        config: ClosedLoopPPOConfig,
        batch: dict[str, Any],
        fwd_out: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """Clipped surrogate on the joint logp + value loss - entropy bonuses + decoder L2."""
        module: ClosedLoopRLModule = self.module[module_id].unwrapped()

        # PPO appends one bootstrap timestep per episode; the loss mask keeps it out of every mean.
        mask = batch.get(Columns.LOSS_MASK)
        if mask is not None:
            num_valid = torch.sum(mask)

            def masked_mean(x: torch.Tensor) -> torch.Tensor:
                return torch.sum(x[mask]) / num_valid
        else:
            masked_mean = torch.mean

        stim_dist = module.encoder_distribution(fwd_out[STIM_DIST_INPUTS])
        # forward_train replayed the stored spikes with the stored (act-time) mean: same logits as when acting.
        action_dist = module.decoder_distribution(fwd_out[Columns.ACTION_DIST_INPUTS])
        logp_stim = stim_dist.logp(batch[STIM])
        logp_action = action_dist.logp(batch[Columns.ACTIONS])
        # Spikes are data, not a function of the encoder: the encoder learns only through logp_stim
        # (score function), the decoder only through logp_action.
        log_ratio = logp_stim + logp_action - batch[Columns.ACTION_LOGP]
        ratio = torch.exp(log_ratio)

        advantages = batch[Postprocessing.ADVANTAGES]
        surrogate = torch.min(
            advantages * ratio,
            advantages * torch.clamp(ratio, 1.0 - config.clip_param, 1.0 + config.clip_param),
        )

        values = fwd_out[Columns.VF_PREDS]
        vf_loss = torch.pow(values - batch[Postprocessing.VALUE_TARGETS], 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0.0, config.vf_clip_param)
        if not config.use_critic:
            # Keep the value net in the graph (zero gradient) so its optimizer never sees a None gradient.
            vf_loss_clipped = 0.0 * vf_loss_clipped

        encoder_entropy = stim_dist.entropy()
        decoder_entropy = action_dist.entropy()

        total_loss = masked_mean(
            -surrogate
            + config.vf_loss_coeff * vf_loss_clipped
            # Both coefficients apply whatever their sign (a negative one is an entropy penalty).
            - config.encoder_entropy_coeff * encoder_entropy
            - config.decoder_entropy_coeff * decoder_entropy
        )
        decoder_l2 = module.decoder.weight_l2()
        if config.decoder_weight_l2_coeff:
            total_loss = total_loss + config.decoder_weight_l2_coeff * decoder_l2

        with torch.no_grad():
            # k3 estimator of KL(old || new) of the joint policy: non-negative, low variance.
            mean_kl = masked_mean(ratio - 1.0 - log_ratio)
            clip_fraction = masked_mean(((ratio - 1.0).abs() > config.clip_param).float())
        if config.use_kl_loss:
            total_loss = total_loss + self.curr_kl_coeffs_per_module[module_id] * masked_mean(ratio - 1.0 - log_ratio)

        valid_targets_and_values = (batch[Postprocessing.VALUE_TARGETS], values.detach())
        if mask is not None:
            valid_targets_and_values = tuple(x[mask] for x in valid_targets_and_values)
        self.metrics.log_dict(
            {
                POLICY_LOSS_KEY: -masked_mean(surrogate),
                VF_LOSS_KEY: masked_mean(vf_loss_clipped),
                LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: masked_mean(vf_loss),
                LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(*valid_targets_and_values),
                ENCODER_ENTROPY_KEY: masked_mean(encoder_entropy),
                DECODER_ENTROPY_KEY: masked_mean(decoder_entropy),
                LEARNER_RESULTS_KL_KEY: mean_kl,
                CLIP_FRACTION_KEY: clip_fraction,
                DECODER_WEIGHT_NORM_KEY: decoder_l2.detach().sqrt(),
                DECODER_L2_LOSS_KEY: config.decoder_weight_l2_coeff * decoder_l2.detach(),
            },
            key=module_id,
            window=1,  # one value per update, like PPO's own loss stats
        )
        return total_loss

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """PPO's bookkeeping, then log the running spike mean the env runners will act with."""
        super().after_gradient_based_update(timesteps=timesteps)
        for module_id, module in self.module.items():
            module = module.unwrapped()
            if not isinstance(module, ClosedLoopRLModule):
                continue
            for name, value in zip(SPIKE_GROUP_NAMES, module.spike_mean.tolist(), strict=True):
                self.metrics.log_value((module_id, SPIKE_MEAN_KEY_PREFIX + name), value, window=1)
