"""How long RLlib waits for an env runner's sample: derived from the experiment, never RLlib's 60 s.

RLlib gives every remote `sample()` call `sample_timeout_s` (60 s by default).
A sample that takes longer is not waited for: the iteration trains on nothing,
while the env runner goes on stimulating the culture for the whole batch, whose
steps then never reach the learner. At a real device's pace (10 steps/s) a
batch of 1,024 steps takes about 105 s, so the default starved every hardware
run.

The loop has its own, sharper loss detection (`loop.max_consecutive_timeouts`
exchanges in a row without a reply), so RLlib's timeout only has to catch an
env runner that hangs outright. `auto` therefore sets it to the longest a
sample can take while the loop still moves: every exchange waiting out its
whole reply horizon (twice `loop.timeout_s`), every step ending an episode
(one `env.reset_delay_s` each) and `STEP_ALLOWANCE_S` for the game and the
model, per step, plus one whole `loop.max_wait_s` when `loop.on_device_loss`
is `wait` (a step that waits for a lost device is the loop paused, not hung).
A lab that wants RLlib to give up sooner sets a number, which must leave room
to fill the batch at the device's nominal pace (`nominal_sample_s`), and with
`wait` also room for that wait: otherwise RLlib would give up on the sample
while its env runner waits, and the episodes of the outage would be lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEP_ALLOWANCE_S = 0.25
"""Per step, on a loaded machine: one game step, the module's forward pass and the loop's bookkeeping (measured:
about 2 ms unpaced, docs/benchmarks.md "loop"; the allowance is a hundred times that)."""


@dataclass(frozen=True)
class SamplePace:
    """What one env runner's sample asks of its culture."""

    rollout_steps: int
    """Env steps each env runner samples per iteration."""
    rounds: int
    """Stimulations per env step (`model.same_frame_rounds`)."""
    reply_horizon_s: float
    """The longest one exchange can wait for its reply (the bridge's horizon: timeout plus grace)."""
    reset_delay_s: float
    """The env's pause before each episode."""
    device_step_s: float | None
    """Culture time per stimulation at the device's nominal pace (artifact wait + collection window), or None for
    a simulated culture that runs as fast as it can."""
    device_wait_s: float = 0.0
    """How long one step may wait for a lost device to answer again (`loop.max_wait_s` with `on_device_loss: wait`;
    0 otherwise)."""

    def longest_sample_s(self) -> float:
        """The longest a sample can take while the loop still progresses (`loop.sample_timeout_s: auto`)."""
        per_step = self.rounds * self.reply_horizon_s + self.reset_delay_s + STEP_ALLOWANCE_S
        return self.rollout_steps * per_step + self.device_wait_s

    def nominal_sample_s(self) -> float:
        """How long the sample takes at the device's nominal pace (0 for a culture that is not paced)."""
        return self.rollout_steps * self.rounds * (self.device_step_s or 0.0)

    def timeout_s(self, setting: float | str) -> float:
        """RLlib's `sample_timeout_s` for `loop.sample_timeout_s` (`auto` or seconds; checked by `check`)."""
        return math.ceil(self.longest_sample_s()) if setting == "auto" else float(setting)

    def check(self, setting: float | str) -> None:
        """Refuse a timeout under which a full batch cannot arrive even at the device's nominal pace."""
        if setting == "auto":
            return
        needed = self.nominal_sample_s()
        if self.device_wait_s and float(setting) <= needed + self.device_wait_s:
            raise ValueError(
                f"loop.sample_timeout_s: {float(setting):g} s does not cover loop.max_wait_s "
                f"({self.device_wait_s:g} s) on top of the sample's {needed:.0f} s at the device's pace: while a step "
                f"waits for a lost device (loop.on_device_loss: wait) RLlib would give up on the sample and its "
                f"episodes would be lost; use auto (here {self.timeout_s('auto'):g} s) or more than "
                f"{needed + self.device_wait_s:.0f} s"
            )
        if float(setting) <= needed:
            raise ValueError(
                f"loop.sample_timeout_s: {float(setting):g} s is not enough to fill a sample of {self.rollout_steps} "
                f"env steps x {self.rounds} stimulation(s) at the device's pace ({needed:.0f} s): RLlib would give "
                f"up on every sample and train on nothing while the culture is stimulated; use auto (here "
                f"{self.timeout_s('auto'):g} s) or more than {needed:.0f} s"
            )
