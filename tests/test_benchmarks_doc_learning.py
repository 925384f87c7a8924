"""docs/benchmarks.md's learning tables are their result files, as measured.

docs/benchmarks/learning.json (`basic`), learning-fresh.json (`basic` on fresh seeds),
learning-defend_the_center.json and ablation.json (no 90% mark column there: it has no `direct` to mark
against): each condition's row is rebuilt from the JSON with the rounding the doc uses and must appear in the doc verbatim, so an edited figure or a
re-run JSON without its doc fails here.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = {
    "learning.json": True,
    "learning-fresh.json": True,
    "learning-defend_the_center.json": True,
    "learning-defend_the_center-100k.json": True,
    "learning-drift.json": True,
    "learning-drift-anneal.json": True,
    "learning-drift-no-end-health.json": True,
    "learning-drift-no-end-health-anneal.json": True,
    "learning-jobs2.json": True,
    "ablation.json": False,
}
"""Result file -> whether its table has the 90% mark column."""


def expected_rows(result: dict, with_mark: bool = True) -> list[str]:
    """One table row per condition: final return and kill rate (mean, per seed), the 90% mark, p against zero."""
    rows = []
    for condition in result["settings"]["conditions"]:
        s = result["summary"][condition]
        ret, kill, mark = s["final_return_mean"], s["final_kill_rate"], s["steps_to_90pct_direct"]
        per_return = ", ".join(f"{v:.0f}" for v in ret["per_seed"].values())
        per_kill = ", ".join(f"{v:.2f}" for v in kill["per_seed"].values())
        when = "never" if mark["median"] is None else f"{mark['median']:,.0f}"
        marked = f" {when} ({mark['reached']}/{s['seeds']}) |" if with_mark else ""
        p = s.get("p_value_vs_zero")
        versus = "" if p is None else f"{p:.3g} ({s['cliffs_delta_vs_zero']:+.2f})"
        rows.append(
            f"| `{condition}` | {ret['pooled']:.1f} ({per_return}) | {kill['pooled']:.2f} ({per_kill}) |"
            f"{marked} {versus} |"
        )
    return rows


@pytest.mark.parametrize("name", RESULTS)
def test_the_learning_table_is_the_result_file(name: str) -> None:
    result = json.loads((REPO / "docs" / "benchmarks" / name).read_text())
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result, RESULTS[name]) if row not in doc]
    assert not missing, f"docs/benchmarks.md differs from {name}; rows expected:\n" + "\n".join(missing)


def test_the_learning_reading_quotes_the_targets_from_the_result_file() -> None:
    """The figures the `basic` reading gives for the speed target: the 90% mark and transparent's ratio to direct."""
    result = json.loads((REPO / "docs" / "benchmarks" / "learning.json").read_text())
    flat = " ".join(DOC.read_text().split())
    speed = result["targets"]["b_transparent_speed"]
    assert f"mark ({result['mark_90pct_return']:.1f})" in flat
    assert (
        f"at a median of {speed['transparent_median_steps']:,.0f} env steps against `direct`'s "
        f"{speed['direct_median_steps']:,.0f}: {speed['ratio']:.2f}x"
    ) in flat
    solve = result["targets"]["a_direct_transparent_solve"]["conditions"]["transparent"]["per_seed"].values()
    returns = sorted(seed["final_return"] for seed in solve)
    assert f"is still missed: {returns[-1]:.0f} to {returns[0]:.0f}" in flat


def test_the_fresh_seed_reading_quotes_the_targets_from_the_result_file() -> None:
    """The fresh-seed run's three target lines: the figures and met / not met, from the file's `targets`."""
    result = json.loads((REPO / "docs" / "benchmarks" / "learning-fresh.json").read_text())
    assert result["settings"]["first_seed"] == 100 and result["settings"]["seeds"] == 5
    flat = " ".join(DOC.read_text().split())
    targets = result["targets"]
    sim = targets["c_sim_beats_zero"]
    verdict = "met" if sim["met"] else "not met"
    assert f"`sim` beats `zero`: p = {sim['p_value']:.3g}** (one-sided exact Mann-Whitney, {sim['seeds_sim']}" in flat
    assert f"target p < 0.01: {verdict})" in flat
    transparent = targets["a_direct_transparent_solve"]["conditions"]["transparent"]
    returns = sorted(seed["final_return"] for seed in transparent["per_seed"].values())
    reached = sum(r >= -425 for r in returns)
    verdict = "met" if transparent["met"] else "not met"
    assert (
        f"in every seed): {verdict}**, {reached} of {len(returns)} seeds ({returns[-1]:.1f} to {returns[0]:.1f})"
        in flat
    )
    speed = targets["b_transparent_speed"]
    assert (
        f"{speed['transparent_median_steps']:,.0f} env steps against `direct`'s {speed['direct_median_steps']:,.0f}, "
        f"{speed['ratio']:.2f}x"
    ) in flat


def test_the_defend_the_center_diagnosis_table_is_its_result_file() -> None:
    """The 100-episode blocks of the transparent run at 5x the budget, as the diagnosis table shows them."""
    result = json.loads((REPO / "docs" / "benchmarks" / "defend_the_center-transparent-100k-seed0.json").read_text())
    blocks = result["blocks"]
    returns, steps = result["episodes"]["return"], result["episodes"]["env_steps"]
    for block in blocks:  # the blocks are the episodes' means
        first, last = block["episodes"]
        assert block["return_mean"] == round(sum(returns[first - 1 : last]) / (last - first + 1), 1)
        assert block["env_steps_at_end"] == steps[last - 1]
    doc = DOC.read_text()
    assert "| env steps | " + " | ".join(f"{b['env_steps_at_end']:,}" for b in blocks) + " |" in doc
    assert "| return | " + " | ".join(f"{b['return_mean']:.1f}" for b in blocks) + " |" in doc


def test_the_defend_the_center_target_table_is_its_result_file() -> None:
    """The tests against random and the target's verdict, as benchmarks.md quotes them."""
    result = json.loads((REPO / "docs" / "benchmarks" / "learning-defend_the_center-100k.json").read_text())
    target = result["targets"]["d_beat_random"]
    doc = DOC.read_text()
    for condition in ("transparent", "sim"):
        c = target["conditions"][condition]
        row = f"| `{condition}` | {c['p_value']:.3g} | {target['holm'][condition]:.3g} | {c['cliffs_delta']:+.2f} |"
        assert row in doc, row
    direct = result["summary"]["direct"]["vs_random"]
    assert f"| `direct` (the ceiling) | {direct['p_value']:.4f} | | {direct['cliffs_delta']:+.2f} |" in doc
    assert target["met"] is False and "**The target `d_beat_random` is not met:**" in doc
    pooled = {c: s["final_return_mean"]["pooled"] for c, s in result["summary"].items()}
    transparent_above, sim_above = (f"{pooled[c] - pooled['random']:+.1f}" for c in ("transparent", "sim"))
    assert f"({transparent_above} and {sim_above})" in doc  # the reading's mean margins over random


DRIFT = REPO / "docs" / "benchmarks" / "learning-drift.json"


def drift_rows(result: dict) -> list[str]:
    """One row per condition and measure: at the default budget and at the end (mean, per seed), the difference."""
    rows = []
    for condition, d in result["drift"].items():
        per_seed = d["per_seed"]
        for measure, key, spec in (("return", "return", ".1f"), ("kill rate", "kill_rate", ".3f")):
            early = [f[f"{key}_at_default"] for f in per_seed.values()]
            late = [f[f"{key}_at_end"] for f in per_seed.values()]
            diff = d[key]
            low, high = diff["ci95_paired"]
            rows.append(
                f"| `{condition}` | {measure} | {sum(early) / len(early):{spec}} | {sum(late) / len(late):{spec}} | "
                + ", ".join(f"{b - a:+{spec}}" for a, b in zip(early, late, strict=True))
                + f" | {diff['mean_difference']:+{spec}} ({low:+{spec}} .. {high:+{spec}}) | "
                f"{diff['signed_rank_p_worse']:.3g} |"
            )
    return rows


@pytest.mark.parametrize(
    ("name", "verdict_words"),
    [
        ("learning-drift.json", "The target `e_no_drift` is"),
        ("learning-drift-anneal.json", "With the schedule, `e_no_drift` is"),
        ("learning-drift-no-end-health.json", "With the term off, `e_no_drift` is"),
        ("learning-drift-no-end-health-anneal.json", "With the term off and the rate lowered, `e_no_drift` is"),
    ],
)
def test_the_drift_table_is_its_result_file(name: str, verdict_words: str) -> None:
    """The 5x-budget runs read against themselves, and the target's verdict, as benchmarks.md quotes them."""
    result = json.loads((REPO / "docs" / "benchmarks" / name).read_text())
    doc = DOC.read_text()
    missing = [row for row in drift_rows(result) if row not in doc]
    assert not missing, f"docs/benchmarks.md differs from {name}; rows expected:\n" + "\n".join(missing)
    target = result["targets"]["e_no_drift"]
    flat = " ".join(doc.split())
    verdict = {True: "met", False: "not met"}[target["met"]]
    sentence = flat[flat.index(f"**{verdict_words} {verdict}") :].split("**", 3)[2]
    for condition, c in target["conditions"].items():
        assert f"`{condition}` {'met' if c['met'] else 'not met'}" in sentence, condition


def _first_parting(a: dict, b: dict) -> int:
    """The first episode (1-based) where two runs differ."""
    pairs = zip(zip(a["env_steps"], a["return"], a["kill"]), zip(b["env_steps"], b["return"], b["kill"]))
    return next(i for i, (x, y) in enumerate(pairs) if x != y) + 1


def test_where_two_machines_part_is_the_result_files() -> None:
    """The same code and seed on two machines: the first episode (1-based) where `direct` seed 100's runs differ."""
    fresh = json.loads((REPO / "docs" / "benchmarks" / "learning-fresh.json").read_text())["runs"]["direct"]["100"]
    long = json.loads(DRIFT.read_text())["runs"]["direct"]["100"]
    first = _first_parting(fresh, long)
    assert fresh["env_steps"][first - 2] < 20_480  # inside the default budget, where both runs are the same run
    for doc in (REPO / "README.md", REPO / "docs" / "architecture.md"):
        assert f"`learning-drift.json` at episode {first})" in " ".join(doc.read_text().split()), doc


def test_the_drift_check_run_is_the_long_runs_start() -> None:
    """On one machine a 20,000-step run is the first 20,480 env steps of the 100,000-step run, episode for episode."""
    check = json.loads((REPO / "docs" / "benchmarks" / "learning-drift-check-direct-20k.json").read_text())
    short = check["runs"]["direct"]["100"]
    long = json.loads(DRIFT.read_text())["runs"]["direct"]["100"]
    cut = max(short["env_steps"])
    prefix = sum(steps <= cut for steps in long["env_steps"])
    assert {k: long[k][:prefix] for k in ("env_steps", "return", "kill")} == {
        k: short[k] for k in ("env_steps", "return", "kill")
    }
    flat = " ".join(DOC.read_text().split())
    assert f"wrote the same {len(short['return']):,} episodes as the first {cut:,} env steps of the long run" in flat


def test_runs_side_by_side_are_the_long_runs_start() -> None:
    """`--jobs 2` on this machine: each direct/transparent/sim run is its seed's 100,000-step run up to 20,480 steps."""
    side = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2.json").read_text())
    long = json.loads(DRIFT.read_text())["runs"]
    assert "--jobs 2" in side["command"]
    compared = 0
    for condition in ("direct", "transparent", "sim"):
        for seed, run in side["runs"][condition].items():
            prefix = sum(steps <= max(run["env_steps"]) for steps in long[condition][seed]["env_steps"])
            for key in ("env_steps", "return", "kill"):
                assert long[condition][seed][key][:prefix] == run[key], (condition, seed, key)
            compared += 1
    runs_s = sum(run["wall_s"] for by_seed in side["runs"].values() for run in by_seed.values())
    flat = " ".join(DOC.read_text().split())
    assert f"({compared} of {compared} runs; doc test)" in flat
    assert f"Its `wall_s` ({side['wall_s']:,.0f} s," in flat
    assert f"its runs' own wall times ({runs_s:,.0f} s)" in flat
    solve = side["targets"]["a_direct_transparent_solve"]["conditions"]["transparent"]["per_seed"]
    met = sum(seed["met"] for seed in solve.values())
    assert f"is met in {met} of {len(solve)} seeds" in flat
    speed = side["targets"]["b_transparent_speed"]
    assert f"{speed['transparent_median_steps']:,.0f} env steps against `direct`'s" in flat
    assert f"{speed['direct_median_steps']:,.0f} ({speed['ratio']:.2f}x; target" in flat


def test_one_at_a_time_the_runs_are_the_same_and_the_times_are_the_files() -> None:
    """Seed 100's five runs one at a time are the side-by-side runs, episode for episode; the times quoted are theirs."""
    alone = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs1-seed100.json").read_text())
    side = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2.json").read_text())
    assert "--jobs" not in alone["command"]
    for condition, by_seed in alone["runs"].items():
        for key in ("env_steps", "return", "kill"):
            assert by_seed["100"][key] == side["runs"][condition]["100"][key], (condition, key)
    alone_s = [by_seed["100"]["wall_s"] for by_seed in alone["runs"].values()]
    side_s = [side["runs"][condition]["100"]["wall_s"] for condition in alone["runs"]]
    flat = " ".join(DOC.read_text().split())
    assert f"took {alone['wall_s']:.0f} s, its runs {min(alone_s):.0f} s (`direct`) to {max(alone_s):.0f} s," in flat
    assert f"against {min(side_s):.0f} to {max(side_s):.0f} s each side by side ({sum(side_s):.0f} s in all)" in flat
    seeds = side["settings"]["seeds"]
    ratio = seeds * alone["wall_s"] / side["wall_s"]
    assert f"{seeds} x {alone['wall_s']:.0f} s = {seeds * alone['wall_s'] / 60:.0f} minutes" in flat
    assert f"against {side['wall_s'] / 60:.0f} side by side: {ratio:.2f}x" in flat


def _same_runs(later: dict, earlier: dict) -> int:
    """Assert every run of `earlier` is, episode for episode, its twin in `later`; how many runs were compared."""
    compared = 0
    for condition, by_seed in earlier["runs"].items():
        for seed, run in by_seed.items():
            for key in ("env_steps", "return", "kill"):
                assert later["runs"][condition][seed][key] == run[key], (condition, seed, key)
            compared += 1
    assert later["summary"] == earlier["summary"]
    return compared


def test_side_by_side_in_one_session_are_the_same_runs_and_the_times_are_the_files() -> None:
    """`--jobs 2` after its children moved into the benchmark's session: every run as before, the times quoted theirs."""
    groups = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2-groups.json").read_text())
    sessions = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2.json").read_text())
    alone = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs1-seed100.json").read_text())
    assert "--jobs 2" in groups["command"] and groups["settings"]["seeds"] == sessions["settings"]["seeds"]
    compared = _same_runs(groups, sessions)
    flat = " ".join(DOC.read_text().split())
    commit = groups["git"]["commit"][:7]
    assert f"commit {commit}" in flat and not groups["git"]["tracked_files_changed"]
    assert f"({compared} of {compared} runs; doc test)" in flat.split("### Side by side in one session")[1]
    wall, before = groups["wall_s"], sessions["wall_s"]
    assert f"**{wall / 60:.0f} minutes** (`wall_s` {wall:,.0f} s)" in flat
    assert f"against {before / 60:.0f} minutes ({before:,.0f} s) in sessions of their own: {before / wall:.2f}x" in flat
    seeds = groups["settings"]["seeds"]
    one_at_a_time = seeds * alone["wall_s"]
    assert (
        f"{seeds} x {alone['wall_s']:.0f} s one at a time ({one_at_a_time / 60:.0f} minutes): {one_at_a_time / wall:.2f}x"
        in flat
    )
    per_run = {c: sorted(r["wall_s"] for r in by_seed.values()) for c, by_seed in groups["runs"].items()}
    for condition, times in per_run.items():
        assert f"`{condition}` {times[0]:.0f}-{times[-1]:.0f} s" in flat, condition
    help_text = " ".join((REPO / "experiments" / "benchmarks" / "learning.py").read_text().split())
    assert f"{one_at_a_time / 60:.0f} minutes on 2 cores, {wall / 60:.0f} with --jobs 2" in help_text


def best_window_mean(returns: list[float], env_steps: list[int], window: int) -> tuple[float, int]:
    """The best mean return over `window` consecutive episodes (the curriculum's figure), and the env steps at its
    last episode (the first such window where several tie)."""
    means = [sum(returns[i - window + 1 : i + 1]) / window for i in range(window - 1, len(returns))]
    best = max(means)
    return best, env_steps[window - 1 + means.index(best)]


def corridor_pilot_rows(result: dict) -> list[str]:
    """Per condition (one seed): level reached, mean return of the first and last 100 episodes, the best mean of
    the curriculum's window (20 episodes) and where, and the last 100 episodes' kill rate."""
    window = (result["settings"].get("curriculum_env") or {}).get("curriculum", {}).get("window_episodes", 20)
    rows = []
    for condition, by_seed in result["runs"].items():
        for run in by_seed.values():
            ret = run["return"]
            best, at = best_window_mean(ret, run["env_steps"], window)
            level = f" {max(run['level']) + 1} |" if "level" in run else ""
            rows.append(
                f"| `{condition}` |{level} {len(ret)} | {sum(ret[:100]) / 100:.1f} | "
                f"{sum(ret[-100:]) / 100:.1f} | {best:.1f} ({at:,.0f}) | {sum(run['kill'][-100:]) / 100:.2f} |"
            )
    return rows


def test_the_corridor_pilot_table_is_its_result_file() -> None:
    result = json.loads((REPO / "docs" / "benchmarks" / "learning-curriculum-deadly_corridor-pilot.json").read_text())
    doc = DOC.read_text()
    missing = [row for row in corridor_pilot_rows(result) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from the corridor pilot; rows expected:\n" + "\n".join(missing)
    assert result["settings"]["curriculum_env"]["curriculum"]["threshold"] == -300.0
    assert "threshold of -300" in " ".join(doc.split())
    direct_best = corridor_pilot_rows(result)[0].split(" | ")[5].split(" (")[0]
    assert f"its best mean over 20 episodes was {direct_best};" in " ".join((REPO / "README.md").read_text().split())
    level5 = json.loads((REPO / "docs" / "benchmarks" / "learning-deadly_corridor_5-pilot.json").read_text())
    assert level5["settings"]["scenario"] == "deadly_corridor_5"
    missing = [row for row in corridor_pilot_rows(level5) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from the level-5 pilot; rows expected:\n" + "\n".join(missing)


def corridor_level_rows(result: dict, seed_column: bool = False) -> list[str]:
    """Per condition and seed: level reached, env steps to the last level, episodes and final return there."""
    rows = []
    for condition, c in result["curriculum"]["conditions"].items():
        for seed, level in c["level_reached"].items():
            steps, final = c["env_steps_to_last_level"][seed], c["final_return_at_last_level"][seed]
            rows.append(
                f"| `{condition}` |{f' {seed} |' if seed_column else ''} {level} | "
                f"{'-' if steps is None else f'{steps:,}'} | "
                f"{c['episodes_at_last_level'][seed]} | {'-' if final is None else f'{final:.1f}'} |"
            )
    return rows


def test_the_corridor_pilot_at_minus_480_is_its_result_file() -> None:
    """The second pilot's table, its threshold, and that each run is the first pilot's run until it moves on."""
    second = json.loads(
        (REPO / "docs" / "benchmarks" / "learning-curriculum-deadly_corridor-pilot-480.json").read_text()
    )
    first = json.loads((REPO / "docs" / "benchmarks" / "learning-curriculum-deadly_corridor-pilot.json").read_text())
    assert second["settings"]["curriculum_env"]["curriculum"]["threshold"] == -480.0
    doc = DOC.read_text()
    missing = [row for row in corridor_level_rows(second) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from the -480 pilot; rows expected:\n" + "\n".join(missing)
    for condition, by_seed in second["runs"].items():
        run, before = by_seed["100"], first["runs"][condition]["100"]
        on_level_1 = next((i for i, level in enumerate(run["level"]) if level > 0), len(run["level"]))
        assert on_level_1 > 100, condition
        for key in ("env_steps", "return", "kill"):
            assert run[key][:on_level_1] == before[key][:on_level_1], (condition, key)
    shipped = (REPO / "experiments" / "deadly_corridor.yaml").read_text()
    assert "threshold: -480.0" in shipped


def test_the_second_pilots_level_times_are_its_file() -> None:
    second = json.loads(
        (REPO / "docs" / "benchmarks" / "learning-curriculum-deadly_corridor-pilot-480.json").read_text()
    )
    spans = {}
    for condition, by_seed in second["runs"].items():
        run = by_seed["100"]
        starts = {}
        for steps, level in zip(run["env_steps"], run["level"], strict=True):
            starts.setdefault(level, steps)
        if 4 in starts:
            spans[condition] = starts[4] - starts[1]
    flat = " ".join(DOC.read_text().split())
    assert f"levels 2-4 in {spans['transparent']:,} env steps (`transparent`" in flat
    assert f"to {spans['direct']:,} (`direct`)" in flat
    assert f"{second['wall_s'] / 60:.1f} minutes;" in flat


def corridor_summary_rows(result: dict) -> list[str]:
    """Per condition: seeds at the last level, the mean final return there, and each against `random` (levels
    reached, and the return there), p and Cliff's delta."""
    curriculum = result["curriculum"]
    rows = []
    for condition, c in curriculum["conditions"].items():
        finals = [f for f in c["final_return_at_last_level"].values() if f is not None]
        mean = f"{statistics.fmean(finals):.1f}" if finals else "-"
        versus = curriculum["vs_random"].get(condition)
        if versus is None:
            tests = " | |"
        else:
            cells = [
                "-" if versus[key]["p"] is None else f"{versus[key]['p']:.4f} ({versus[key]['cliffs_delta']:+.2f})"
                for key in ("level_reached", "final_return_at_last_level")
            ]
            tests = f" {cells[0]} | {cells[1]} |"
        rows.append(f"| `{condition}` | {c['reached_last_level']}/{len(c['level_reached'])} | {mean} |{tests}")
    return rows


def best_level_1_mean(run: dict, window: int = 20) -> tuple[float, int]:
    """A curriculum run's best mean return over `window` consecutive level-1 episodes, and the env steps there."""
    on_level_1 = [i for i, level in enumerate(run["level"]) if level == 0]
    returns, env_steps = ([run[key][i] for i in on_level_1] for key in ("return", "env_steps"))
    return best_window_mean(returns, env_steps, window)


def test_the_corridor_measurement_is_its_result_file() -> None:
    """The five fresh seeds' tables, the settings fixed before the run, the reading's figures, the verdict."""
    result = json.loads((REPO / "docs" / "benchmarks" / "learning-curriculum-deadly_corridor.json").read_text())
    settings = result["settings"]
    assert (settings["first_seed"], settings["seeds"], settings["env_steps_per_run"]) == (101, 5, 100_000)
    assert settings["conditions"] == ["direct", "transparent", "sim", "random"]
    assert settings["curriculum_env"]["curriculum"]["threshold"] == -480.0
    assert result["command"] == (
        "spikeloop bench learning --curriculum experiments/deadly_corridor.yaml --conditions direct transparent "
        "sim random --seeds 5 --first-seed 101 --env-steps 100000 --jobs 2"
    )
    doc = DOC.read_text()
    rows = corridor_level_rows(result, seed_column=True) + corridor_summary_rows(result)
    missing = [row for row in rows if row not in doc]
    assert not missing, "docs/benchmarks.md differs from the corridor measurement; rows expected:\n" + "\n".join(
        missing
    )
    flat = " ".join(doc.split())
    target = result["targets"]["curriculum_transparent"]
    assert f"**The target `curriculum_transparent` is {'met' if target['met'] else 'not met'}." in flat
    assert f"{result['git']['commit'][:7]}, `--jobs 2`, {result['wall_s'] / 60:.1f} minutes on 2 cores" in flat
    runs, levels = result["runs"], result["curriculum"]["conditions"]
    t101, t105, s101 = (
        best_level_1_mean(runs[c][s]) for c, s in (("transparent", "101"), ("transparent", "105"), ("sim", "101"))
    )
    assert f"at {t101[0]:.1f} ({t101[1]:,} env steps) and {t105[0]:.1f} ({t105[1]:,})" in flat
    assert f"its first episodes ({s101[0]:.1f}, at {s101[1]:,} env steps)" in flat
    random_best = [best_level_1_mean(run)[0] for run in runs["random"].values()]
    assert f"`random`'s best was {min(random_best):.1f} to {max(random_best):.1f}" in flat
    medians = {
        c: statistics.median(s for s in levels[c]["env_steps_to_last_level"].values() if s is not None)
        for c in ("transparent", "direct")
    }
    assert f"(median {medians['transparent']:,.0f} against {medians['direct']:,.0f} env steps)" in flat
    assert f"`sim` seed 104 played {levels['sim']['episodes_at_last_level']['104']} there" in flat
    reached = {c: levels[c]["reached_last_level"] for c in levels}
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        f"stage 5 was reached in {reached['direct']} of 5 seeds by `direct`, {reached['sim']} by `sim`, "
        f"{reached['transparent']} by `transparent` and {reached['random']} by `random`; `transparent` against "
        f"`random` on the stage reached gives p = {target['p']:.4f}"
    ) in readme


def test_after_the_kernel_change_the_runs_are_the_same_and_the_times_are_the_files() -> None:
    """The culture kernel's speed change: all 25 runs of `--jobs 2` as before, the times quoted theirs."""
    kernel = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2-kernel.json").read_text())
    groups = json.loads((REPO / "docs" / "benchmarks" / "learning-jobs2-groups.json").read_text())
    assert kernel["command"].startswith("spikeloop bench learning --seeds 5 --jobs 2 ")
    assert not kernel["git"]["tracked_files_changed"]
    compared = _same_runs(kernel, groups)
    section = " ".join(DOC.read_text().split()).split("### After the culture kernel's speed change")[1]
    section = section.split("###")[0]
    assert f"from a checkout of {kernel['git']['commit'][:7]}" in section
    assert f"({compared} of {compared} runs; doc test)" in section
    wall, before = kernel["wall_s"], groups["wall_s"]
    assert (
        f"**{wall / 60:.0f} minutes** (`wall_s` {wall:,.0f} s) against {before / 60:.0f} ({before:,.0f} s)" in section
    )
    assert f"{before / wall:.2f}x" in section
    for condition in ("sim", "zero", "random"):
        new = sum(r["wall_s"] for r in kernel["runs"][condition].values())
        old = sum(r["wall_s"] for r in groups["runs"][condition].values())
        assert f"`{condition}` {new:.0f}" in section and f"against {old:.0f}" in section, condition


def test_a_schedule_that_holds_the_rate_is_the_constant_rate_run() -> None:
    """architecture.md: with the first rate a Python float, the held schedule wrote the constant run's episodes."""
    constant = json.loads((REPO / "docs" / "benchmarks" / "learning-hold-check-constant.json").read_text())
    schedule = json.loads((REPO / "docs" / "benchmarks" / "learning-hold-check-schedule.json").read_text())
    assert "ppo" not in constant["settings"] and schedule["settings"]["ppo"]["lr"][:2] == [[0, 0.01], [20480, 0.01]]
    assert constant["machine"]["cpu_model"] == schedule["machine"]["cpu_model"]
    assert _same_runs(schedule, constant) == 1
    episodes = len(constant["runs"]["direct"]["100"]["return"])
    flat = " ".join((REPO / "docs" / "architecture.md").read_text().split())
    assert f"the same run then wrote the constant run's {episodes:,} episodes" in flat


def test_where_the_scheduled_runs_part_from_their_twins_is_the_result_files() -> None:
    """The check the schedule's reading named: episode numbers quoted in benchmarks.md, from the files."""
    bench = REPO / "docs" / "benchmarks"
    anneal = json.loads((bench / "learning-drift-anneal.json").read_text())["runs"]["direct"]["100"]
    intel = json.loads((bench / "learning-jobs2-kernel.json").read_text())["runs"]["direct"]["100"]
    constant = json.loads((bench / "learning-hold-check-constant.json").read_text())["runs"]["direct"]["100"]
    flat = " ".join(DOC.read_text().split())
    assert f"from its twin in `learning-jobs2-kernel.json` at episode {_first_parting(anneal, intel)}." in flat
    assert f"parted from that file at episode {_first_parting(constant, intel)}," in flat
    assert f"yet the schedule's run parted from it at episode {_first_parting(anneal, constant)} too" in flat
    arch = " ".join((REPO / "docs" / "architecture.md").read_text().split())
    parting = _first_parting(anneal, constant)
    assert f"at episode {parting} ({anneal['env_steps'][parting - 1]:,.0f} env steps)" in arch


def steps_per_episode(run: dict, low: int, high: int) -> float:
    """Env steps per episode over the iterations that end in (low, high]: their env steps over their episodes."""
    episodes = sum(low < at <= high for at in run["env_steps"])
    return (high - low) / episodes


def episode_lengths(result: dict, condition: str) -> tuple[float, float]:
    """Mean over seeds of env steps per episode between 10,240 and 20,480 env steps, and in the last 10,240."""
    runs = result["runs"][condition].values()
    early = [steps_per_episode(run, 10240, 20480) for run in runs]
    late = [steps_per_episode(run, run["env_steps_total"] - 10240, run["env_steps_total"]) for run in runs]
    return statistics.mean(early), statistics.mean(late)


def test_the_episode_lengths_the_health_term_reading_quotes_are_the_drift_files() -> None:
    """The reading fixed before the runs with the end-of-episode health term off starts from these figures."""
    bench = REPO / "docs" / "benchmarks"
    constant, anneal = (json.loads((bench / f"learning-{n}.json").read_text()) for n in ("drift", "drift-anneal"))
    flat = " ".join(DOC.read_text().split())
    direct = [f"{v:.1f}" for result in (constant, anneal) for v in episode_lengths(result, "direct")]
    assert (
        f"{direct[0]} against {direct[1]} at the constant rate, {direct[2]} against {direct[3]} with the rate held"
        in flat
    )
    for condition in ("transparent", "sim"):
        (a, b), (c, d) = (episode_lengths(result, condition) for result in (constant, anneal))
        assert f"`{condition}` {a:.1f} against {b:.1f} and {c:.1f} against {d:.1f}" in flat, condition


def test_the_health_term_readings_discounted_values_are_the_learners_and_the_games() -> None:
    """The reading's arithmetic from the learner's gamma, the reward's defaults and `basic` as VizDoom plays it."""
    from spikeloop.envs.doom_env import DoomEnv
    from spikeloop.envs.rewards import RewardSettings
    from spikeloop.models.ppo_config import ClosedLoopPPOConfig

    gamma, reward = ClosedLoopPPOConfig().gamma, RewardSettings()
    env = DoomEnv(scenario="basic")
    try:  # a timeout with no round spent: move without shooting until the game ends the episode
        env.reset(seed=0)
        rewards, truncated = [], False
        while not truncated:
            _, step_reward, terminated, truncated, info = env.step(1)
            assert not terminated and not info["events"]["ammo_waste"]
            rewards.append(step_reward)
    finally:
        env.close()
    timeout_step, end = len(rewards), reward.end_health_per_hp * 100
    assert rewards == [0.0] * (timeout_step - 1) + [end]  # basic never takes health: the term is -500 at the end

    def kill(step: int, term: float = end) -> float:
        return (reward.kill + reward.ammo_spent_per_round + term) * gamma ** (step - 1)

    flat = " ".join(DOC.read_text().split())
    assert f"worth {kill(1):.0f} x {gamma}^(t-1): {kill(1):.0f} at step 1, {kill(12):.0f} at step 12" in flat
    assert f"{kill(timeout_step - 1):.0f} at step {timeout_step - 1}, the last before `basic`'s timeout at step" in flat
    assert f"timeout at step {timeout_step} (300 tics, 4 per step)" in flat
    assert f"a timeout with no round spent is worth {end * gamma ** (timeout_step - 1):.0f}, more than a kill" in flat
    assert f"a kill at step t is worth +{kill(1, 0.0):.0f} x {gamma}^(t-1)" in flat


def kill_share(run: dict, low: int, high: int) -> float:
    """The share of episodes killed among those the iterations ending in (low, high] recorded."""
    kills = [kill for at, kill in zip(run["env_steps"], run["kill"], strict=True) if low < at <= high]
    return sum(kills) / len(kills)


def late_kill_shares(result: dict, condition: str) -> list[float]:
    """Per seed, the share of episodes killed in the run's last 10,240 env steps."""
    return [
        kill_share(r, r["env_steps_total"] - 10240, r["env_steps_total"]) for r in result["runs"][condition].values()
    ]


def test_the_health_term_result_quotes_its_file_and_the_constant_rate_drift_file() -> None:
    """The reading of the runs with the term off: episode lengths, late kill rates and early kill shares."""
    bench = REPO / "docs" / "benchmarks"
    on, off = (json.loads((bench / f"learning-{n}.json").read_text()) for n in ("drift", "drift-no-end-health"))
    assert off["settings"]["env"] == {"reward_settings": {"end_health_per_hp": 0}} and "env" not in on["settings"]
    flat = " ".join(DOC.read_text().split())
    for condition in ("direct", "transparent"):
        early, late = episode_lengths(off, condition)
        assert f"{early:.1f}" in flat and f"{late:.1f}" in flat, condition
    early, late = episode_lengths(off, "direct")
    assert f"(env steps per episode {early:.1f} between 10,240 and 20,480 env steps, {late:.1f} in the last" in flat
    assert early >= late  # the prediction the reading calls met

    off_direct, on_direct = late_kill_shares(off, "direct"), late_kill_shares(on, "direct")
    arch = " ".join((REPO / "docs" / "architecture.md").read_text().split())
    on_early, on_late = episode_lengths(on, "direct")
    assert f"its episodes grew from {on_early:.1f} to {on_late:.1f} env steps" in arch
    assert f"and it ran out of time in about {round(100 * (1 - statistics.mean(on_direct)))}% of them" in arch
    assert f"was {min(off_direct):.3f}-{max(off_direct):.3f} in every seed ({min(on_direct):.3f}-" in arch
    assert f"was {min(off_direct):.3f}-{max(off_direct):.3f} in every seed, against {min(on_direct):.3f}-" in flat
    assert f"{max(on_direct):.3f} with the term on" in flat
    assert f"its last 10,240 env steps {late_kill_shares(off, 'transparent')[3]:.3f})" in flat  # seed 103

    def first_kills(result: dict, condition: str) -> float:
        return statistics.mean(kill_share(r, 0, 10240) for r in result["runs"][condition].values())

    shares = [f"{first_kills(r, c):.3f}" for c in ("direct", "transparent", "sim") for r in (off, on)]
    assert f"`direct` {shares[0]} against {shares[1]} with the term on" in flat
    assert f"`transparent` {shares[2]} against {shares[3]}, `sim` {shares[4]} against {shares[5]}." in flat


def _same_numbers(measured, rebuilt, path: str = "") -> list[str]:
    """Where two JSON values differ, floats compared to 1e-9 (another machine sums in another order)."""
    if isinstance(measured, dict) and isinstance(rebuilt, dict):
        return [
            d
            for key in sorted(set(measured) | set(rebuilt), key=str)
            for d in _same_numbers(measured.get(key), rebuilt.get(key), f"{path}/{key}")
        ]
    if isinstance(measured, list) and isinstance(rebuilt, list) and len(measured) == len(rebuilt):
        return [d for i, (m, r) in enumerate(zip(measured, rebuilt)) for d in _same_numbers(m, r, f"{path}/{i}")]
    if isinstance(measured, float) and isinstance(rebuilt, float):
        return (
            [] if math.isclose(measured, rebuilt, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {measured} != {rebuilt}"]
        )
    return [] if measured == rebuilt else [f"{path}: {measured!r} != {rebuilt!r}"]


LEARNING_FILES = sorted(
    path.name
    for path in (REPO / "docs" / "benchmarks").glob("*.json")
    if {"settings", "runs", "summary"} <= set(json.loads(path.read_text()))
)


@pytest.mark.parametrize("name", LEARNING_FILES)
def test_every_committed_statistic_is_what_its_runs_give_today(name: str) -> None:
    """Summary, tests, targets and verdicts rebuilt from the file's own episodes by today's code are the file's.

    A committed figure the code would no longer compute (a target read in the wrong units, a test since made
    exact) fails here until the file is restated from its unchanged runs (its `restated` says when and why).
    """
    from spikeloop.experiments.benchmarks import learning as bl
    from spikeloop.experiments.strict_json import json_safe

    result = json.loads((REPO / "docs" / "benchmarks" / name).read_text())
    runs, facts = bl.runs_from_result(result), bl.run_facts_from_result(result)
    rebuilt = json.loads(json.dumps(json_safe(bl.build_result(result["settings"], runs, facts, 0.0))))
    differences = [d for key in rebuilt if key != "wall_s" for d in _same_numbers(result.get(key), rebuilt[key], key)]
    assert not differences, f"{name} is not what its runs give today:\n" + "\n".join(differences[:20])


def test_the_term_off_reading_translates_transparent_from_its_file() -> None:
    """The default-reward finals the reading gives for transparent at 20,000 env steps: the drift table's, - 500."""
    result = json.loads((REPO / "docs" / "benchmarks" / "learning-drift-no-end-health.json").read_text())
    assert result["targets"]["a_direct_transparent_solve"]["met"] is None  # read on kill rates only
    finals = [seed["return_at_default"] - 500 for seed in result["drift"]["transparent"]["per_seed"].values()]
    flat = " ".join(DOC.read_text().split())
    assert f"would be {', '.join(f'{v:.1f}' for v in finals)} in the default reward" in flat
    below = [seed for seed, v in zip(result["drift"]["transparent"]["per_seed"], finals) if v < -425]
    assert f"reward: seed {', '.join(below)} below -425" in flat


def test_the_term_off_and_schedule_runs_are_the_term_off_runs_until_the_schedule_starts() -> None:
    """The reading's check, its late kill shares, episode lengths and translated finals, from the two files."""
    bench = REPO / "docs" / "benchmarks"
    off, both = (
        json.loads((bench / f"learning-{n}.json").read_text())
        for n in ("drift-no-end-health", "drift-no-end-health-anneal")
    )
    assert (
        both["settings"]["env"] == off["settings"]["env"] and "ppo" in both["settings"] and "ppo" not in off["settings"]
    )
    twins = 0
    for condition, by_seed in both["runs"].items():
        for seed, run in by_seed.items():
            twin = off["runs"][condition][seed]
            cut = [i for i, at in enumerate(run["env_steps"]) if at <= 20480]
            assert cut and all(twin[k][i] == run[k][i] for k in ("env_steps", "return", "kill") for i in cut), (
                condition,
                seed,
            )
            assert twin["env_steps"][len(cut)] > 20480  # the twin's episodes up to the cut are these, and no more
            twins += 1
    flat = " ".join(DOC.read_text().split())
    assert f"episode for episode ({twins} of {twins} runs; doc test)" in flat

    def late(result: dict, condition: str) -> str:
        shares = late_kill_shares(result, condition)
        return f"{min(shares):.3f}-{max(shares):.3f}"

    assert (
        f"`transparent` in {late(both, 'transparent')} of them ({late(off, 'direct')} and {late(off, 'transparent')}"
        in flat
    )
    assert late(both, "direct") == "1.000-1.000"  # "killed in every episode of every seed"
    lengths = [f"{v:.1f}" for c in ("direct", "transparent") for v in episode_lengths(both, c)]
    assert f"`direct` {lengths[0]} env steps per episode between 10,240 and 20,480, {lengths[1]} in the last" in flat
    assert f"`transparent` {lengths[2]} and {lengths[3]}." in flat
    finals = [v - 500 for v in both["summary"]["transparent"]["final_return_mean"]["per_seed"].values()]
    assert f"are {', '.join(f'{v:.1f}' for v in finals)}, every seed above -425" in flat and min(finals) >= -425


def test_the_readme_recipe_for_long_basic_runs_is_the_measured_settings() -> None:
    """The flags the README gives for `basic` runs beyond the default budget are the met drift run's, as parsed."""
    import re
    import shlex

    from spikeloop.experiments.benchmarks import learning as bl

    result = json.loads((REPO / "docs" / "benchmarks" / "learning-drift-no-end-health-anneal.json").read_text())
    assert result["targets"]["e_no_drift"]["met"] is True
    readme = " ".join((REPO / "README.md").read_text().split())
    recipe = re.search(r"that is the recipe: `(--env [^`]+)`", readme)
    assert recipe, "the README's recipe sentence is gone"
    words = shlex.split(recipe.group(1))
    flags = {"env": words[1::2][words[0::2].index("--env")], "ppo": words[1::2][words[0::2].index("--ppo")]}
    for section, pair in flags.items():
        assert bl._section_overrides([pair], "basic", section) == result["settings"][section], section


def test_the_ablations_without_a_culture_are_the_same_runs_and_the_times_are_the_files() -> None:
    """The ablations on the zero backend: all 25 runs of `--jobs 2` as before on one machine, the times quoted theirs."""
    bench = REPO / "docs" / "benchmarks"
    before = json.loads((bench / "learning-amd-before.json").read_text())
    after = json.loads((bench / "learning-amd-after.json").read_text())
    for result in (before, after):
        assert result["command"].startswith("spikeloop bench learning --seeds 5 --jobs 2 ")
        assert not result["git"]["tracked_files_changed"]
    assert before["machine"] == after["machine"]
    compared = _same_runs(after, before)
    section = " ".join(DOC.read_text().split()).split("### The ablations without a simulated culture")[1]
    section = section.split("###")[0]
    assert f"checkout of {before['git']['commit'][:7]}" in section
    assert f"checkout of {after['git']['commit'][:7]}" in section
    assert f"({compared} of {compared} runs; doc test)" in section
    wall, old = after["wall_s"], before["wall_s"]
    assert f"**{wall / 60:.1f} minutes** (`wall_s` {wall:,.0f} s) against {old / 60:.1f} ({old:,.0f} s)" in section
    assert f"{old / wall:.2f}x" in section
    for condition in before["runs"]:
        new = sum(r["wall_s"] for r in after["runs"][condition].values())
        was = sum(r["wall_s"] for r in before["runs"][condition].values())
        assert f"`{condition}` {new:.0f} s against {was:.0f}" in section, condition
    targets = after["targets"]
    assert f"(p = {targets['c_sim_beats_zero']['p_value']:.4f})" in section
    solved = targets["a_direct_transparent_solve"]["conditions"]["transparent"]["per_seed"].values()
    assert f"met in {sum(seed['met'] for seed in solved)} of 5 seeds" in section
    speed = targets["b_transparent_speed"]
    assert f"{speed['ratio']:.2f}x `direct`'s ({speed['transparent_median_steps']:,.0f} against " in section
    assert f"{speed['direct_median_steps']:,.0f} env steps)" in section
    intel = json.loads((bench / "learning-jobs2-kernel.json").read_text())["summary"]["transparent"]
    here = after["summary"]["transparent"]["final_return_mean"]["per_seed"]["100"]
    there = intel["final_return_mean"]["per_seed"]["100"]
    assert f"`transparent` seed 100 {here:.1f} here against {there:.0f} in `learning-jobs2-kernel.json`" in section


def _transparent_cells(base: dict, candidate: dict, own_direct: bool = False) -> tuple[float, list[str]]:
    """`direct`'s median 90% mark and the candidate's `transparent` cells (90% marks per tuning seed, their median,
    the ratio, finals per seed), read against the base file's `zero` and `direct` (the candidate's own `direct` with
    `own_direct`)."""
    from spikeloop.experiments.benchmarks import learning as bl

    runs = bl.runs_from_result(base)
    own = bl.runs_from_result(candidate)
    runs["transparent"] = own["transparent"]
    if own_direct:
        runs["direct"] = own["direct"]
    stats = bl.summarize(runs, "basic", 20480)
    marks = stats["summary"]["transparent"]["steps_to_90pct_direct"]
    finals = stats["summary"]["transparent"]["final_return_mean"]["per_seed"]
    speed = stats["targets"]["b_transparent_speed"]
    seeds = [str(s) for s in range(5)]
    cells = [
        ", ".join("never" if marks["per_seed"][s] is None else f"{marks['per_seed'][s]:,.0f}" for s in seeds),
        "never" if marks["median"] is None else f"{marks['median']:,.0f}",
        "-" if speed["ratio"] is None else f"{speed['ratio']:.2f}x",
        ", ".join(f"{finals[s]:.1f}" for s in seeds),
    ]
    return speed["direct_median_steps"], cells


def test_the_concentration_table_is_the_tuning_files() -> None:
    """Each concentration's 90% marks, ratio and finals, read against the tuning file's direct and zero."""
    bench = REPO / "docs" / "benchmarks"
    base = json.loads((bench / "learning-tuning-seeds.json").read_text())
    section = " ".join(DOC.read_text().split()).split("### The stimulation's noise")[1].split("###")[0]
    for name, concentration in (
        ("learning-tuning-seeds", None),
        ("learning-tuning-concentration-100", 100),
        ("learning-tuning-concentration-12", 12),
    ):
        candidate = json.loads((bench / f"{name}.json").read_text())
        assert candidate["settings"].get("model") == (
            {"encoder_init_concentration": concentration} if concentration else None
        )
        assert candidate["settings"]["first_seed"] == 0 and candidate["git"]["commit"][:7] in section
        direct_median, cells = _transparent_cells(base, candidate)
        assert " | ".join(cells) + " |" in section, name
        assert f"median {direct_median:,.0f} env steps" in section


def _candidate_row(base: dict, candidate: dict) -> str:
    """A tuning candidate's row from `direct`'s column on: read against its own `direct` where it ran one."""
    own_direct = candidate is not base and "direct" in candidate["runs"]
    direct_median, cells = _transparent_cells(base, candidate, own_direct=own_direct)
    read_against = "its own" if own_direct else "the defaults'"
    return " | ".join([f"{read_against} ({direct_median:,.0f})", *cells])


def test_the_tuning_candidates_tables_are_their_files() -> None:
    """Each candidate's row (90% marks, ratio, finals) rebuilt from its file against the tuning seeds' direct and zero."""
    bench = REPO / "docs" / "benchmarks"
    base = json.loads((bench / "learning-tuning-seeds.json").read_text())
    flat = " ".join(DOC.read_text().split())
    section = flat.split("### The encoder's rate, its head's spread")[1].split("### No drift at 5 times")[0]
    candidates = {
        "learning-tuning-decoder-mlp": ("model", {"decoder_type": "mlp"}),
        "learning-tuning-head-std-2": ("model", {"encoder_head_init_std": 2.0}),
        "learning-tuning-encoder-lr-1": ("ppo", {"encoder_lr_multiplier": 1.0}),
        "learning-tuning-encoder-entropy-0.01": ("ppo", {"encoder_entropy_coeff": -0.01}),
        "learning-tuning-encoder-entropy-0.03": ("ppo", {"encoder_entropy_coeff": -0.03}),
        "learning-tuning-decoder-entropy-0.005": ("ppo", {"decoder_entropy_coeff": 0.005}),
    }
    for name, (section_key, setting) in candidates.items():
        candidate = json.loads((bench / f"{name}.json").read_text())
        assert candidate["settings"].get(section_key) == setting, name
        assert candidate["settings"]["first_seed"] == 0 and candidate["settings"]["seeds"] == 5
        assert candidate["git"]["commit"][:7] in section
        [(key, value)] = setting.items()
        label = f"`{key}={value}`"
        assert f"| {label} | {_candidate_row(base, candidate)} |" in section, name
    assert f"| none (the defaults, above) | {_candidate_row(base, base)} |" in section


def _kill_range(name: str, condition: str) -> str:
    per_seed = json.loads((REPO / "docs" / "benchmarks" / name).read_text())["summary"][condition]["final_kill_rate"]
    values = per_seed["per_seed"].values()
    return f"{min(values):.2f}-{max(values):.2f}"


def test_the_kill_rate_ranges_quoted_in_prose_are_their_files() -> None:
    """Ranges the README and the stim-mode reading quote from result files (each was once another file's)."""
    import re

    readme = " ".join((REPO / "README.md").read_text().split())
    for name in ("learning-fresh.json", "learning-jobs2.json", "learning-amd-after.json"):
        quoted = re.search(rf"(\d\.\d\d-\d\.\d\d)[^`]{{0,60}}\(`{re.escape(name)}`\)", readme)
        assert quoted is not None, f"README quotes no kill-rate range from {name}"
        assert quoted.group(1) == _kill_range(name, "sim"), name
    doc = " ".join(DOC.read_text().split())
    assert f"against `zero`'s {_kill_range('learning.json', 'zero')} in the learning benchmark" in doc
