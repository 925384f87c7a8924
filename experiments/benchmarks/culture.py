"""`spikeloop bench culture`: how much of its stimulation the simulated culture passes on to the spike groups.

A closed loop can only learn through what reaches the decoder. This measures it for the
`sim` backend, in culture time (as fast as possible), with the device's own windows:

- `response_after_one_pulse`: mean counts per spike group in time bins after one pulse
  (2.0 uA) on every encoding electrode, averaged over `--pulses` pulses 500 ms apart: when
  the culture answers, and how that lines up with the artifact and collection windows.
- `separability`: how well a logistic regression on one tick's group counts (the decoder's
  input: artifact wait, then the collection window) tells two stimulation patterns apart,
  held-out accuracy (chance 0.5), mean over `--pairs` pattern pairs of each kind:
  `one_electrode` (each pattern drives one encoding electrode hard, the others barely),
  `random_full` (16 values uniform over the range) and `random_mid` (uniform over the
  middle 40%). Every tick adds noise of std 0.1 (of the range) to its pattern, as a
  stimulation policy would. Measured for each device stimulation mode (`--stim-modes`,
  default both: `burst`, spikeloop's default, a burst lasting one tick; `reference`, the
  reference device's interrupt of every electrode, then one pulse per encoding electrode),
  on the same culture, patterns, labels and noise, so the two ways are paired.
- `information`: the culture information meter (bridge/trainer/information.py) on `--info-ticks` ticks of stimulation
  uniform over the encoder's range: shuffle-corrected bits per tick that one tick's group counts carry about
  the stimulation's class (its strongest encoding electrode, ceiling log2 8 = 3 bits), for the sim culture in
  each stimulation mode and for the controls: `transparent` (the perfect channel), `zero` and `random`.

Writes docs/benchmarks/culture.json. A measurement of the simulated culture, not a target.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.device.backends import make_backend
from spikeloop.bridge.device.backends.base import STIM_MODES, Backend, group_matrix
from spikeloop.bridge.device.backends.sim import SimBackend
from spikeloop.bridge.device.simulated_culture import SimulatedCulture
from spikeloop.bridge.trainer.information import InformationEstimate, decoded_information, strongest_electrode
from spikeloop.bridge.wire.channels import (
    ARTIFACT_WAIT_MS,
    COLLECT_WINDOW_MS,
    ENCODING_ELECTRODES,
    N_ENCODING,
    SPIKE_GROUP_NAMES,
    STIM_AMPLITUDE_RANGE_UA,
    STIM_FREQUENCY_RANGE_HZ,
    TICK_FREQUENCY_HZ,
)
from spikeloop.experiments.benchmarks.record import provenance, write_result

DEFAULT_OUTPUT = Path("docs/benchmarks/culture.json")
BINS_MS = ((0, 5), (5, 10), (10, 20), (20, 30), (30, 50), (50, 75), (75, 100), (100, 150))
PATTERN_NOISE = 0.1
PULSE_AMPLITUDE_UA = 2.0


def response_after_one_pulse(seed: int, pulses: int) -> dict[str, list[float]]:
    """Mean counts per group in each of BINS_MS after one pulse on every encoding electrode."""
    culture = SimulatedCulture(seed=seed)
    groups = group_matrix()
    total = np.zeros((BINS_MS[-1][1], len(SPIKE_GROUP_NAMES)))
    for _ in range(pulses):
        for electrode in ENCODING_ELECTRODES:
            culture.stimulate(electrode, PULSE_AMPLITUDE_UA, 1, 1.0)
        total += culture.advance(BINS_MS[-1][1]) @ groups
        culture.advance(500 - BINS_MS[-1][1])
    total /= pulses
    return {f"{lo}-{hi} ms": [round(float(x), 2) for x in total[lo:hi].sum(0)] for lo, hi in BINS_MS}


def _to_stim(unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """16 values in [0, 1] -> (frequencies Hz, amplitudes uA)."""
    (f_lo, f_hi), (a_lo, a_hi) = STIM_FREQUENCY_RANGE_HZ, STIM_AMPLITUDE_RANGE_UA
    return f_lo + (f_hi - f_lo) * unit[:N_ENCODING], a_lo + (a_hi - a_lo) * unit[N_ENCODING:]


def holdout_accuracy(x: np.ndarray, y: np.ndarray, steps: int = 300, l2: float = 1e-3) -> float:
    """Held-out accuracy (last third) of an L2 logistic regression on standardised x (gradient descent)."""
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    x = np.c_[x, np.ones(len(x))]
    cut = 2 * len(x) // 3
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-x[:cut] @ w))
        w -= 0.5 * (x[:cut].T @ (p - y[:cut]) / cut + l2 * w)
    return float((((x[cut:] @ w) > 0) == (y[cut:] > 0.5)).mean())


def separability(
    backend: SimBackend, pairs: list[tuple[np.ndarray, np.ndarray]], ticks: int, rng: np.random.Generator
) -> float:
    """Mean held-out accuracy over pattern pairs, each presented `ticks` times in random order."""
    artifact_s, collect_s = ARTIFACT_WAIT_MS / 1e3, COLLECT_WINDOW_MS / 1e3
    accuracies = []
    for a, b in pairs:
        labels = rng.integers(0, 2, ticks)
        counts = []
        for label in labels:
            unit = np.clip((b if label else a) + rng.normal(scale=PATTERN_NOISE, size=2 * N_ENCODING), 0.0, 1.0)
            t = backend.now_s()
            frequencies_hz, amplitudes_ua = _to_stim(unit)
            backend.stimulate(t, frequencies_hz.tolist(), amplitudes_ua.tolist())
            backend.advance_to(t + artifact_s + collect_s)
            counts.append(backend.spike_counts(t + artifact_s, t + artifact_s + collect_s))
        accuracies.append(holdout_accuracy(np.array(counts), labels.astype(float)))
    return float(np.mean(accuracies))


def information_about_stimulation(backend: Backend, ticks: int, rng: np.random.Generator) -> InformationEstimate:
    """The meter's bits per tick about the stimulation's class, over `ticks` stimulations uniform in range."""
    artifact_s, collect_s = ARTIFACT_WAIT_MS / 1e3, COLLECT_WINDOW_MS / 1e3
    counts, classes = [], []
    for _ in range(ticks):
        frequencies_hz, amplitudes_ua = _to_stim(rng.uniform(0.0, 1.0, 2 * N_ENCODING))
        t = backend.now_s()
        backend.stimulate(t, frequencies_hz.tolist(), amplitudes_ua.tolist())
        backend.advance_to(t + artifact_s + collect_s)
        counts.append(backend.spike_counts(t + artifact_s, t + artifact_s + collect_s))
        classes.append(strongest_electrode(frequencies_hz, amplitudes_ua))
    return decoded_information(np.array(counts), np.array(classes))


def information_by_source(seed: int, modes: list[str], ticks: int) -> dict[str, dict[str, float]]:
    """The meter on the sim culture (one entry per stimulation mode) and on the three controls, paired by seed."""
    sources: dict[str, Backend] = {
        f"sim_{mode}": SimBackend(TICK_FREQUENCY_HZ, seed, realtime=False, stim_mode=mode) for mode in modes
    }
    for control in ("transparent", "zero", "random"):
        sources[control] = make_backend(control, tick_frequency_hz=TICK_FREQUENCY_HZ, seed=seed, realtime=False)
    result = {}
    for name, backend in sources.items():
        backend.open(None)
        estimate = information_about_stimulation(backend, ticks, np.random.default_rng(seed))
        result[name] = {k: round(v, 4) for k, v in estimate.as_dict().items()}
    return result


def pattern_pairs(kind: str, n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """`n` pairs of 16-value patterns (frequencies then amplitudes, in [0, 1]) of one kind."""
    pairs = []
    for _ in range(n):
        if kind == "one_electrode":
            i, j = rng.choice(N_ENCODING, 2, replace=False)
            a, b = np.full(2 * N_ENCODING, 0.05), np.full(2 * N_ENCODING, 0.05)
            a[[i, i + N_ENCODING]] = b[[j, j + N_ENCODING]] = 0.95
        else:
            low, high = (0.0, 1.0) if kind == "random_full" else (0.3, 0.7)
            a, b = rng.uniform(low, high, 2 * N_ENCODING), rng.uniform(low, high, 2 * N_ENCODING)
        pairs.append((a, b))
    return pairs


def main(argv: list[str] | None = None) -> int:
    """Measure the simulated culture's response and separability; write the JSON."""
    parser = argparse.ArgumentParser(
        prog="spikeloop bench culture", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="cultures (seeds 0..N-1) measured (default 3)")
    parser.add_argument("--pairs", type=int, default=5, help="pattern pairs of each kind per culture (default 5)")
    parser.add_argument("--ticks", type=int, default=400, help="ticks per pattern pair (default 400)")
    parser.add_argument(
        "--info-ticks", type=int, default=1000, help="ticks of the information meter per source (default 1000)"
    )
    parser.add_argument("--pulses", type=int, default=40, help="single pulses averaged for the response (default 40)")
    parser.add_argument(
        "--stim-modes",
        nargs="+",
        choices=STIM_MODES,
        default=list(STIM_MODES),
        help=f"device stimulation modes measured (default: {' '.join(STIM_MODES)})",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result file (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    for name in ("seeds", "pairs", "pulses"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.ticks < 30:
        parser.error("--ticks must be >= 30 (a third is held out)")
    if args.info_ticks < 100:
        parser.error("--info-ticks must be >= 100 (the meter's five folds each need ticks of every class)")

    kinds = ("one_electrode", "random_full", "random_mid")
    modes = [m for m in STIM_MODES if m in set(args.stim_modes)]
    per_seed: dict[str, dict[str, Any]] = {}
    for seed in range(args.seeds):
        by_mode: dict[str, dict[str, float]] = {}
        for mode in modes:
            # Each mode on a fresh culture of this seed, with the same patterns, labels and noise: paired.
            backend = SimBackend(TICK_FREQUENCY_HZ, seed, realtime=False, stim_mode=mode)
            backend.open(None)
            rng = np.random.default_rng(seed)
            by_mode[mode] = {
                kind: round(separability(backend, pattern_pairs(kind, args.pairs, rng), args.ticks, rng), 3)
                for kind in kinds
            }
            print(f"culture seed {seed}, stim_mode {mode}: separability {by_mode[mode]}", flush=True)
        information = information_by_source(seed, modes, args.info_ticks)
        print(f"culture seed {seed}: information bits/tick { ({k: v['bits'] for k, v in information.items()}) }")
        per_seed[str(seed)] = {
            "separability": by_mode,
            "response_after_one_pulse": response_after_one_pulse(seed, args.pulses),
            "information": information,
        }
    result = {
        "settings": {
            "artifact_wait_ms": ARTIFACT_WAIT_MS,
            "collect_window_ms": COLLECT_WINDOW_MS,
            "pattern_noise": PATTERN_NOISE,
            "pairs": args.pairs,
            "ticks": args.ticks,
            "pulse_amplitude_ua": PULSE_AMPLITUDE_UA,
            "groups": list(SPIKE_GROUP_NAMES),
            "tick_frequency_hz": TICK_FREQUENCY_HZ,
            "stim_frequency_range_hz": list(STIM_FREQUENCY_RANGE_HZ),
            "stim_amplitude_range_ua": list(STIM_AMPLITUDE_RANGE_UA),
            "stim_modes": modes,
            "info_ticks": args.info_ticks,
            "info_variable": "the stimulation's strongest encoding electrode (8 classes, ceiling 3 bits)",
        },
        "information_bits_mean": {
            source: round(float(np.mean([s["information"][source]["bits"] for s in per_seed.values()])), 3)
            for source in next(iter(per_seed.values()))["information"]
        },
        "separability_mean": {
            mode: {
                kind: round(float(np.mean([s["separability"][mode][kind] for s in per_seed.values()])), 3)
                for kind in kinds
            }
            for mode in modes
        },
        "per_seed": per_seed,
    } | provenance("culture", argv)
    write_result(args.output, result)
    print(f"separability (mean over {args.seeds} cultures): {result['separability_mean']}")
    print(f"information, bits per tick (mean over {args.seeds} cultures): {result['information_bits_mean']}")
    print(f"written to {args.output}")
    return 0
