"""A simulated culture saved whole and loaded again, so a later device program continues the same dish.

On a CL1 every block of a study runs on the same culture, carrying over what the last block left. `save_culture`
writes everything a `SimulatedCulture` is (wiring, weights, traces, eligibility, dopamine, the input ring,
membranes, culture time, the noise generator's state, the pulses still scheduled, its knobs and plasticity switch)
to one `.npz` file, atomically; `load_culture` gives back a culture that goes on bit for bit as the saved one would
have, without maturing it again. The file holds plain arrays and one JSON header (format, version, knobs), never
pickled objects, and every array is checked on load against the shapes and index ranges the compiled kernel relies
on: a corrupt or foreign file is a ValueError naming the file and the problem, never an out-of-bounds write.

`device_culture` is what the sim backend builds its culture with: loaded from `--culture-state` if that file
exists (refusing culture knobs or a culture seed that say otherwise), else drawn fresh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.bridge.device.culture_variation import varied_culture
from spikeloop.bridge.device.simulated_culture import (
    MAX_DELAY_MS,
    NOISE_LANES,
    PLASTICITY_RULES,
    RING_ROWS,
    SimulatedCulture,
    SimulatedCultureConfig,
    xorshift_jump_table,
)
from spikeloop.bridge.wire.channels import N_ELECTRODES

log = logging.getLogger(__name__)

FORMAT = "spikeloop-culture-state"
VERSION = 1
"""Raised whenever the saved state's meaning changes; a file of another version is refused, not guessed at."""

_N, _N1, _SYN, _STIM = "n", "n+1", "synapses", "stim"
_MEMBRANES = ("v", "u")
"""May hold inf or NaN: a neuron driven far past its peak overflows the kernel's quadratic term and is NaN (silent)
from then on, in every run, saved or not (docs/architecture.md, "Neurons that overflow"). A saved culture keeps
them as they are, so it goes on as the unsaved one would; a membrane value is no index, so the kernel stays in
bounds."""
_ARRAYS: dict[str, tuple[type, tuple[str | int, ...]]] = {
    "positions": (np.float64, (_N, 2)),
    "excitatory": (np.bool_, (_N,)),
    **{name: (np.float64, (_N,)) for name in ("a", "b", "c", "d", "v", "u", "_spike_trace", "_trace_before")},
    "out_ptr": (np.int64, (_N1,)),
    "out_target": (np.int64, (_SYN,)),
    "synapse_source": (np.int64, (_SYN,)),
    "out_delay": (np.int64, (_SYN,)),
    "weight": (np.float64, (_SYN,)),
    "plastic": (np.bool_, (_SYN,)),
    "in_synapse": (np.int64, (_SYN,)),
    "in_ptr": (np.int64, (_N1,)),
    "recorded_by": (np.int64, (_N,)),
    "stim_ptr": (np.int64, (N_ELECTRODES + 1,)),
    "stim_neuron": (np.int64, (_STIM,)),
    "stim_falloff": (np.float64, (_STIM,)),
    "_trace": (np.float64, (_SYN, 2)),
    "_dopamine": (np.float64, (4,)),
    "_dopamine_per_pulse": (np.float64, (N_ELECTRODES,)),
    "_input_ring": (np.float64, (RING_ROWS, _N)),
    "_small_traces": (np.int64, (_N1,)),
    "_kicked": (np.bool_, (_N,)),
    "_spiked": (np.bool_, (_N,)),
    "_pulse_next_step": (np.int64, (N_ELECTRODES,)),
    "_pulse_interval_steps": (np.int64, (N_ELECTRODES,)),
    "_pulse_remaining": (np.int64, (N_ELECTRODES,)),
    "_pulse_amplitude_ua": (np.float64, (N_ELECTRODES,)),
    "_rng_state": (np.uint64, (1,)),
}
"""Every array of a SimulatedCulture: dtype and shape (n neurons, synapses and stimulation sites from the file)."""
_HEADER_FIELDS = ("step", "_rule", "plasticity_enabled", "culture_seed")
"""The culture's other state, kept in the JSON header beside its knobs."""
_DERIVED = ("config", "_noise_jump")
"""Not arrays of the file: the knobs (header) and a table rebuilt from n_neurons (shared by cultures of one size)."""


def save_culture(culture: SimulatedCulture, path: Path | str) -> None:
    """Write the culture whole to `path` (.npz): a temporary file beside it, then renamed over it."""
    path = Path(path)
    attributes = vars(culture)
    unknown = sorted(set(attributes) - set(_ARRAYS) - set(_HEADER_FIELDS) - set(_DERIVED))
    if unknown:  # a new piece of state must be saved, or a loaded culture would silently lack it
        raise TypeError(f"culture_state does not save SimulatedCulture.{', '.join(unknown)}: add it to _ARRAYS")
    header = {
        "format": FORMAT,
        "version": VERSION,
        "config": dataclasses.asdict(culture.config),
        **{name: attributes[name] for name in _HEADER_FIELDS},
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            np.savez(f, header=np.array(json.dumps(header)), **{name: attributes[name] for name in _ARRAYS})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_culture(path: Path | str) -> SimulatedCulture:
    """The culture saved at `path`, ready to go on where it stopped; ValueError names the file and the problem."""
    path = Path(path)
    where = f"culture state {path}"
    if not path.is_file():
        raise ValueError(f"{where}: {'no such file' if not path.exists() else 'not a file'}")
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = {name: data[name] for name in data.files}
    except Exception as exc:  # a truncated zip, a bad CRC, a text file: every way a foreign file fails to read
        raise ValueError(f"{where}: not a culture state file ({type(exc).__name__}: {exc})") from None
    header = _header(stored.pop("header", None), where)
    try:
        config = SimulatedCultureConfig.from_mapping(header["config"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: its culture knobs are refused: {exc}") from None
    _check_arrays(stored, config.n_neurons, where)
    culture = SimulatedCulture.__new__(SimulatedCulture)  # no __init__: the saved culture has matured already
    culture.config = config
    for name in _ARRAYS:
        setattr(culture, name, np.ascontiguousarray(stored[name]))
    for name in _HEADER_FIELDS:
        setattr(culture, name, header[name])
    culture._noise_jump = xorshift_jump_table(config.n_neurons // NOISE_LANES)
    return culture


def _header(raw: np.ndarray | None, where: str) -> dict[str, Any]:
    if raw is None or raw.shape != () or raw.dtype.kind != "U":
        raise ValueError(f"{where}: not a culture state file (no header)")
    try:
        header = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: its header is not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{where}: not a culture state file (format {header.get('format')!r}, not {FORMAT!r})")
    if header.get("version") != VERSION:
        raise ValueError(
            f"{where}: format version {header.get('version')!r}, this spikeloop reads version {VERSION}; load it "
            "with the spikeloop that saved it, or start a new culture"
        )
    missing = [name for name in ("config", *_HEADER_FIELDS) if name not in header]
    step, rule, enabled, seed = (header.get(name) for name in _HEADER_FIELDS)
    if (
        missing
        or not isinstance(header["config"], dict)
        or isinstance(step, bool)
        or not isinstance(step, int)
        or not 0 <= step < 2**62  # culture time in ms, an int64 in the kernel: no culture runs 10^11 years
        or rule not in PLASTICITY_RULES
        or not isinstance(enabled, bool)
        or not (seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0))
    ):
        raise ValueError(f"{where}: its header is damaged (missing {missing} or a value of the wrong kind)")
    return header


def _check_arrays(stored: dict[str, np.ndarray], n: int, where: str) -> None:
    """Every array of the right dtype and shape, and every index in range (the kernel checks none)."""
    if set(stored) != set(_ARRAYS):
        extra, missing = sorted(set(stored) - set(_ARRAYS)), sorted(set(_ARRAYS) - set(stored))
        raise ValueError(f"{where}: arrays missing {missing} or not of a culture {extra}")
    sizes = {_N: n, _N1: n + 1, _SYN: len(stored["weight"]), _STIM: len(stored["stim_neuron"])}
    for name, (dtype, shape) in _ARRAYS.items():
        array, want = stored[name], tuple(sizes[d] if isinstance(d, str) else d for d in shape)
        if array.dtype != dtype or array.shape != want:
            raise ValueError(
                f"{where}: array {name} is {array.dtype} {array.shape}, a culture's is {np.dtype(dtype)} {want}"
            )
        if array.dtype.kind == "f" and name not in _MEMBRANES and not np.isfinite(array).all():
            raise ValueError(f"{where}: array {name} holds a value that is not finite")

    def within(name: str, low: int, high: int, values: np.ndarray | None = None) -> None:
        values = stored[name] if values is None else values
        if len(values) and (values.min() < low or values.max() > high):
            raise ValueError(f"{where}: array {name} holds an index outside {low}..{high}")

    for name, end in (("out_ptr", _SYN), ("in_ptr", _SYN), ("stim_ptr", _STIM)):
        ptr = stored[name]
        if ptr[0] != 0 or ptr[-1] != sizes[end] or (np.diff(ptr) < 0).any():
            raise ValueError(f"{where}: array {name} does not index its {end} in order")
    for name in ("out_target", "synapse_source", "stim_neuron"):
        within(name, 0, n - 1)
    within("in_synapse", 0, sizes[_SYN] - 1)
    within("out_delay", 1, MAX_DELAY_MS)
    within("recorded_by", -1, N_ELECTRODES - 1)
    small = stored["_small_traces"]
    within("_small_traces", 0, n, small[-1:])
    within("_small_traces", 0, n - 1, small[: int(small[-1])])
    within("_pulse_remaining", 0, np.iinfo(np.int64).max)
    within("_pulse_interval_steps", 1, np.iinfo(np.int64).max)
    if stored["_rng_state"][0] == 0:
        raise ValueError(f"{where}: the noise generator's state is 0 (xorshift would draw only zeros)")


def device_culture(
    config: SimulatedCultureConfig | None,
    seed: int,
    culture_seed: int | None = None,
    fixed: Collection[str] = (),
    state_path: Path | None = None,
) -> SimulatedCulture:
    """The sim backend's culture: loaded from `state_path` if it exists, else built (drawn, with a culture seed).

    `fixed`: the knobs set explicitly; a saved culture is refused when one of them, or `culture_seed`, says
    otherwise than the saved culture (a saved dish continues as it is: its knobs cannot change between blocks).
    """
    if state_path is not None and state_path.exists():
        culture = load_culture(state_path)
        given = config or SimulatedCultureConfig()
        differ = [
            f"{k}={getattr(given, k)!r} (saved: {getattr(culture.config, k)!r})"
            for k in sorted(fixed)
            if getattr(given, k) != getattr(culture.config, k)
        ]
        if culture_seed is not None and culture_seed != culture.culture_seed:
            differ.insert(0, f"culture seed {culture_seed} (saved: {culture.culture_seed})")
        if differ:
            raise ValueError(
                f"culture state {state_path} holds another culture than asked for: {'; '.join(differ)}. A saved "
                "culture goes on as it is: leave out the culture seed and knobs, or name a new culture state file"
            )
        log.info("culture loaded from %s at culture time %.3f s", state_path, culture.time_ms / 1000.0)
        return culture
    if state_path is not None and not state_path.parent.is_dir():
        raise ValueError(f"culture state {state_path}: its directory does not exist; create it or choose another path")
    if culture_seed is not None:
        return varied_culture(config or SimulatedCultureConfig(), culture_seed, fixed)
    return SimulatedCulture(config, seed=seed)
