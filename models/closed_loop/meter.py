"""The live culture information meter: bits per tick the culture's counts carry, over the last ticks of a run.

Each env runner's culture link holds one `CultureMeter` (experiment key `meter`, on by default). The culture
connector hands it every tick (`observe`: the stimulation sent, the culture's counts before any ablation, the
observation's features, the action taken) and, every `every_ticks` ticks, lets it recompute while the culture
answers the next stimulation (`update_if_due`, called from the tick's `while_waiting`). Over the last
`window_ticks` ticks it estimates how many bits per tick the counts carry about three variables:

* `stim`: the stimulation's class, its strongest encoding electrode (`spikeloop.bridge.trainer.information.strongest_electrode`,
  8 classes, ceiling 3 bits): does the culture's answer depend on what it was sent;
* `features`: the observation, as the tercile (`feature_classes` quantiles) of the feature that varies most
  over the window (3 classes, ceiling log2 3 = 1.58 bits): does what the game showed get through the culture;
* `action`: the action the policy took: how much of the policy the culture's answer decides.

The estimator is `spikeloop.bridge.trainer.information.decoded_information` (a cross-validated linear decoder's confusion
information, less its label-shuffled bias), the same as `spikeloop bench culture` and `spikeloop replay` use.
A variable with a single class in the window has nothing to carry: no estimate. The callbacks log the figures
(TensorBoard `culture/info_stim`, `culture/info_features`, `culture/info_action`, each with `_sd`, the
estimator's noise) and the live view shows them (`shown`). Pure NumPy: no Ray, no torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spikeloop.bridge.trainer.information import (
    DEFAULT_FOLDS,
    InformationEstimate,
    decoded_information,
    strongest_electrode,
)

VARIABLES = ("stim", "features", "action")
"""What the meter measures the counts against; TensorBoard tags `culture/info_<variable>`."""
MIN_WINDOW_TICKS = 50
MIN_EVERY_TICKS = 10
MAX_WINDOW_TICKS = 100_000
MAX_FEATURE_CLASSES = 8


@dataclass(frozen=True)
class MeterSettings:
    """The meter's switch, its window and how often it recomputes (experiment section `meter`)."""

    enabled: bool = True
    window_ticks: int = 500
    """The estimate covers the last this many ticks: about 50 s at 10 Hz, enough for the 8 stimulation classes."""
    every_ticks: int = 100
    """Recompute after this many new ticks (each recomputation costs about 10 ms of CPU per variable)."""
    feature_classes: int = 3
    """The observation's classes: quantiles of its most varying feature (3: terciles)."""

    def __post_init__(self) -> None:
        for name, low, high in (
            ("window_ticks", MIN_WINDOW_TICKS, MAX_WINDOW_TICKS),
            ("every_ticks", MIN_EVERY_TICKS, MAX_WINDOW_TICKS),
            ("feature_classes", 2, MAX_FEATURE_CLASSES),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}={value!r}: must be a whole number {low}-{high}")


def feature_classes(features: np.ndarray, classes: int) -> tuple[np.ndarray, int]:
    """The observation's class per tick: the quantile bin (of `classes`) of its most varying feature, and that feature.

    The most varying feature (largest variance over these ticks) rather than one chosen by hand or by the encoder's
    weights: the same rule holds for every scenario, and the question does not change as the encoder learns.
    Quantile bins make the classes about equally frequent, so that the ceiling log2(classes) can be reached.
    Equal values always share a class: values tied at a bin edge go below or above it, whichever leaves more
    classes (a feature that is mostly one value, 0 while no enemy is seen, still splits into two).
    """
    index = int(np.argmax(features.var(axis=0)))
    column = features[:, index]
    edges = np.quantile(column, np.arange(1, classes) / classes)
    below, above = (np.searchsorted(edges, column, side=side) for side in ("left", "right"))
    return (below if len(np.unique(below)) > len(np.unique(above)) else above), index


class CultureMeter:
    """Rolling window of the last ticks and the latest estimate per variable."""

    def __init__(self, settings: MeterSettings, feature_names: Sequence[str] = ()) -> None:
        self.settings = settings
        self.feature_names = tuple(feature_names)
        """Names of the observation's features (the env's), to say which one the `features` classes follow."""
        n = settings.window_ticks
        self._stim_class = np.zeros(n, dtype=np.int64)
        self._action = np.zeros(n, dtype=np.int64)
        self._spikes: np.ndarray | None = None  # [n, groups], sized at the first tick
        self._features: np.ndarray | None = None  # [n, features]
        self._next = 0  # where the next tick goes (a ring)
        self.ticks = 0
        """Ticks observed since the meter started."""
        self._since_update = 0
        self.estimates: dict[str, InformationEstimate | None] = dict.fromkeys(VARIABLES)
        self.feature_index: int | None = None
        self.updated_at_tick = 0
        self.updates = 0
        self.cpu_s = 0.0
        """CPU time the meter cost the thread that runs the loop: estimating (`update`) and observing (charged by
        the caller, with what it took to fetch the tick)."""

    def observe(self, stim: np.ndarray, raw_spikes: np.ndarray, features: np.ndarray, action: int) -> None:
        """One tick: the stimulation sent ([16], Hz then uA), the culture's counts, the observation's features, the action.

        Its CPU time is charged to `cpu_s` by the caller, together with fetching what it hands over.
        """
        n = self.settings.window_ticks
        counts = np.asarray(raw_spikes, dtype=np.float32).ravel()
        observed = np.asarray(features, dtype=np.float32).ravel()
        if self._spikes is None or self._spikes.shape[1] != len(counts):
            self._spikes = np.zeros((n, len(counts)), dtype=np.float32)
        if self._features is None or self._features.shape[1] != len(observed):
            self._features = np.zeros((n, len(observed)), dtype=np.float32)
        half = len(stim) // 2
        i = self._next
        self._stim_class[i] = strongest_electrode(stim[:half], stim[half:])
        self._spikes[i] = counts
        self._features[i] = observed
        self._action[i] = int(action)
        self._next = (i + 1) % n
        self.ticks += 1
        self._since_update += 1

    def due(self) -> bool:
        """True once `every_ticks` ticks came since the last estimate."""
        return self._since_update >= self.settings.every_ticks

    def update_if_due(self) -> bool:
        """Recompute the estimates if `every_ticks` ticks came since the last; True if it did."""
        if not self.due():
            return False
        self.update()
        return True

    def window(self) -> dict[str, np.ndarray]:
        """The ticks of the window in the order they came (oldest first)."""
        n = min(self.ticks, self.settings.window_ticks)
        order = (np.arange(n) + (self._next - n)) % self.settings.window_ticks
        assert self._spikes is not None and self._features is not None
        return {
            "spikes": self._spikes[order],
            "features": self._features[order],
            "stim": self._stim_class[order],
            "action": self._action[order],
        }

    def update(self) -> None:
        """Estimate the bits per tick about each variable over the window (none for a single class)."""
        started = time.thread_time()
        self._since_update = 0
        if self.ticks < 2 * DEFAULT_FOLDS:
            return
        window = self.window()
        labels, feature_index = feature_classes(window["features"], self.settings.feature_classes)
        estimates: dict[str, InformationEstimate | None] = {}
        for variable, values in (("stim", window["stim"]), ("features", labels), ("action", window["action"])):
            one_class = len(np.unique(values)) < 2
            estimates[variable] = None if one_class else decoded_information(window["spikes"], values)
        # Whole new values, each set once: the live view's server thread reads them while the loop runs.
        self.estimates, self.feature_index = estimates, feature_index
        self.updated_at_tick = self.ticks
        self.updates += 1
        self.cpu_s += time.thread_time() - started

    def metrics(self) -> dict[str, float]:
        """The latest figures by metric name (`info_<variable>` bits per tick and `info_<variable>_sd`, its noise)."""
        out: dict[str, float] = {}
        for variable, estimate in self.estimates.items():
            if estimate is not None and math.isfinite(estimate.bits):
                out[f"info_{variable}"] = estimate.bits
                out[f"info_{variable}_sd"] = estimate.shuffle_bits_sd
        return out

    def shown(self) -> dict[str, Any]:
        """What the live view shows: per variable bits, noise and ceiling, and which feature and window."""
        feature = self.feature_index
        return {
            "window_ticks": self.settings.window_ticks,
            "ticks": min(self.updated_at_tick, self.settings.window_ticks),
            "updated_at_tick": self.updated_at_tick,
            "feature_classes": self.settings.feature_classes,
            "feature": None
            if feature is None
            else (self.feature_names[feature] if feature < len(self.feature_names) else f"feature {feature}"),
            **{
                variable: None
                if estimate is None
                else {
                    "bits": round(estimate.bits, 4),
                    "sd": round(estimate.shuffle_bits_sd, 4),
                    "ceiling": round(estimate.ceiling_bits, 4),
                }
                for variable, estimate in self.estimates.items()
            },
        }

    def cost(self) -> dict[str, float]:
        """The meter's CPU time so far: in all and per tick observed (`spikeloop bench loop` reports it)."""
        return {
            "meter_cpu_s": self.cpu_s,
            "meter_ticks": float(self.ticks),
            "meter_updates": float(self.updates),
            "meter_cpu_ms_per_tick": 1e3 * self.cpu_s / self.ticks if self.ticks else 0.0,
        }
