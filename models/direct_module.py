"""The `direct` control: observation features straight to action logits, no stimulation, no culture.

The "no neurons" baseline: the encoder's trunk (same layers and sizes as the closed
loop's) with a linear action head in place of the stimulation heads, and the same
normalised value net, trained by the same learner and PPO settings (the loss simply
has no stimulation term). It shows what plain PPO reaches on the task; a closed loop
through the `transparent` channel should come close to it, and a culture falls
between `transparent` and the `zero` ablation.

RLlib samples the action itself (its own GetActions piece), so no culture connector
is needed; the trunk trains with the encoder's optimizer and the head with the
decoder's, so learning rates and clipping match the closed loop's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import nn

from spikeloop.models.closed_loop_module import build_value_net, feature_normalizer
from spikeloop.models.encoder import StimEncoder, features_and_screen, n_discrete_actions
from spikeloop.models.module_config import ClosedLoopModelConfig


class DirectRLModule(TorchRLModule, ValueFunctionAPI):
    """Encoder trunk + action head, and a value net; settings in ClosedLoopModelConfig."""

    @override(TorchRLModule)
    def setup(self) -> None:
        """Build the trunk (as the encoder's), the action head and the value net."""
        self.settings = s = ClosedLoopModelConfig.from_dict(self.model_config)
        self.n_actions = n_discrete_actions(self.action_space)
        if s.same_frame_rounds != 1:
            raise ValueError("model.same_frame_rounds: the direct policy stimulates nothing; use 1 with policy: direct")
        self.feature_norm = feature_normalizer(self.observation_space, s)
        # The closed loop's encoder, whose stimulation head is replaced by an action head.
        self.encoder = StimEncoder(self.observation_space, s)
        self.encoder.head = nn.Linear(self.encoder.head.in_features, self.n_actions)
        nn.init.normal_(self.encoder.head.weight, std=s.decoder_init_std / np.sqrt(self.encoder.head.in_features))
        nn.init.zeros_(self.encoder.head.bias)
        if not s.encoder_trainable:  # the frozen-encoder control: a trained head on fixed random features
            for name, param in self.encoder.named_parameters():
                param.requires_grad_(name.startswith("head."))
        self.value_net = build_value_net(self.observation_space, s)

    # The learner's parameter groups: the trunk learns at the encoder's rate, the head at the decoder's.
    def encoder_parameters(self) -> list[nn.Parameter]:
        """The trunk (and screen CNN): the encoder's part of the direct policy."""
        return [p for name, p in self.encoder.named_parameters() if not name.startswith("head.") and p.requires_grad]

    def decoder_parameters(self) -> list[nn.Parameter]:
        """The action head: the decoder's part of the direct policy."""
        return list(self.encoder.head.parameters())

    def value_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the value net."""
        return list(self.value_net.parameters())

    def decoder_weight_l2(self) -> torch.Tensor:
        """Sum of the squared action-head weights."""
        return self.encoder.head.weight.pow(2).sum()

    def decoder_distribution(self, action_logits: torch.Tensor) -> TorchCategorical:
        """Categorical over the game actions."""
        return TorchCategorical(logits=action_logits)

    @override(TorchRLModule)
    def get_exploration_action_dist_cls(self) -> type:
        """RLlib samples actions from a Categorical over ACTION_DIST_INPUTS."""
        return TorchCategorical

    @override(TorchRLModule)
    def get_inference_action_dist_cls(self) -> type:
        """Greedy actions come from the same Categorical."""
        return TorchCategorical

    @override(TorchRLModule)
    def get_train_action_dist_cls(self) -> type:
        """The learner's Categorical."""
        return TorchCategorical

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Action logits and values."""
        features, screen = features_and_screen(batch[Columns.OBS])
        features = self.feature_norm(features)
        return {
            Columns.ACTION_DIST_INPUTS: self.encoder(features, screen),
            Columns.VF_PREDS: self.value_net(features, screen),
        }

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Value estimates [B] (ValueFunctionAPI, used by GAE)."""
        features, screen = features_and_screen(batch[Columns.OBS])
        return self.value_net(self.feature_norm(features), screen)
