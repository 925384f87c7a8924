"""ClosedLoopRLModule: forward outputs, decoder options, ablation, spike mean, model_config."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from spikeloop.bridge.wire.channels import N_ENCODING, N_SPIKE_GROUPS, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import SPIKE_MEAN, SPIKE_STD, SPIKES, STIM_DIST_INPUTS
from spikeloop.models.module_config import ClosedLoopModelConfig

BOX_OBS = gym.spaces.Box(-1.0, 1.0, (59,), np.float32)
DICT_OBS = gym.spaces.Dict(
    {
        "features": gym.spaces.Box(-1.0, 1.0, (59,), np.float32),
        "screen": gym.spaces.Box(0, 255, (60, 80, 3), np.uint8),
    }
)


def make_module(obs_space: gym.Space = BOX_OBS, n_actions: int = 54, **model_config) -> ClosedLoopRLModule:
    return ClosedLoopRLModule(
        observation_space=obs_space, action_space=gym.spaces.Discrete(n_actions), model_config=model_config
    )


def test_forward_outputs_box_obs() -> None:
    module = make_module()
    out = module.forward_exploration({Columns.OBS: torch.randn(5, 59)})
    assert out[STIM_DIST_INPUTS].shape == (5, 4 * N_ENCODING)
    assert out[Columns.VF_PREDS].shape == (5,)
    # No action and no action-dist inputs: RLlib's GetActions must not sample an action itself.
    assert Columns.ACTIONS not in out and Columns.ACTION_DIST_INPUTS not in out


def test_forward_train_dict_obs_with_screen() -> None:
    module = make_module(DICT_OBS, n_actions=8)
    batch = {
        Columns.OBS: {
            "features": torch.randn(3, 59),
            "screen": torch.randint(0, 256, (3, 60, 80, 3), dtype=torch.uint8),
        },
        SPIKES: torch.ones(3, N_SPIKE_GROUPS),
        SPIKE_MEAN: torch.zeros(3, N_SPIKE_GROUPS),
        SPIKE_STD: torch.ones(3, N_SPIKE_GROUPS),
    }
    out = module.forward_train(batch)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (3, 8)
    assert module.compute_values(batch).shape == (3,)
    assert module.encoder.screen_cnn is not None


def test_encoder_distribution_uses_configured_ranges() -> None:
    module = make_module(stim_frequency_range_hz=(5.0, 10.0), stim_amplitude_range_ua=(1.0, 1.5))
    stim = module.encoder_distribution(torch.randn(100, 4 * N_ENCODING)).sample()
    assert stim[:, :N_ENCODING].min() >= 5.0 and stim[:, :N_ENCODING].max() <= 10.0
    assert stim[:, N_ENCODING:].min() >= 1.0 and stim[:, N_ENCODING:].max() <= 1.5


def test_default_ranges_come_from_channels() -> None:
    module = make_module()
    assert module.stim_low[0].item() == STIM_FREQUENCY_RANGE_HZ[0]
    assert module.stim_high[-1].item() == STIM_AMPLITUDE_RANGE_UA[1]


def test_decode_centres_spikes() -> None:
    module = make_module()
    spikes, mean = torch.rand(4, N_SPIKE_GROUPS) * 5, torch.rand(4, N_SPIKE_GROUPS)
    torch.testing.assert_close(module.decode(spikes, mean), module.decode(spikes - mean, torch.zeros_like(mean)))
    module.spike_mean.fill_(2.0)
    torch.testing.assert_close(module.decode(spikes), module.decode(spikes, torch.full_like(spikes, 2.0)))


def test_decode_scales_centred_spikes_by_the_running_std() -> None:
    module = make_module()  # spike_scaling on by default, floor 1 count
    torch.testing.assert_close(module.spike_std(), torch.ones(N_SPIKE_GROUPS))  # nothing seen yet: the floor
    counts = torch.tensor([[10.0] * N_SPIKE_GROUPS, [30.0] * N_SPIKE_GROUPS])
    counts[:, -1] = torch.tensor([2.0, 2.5])  # a nearly constant group: its std 0.25 stays at the floor
    module.update_spike_mean(counts)
    expected_std = torch.tensor([10.0] * (N_SPIKE_GROUPS - 1) + [1.0])
    torch.testing.assert_close(module.spike_std(), expected_std)
    torch.testing.assert_close(module.spike_mean, counts.mean(0))
    spikes = torch.rand(4, N_SPIKE_GROUPS) * 40
    unit = (spikes - module.spike_mean) / expected_std
    torch.testing.assert_close(
        module.decode(spikes), module.decode(unit, torch.zeros(4, N_SPIKE_GROUPS), torch.ones(4, N_SPIKE_GROUPS))
    )
    off = make_module(spike_scaling=False)
    off.update_spike_mean(counts)
    torch.testing.assert_close(off.spike_std(), torch.ones(N_SPIKE_GROUPS))


def test_linear_decoder_has_no_bias_by_default() -> None:
    module = make_module()
    assert module.decoder.bias is None
    # Zero-bias readout: zero centred spikes give uniform logits (all zero).
    assert torch.count_nonzero(module.decode(torch.zeros(1, N_SPIKE_GROUPS), torch.zeros(1, N_SPIKE_GROUPS))) == 0


def test_decoder_options() -> None:
    nonneg = make_module(decoder_nonnegative=True)
    assert (nonneg.decoder.effective_weight() > 0).all()
    frozen = make_module(decoder_frozen=True)
    assert frozen.decoder_parameters() == []
    mlp = make_module(decoder_type="mlp", decoder_hiddens=(16,))
    assert mlp.decode(torch.ones(2, N_SPIKE_GROUPS), torch.zeros(2, N_SPIKE_GROUPS)).shape == (2, 54)
    assert all(m.bias is None for m in mlp.decoder.mlp if isinstance(m, torch.nn.Linear))
    biased = make_module(decoder_bias=True)
    assert biased.decoder.bias is not None


def test_ablation_modes() -> None:
    spikes = torch.arange(16.0).reshape(2, N_SPIKE_GROUPS)
    torch.testing.assert_close(make_module(ablation="none").ablate(spikes), spikes)
    torch.testing.assert_close(make_module(ablation="zero").ablate(spikes), torch.zeros_like(spikes))
    random_module = make_module(ablation="random", ablation_poisson_rate=3.0)
    a = random_module.ablate(torch.zeros(4000, N_SPIKE_GROUPS), torch.Generator().manual_seed(1))
    b = random_module.ablate(torch.zeros(4000, N_SPIKE_GROUPS), torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)  # reproducible per generator
    assert abs(a.mean().item() - 3.0) < 0.1 and (a == a.round()).all() and (a >= 0).all()


def test_spike_mean_ema_and_cumulative() -> None:
    ema = make_module(spike_mean_mode="ema", spike_mean_momentum=0.5)
    ema.update_spike_mean(torch.full((10, N_SPIKE_GROUPS), 4.0))  # first batch sets the mean
    torch.testing.assert_close(ema.spike_mean, torch.full((N_SPIKE_GROUPS,), 4.0))
    ema.update_spike_mean(torch.zeros(30, N_SPIKE_GROUPS))
    torch.testing.assert_close(ema.spike_mean, torch.full((N_SPIKE_GROUPS,), 2.0))

    cumulative = make_module(spike_mean_mode="cumulative")
    cumulative.update_spike_mean(torch.full((10, N_SPIKE_GROUPS), 4.0))
    cumulative.update_spike_mean(torch.zeros(30, N_SPIKE_GROUPS))
    torch.testing.assert_close(cumulative.spike_mean, torch.full((N_SPIKE_GROUPS,), 1.0))
    assert cumulative.spike_mean_count.item() == 40

    off = make_module(spike_mean_mode="off")
    off.update_spike_mean(torch.ones(5, N_SPIKE_GROUPS))
    assert torch.count_nonzero(off.spike_mean) == 0


def test_spike_mean_is_in_state_and_restored() -> None:
    module = make_module()
    module.update_spike_mean(torch.full((3, N_SPIKE_GROUPS), 1.5))
    state = module.get_state()
    assert "spike_mean" in state and "spike_mean_count" in state and "spike_sq_mean" in state
    assert "stim_low" not in state  # ranges come from config, never from a checkpoint
    fresh = make_module()
    fresh.set_state(state)
    torch.testing.assert_close(fresh.spike_mean, module.spike_mean)


def test_model_config_keys() -> None:
    with pytest.raises(ValueError, match="unknown"):
        make_module(ablaton="zero")
    # RLlib's own model keys (merged in by AlgorithmConfig) are tolerated.
    assert make_module(fcnet_hiddens=[256], vf_share_layers=False).settings == ClosedLoopModelConfig()
    settings = ClosedLoopModelConfig.from_dict({"encoder_hiddens": [64], "stim_frequency_range_hz": [4, 20]})
    assert settings.encoder_hiddens == (64,) and settings.stim_frequency_range_hz == (4, 20)
    with pytest.raises(ValueError):
        ClosedLoopModelConfig(ablation="shuffle")
    with pytest.raises(ValueError):
        ClosedLoopModelConfig(stim_amplitude_range_ua=(2.5, 1.0))


def test_act_is_the_decoder_distribution_in_fewer_ops() -> None:
    module = make_module(n_actions=6)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5, 0.5, -3.0]] * 20000)
    torch.manual_seed(0)
    action, logp = module.act(logits, explore=True)
    categorical = module.decoder_distribution(logits)
    torch.testing.assert_close(logp, categorical.logp(action))
    # Sampled with the Categorical's probabilities (5 sigma on 20000 draws).
    freq = torch.bincount(action, minlength=6).double() / len(action)
    probs = torch.softmax(logits[0].double(), -1)
    assert torch.all((freq - probs).abs() < 5 * torch.sqrt(probs * (1 - probs) / len(action)))
    greedy, greedy_logp = module.act(logits[:3], explore=False)
    assert greedy.tolist() == [0, 0, 0]
    torch.testing.assert_close(greedy_logp, module.decoder_distribution(logits[:3]).logp(greedy))


def test_acting_skips_the_train_eval_switch_and_refuses_mode_dependent_layers() -> None:
    module = make_module()
    module.train()
    module.forward_exploration({Columns.OBS: torch.randn(2, 59)})
    module.forward_inference({Columns.OBS: torch.randn(2, 59)})
    assert module.training  # untouched: nothing in the module depends on the mode
    with pytest.raises(TypeError, match="Dropout"):
        _module_with_dropout()


def _module_with_dropout() -> ClosedLoopRLModule:
    class WithDropout(ClosedLoopRLModule):
        def setup(self) -> None:
            self.extra = torch.nn.Dropout(0.1)
            super().setup()

    return WithDropout(observation_space=BOX_OBS, action_space=gym.spaces.Discrete(8), model_config={})
