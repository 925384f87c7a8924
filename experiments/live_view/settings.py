"""What the live view serves and where: the settings every env runner receives."""

from __future__ import annotations

from dataclasses import dataclass

from spikeloop.bridge.wire.channels import LIVE_VIEW_PORT
from spikeloop.experiments.live_view.progress import RunBudget


@dataclass(frozen=True)
class ViewSettings:
    """The live view of each env runner: off by default; on, a local-only HTTP server per runner."""

    enabled: bool = False
    host: str = "127.0.0.1"
    """Bind address; "0.0.0.0" opens the view to the network (it has no authentication)."""
    port: int = LIVE_VIEW_PORT
    """Env runner 0 and 1 serve here, env runner i >= 2 on port + i - 1."""
    jpeg_quality: int = 75
    max_fps: float = 20.0
    """Frames and states sent per second per client at most; newer ticks replace older ones."""
    budget: RunBudget | None = None
    """The experiment's stop conditions, for the dashboard's progress (None: env steps without a budget)."""

    def __post_init__(self) -> None:
        if not 1 <= self.jpeg_quality <= 95:
            raise ValueError(f"jpeg_quality must be 1-95 (Pillow's useful range), got {self.jpeg_quality}")
        if not 0 < self.max_fps <= 120:
            raise ValueError(f"max_fps must be in (0, 120], got {self.max_fps}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535 (0: any free port), got {self.port}")

    def port_for(self, runner_index: int) -> int:
        """The port env runner `runner_index` serves on (0 stays 0: any free port)."""
        if self.port == 0:
            return 0
        # The local runner (0) only samples when there are no remote runners, so it shares runner 1's port.
        return self.port + max(runner_index - 1, 0)
