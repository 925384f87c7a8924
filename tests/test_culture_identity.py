"""A simulated culture is a dish: a culture seed names one that differs from others, and its state carries over.

(a) Variation: two culture seeds give two cultures that differ in the varied knobs and in their spontaneous firing,
one culture seed always the same one, and the knobs a user set are kept. (b) A culture saved and loaded goes on bit
for bit as the original does under the same stimulation, and a damaged file is refused naming the file and the
problem. (c) Through the front door: `spikeloop device --backend sim --culture-state PATH` as its own process saves
the culture when stopped with SIGTERM, and a second program on the same PATH continues it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from spikeloop.bridge.device.culture_state import FORMAT, device_culture, load_culture, save_culture
from spikeloop.bridge.device.culture_variation import VARIATION, draw_unit, variation_table, varied_config
from spikeloop.bridge.device.simulated_culture import SimulatedCulture, SimulatedCultureConfig
from tests.support.device_client import ROOT, Client, start_device, stop_device

SMALL = SimulatedCultureConfig(n_neurons=150, maturation_ms=1000.0)
SMALL_FLAGS = ("--culture", "n_neurons=150", "--culture", "maturation_ms=1000")


# --- (a) variation ------------------------------------------------------------------------------------------------


def test_two_culture_seeds_are_two_cultures_and_one_seed_is_always_the_same() -> None:
    one, other = varied_config(SMALL, 1), varied_config(SMALL, 2)
    for v in VARIATION:
        assert getattr(one, v.knob) != getattr(other, v.knob), v.knob
        assert v.low <= getattr(one, v.knob) <= v.high, v.knob
    assert varied_config(SMALL, 1) == one
    assert (one.n_neurons, one.maturation_ms) == (150, 1000.0), "knobs that do not vary are the base's"
    # The draw is a hash of (seed, knob), not numpy's stream: this value holds whatever the numpy version.
    assert draw_unit(0, "excitatory_weight_mv") == 0.034732554905274604


def test_varied_cultures_differ_in_their_spontaneous_firing_and_repeat_for_one_seed() -> None:
    def spontaneous(culture_seed: int) -> int:
        return int(device_culture(SMALL, seed=0, culture_seed=culture_seed).advance(5000).sum())

    first = spontaneous(1)
    assert first > 0
    assert spontaneous(1) == first
    assert spontaneous(2) != first


def test_a_culture_seed_names_the_wiring_too_whatever_the_seed() -> None:
    every_knob = {v.knob for v in VARIATION}  # the same knobs: only the wiring can tell two cultures apart
    one = device_culture(SMALL, seed=0, culture_seed=1, fixed=every_knob)
    assert np.array_equal(one.positions, device_culture(SMALL, seed=9, culture_seed=1, fixed=every_knob).positions)
    assert not np.array_equal(one.positions, device_culture(SMALL, seed=0, culture_seed=2, fixed=every_knob).positions)


def test_knobs_set_explicitly_are_kept_and_variation_is_off_without_a_culture_seed() -> None:
    base = SimulatedCultureConfig(excitatory_weight_mv=4.0, stim_gain_mv_per_ua=10.0)
    varied = varied_config(base, 3, fixed={"excitatory_weight_mv", "stim_gain_mv_per_ua"})
    assert (varied.excitatory_weight_mv, varied.stim_gain_mv_per_ua) == (4.0, 10.0)
    assert varied.noise_probability_per_ms != base.noise_probability_per_ms
    with pytest.raises(ValueError, match="fixed knob\\(s\\) bogus: not culture knobs"):
        varied_config(base, 3, fixed={"bogus"})
    plain = device_culture(SMALL, seed=4)
    assert plain.config == SMALL and plain.culture_seed is None
    assert np.array_equal(plain.weight, SimulatedCulture(SMALL, seed=4).weight)


def test_the_docs_carry_the_variation_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert variation_table() in text, "docs/architecture.md: paste variation_table() into 'Cultures that differ'"


# --- (b) state save and load ----------------------------------------------------------------------------------------


def _stimulated(rule: str) -> SimulatedCulture:
    culture = device_culture(SimulatedCultureConfig(n_neurons=150, maturation_ms=500.0, plasticity=rule), 0, 7)
    for electrode in (3, 4, 5):
        culture.stimulate(electrode, 2.0, 20, 40.0)
    culture.advance(123)
    culture.stimulate(19, 2.0, 50, 20.0)  # a good-news electrode, still pulsing when saved (dopamine_stdp: reward)
    culture.advance(37)
    return culture


@pytest.mark.parametrize("rule", ["stdp", "dopamine_stdp"])
def test_a_loaded_culture_goes_on_bit_for_bit_as_the_saved_one(tmp_path: Path, rule: str) -> None:
    original = _stimulated(rule)
    save_culture(original, tmp_path / "dish.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["dish.npz"], "the temporary file is renamed, not left"
    loaded = load_culture(tmp_path / "dish.npz")
    assert vars(loaded).keys() == vars(original).keys()
    restored = vars(loaded)
    for name, value in vars(original).items():
        assert np.array_equal(value, restored[name]) if isinstance(value, np.ndarray) else value == restored[name], name
    assert loaded.step == original.step > 0 and loaded.culture_seed == 7
    for culture in (original, loaded):
        culture.stimulate(10, 1.5, 30, 100.0)
        culture.plasticity_enabled = True
    counts = original.advance(2000), loaded.advance(2000)
    assert counts[0].sum() > 0 and np.array_equal(*counts)
    assert np.array_equal(original.synaptic_weights(), loaded.synaptic_weights())
    assert original.dopamine == loaded.dopamine


def test_a_culture_whose_neurons_overflowed_is_saved_and_goes_on_as_it_would(tmp_path: Path) -> None:
    """A neuron driven far past its peak overflows the kernel's quadratic term and stays NaN from then on, in
    every run. An over-excited culture under feedback bursts has such neurons within two seconds; it must save
    and load (a design's culture carries over between blocks) and go on as the unsaved one does. A NaN weight is
    still refused: the kernel adds weights into the input ring."""
    from spikeloop.bridge.wire.channels import BAD_NEWS_ELECTRODES, ENCODING_ELECTRODES, GOOD_NEWS_ELECTRODES

    config = SimulatedCultureConfig(n_neurons=400, plasticity="none", excitatory_weight_mv=6.0, maturation_ms=500.0)
    culture = SimulatedCulture(config, seed=3)
    rng = np.random.default_rng(0)
    for tick in range(20):
        for electrode in ENCODING_ELECTRODES:
            if rng.uniform() < 0.5:
                culture.stimulate(
                    electrode, float(rng.uniform(1, 3)), int(rng.integers(1, 6)), float(rng.uniform(5, 40))
                )
        for every, electrodes in ((7, GOOD_NEWS_ELECTRODES), (11, BAD_NEWS_ELECTRODES)):
            for electrode in electrodes if tick % every == 0 else ():
                culture.stimulate(electrode, 2.0, 5, 100.0)  # feedback bursts
        culture.advance(100)
    overflowed = ~np.isfinite(culture.v)
    assert overflowed.any(), "this culture no longer overflows: the case needs another drive"
    save_culture(culture, tmp_path / "dish.npz")
    loaded = load_culture(tmp_path / "dish.npz")
    assert np.array_equal(loaded.v, culture.v, equal_nan=True) and np.array_equal(loaded.u, culture.u, equal_nan=True)
    for each in (culture, loaded):
        each.stimulate(10, 1.5, 30, 100.0)
    assert np.array_equal(culture.advance(1000), loaded.advance(1000))
    weights = loaded.weight.copy()
    weights[0] = np.nan
    with pytest.raises(ValueError, match="array weight holds a value that is not finite"):
        load_culture(_resaved(tmp_path / "dish.npz", tmp_path / "nan-weight.npz", weight=weights))


def test_a_piece_of_state_the_saver_does_not_know_is_refused(tmp_path: Path) -> None:
    culture = device_culture(SMALL, seed=0)
    culture.new_state = np.zeros(3)  # type: ignore[attr-defined]  # a later change that forgot culture_state
    with pytest.raises(TypeError, match="does not save SimulatedCulture.new_state"):
        save_culture(culture, tmp_path / "dish.npz")
    assert not list(tmp_path.iterdir())


def _resaved(source: Path, target: Path, **changes: object) -> Path:
    with np.load(source, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    header = json.loads(str(arrays["header"]))
    for key, value in changes.items():
        if key in header:
            header[key] = value
        elif value is None:
            del arrays[key]
        else:
            arrays[key] = value  # type: ignore[assignment]
    arrays["header"] = np.array(json.dumps(header))
    with target.open("wb") as f:
        np.savez(f, **arrays)
    return target


def test_a_damaged_or_foreign_file_is_refused_naming_it_and_the_problem(tmp_path: Path) -> None:
    culture = device_culture(SMALL, seed=0)
    good = tmp_path / "good.npz"
    save_culture(culture, good)
    bad_target = culture.out_target.copy()
    bad_target[0] = SMALL.n_neurons  # one past the last neuron: the kernel would write outside the input ring
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:5000])
    text = tmp_path / "notes.npz"
    text.write_text("not a culture")
    cases = {
        tmp_path / "missing.npz": "no such file",
        text: "not a culture state file",
        truncated: "not a culture state file",
        _resaved(good, tmp_path / "v99.npz", version=99): "format version 99, this spikeloop reads version 1",
        _resaved(good, tmp_path / "other.npz", format="other"): f"not {FORMAT!r}",
        _resaved(good, tmp_path / "step.npz", step=-1): "its header is damaged",
        _resaved(good, tmp_path / "index.npz", out_target=bad_target): "array out_target holds an index outside",
        _resaved(
            good, tmp_path / "short.npz", plastic=culture.plastic[:-1]
        ): "bool (8999,), a culture's is bool (9000,)",
        _resaved(good, tmp_path / "f32.npz", v=culture.v.astype(np.float32)): "array v is float32 (150,), a culture's",
        _resaved(good, tmp_path / "gone.npz", _rng_state=None): "arrays missing ['_rng_state']",
        _resaved(good, tmp_path / "knob.npz", config={"n_neurons": -1}): "its culture knobs are refused: n_neurons",
    }
    for path, problem in cases.items():
        with pytest.raises(ValueError) as info:
            load_culture(path)
        assert str(info.value).startswith(f"culture state {path}: "), info.value
        assert problem in str(info.value), info.value
    with zipfile.ZipFile(good) as z:
        assert all(name.endswith(".npy") for name in z.namelist())  # plain arrays only


def test_a_saved_culture_refuses_a_culture_seed_or_knob_that_says_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "dish.npz"
    save_culture(device_culture(SMALL, seed=0, culture_seed=5, fixed={"n_neurons", "maturation_ms"}), path)
    again = device_culture(SMALL, seed=0, culture_seed=5, fixed={"n_neurons", "maturation_ms"}, state_path=path)
    assert again.culture_seed == 5 and again.config.n_neurons == 150
    with pytest.raises(ValueError, match="culture seed 6 \\(saved: 5\\)"):
        device_culture(SMALL, seed=0, culture_seed=6, state_path=path)
    other = SimulatedCultureConfig(n_neurons=151, maturation_ms=1000.0)
    with pytest.raises(ValueError, match="n_neurons=151 \\(saved: 150\\)"):
        device_culture(other, seed=0, fixed={"n_neurons"}, state_path=path)


# --- (c) the device program -----------------------------------------------------------------------------------------


def _program(client: Client, state: Path, stimulations: int) -> dict:
    """A sim device program on `state`, given `stimulations` stimulations, stopped with SIGTERM."""
    proc = start_device(client, "--backend", "sim", "--culture-seed", "5", "--culture-state", str(state),
                        "--collect-window-ms", "100", *SMALL_FLAGS)  # fmt: skip
    try:
        for k in range(stimulations):
            client.stim(1000 + k, (20.0,) * 8, (1.5,) * 8)
    finally:
        summary = stop_device(proc)
    assert summary["exit_reason"] == "SIGTERM"
    return summary


def test_a_device_program_saves_its_culture_and_the_next_one_continues_it(tmp_path: Path) -> None:
    client = Client()
    state = tmp_path / "dish.npz"
    try:
        _program(client, state, stimulations=6)
        first = load_culture(state)
        _program(client, state, stimulations=2)  # fewer than before: a fresh culture would end earlier
        second = load_culture(state)
    finally:
        client.sock.close()
    assert first.culture_seed == second.culture_seed == 5
    assert first.config == second.config and first.config.n_neurons == 150
    assert second.step > first.step >= 6 * 100, "culture time went on from where the first program stopped"
    assert np.array_equal(first.out_target, second.out_target), "the same wiring: the same dish"
    assert not np.array_equal(first.weight, second.weight), "and its weights went on changing (STDP)"


def _refused(*flags: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "device", "--as-fast-as-possible", *flags],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run.stderr


def test_the_device_program_refuses_a_bad_culture_state_or_a_conflict_with_a_clear_message(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    assert f"spikeloop device: culture state {junk}: not a culture state file" in _refused(
        "--backend", "sim", "--culture-state", str(junk)
    )
    saved = tmp_path / "dish.npz"
    save_culture(device_culture(SMALL, seed=0, culture_seed=5), saved)
    err = _refused("--backend", "sim", "--culture-state", str(saved), "--culture-seed", "6")
    assert "culture seed 6 (saved: 5)" in err and "name a new culture state file" in err
    err = _refused("--backend", "zero", "--culture-state", str(saved))
    assert "--culture-state is for the sim backend's simulated culture; backend 'zero'" in err
    assert "use --backend sim" in err
    assert "drop --seed" in _refused("--backend", "sim", "--culture-seed", "1", "--seed", "2")
    missing_dir = tmp_path / "no" / "dish.npz"
    assert "its directory does not exist" in _refused("--backend", "sim", "--culture-state", str(missing_dir))
