"""`spikeloop analyze` on synthetic sweeps, the learning benchmark's file, TensorBoard's HPARAMS tab, `check`'s plan.

The synthetic run directories are written as a run writes them (tests/support/sweep_runs.py):
resolved experiments with seed k applied by the runner, episodes.jsonl lines, and for the
HPARAMS test the run's own RunLog. No Ray: the sweep through `spikeloop tune` is
tests/test_sweep_seeds.py.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from spikeloop.experiments.analysis import plan, power, power_table, sweep
from spikeloop.experiments.run_log import DEVICE_LOST, FINISHED
from spikeloop.experiments.schema import load_experiment
from tests.support.hparams_reader import hparams_tab
from tests.support.spikeloop_cli import REPO, run_spikeloop
from tests.support.sweep_runs import write_sweep

END = "env.reward_settings.end_health_per_hp"
LOST = "env.reward_settings.health_lost_per_hp"
GAIN = "feedback.surprise.frequency_gain"
PLANTED = 30.0


def _episodes(point: dict, seed: int) -> list[tuple[float, bool]]:
    """A seed effect far larger than the planted one (pairing must see through it), plus per-episode noise.

    END -4 adds PLANTED to every episode; LOST changes nothing (no health is lost in `basic`); the kill
    rate is the same everywhere. With the same noise draws per seed, a configuration that plants nothing
    has exactly its baseline's episodes.
    """
    rng = np.random.default_rng(seed)
    seed_effect = rng.normal(0, 60)
    planted = PLANTED if point.get(END) == -4.0 else 0.0
    return [(-480 + seed_effect + planted + rng.normal(0, 20), bool(rng.random() < 0.7)) for _ in range(130)]


@pytest.fixture(scope="module")
def factorial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 x 2 grid (planted x no-op), 7 paired seeds, one key drawn at random per trial."""
    space = {END: {"grid": [-5.0, -4.0]}, LOST: {"grid": [-5.0, -1.0]}, GAIN: {"uniform": [0.3, 0.9]}}
    return write_sweep(tmp_path_factory.mktemp("factorial") / "run", space, 7, _episodes, drawn={GAIN: 0.5})


def _row(rows: list[dict], label: str) -> dict:
    return next(r for r in rows if r.get("configuration", r.get("label")) == label)


def test_configurations_seeds_and_the_final_window(factorial: Path) -> None:
    data = sweep.load(factorial)
    assert data.kind == "tune" and list(data.factors) == [END, LOST] and data.drawn_keys == [GAIN]
    assert data.factors[END] == [-5.0, -4.0] and data.default_baseline == (-5.0, -5.0)
    assert len(data.configurations) == 4 and len(data.units) == 28
    assert sorted({u.seed for u in data.units}) == list(range(7))  # seed k = seed + k, in every configuration
    unit = data.units[0]
    assert unit.final("final_return") == pytest.approx(np.mean(unit.returns[-sweep.FINAL_EPISODES :]))
    result = sweep.analyze(data)
    base = result["configurations"][0]
    assert base["label"] == "end_health_per_hp=-5.0, health_lost_per_hp=-5.0" == result["baseline"]
    assert set(base["final_return"]["per_seed"]) == {str(s) for s in range(7)}
    lo, hi = base["final_return"]["ci95"]
    assert lo < base["final_return"]["mean"] < hi
    assert base["drawn"] == {GAIN: [0.5] * 7}


def test_planted_effect_found_and_no_op_not_declared(factorial: Path) -> None:
    result = sweep.analyze(sweep.load(factorial))
    rows = result["comparisons"]["final_return"]
    assert len(rows) == 3 and all(r["design"] == "paired" and r["family_size"] == 3 for r in rows)
    planted = _row(rows, "end_health_per_hp=-4.0, health_lost_per_hp=-5.0")
    assert planted["mean_difference"] == pytest.approx(PLANTED) and planted["higher_lower_tied"] == [7, 0, 0]
    assert planted["p"] == pytest.approx(2 / 2**7) and planted["p_holm"] == pytest.approx(3 * 2 / 2**7)
    assert planted["significant"] and "higher than the baseline" in planted["verdict"]
    same = _row(rows, "end_health_per_hp=-5.0, health_lost_per_hp=-1.0")
    assert same["higher_lower_tied"] == [0, 0, 7] and same["p"] == 1.0 and not same["significant"]
    assert "no evidence of a difference" in same["verdict"]
    # The seed effect (SD 60) swamps the planted 30 unpaired; pairing takes it out completely.
    assert planted["pairing"]["sd_paired"] == 0.0 and planted["pairing"]["sd_unpaired"] > 2 * PLANTED
    assert abs(planted["cliffs_delta"]) < 1  # the groups overlap: only the pairing shows the effect
    kills = result["comparisons"]["final_kill_rate"]
    assert all(r["p"] == 1.0 and not r["significant"] for r in kills)


def test_main_effects_of_a_factorial_grid(factorial: Path) -> None:
    effects = sweep.analyze(sweep.load(factorial))["main_effects"]["final_return"]
    assert [(e["factor"], e["level"], e["reference"]) for e in effects] == [(END, -4.0, -5.0), (LOST, -1.0, -5.0)]
    end, lost = effects
    assert end["configurations_averaged"] == [2, 2] and end["family_size"] == 2
    assert end["mean_difference"] == pytest.approx(PLANTED) and end["significant"]
    assert lost["mean_difference"] == pytest.approx(0.0) and not lost["significant"]


def test_few_seeds_claim_nothing(tmp_path: Path) -> None:
    run = write_sweep(tmp_path / "run", {END: {"grid": [-5.0, -4.0]}}, 3, _episodes)
    result = sweep.analyze(sweep.load(run))
    (row,) = result["comparisons"]["final_return"]
    assert row["higher_lower_tied"] == [3, 0, 0] and row["p"] == pytest.approx(0.25) == row["smallest_p"]
    assert not row["significant"] and "cannot tell" in row["verdict"] and "add seeds" in row["verdict"]
    assert result["power"]["final_return"]["min_seeds_paired"] == 6


def test_unpaired_when_the_seeds_differ(tmp_path: Path) -> None:
    run = write_sweep(tmp_path / "run", {END: {"grid": [-5.0, -4.0]}}, 5, _episodes)
    for trial in run.glob("trial_*"):  # the planted configuration's seeds become 100..104
        text = (trial / "experiment.yaml").read_text()
        if "end_health_per_hp: -4.0" in text:
            (trial / "experiment.yaml").write_text(text.replace("\nseed: ", "\nseed: 10", 1))
    (row,) = sweep.analyze(sweep.load(run))["comparisons"]["final_return"]
    assert row["design"] == "unpaired" and row["test"] == "exact Mann-Whitney" and "pairing" not in row
    assert row["seeds"] == [5, 5] and row["smallest_p"] == pytest.approx(2 / 252)


def _report(trial: Path, rows: list[dict]) -> None:
    """result.json as Tune writes a trial's reports: one JSON line per iteration."""
    (trial / "result.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_trials_that_did_not_reach_their_stop_are_left_out_and_named(tmp_path: Path) -> None:
    """A sweep still running (or stopped, or ended by a lost device): its episodes so far are no final return."""
    run = write_sweep(tmp_path / "run", {END: {"grid": [-5.0, -4.0]}}, 3, _episodes)
    trials = sorted(run.glob("trial_*"))
    for trial in trials:
        _report(trial, [{"training_iteration": 1, FINISHED: False}, {"training_iteration": 2, FINISHED: True}])
    _report(trials[1], [{"training_iteration": 1, FINISHED: False}])  # running, or its driver was killed
    _report(trials[4], [{"training_iteration": 1, FINISHED: True, DEVICE_LOST: "device 'sim' went silent"}])
    data = sweep.load(run)
    assert data.left_out == {
        trials[1].name: "still running or stopped (last report at iteration 1)",
        trials[4].name: "ended early, device_lost: device 'sim' went silent",
    }
    assert sorted(str(u.source) for u in data.units) == sorted(str(t) for i, t in enumerate(trials) if i not in (1, 4))
    result = sweep.analyze(data)
    assert [len(c["final_return"]["per_seed"]) for c in result["configurations"]] == [2, 2]
    (row,) = result["comparisons"]["final_return"]  # seed 1 left out on both sides: seeds 0 and 2 stay paired
    assert row["design"] == "paired" and row["seeds"] == [2, 2] and row["seeds_set_aside"] == []
    assert result["left_out"] == data.left_out
    assert len(sweep.load(run, include_unfinished=True).units) == len(trials) == 6

    proc = run_spikeloop(["analyze", str(run), "--output-dir", str(tmp_path / "out")], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("Left out: 2 trial(s) that have not reached their stop condition"), proc.stdout
    assert "Left out: 2 trial(s)" in (tmp_path / "out" / "analysis.md").read_text()
    for trial in trials:
        _report(trial, [{"training_iteration": 1, FINISHED: False}])
    none = run_spikeloop(["analyze", str(run)], timeout=120)
    assert none.returncode == 1 and "none of its 6 trial(s) has reached its stop condition" in none.stderr
    assert "--include-unfinished" in none.stderr and "Traceback" not in none.stderr


def test_seeds_only_one_side_has_finished_are_set_aside_and_the_rest_stay_paired(tmp_path: Path) -> None:
    """Mid-sweep: the baseline has finished seed 4, the planted configuration not yet."""
    run = write_sweep(tmp_path / "run", {END: {"grid": [-5.0, -4.0]}}, 5, _episodes)
    for trial in run.glob("trial_*"):
        text = (trial / "experiment.yaml").read_text()
        finished = not ("end_health_per_hp: -4.0" in text and "\nseed: 4\n" in text)
        _report(trial, [{"training_iteration": 1, FINISHED: finished}])
    (row,) = sweep.analyze(sweep.load(run))["comparisons"]["final_return"]
    assert row["design"] == "paired" and row["seeds"] == [4, 4] and row["seeds_set_aside"] == [4]
    assert row["mean_difference"] == pytest.approx(PLANTED) and "seeds 4 set aside" in row["verdict"]


def test_baseline_by_key_and_value(factorial: Path) -> None:
    data = sweep.load(factorial)
    assert sweep.parse_baseline(data, ["end_health_per_hp=-4"]) == (-4.0, -5.0)
    assert sweep.parse_baseline(data, [f"{LOST}=-1.0", "end_health_per_hp=-4.0"]) == (-4.0, -1.0)
    with pytest.raises(ValueError, match="levels are -5.0, -4.0"):
        sweep.parse_baseline(data, ["end_health_per_hp=3"])
    with pytest.raises(ValueError, match="not one swept grid key"):
        sweep.parse_baseline(data, ["frame_skip=4"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sweep.parse_baseline(data, ["end_health_per_hp"])
    result = sweep.analyze(data, sweep.parse_baseline(data, ["end_health_per_hp=-4"]))
    row = _row(result["comparisons"]["final_return"], "end_health_per_hp=-5.0, health_lost_per_hp=-5.0")
    assert row["mean_difference"] == pytest.approx(-PLANTED) and "lower than the baseline" in row["verdict"]


def test_learning_benchmark_file_is_paired_by_seed() -> None:
    data = sweep.load(REPO / "docs" / "benchmarks" / "learning.json")
    assert data.kind == "bench learning" and data.default_baseline == ("zero",)
    result = sweep.analyze(data)
    sim = _row(result["comparisons"]["final_return"], "condition=sim")
    recorded = json.loads((REPO / "docs" / "benchmarks" / "learning.json").read_text())["summary"]
    assert sim["design"] == "paired" and sim["seeds"] == [5, 5]
    assert sim["mean_difference"] == pytest.approx(
        recorded["sim"]["final_return_mean"]["pooled"] - recorded["zero"]["final_return_mean"]["pooled"], abs=0.1
    )
    # Every sim seed beat its zero seed, but 5 paired seeds cannot reach 0.05 / 4 after Holm: said, not hidden.
    assert sim["higher_lower_tied"] == [5, 0, 0] and not sim["significant"] and "cannot tell" in sim["verdict"]


def test_report_files_and_the_command(factorial: Path, tmp_path: Path) -> None:
    proc = run_spikeloop(["analyze", str(factorial), "--output-dir", str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| configuration | seeds |" in proc.stdout and "higher than the baseline" in proc.stdout
    written = json.loads((tmp_path / "analysis.json").read_text())
    assert set(written) >= {"configurations", "comparisons", "main_effects", "pairing", "power", "baseline"}
    curve = written["configurations"][0]["curves"]["final_return"]
    assert len(curve["env_steps"]) == len(curve["mean"]) == len(curve["low"]) and max(curve["seeds"]) == 7
    text = (tmp_path / "analysis.md").read_text()
    assert (
        "## Final return: each configuration against the baseline" in text and "## Final return: main effects" in text
    )
    assert "SD of the per-seed differences" in text
    assert (tmp_path / "analysis.png").read_bytes().startswith(b"\x89PNG")
    bad = run_spikeloop(["analyze", str(factorial), "--baseline", "nope=1"], timeout=120)
    assert bad.returncode == 1 and "not one swept grid key" in bad.stderr and "Traceback" not in bad.stderr
    missing = run_spikeloop(["analyze", str(tmp_path / "absent")], timeout=120)
    assert missing.returncode == 1 and "no such run directory" in missing.stderr
    trial = run_spikeloop(["analyze", str(next(factorial.glob("trial_*")))], timeout=120)
    assert trial.returncode == 1 and "is a trial directory" in trial.stderr


def test_hparams_tab_shows_the_sweep(tmp_path: Path) -> None:
    """Each trial's swept values, seed and final figures, read back through TensorBoard's hparams plugin."""
    space = {END: {"grid": [-5.0, -4.0]}, "feedback.enabled": {"grid": [True, False]}, GAIN: {"uniform": [0.3, 0.9]}}
    run = write_sweep(tmp_path / "run", space, 1, _episodes, drawn={GAIN: 0.7}, tensorboard=True)
    tab = hparams_tab(run)
    assert set(tab["hparams"]) == {END, "feedback.enabled", GAIN, "seed"}
    assert list(tab["hparams"][END].domain_discrete.values) and tab["hparams"][GAIN].domain_interval.max_value == 0.9
    assert {"final/return_mean", "final/kill_rate", "episode/return_mean"} <= set(tab["metrics"])
    assert len(tab["sessions"]) == 4
    data = sweep.load(run)
    for unit in data.units:
        session = tab["sessions"][Path(unit.source).name]
        assert session["hparams"]["seed"] == unit.seed and session["hparams"][GAIN] == pytest.approx(0.7)
        assert (
            session["hparams"][END] == unit.configuration[0]
            and session["hparams"]["feedback.enabled"] is (unit.configuration[1])
        )
        assert session["metrics"]["final/return_mean"] == pytest.approx(unit.final("final_return"), rel=1e-6)
        assert session["metrics"]["final/kill_rate"] == pytest.approx(unit.final("final_kill_rate"), rel=1e-6)


def test_check_plans_the_sweep() -> None:
    """Trials, wall time from the benchmark's measured rate, and the power the seed count gives."""
    experiment = load_experiment(REPO / "experiments" / "sweep_feedback.yaml", ["tune.seeds=10"])
    p = plan.plan(experiment, cpus=2)
    # 6 of the 16 grid points repeat another (the scaling does nothing with episode feedback or surprise off)
    assert (p.configurations, p.seeds, p.trials) == (16, 10, 100)
    data = json.loads((REPO / "docs" / "benchmarks" / "learning.json").read_text())
    rate = float(np.median([r["env_steps_total"] / r["wall_s"] for r in data["runs"]["sim"].values()]))
    # the stop at 20,000 is reached at whole batches of 1,024; its trials sample in their own process (no env
    # runners: one CPU each), so two run side by side on 2 cores
    assert experiment.resources.num_env_runners == 0 and plan.cpus_per_trial(experiment) == 1
    assert p.seconds == pytest.approx(100 * 20_480 / rate / 2)
    one_runner = load_experiment(REPO / "experiments" / "sweep_feedback.yaml", ["resources.num_env_runners=1"])
    assert plan.plan(one_runner, cpus=2).seconds == pytest.approx(2 * plan.plan(one_runner, cpus=4).seconds)
    assert "sim` trains at" in p.basis and "learning.json" in p.basis
    lines = plan.lines(experiment, cpus=2)
    assert lines[0].startswith("[info] sweep: 16 configuration(s)") and "= 100 trial(s)" in lines[0]
    assert "6 of them the same experiment as another and not run" in lines[0] and ": 10 x 10 seed(s)" in lines[0]
    spread = power_table.benchmark_spread(power_table.LEARNING_JSON, "sim")["final_return"]
    # Against the baseline: the 10 distinct experiments give 9 tests (a repeat's is its twin's); then the 4 main
    # effects, a Holm family of their own.
    text = "\n".join(lines)
    assert "9 comparison(s) against the baseline: alpha 0.05/9" in text and "4 main effect(s) of 4 factors" in text
    for family in (9, 4):
        detectable = power.detectable_difference(10, spread["sd_paired"], paired=True, alpha=0.05 / family)
        assert f"final return: {detectable:.1f} at the measured pairing" in text
    few = plan.lines(load_experiment(REPO / "experiments" / "sweep_feedback.yaml", ["tune.seeds=5"]), cpus=2)
    assert [line.split("detectable; ")[-1] for line in few if "no difference of any size" in line] == [
        "9 seeds can reach it",  # 2/2^9 < 0.05/9 <= 2/2^8
        "8 seeds can reach it",  # 2/2^8 < 0.05/4 <= 2/2^7
    ]
    assert plan.lines(load_experiment(REPO / "experiments" / "quickstart.yaml"), cpus=2) == []
    assert math.isfinite(p.seconds)


def test_a_sweep_exported_to_one_file_analyses_as_its_run(factorial: Path, tmp_path: Path) -> None:
    """`--export` keeps the trials, experiment and provenance; the file reads back to the same analysis."""
    from spikeloop.experiments.runner import record_provenance

    run = tmp_path / "run"
    shutil.copytree(factorial, run)  # a copy: the module's fixture stays as it was
    record_provenance(run, resumed=False)
    record_provenance(run, resumed=True)
    record = json.loads((run / "provenance.json").read_text())
    assert record["started"]["git"]["commit"] == record["resumed"][0]["git"]["commit"]
    assert len(record["resumed"]) == 1 and record["started"]["machine"]["cpus"] >= 1

    out, export = tmp_path / "from-run", tmp_path / "sweep.json"
    proc = run_spikeloop(["analyze", str(run), "--output-dir", str(out), "--export", str(export)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = json.loads(export.read_text())
    assert exported["kind"] == sweep.EXPORT_KIND and exported["provenance"] == record
    assert exported["experiment"]["tune"]["search_space"][END] == {"grid": [-5.0, -4.0]}
    assert len(exported["trials"]) == 4 * 7 and {t["seed"] for t in exported["trials"]} == set(range(7))

    again = tmp_path / "from-file"
    proc = run_spikeloop(["analyze", str(export), "--output-dir", str(again)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (json.loads(f.read_text()) for f in (out / "analysis.json", again / "sweep.analysis.json"))
    for key in ("comparisons", "main_effects", "pairing", "baseline", "factors"):
        assert a[key] == b[key], key
    for from_run, from_file in zip(a["configurations"], b["configurations"], strict=True):
        # The same trials, named by their directory in the run and by the file and the directory in the export.
        assert [Path(t).name for t in from_run.pop("trials")] == [t.split(": ")[1] for t in from_file.pop("trials")]
        assert from_run == from_file

    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({**exported, "trials": [{"seed": 0}]}))
    proc = run_spikeloop(["analyze", str(damaged)], timeout=120)
    assert proc.returncode == 1 and "damaged sweep export" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_spikeloop(["analyze", str(export), "--export", str(tmp_path / "x.json")], timeout=120)
    assert proc.returncode == 2 and "--export reads a run directory" in proc.stderr


def test_labels_name_each_swept_key_by_its_shortest_unambiguous_tail() -> None:
    """`use_reward_feedback`, not `feedback.use_reward_feedback`; but `surprise.enabled`: `enabled` alone says nothing."""
    keys = ["feedback.use_reward_feedback", "feedback.surprise.enabled", "env.reward_settings.end_health_per_hp"]
    assert sweep.short_names(keys) == {
        "feedback.use_reward_feedback": "use_reward_feedback",
        "feedback.surprise.enabled": "surprise.enabled",
        "env.reward_settings.end_health_per_hp": "end_health_per_hp",
    }
    # Two keys with one tail keep as much of each as tells them apart.
    assert sweep.short_names(["a.x.gain", "b.x.gain"]) == {"a.x.gain": "a.x.gain", "b.x.gain": "b.x.gain"}
    assert sweep.short_names(["view.enabled", "meter.enabled"]) == {
        "view.enabled": "view.enabled",
        "meter.enabled": "meter.enabled",
    }


def test_update_docs_writes_the_tables_between_the_sources_markers(factorial: Path, tmp_path: Path) -> None:
    """`analyze SOURCE --update-docs DOC`: the configuration and main-effect tables, from the analysis itself, between
    the markers named after the source; idempotent; a document without them gets the lines to add, not a traceback."""
    from spikeloop.experiments.analysis import doc_blocks, report

    name = report.docs_block_name(factorial)
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\n<!-- {name}: begin (written by hand) -->\nold\n<!-- {name}: end -->\n\nmore\n")
    out = tmp_path / "out"
    args = ["analyze", str(factorial), "--output-dir", str(out), "--update-docs", str(doc)]
    proc = run_spikeloop(args, timeout=120)
    assert proc.returncode == 0 and f"{doc}: updated" in proc.stdout, proc.stderr[-3000:]
    block = doc_blocks.read(doc, name)
    assert block == report.docs_tables(json.loads((out / "analysis.json").read_text()))
    names = sweep.short_names([END, LOST])
    assert block.splitlines()[0].startswith(f"| `{names[END]}` | `{names[LOST]}` | seeds |")
    assert "| main effect |" in block and "baseline" in block
    assert doc.read_text().startswith("# Results\n\n<!-- ") and doc.read_text().endswith("\n\nmore\n")
    again = run_spikeloop(args, timeout=120)
    assert again.returncode == 0 and f"{doc}: already up to date" in again.stdout

    bare = tmp_path / "bare.md"
    bare.write_text("# Results\n")
    missing = run_spikeloop([*args[:-1], str(bare)], timeout=120)
    assert missing.returncode == 2 and "no markers for this table; add the lines" in missing.stderr
    assert f"<!-- {name}: begin (spikeloop analyze" in missing.stderr and "Traceback" not in missing.stderr


def test_a_trial_stopped_before_its_first_report_is_left_out(tmp_path: Path) -> None:
    """Ctrl-C during a trial's first iteration: its first episodes are logged, Tune's result.json is still empty
    (seen in the feedback sweep: 6 episodes of a trial that had just started read as its final return)."""
    run = write_sweep(tmp_path / "run", {END: {"grid": [-5.0, -4.0]}}, 3, _episodes)
    trials = sorted(run.glob("trial_*"))
    for trial in trials:
        _report(trial, [{"training_iteration": 1, FINISHED: True}])
    (trials[2] / "result.json").write_text("")
    data = sweep.load(run)
    assert data.left_out == {trials[2].name: "stopped before its first report"}
    assert len(data.units) == len(trials) - 1
