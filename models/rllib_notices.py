"""Keep Ray's and RLlib's notices that a spikeloop user cannot act on out of the terminal.

Each is logged on every run, in the driver, the trial and every env runner, and says
nothing about the experiment: that PPO runs on RLlib's new API stack (spikeloop chose
it), that RLlib builds its own modules through a deprecated path (RLlib's own call),
and that GPUtil is missing (spikeloop monitors no GPU). Only these exact messages are
dropped, on the loggers that emit them; every other warning still shows.
"""

from __future__ import annotations

import logging

NOTICES: tuple[tuple[str, str], ...] = (
    ("ray.rllib.algorithms.algorithm_config", "on the new API stack!"),
    ("ray._common.deprecation", "`RLModule(config=[RLModuleConfig object])` has been deprecated"),
    ("ray.tune.utils.util", "Install gputil for GPU system monitoring"),
)
"""(logger name, a fragment of the message) of each notice dropped."""


class _DropNotice(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def install() -> None:
    """Drop the notices in this process (idempotent)."""
    for logger_name, fragment in NOTICES:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropNotice) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropNotice(fragment))
