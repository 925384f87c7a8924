"""Per-culture variation: the knobs that differ from dish to dish, and one culture drawn from a culture seed.

On a CL1 the unit of experiment is the culture: dishes plated the same way differ in how strongly and how far
their neurons connect, how excitable they are and how well they couple to the electrodes. `VARIATION` is the one
table of the knobs that vary and their ranges; `varied_config(base, culture_seed)` draws one culture's values.

The draw is a hash, not a random generator's stream: knob k of culture seed N takes the top 53 bits of
SHA-256("spikeloop culture variation v1|N|k") as a number u in [0, 1), then low + u (high - low) (`linear`) or
low (high / low)^u (`log`); whole-number knobs are rounded. So a culture seed names the same culture whatever the
numpy version, and adding a knob to the table changes no other knob's draw. Every value is then clamped into the
knob's own bounds (SimulatedCultureConfig).

The ranges keep a culture in a plausible regime: measured with `python -m spikeloop.bridge.device.culture_variation`
(docs/architecture.md, "Cultures that differ as dishes do"), 1,000-neuron cultures from the defaults plus the
variation fire 2.7-6.2 Hz per electrode spontaneously (culture seeds 0-11; the defaults: 4.3 Hz), and with every
varied knob at the bottom or the top of its range 2.5 or 7.7-10.4 Hz.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any, Literal

from spikeloop.bridge.device.simulated_culture import SimulatedCulture, SimulatedCultureConfig


@dataclass(frozen=True)
class Variation:
    """One knob that varies between cultures: its range and how values spread over it."""

    knob: str
    low: float
    high: float
    scale: Literal["linear", "log"]
    why: str


VARIATION: tuple[Variation, ...] = (
    Variation("excitatory_weight_mv", 3.2, 4.8, "linear", "connectivity strength: how strongly neurons drive others"),
    Variation("connection_length", 0.8, 1.25, "log", "connectivity: how far local connections reach (pitches)"),
    Variation("synapses_per_neuron", 45, 80, "linear", "connectivity: how many synapses each neuron makes"),
    Variation("noise_probability_per_ms", 0.0002, 0.00045, "log", "excitability: rate of spontaneous kicks"),
    Variation("motor_projection", 0.15, 0.45, "linear", "strength of the projection from encoding to motor groups"),
    Variation("stim_gain_mv_per_ua", 22.0, 40.0, "log", "coupling of the electrodes to the tissue (mV per uA)"),
)
"""The knobs that differ from dish to dish, with their ranges (the defaults lie inside each)."""

DRAW_TAG = "spikeloop culture variation v1"
"""Prefix of every draw's hash: changing it (v2) is the one way to change which culture a seed names."""


def draw_unit(culture_seed: int, knob: str) -> float:
    """Culture `culture_seed`'s draw for `knob`: a number in [0, 1) from SHA-256 (module docstring)."""
    digest = hashlib.sha256(f"{DRAW_TAG}|{culture_seed}|{knob}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / 2.0**53


def _value(v: Variation, u: float) -> float:
    if v.scale == "log":
        return v.low * (v.high / v.low) ** u
    return v.low + u * (v.high - v.low)


def varied_config(
    base: SimulatedCultureConfig, culture_seed: int, fixed: Collection[str] = ()
) -> SimulatedCultureConfig:
    """`base` with each knob of `VARIATION` drawn for culture `culture_seed`, except the knobs in `fixed`.

    `fixed`: the knobs the user set explicitly (`--culture`, `--culture-file`), which keep their values.
    """
    if isinstance(culture_seed, bool) or not isinstance(culture_seed, int) or culture_seed < 0:
        raise ValueError(f"culture_seed={culture_seed!r}: must be a whole number >= 0")
    bounds = {f.name: f for f in fields(SimulatedCultureConfig)}
    unknown = sorted(set(fixed) - set(bounds))
    if unknown:
        raise ValueError(f"fixed knob(s) {', '.join(unknown)}: not culture knobs (--culture-help lists them)")
    drawn: dict[str, Any] = {}
    for v in VARIATION:
        if v.knob in fixed:
            continue
        meta = bounds[v.knob].metadata
        value = min(max(_value(v, draw_unit(culture_seed, v.knob)), meta["low"]), meta["high"])
        drawn[v.knob] = round(value) if isinstance(bounds[v.knob].default, int) else value
    return dataclasses.replace(base, **drawn)


def varied_culture(base: SimulatedCultureConfig, culture_seed: int, fixed: Collection[str] = ()) -> SimulatedCulture:
    """Culture `culture_seed`: its knobs drawn (`varied_config`) and its wiring seeded by the culture seed too.

    A culture is one dish: its wiring belongs to it as much as its connectivity strength does, so one culture seed
    names both. Were the wiring seeded apart (a trial's `--seed`), one culture seed would name a different dish in
    every trial of a sweep, and the culture could not be the unit of the experiment.
    """
    culture = SimulatedCulture(varied_config(base, culture_seed, fixed), seed=culture_seed)
    culture.culture_seed = culture_seed
    return culture


def variation_table() -> str:
    """`VARIATION` as a Markdown table (docs/architecture.md carries it verbatim; a test keeps it so)."""
    defaults = SimulatedCultureConfig()
    rows = ["| knob | default | varies over | spread | what differs between dishes |", "|---|---|---|---|---|"]
    for v in VARIATION:
        default = getattr(defaults, v.knob)
        rows.append(f"| `{v.knob}` | {default:g} | {v.low:g} .. {v.high:g} | {v.scale} | {v.why} |")
    return "\n".join(rows)


def _measure(culture_seeds: range, duration_ms: float) -> None:
    """Print each varied culture's knobs and spontaneous rate per electrode (the docs' figures)."""
    for seed in culture_seeds:
        culture = varied_culture(SimulatedCultureConfig(), seed)
        config, counts = culture.config, culture.advance(duration_ms)
        knobs = " ".join(f"{v.knob}={getattr(config, v.knob):.4g}" for v in VARIATION)
        print(f"culture seed {seed}: {counts.sum() / 64 / (duration_ms / 1000):.2f} Hz per electrode; {knobs}")
        sys.stdout.flush()


if __name__ == "__main__":
    _measure(range(int(sys.argv[1]) if len(sys.argv) > 1 else 8), 10_000.0)
