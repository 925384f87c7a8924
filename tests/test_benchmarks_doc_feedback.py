"""docs/benchmarks.md's feedback-control tables are their result files, as measured.

docs/benchmarks/feedback-dopamine.json: feedback on (settled) against off; feedback-dopamine-frozen.json: the
same runs merged with the frozen-weights control's, and its two comparisons; feedback-negative.json: the negative
controls on fresh seeds, their four comparisons and Holm over them, as the reading and the README quote them.

The rows are rebuilt from the JSON with the rounding the doc uses; each must appear in the doc verbatim, so an
edited figure or a re-run JSON without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULT = REPO / "docs" / "benchmarks" / "feedback-dopamine.json"
FROZEN = REPO / "docs" / "benchmarks" / "feedback-dopamine-frozen.json"
FROZEN_COMPARISONS = ("dopamine_on_settle - dopamine_frozen_on_settle", "dopamine_frozen_on_settle - dopamine_off")


def _signed(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}"


def _effect_cells(effect: dict, digits: int) -> tuple[str, str]:
    """One metric of a comparison as the doc writes it: the per-seed differences, and the mean with its interval."""
    low, high = effect["ci95_paired"]
    per_seed = ", ".join(_signed(v, digits) for v in effect["per_seed_difference"].values())
    interval = f"{_signed(effect['mean_difference'], digits)} ({_signed(low, digits)} .. {_signed(high, digits)})"
    return per_seed, interval


def expected_rows(result: dict, comparisons: tuple[str, ...] = ("dopamine_on_settle - dopamine_off",)) -> list[str]:
    """The doc's condition rows and effect rows, built from the result file."""
    rows = []
    for condition in result["settings"]["conditions"]:
        summary = result["summary"][condition]
        ret, kill = summary["final_return_mean"], summary["final_kill_rate"]
        per_return = ", ".join(f"{v:.1f}" for v in ret["per_seed"].values())
        per_kill = ", ".join(f"{v:.2f}" for v in kill["per_seed"].values())
        rows.append(f"| `{condition}` | {ret['pooled']:.1f} ({per_return}) | {kill['pooled']:.2f} ({per_kill}) |")
    for comparison in comparisons:
        effect = result["feedback_effects"][comparison]
        named = "" if len(comparisons) == 1 else f"`{comparison}` | "  # several comparisons: a column names each
        for label, key, digits in (("final return", "final_return", 1), ("kill rate", "kill_rate", 2)):
            per_seed, interval = _effect_cells(effect[key], digits)
            rows.append(f"| {named}{label} | {per_seed} | {interval} |")
    return rows


def test_the_positive_control_tables_are_the_result_file() -> None:
    result = json.loads(RESULT.read_text())
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-dopamine.json; rows expected:\n" + "\n".join(missing)
    assert f"Chance (each run's first 100 episodes, mean of the 10 runs): {result['chance_return']:.1f}." in doc
    p = result["feedback_effects"]["dopamine_on_settle - dopamine_off"]["final_return"]["mann_whitney_p_greater"]
    assert f"p = {p:.4f} < 0.01" in doc


def test_the_frozen_control_tables_are_the_result_file() -> None:
    result = json.loads(FROZEN.read_text())
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result, FROZEN_COMPARISONS) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-dopamine-frozen.json; rows expected:\n" + "\n".join(
        missing
    )


NEGATIVE = REPO / "docs" / "benchmarks" / "feedback-negative.json"
NEGATIVE_COMPARISONS = (
    "stdp_on - stdp_off",
    "none_on - none_off",
    "none_on_settle - none_off",
    "none_on - none_on_settle",
)
"""The negative controls' family, as the reading plan fixed it before the runs (benchmarks.md)."""


def negative_holm(result: dict, key: str) -> list[float]:
    """Holm over the four comparisons' two-sided Mann-Whitney p, in NEGATIVE_COMPARISONS order."""
    from spikeloop.experiments.analysis.stats import holm

    return holm([result["feedback_effects"][c][key]["mann_whitney_p_two_sided"] for c in NEGATIVE_COMPARISONS])


def negative_rows(result: dict) -> list[str]:
    """The negative controls' effect rows: per seed, interval, two-sided Mann-Whitney p, its Holm p over the four."""
    rows = []
    for label, key, digits in (("final return", "final_return", 1), ("kill rate", "kill_rate", 2)):
        effects = [result["feedback_effects"][c][key] for c in NEGATIVE_COMPARISONS]
        adjusted = negative_holm(result, key)
        for comparison, e, p_holm in zip(NEGATIVE_COMPARISONS, effects, adjusted, strict=True):
            per_seed, interval = _effect_cells(e, digits)
            rows.append(
                f"| `{comparison}` | {label} | {per_seed} | {interval} | {e['mann_whitney_p_two_sided']:.2g} | "
                f"{p_holm:.2g} | {e['cliffs_delta']:+.2f} |"
            )
    return rows


def test_the_negative_controls_tables_are_the_result_file() -> None:
    result = json.loads(NEGATIVE.read_text())
    settings = result["settings"]
    # Fresh seeds 100-105, every condition of the two files, every run whole.
    assert settings["first_seed"] == 100 and settings["seeds"] == 6
    assert set(result["runs"]) == {"stdp_on", "stdp_off", "none_on", "none_on_settle", "none_off"}
    assert all(sorted(by_seed, key=int) == [str(s) for s in range(100, 106)] for by_seed in result["runs"].values())
    assert {s["git"]["commit"][:7] for s in result["sources"]} == {"fa27e58"}
    doc = DOC.read_text()
    condition_rows = expected_rows(result, ())
    missing = [row for row in [*condition_rows, *negative_rows(result)] if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-negative.json; rows expected:\n" + "\n".join(missing)
    assert f"Chance (each run's first 100 episodes, mean of the 30 runs): {result['chance_return']:.1f}." in doc


def test_the_negative_controls_reading_and_readme_quote_the_result_file() -> None:
    """The figures the reading and the README quote, rebuilt from feedback-negative.json."""
    result = json.loads(NEGATIVE.read_text())
    effects = result["feedback_effects"]
    holm_return = dict(zip(NEGATIVE_COMPARISONS, negative_holm(result, "final_return"), strict=True))
    holm_kill = negative_holm(result, "kill_rate")
    doc = " ".join(DOC.read_text().split())
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"the smallest Holm p is {min(holm_return.values()):.2g}; kill rate {min(holm_kill):.2g})" in doc
    assert min(holm_return.values()) >= 0.05  # the reading's headline: nothing claimed

    stdp = effects["stdp_on - stdp_off"]["final_return"]
    low, high = stdp["ci95_paired"]
    lower = sum(d < 0 for d in stdp["per_seed_difference"].values())
    assert (
        f"`stdp_on` ended below `stdp_off` in {lower} of 6 seeds, by {-stdp['mean_difference']:.1f} on average "
        f"(paired interval {low:.1f} to {high:.1f}, which excludes 0 unadjusted; two-sided Mann-Whitney "
        f"p = {stdp['mann_whitney_p_two_sided']:.2f}, Holm {holm_return['stdp_on - stdp_off']:.2f}; two-sided "
        f"Wilcoxon on the pairs {stdp['wilcoxon_p_two_sided']:.2g})"
    ) in doc
    assert high < 0  # "excludes 0"
    assert (
        f"ended {-stdp['mean_difference']:.1f} lower than without (95% interval {low:.1f} to {high:.1f}, two-sided "
        f"p = {stdp['mann_whitney_p_two_sided']:.2f}, Holm {holm_return['stdp_on - stdp_off']:.2f})"
    ) in readme

    settle = effects["none_on_settle - none_off"]["final_return"]
    low, high = settle["ci95_paired"]
    diffs = settle["per_seed_difference"].values()
    assert (
        f"+{settle['mean_difference']:.1f} ({low:.1f} to +{high:.1f}), at least as high in every seed "
        f"({min(diffs):+.1f} to {max(diffs):+.1f})"
    ) in doc
    assert f"p = {settle['mann_whitney_p_two_sided']:.2g}, Holm {holm_return['none_on_settle - none_off']:.2g}" in doc
    assert f"+{settle['mean_difference']:.1f} ({low:.1f} to {high:.1f}, Holm" in readme

    direct = effects["none_on - none_on_settle"]["final_return"]
    low, high = direct["ci95_paired"]
    assert (
        f"+{direct['mean_difference']:.1f} ({low:.1f} to +{high:.1f}), p = {direct['mann_whitney_p_two_sided']:.2f}"
        in doc
    )
    assert f"+{direct['mean_difference']:.1f} ({low:.1f} to {high:.1f})" in readme


FRESH = REPO / "docs" / "benchmarks" / "feedback-dopamine-fresh.json"


def test_the_positive_control_on_fresh_seeds_is_its_result_file() -> None:
    """The fresh-seed tables, chance and the p the reading quotes, rebuilt from feedback-dopamine-fresh.json."""
    result = json.loads(FRESH.read_text())
    assert result["settings"]["first_seed"] == 100  # held apart from the tuning seeds
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-dopamine-fresh.json; rows expected:\n" + "\n".join(
        missing
    )
    assert f"Chance (each run's first 100 episodes, mean of the 10 runs): {result['chance_return']:.1f}." in doc
    effect = result["feedback_effects"]["dopamine_on_settle - dopamine_off"]["final_return"]
    p = effect["mann_whitney_p_greater"]
    assert p >= 0.01 and f"not met on fresh seeds: p = {p:.2g}, not < 0.01" in doc
    readme = (REPO / "README.md").read_text()
    assert f"+{effect['mean_difference']:.1f}" in readme and f"p = {p:.3f}" in readme
