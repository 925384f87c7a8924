"""Which parameters each loss term trains, on the real learner loss and a batch built like the env runner's.

The encoder must learn only through log p(stim | obs) (and its entropy), the decoder only
through log p(action | spikes) (its entropy, its L2), the value net only through the value loss.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing

from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import STIM, STIM_DIST_INPUTS, STIM_LOGP
from spikeloop.models.learner import ClosedLoopPPOLearner
from spikeloop.models.ppo_config import ClosedLoopPPOConfig
from tests.support.toy_loop import ToyClosedLoopEnv, closed_loop_step

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MID = "default_policy"
# Everything off: each test switches on the one term it examines.
SILENT = dict(
    vf_loss_coeff=0.0,
    encoder_entropy_coeff=0.0,
    decoder_entropy_coeff=0.0,
    decoder_weight_l2_coeff=0.0,
    clip_param=1e9,  # no clipping: the surrogate gradient is then exactly -A * ratio * grad(logp)
)


@pytest.fixture(scope="module")
def learner() -> ClosedLoopPPOLearner:
    config = ClosedLoopPPOConfig().environment(ToyClosedLoopEnv)
    return config.build_learner(env=ToyClosedLoopEnv())


@pytest.fixture(scope="module")
def batch(learner: ClosedLoopPPOLearner) -> dict:
    module = learner.module[MID].unwrapped()
    module.spike_mean.fill_(0.7)  # a non-zero act-time mean, so centring is exercised
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(128, 59, generator=g) * 2 - 1
    columns = closed_loop_step(module, {Columns.OBS: obs}, g)
    # Pretend the policy moved since acting, so that ratios differ from 1.
    columns[Columns.ACTION_LOGP] = columns[Columns.ACTION_LOGP] + 0.3 * torch.randn(128, generator=g)
    return {
        Columns.OBS: obs,
        **columns,
        Postprocessing.ADVANTAGES: torch.randn(128, generator=g),
        Postprocessing.VALUE_TARGETS: torch.randn(128, generator=g),
    }


def config_with(learner: ClosedLoopPPOLearner, **training) -> ClosedLoopPPOConfig:
    return learner.config.copy(copy_frozen=False).training(**{**SILENT, **training})


def loss(learner: ClosedLoopPPOLearner, batch: dict, config: ClosedLoopPPOConfig) -> torch.Tensor:
    module = learner.module[MID]
    fwd_out = module.forward_train(batch)
    return learner.compute_loss_for_module(module_id=MID, config=config, batch=batch, fwd_out=fwd_out)


def grads(term: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Gradients of term; a parameter outside its graph gets an explicit zero."""
    out = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, out, strict=True)]


def norm(gs: list[torch.Tensor]) -> float:
    return sum(g.pow(2).sum() for g in gs).sqrt().item()


def parts(learner: ClosedLoopPPOLearner) -> tuple[ClosedLoopRLModule, list, list, list]:
    module = learner.module[MID].unwrapped()
    return module, module.encoder_parameters(), module.decoder_parameters(), module.value_parameters()


def test_policy_term_trains_encoder_through_stim_logp_and_decoder_through_action_logp(learner, batch) -> None:
    module, enc, dec, val = parts(learner)
    total = loss(learner, batch, config_with(learner, ratio_clipping="joint"))
    assert norm(grads(total, val)) == 0.0  # the value net gets nothing from the policy term

    # Reference gradients from the two log-prob terms, with the ratio as a constant weight.
    fwd = module.forward_train(batch)
    logp_stim = module.encoder_distribution(fwd[STIM_DIST_INPUTS]).logp(batch[STIM])
    logp_action = module.decoder_distribution(fwd[Columns.ACTION_DIST_INPUTS]).logp(batch[Columns.ACTIONS])
    weight = (
        batch[Postprocessing.ADVANTAGES] * torch.exp(logp_stim + logp_action - batch[Columns.ACTION_LOGP])
    ).detach()
    for got, want in zip(grads(total, enc), grads(-(weight * logp_stim).mean(), enc), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    for got, want in zip(grads(total, dec), grads(-(weight * logp_action).mean(), dec), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    assert norm(grads(total, enc)) > 0 and norm(grads(total, dec)) > 0

    # No cross paths: the action log-prob never reaches the encoder, the stim log-prob never the decoder.
    assert norm(grads(logp_action.sum(), enc)) == 0.0
    assert norm(grads(logp_stim.sum(), dec)) == 0.0


def test_factored_surrogate_weights_each_part_by_its_own_ratio(learner, batch) -> None:
    module, enc, dec, _ = parts(learner)
    total = loss(learner, batch, config_with(learner, ratio_clipping="factored"))
    fwd = module.forward_train(batch)
    logp_stim = module.encoder_distribution(fwd[STIM_DIST_INPUTS]).logp(batch[STIM])
    logp_action = module.decoder_distribution(fwd[Columns.ACTION_DIST_INPUTS]).logp(batch[Columns.ACTIONS])
    advantages = batch[Postprocessing.ADVANTAGES]
    encoder_weight = (advantages * torch.exp(logp_stim - batch[STIM_LOGP])).detach()
    decoder_weight = (advantages * torch.exp(logp_action - batch[Columns.ACTION_LOGP] + batch[STIM_LOGP])).detach()
    for got, want in zip(grads(total, enc), grads(-(encoder_weight * logp_stim).mean(), enc), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    for got, want in zip(grads(total, dec), grads(-(decoder_weight * logp_action).mean(), dec), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("clipping", ["joint", "factored"])
def test_a_far_moved_stimulation_blocks_the_decoder_only_when_clipping_jointly(learner, batch, clipping) -> None:
    module, enc, dec, _ = parts(learner)
    with torch.no_grad():
        fwd = module.forward_train(batch)
        logp_stim = module.encoder_distribution(fwd[STIM_DIST_INPUTS]).logp(batch[STIM])
        logp_action = module.decoder_distribution(fwd[Columns.ACTION_DIST_INPUTS]).logp(batch[Columns.ACTIONS])
    # Since acting, the stimulation became 10x more likely (encoder ratio 10, far above 1 + clip) and the
    # action's probability did not change (decoder ratio 1). With positive advantages the joint ratio is
    # clipped, and with it the decoder's whole gradient; factored, only the encoder's part is.
    old_stim_logp = logp_stim - math.log(10.0)
    moved = {
        **batch,
        STIM_LOGP: old_stim_logp,
        Columns.ACTION_LOGP: old_stim_logp + logp_action,
        Postprocessing.ADVANTAGES: batch[Postprocessing.ADVANTAGES].abs() + 0.1,
    }
    total = loss(learner, moved, config_with(learner, clip_param=0.2, ratio_clipping=clipping))
    assert norm(grads(total, enc)) == 0.0  # the encoder's own ratio is out of range either way
    if clipping == "joint":
        assert norm(grads(total, dec)) == 0.0
    else:
        assert norm(grads(total, dec)) > 0.0


def test_zero_advantage_leaves_only_value_gradient(learner, batch) -> None:
    _, enc, dec, val = parts(learner)
    flat = {**batch, Postprocessing.ADVANTAGES: torch.zeros(128)}
    total = loss(learner, flat, config_with(learner, vf_loss_coeff=0.3))
    assert norm(grads(total, enc)) == 0.0 and norm(grads(total, dec)) == 0.0
    assert norm(grads(total, val)) > 0.0


@pytest.mark.parametrize("head", ["encoder", "decoder"])
@pytest.mark.parametrize("coeff", [0.05, -0.1])
def test_entropy_coefficient_any_sign_changes_loss_by_c_times_h(learner, batch, head, coeff) -> None:
    module, enc, dec, val = parts(learner)
    base = loss(learner, batch, config_with(learner))
    with_entropy = loss(learner, batch, config_with(learner, **{f"{head}_entropy_coeff": coeff}))

    fwd = module.forward_train(batch)
    if head == "encoder":
        entropy = module.encoder_distribution(fwd[STIM_DIST_INPUTS]).entropy().mean()
    else:
        entropy = module.decoder_distribution(fwd[Columns.ACTION_DIST_INPUTS]).entropy().mean()
    torch.testing.assert_close(with_entropy - base, -coeff * entropy, rtol=1e-4, atol=1e-5)

    # The entropy term trains its own head only.
    term = with_entropy - base
    own, other = (enc, dec) if head == "encoder" else (dec, enc)
    assert norm(grads(term, own)) > 0.0
    assert norm(grads(term, other)) < 1e-6 and norm(grads(term, val)) < 1e-6


def test_decoder_weight_l2_trains_decoder_only(learner, batch) -> None:
    module, enc, dec, val = parts(learner)
    term = loss(learner, batch, config_with(learner, decoder_weight_l2_coeff=0.01)) - loss(
        learner, batch, config_with(learner)
    )
    torch.testing.assert_close(term, 0.01 * module.decoder.weight_l2(), rtol=1e-4, atol=1e-6)
    assert norm(grads(term, dec)) > 0.0
    assert norm(grads(term, enc)) < 1e-6 and norm(grads(term, val)) < 1e-6


def test_ratio_is_one_on_fresh_samples_even_after_buffer_moves(learner) -> None:
    # The learner replays the stored act-time spike mean, not the (since updated) buffer.
    module = learner.module[MID].unwrapped()
    g = torch.Generator().manual_seed(3)
    obs = torch.rand(64, 59, generator=g) * 2 - 1
    columns = closed_loop_step(module, {Columns.OBS: obs}, g)
    module.spike_mean.add_(5.0)
    try:
        fwd = module.forward_train({Columns.OBS: obs, **columns})
        logp = module.encoder_distribution(fwd[STIM_DIST_INPUTS]).logp(columns[STIM]) + module.decoder_distribution(
            fwd[Columns.ACTION_DIST_INPUTS]
        ).logp(columns[Columns.ACTIONS])
        torch.testing.assert_close(logp, columns[Columns.ACTION_LOGP], rtol=1e-5, atol=1e-4)
    finally:
        module.spike_mean.sub_(5.0)
