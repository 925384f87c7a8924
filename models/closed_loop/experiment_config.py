"""`ClosedLoopExperimentConfig`: the PPO config plus what an experiment's env runners read from it.

Declared fields, not attributes set on the side: the culture each env runner
drives, the live view's settings and the trial's episode counter travel to the
env runners inside the algorithm config, the one object RLlib ships to them.
"""

from __future__ import annotations

from typing import Self

from ray.rllib.algorithms.algorithm_config import NotProvided

from spikeloop.experiments.live_view.settings import ViewSettings
from spikeloop.models.closed_loop.session_record import RecordSettings
from spikeloop.models.closed_loop.settings import CultureSettings
from spikeloop.models.ppo_config import ClosedLoopPPOConfig


class ClosedLoopExperimentConfig(ClosedLoopPPOConfig):
    """ClosedLoopPPOConfig with the experiment's cultures, live view and episode counter."""

    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class)
        self.culture_settings: CultureSettings | None = None
        """The cultures env runners drive, one each (None: the direct policy, no culture)."""
        self.live_view: ViewSettings | None = None
        """The live view's settings when it is on (None: off)."""
        self.episode_counter_name: str | None = None
        """The trial's episode-counter actor (None: each env runner numbers its own episodes)."""
        self.session_record: RecordSettings | None = None
        """Where env runners write their session records (`output.record`; None: off)."""

    def experiment(
        self,
        *,
        culture_settings: CultureSettings | None = NotProvided,
        live_view: ViewSettings | None = NotProvided,
        episode_counter_name: str | None = NotProvided,
        session_record: RecordSettings | None = NotProvided,
    ) -> Self:
        """Set the experiment's cultures, live view (None or disabled: off), episode counter and session record."""
        if culture_settings is not NotProvided:
            self.culture_settings = culture_settings
        if live_view is not NotProvided:
            self.live_view = live_view if live_view is not None and live_view.enabled else None
        if episode_counter_name is not NotProvided:
            self.episode_counter_name = episode_counter_name
        if session_record is not NotProvided:
            self.session_record = session_record
        return self

    def validate(self) -> None:
        """The closed-loop checks plus the types of the experiment fields."""
        super().validate()
        if self.culture_settings is not None and not isinstance(self.culture_settings, CultureSettings):
            self._value_error(f"culture_settings must be CultureSettings or None, got {type(self.culture_settings)}")
        if self.live_view is not None and not isinstance(self.live_view, ViewSettings):
            self._value_error(f"live_view must be ViewSettings or None, got {type(self.live_view)}")
