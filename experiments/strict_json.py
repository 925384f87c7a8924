"""Values made fit for strict JSON: what the run's own files (protocol.json, analysis.json, benchmark results) write.

JSON has no NaN or infinity, and `json.dumps` knows no numpy scalar: a figure that could not be computed is written
as null, a numpy number as the Python number it holds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def json_safe(value: Any) -> Any:
    """`value` with NaN and infinities as None, numpy scalars as Python numbers and mapping keys as text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
