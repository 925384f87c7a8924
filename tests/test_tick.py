"""`tick`, the closed loop's one tick, against a culture that records what it is asked and answers known counts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from spikeloop.bridge.trainer.core import SpikeReply
from spikeloop.bridge.wire.channels import N_SPIKE_GROUPS
from spikeloop.models.closed_loop.tick import tick
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from spikeloop.models.columns import EXCHANGE_OK, RAW_SPIKES, SPIKES, STIM, STIM_DIST_INPUTS, STIM_TIMESTAMP
from spikeloop.models.encoder import N_STIM

OBS = gym.spaces.Box(-1.0, 1.0, (59,), np.float32)


def module(**settings) -> ClosedLoopRLModule:
    spec = RLModuleSpec(
        module_class=ClosedLoopRLModule,
        observation_space=OBS,
        action_space=gym.spaces.Discrete(54),
        model_config=settings,
    )
    return spec.build()


class ScriptedCulture:
    """Records every call; answers stimulation i with counts i + 1 on every group (a timeout for `timeout_at`)."""

    def __init__(self, timeout_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.stims: list[np.ndarray] = []
        self.timeout_at = timeout_at

    def send_stim(self, stim: np.ndarray) -> None:
        self.calls.append("send")
        self.stims.append(np.array(stim))

    def receive_spikes(self) -> SpikeReply:
        self.calls.append("receive")
        i = len(self.stims) - 1
        if i == self.timeout_at:
            return SpikeReply(np.zeros(N_SPIKE_GROUPS, np.float32), "timeout", 0.5, 1000 + i, None, 0)
        return SpikeReply(np.full(N_SPIKE_GROUPS, i + 1.0, np.float32), "ok", 0.1, 1000 + i, 2000 + i, 0)


def forward(mod: ClosedLoopRLModule, rows: int) -> torch.Tensor:
    obs = torch.rand(rows, 59, generator=torch.Generator().manual_seed(1)) * 2 - 1
    return mod.forward_exploration({Columns.OBS: obs})[STIM_DIST_INPUTS]


def test_one_tick_sends_waits_receives_and_decodes_the_answer() -> None:
    mod = module()
    culture = ScriptedCulture()
    result = tick(
        mod,
        forward(mod, 1),
        culture,
        explore=True,
        generator=torch.Generator().manual_seed(0),
        while_waiting=lambda: culture.calls.append("while_waiting"),
    )
    # The work that needs no spikes runs after the stimulation left and before its answer is taken.
    assert culture.calls == ["send", "while_waiting", "receive"]
    np.testing.assert_array_equal(culture.stims[0], result.stim[0])
    assert culture.stims[0].shape == (N_STIM,)
    np.testing.assert_array_equal(result.raw_spikes, np.ones((1, N_SPIKE_GROUPS)))
    np.testing.assert_array_equal(result.spikes.numpy(), result.raw_spikes)  # ablation "none"
    # The action's log-probability is the decoder's, given the answer this stimulation got.
    with torch.no_grad():
        decoder_logp = mod.decoder_distribution(mod.decode(result.spikes)).logp(result.action)
        stim_logp = mod.encoder_distribution(forward(mod, 1)).logp(torch.from_numpy(result.stim))
    torch.testing.assert_close(result.action_logp, stim_logp + decoder_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.stim_logp, stim_logp, rtol=1e-5, atol=1e-5)
    columns = result.columns()
    assert columns[EXCHANGE_OK].tolist() == [1.0] and columns[STIM_TIMESTAMP].dtype == np.uint64
    assert columns[STIM_TIMESTAMP].tolist() == [1000]
    np.testing.assert_array_equal(columns[STIM], result.stim)


def test_same_frame_rounds_take_one_exchange_each_in_turn() -> None:
    mod = module(same_frame_rounds=2)
    culture = ScriptedCulture(timeout_at=1)
    result = tick(mod, forward(mod, 1), culture, explore=False)
    assert culture.calls == ["send", "receive", "send", "receive"]
    for r in range(2):
        np.testing.assert_array_equal(culture.stims[r], result.stim[0, r * N_STIM : (r + 1) * N_STIM])
    np.testing.assert_array_equal(result.raw_spikes[0], [1.0] * N_SPIKE_GROUPS + [0.0] * N_SPIKE_GROUPS)
    assert result.columns()[EXCHANGE_OK].tolist() == [0.0]  # one round timed out: the step did not get its answer


@pytest.mark.parametrize("ablation", ["zero", "random"])
def test_the_decoder_sees_the_ablated_answer_and_the_batch_keeps_both(ablation: str) -> None:
    mod = module(ablation=ablation)
    result = tick(mod, forward(mod, 3), ScriptedCulture(), explore=True, generator=torch.Generator().manual_seed(2))
    columns = result.columns()
    np.testing.assert_array_equal(columns[RAW_SPIKES], np.repeat([[1.0], [2.0], [3.0]], N_SPIKE_GROUPS, axis=1))
    if ablation == "zero":
        assert not columns[SPIKES].any()
    else:
        assert not np.array_equal(columns[SPIKES], columns[RAW_SPIKES])


def test_shuffled_gives_the_decoder_the_cultures_answer_to_another_stimulation() -> None:
    """`ablation: shuffled`: each step the decoder reads one of the culture's earlier answers, drawn from the pool,
    never the answer to its own stimulation; the batch keeps the real one. The same seed draws the same."""
    from spikeloop.models.closed_loop.shuffled_answers import ShuffledAnswers

    def run(seed: int) -> tuple[list[float], list[float]]:
        mod, culture, answers = module(ablation="shuffled"), ScriptedCulture(), ShuffledAnswers(8)
        generator = torch.Generator().manual_seed(seed)
        seen, raw = [], []
        for _ in range(40):
            result = tick(mod, forward(mod, 1), culture, explore=True, generator=generator, answers=answers)
            assert len(set(result.spikes[0].tolist())) == 1  # a whole answer, not a mix of answers
            seen.append(float(result.spikes[0, 0]))
            raw.append(float(result.raw_spikes[0, 0]))
        return seen, raw

    seen, raw = run(3)
    assert raw == [i + 1.0 for i in range(40)]  # the culture answered stimulation i with counts i + 1
    assert seen[0] == 0.0  # nothing to draw before the first answer
    for step in range(1, 40):
        assert seen[step] in raw[max(0, step - 8) : step], step  # an earlier answer, from the last 8
    assert len(set(seen[9:])) > 4  # drawn, not a fixed lag
    assert run(3) == (seen, raw) and run(4)[0] != seen
    with pytest.raises(ValueError, match="pool of answers"):
        tick(module(ablation="shuffled"), forward(module(), 1), ScriptedCulture(), explore=True)
