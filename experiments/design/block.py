"""One block of a design's sequence, as the runner trains it (experiments/design/sequence.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Block:
    """Where a block writes, what runs on its culture before play (the rest), and whether it ends the sequence."""

    directory: Path
    before_play: Callable[[Any], None]
    last: bool
