"""docs/benchmarks.md's feedback sweep reading is its committed analysis, as measured.

The sweep's record is docs/benchmarks/sweep.json (`spikeloop analyze RUN_DIR --export`); analysing it now must give
the committed docs/benchmarks/sweep.analysis.json and the tables between the doc's markers (what `spikeloop analyze
docs/benchmarks/sweep.json --update-docs docs/benchmarks.md` writes), and each figure the reading quotes is rebuilt
here from the analysis with the doc's rounding and must appear in it verbatim. So an edited figure, a re-exported run
or a changed analysis without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spikeloop.experiments.analysis import doc_blocks, report, sweep

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
SOURCE = "docs/benchmarks/sweep.json"  # as the --update-docs command names it: the block's name
EXPORT = REPO / SOURCE
ANALYSIS = REPO / "docs" / "benchmarks" / "sweep.analysis.json"
TITLE = "## feedback sweep ("
EFFECT_NAMES = {  # the doc's words for each factor's main effect, in the analysis' order
    "feedback.use_reward_feedback": "reward feedback",
    "feedback.use_episode_feedback": "episode feedback",
    "feedback.episode_feedback_surprise_scaling": "its surprise scaling",
    "feedback.surprise.enabled": "step surprise",
}


@pytest.fixture(scope="module")
def analysis() -> dict[str, Any]:
    """The export analysed now, as `spikeloop analyze docs/benchmarks/sweep.json` does (default baseline)."""
    data = sweep.load(EXPORT)
    return sweep.analyze(data, sweep.parse_baseline(data, []), 0.05, "two-sided")


@pytest.fixture(scope="module")
def reading() -> str:
    """The sweep's section of the doc, whitespace folded so that line breaks do not matter."""
    doc = DOC.read_text()
    start = doc.index(TITLE)
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start : end if end >= 0 else None].split())


def _canonical(value: Any) -> str:
    return json.dumps(json.loads(json.dumps(value, default=float)), sort_keys=True)


def test_the_committed_analysis_is_the_analysis_of_the_export(analysis: dict[str, Any]) -> None:
    committed = json.loads(ANALYSIS.read_text())
    for key in ("baseline", "factors", "left_out", "comparisons", "main_effects", "pairing", "power"):
        assert _canonical(analysis[key]) == _canonical(committed[key]), key
    without_curves = [{k: v for k, v in c.items() if k != "curves"} for c in committed["configurations"]]
    assert _canonical(analysis["configurations"]) == _canonical(without_curves)


def test_the_whole_sweep_ran(analysis: dict[str, Any]) -> None:
    assert analysis["left_out"] == {}
    assert len(analysis["configurations"]) == 16
    assert {len(c["final_return"]["per_seed"]) for c in analysis["configurations"]} == {8}


def test_the_tables_in_the_doc_are_the_analysis(analysis: dict[str, Any]) -> None:
    assert doc_blocks.read(DOC, report.docs_block_name(SOURCE)) == report.docs_tables(analysis).strip()


def effects_sentence(analysis: dict[str, Any], metric: str, spec: str) -> str:
    """'reward feedback -11.9 (-17.9 to -6.0; Holm p 0.0625), ...' for one metric's main effects (p as the
    report writes it, `.3g`)."""
    parts = []
    for effect in analysis["main_effects"][metric]:
        low, high = effect["difference_ci95"]
        parts.append(
            f"{EFFECT_NAMES[effect['factor']]} {effect['mean_difference']:+{spec}} "
            f"({low:+{spec}} to {high:+{spec}}; Holm p {effect['p_holm']:.3g})"
        )
    return ", ".join(parts)


def test_the_reading_quotes_the_main_effects(analysis: dict[str, Any], reading: str) -> None:
    assert [e["factor"] for e in analysis["main_effects"]["final_return"]] == list(EFFECT_NAMES)
    # "No switch has a main effect the sweep can show after Holm's correction."
    assert not any(e["significant"] for metric in analysis["main_effects"].values() for e in metric)
    assert effects_sentence(analysis, "final_return", ".1f") in reading
    assert effects_sentence(analysis, "final_kill_rate", ".2f") in reading


def test_the_reading_quotes_the_pairing(analysis: dict[str, Any], reading: str) -> None:
    for metric, spec in (("final_return", ".1f"), ("final_kill_rate", ".3f")):
        pairing = analysis["pairing"][metric]
        assert (
            f"{pairing['sd_paired']:{spec}} paired against {pairing['sd_unpaired']:{spec}} unpaired "
            f"(ratio {pairing['ratio']:.2f})"
        ) in reading, metric


def test_the_reading_quotes_reward_feedback_and_the_span(analysis: dict[str, Any], reading: str) -> None:
    reward = analysis["main_effects"]["final_return"][0]
    assert reward["factor"] == "feedback.use_reward_feedback"
    higher, lower, _ = reward["higher_lower_tied"]
    assert f"lower in {lower} of {higher + lower} seeds" in reading
    assert (
        f"exact signed-rank p {reward['p']:.3g}, Holm {reward['p_holm']:.3g}; Cliff's delta {reward['cliffs_delta']:+.2f}"
        in reading
    )
    against = [seed for seed, d in reward["differences"].items() if d > 0]
    assert against == ["5"] and f"(seed 5, {reward['differences']['5']:+.2f})" in reading
    lows = [e["difference_ci95"][0] for e in analysis["main_effects"]["final_return"]]
    highs = [e["difference_ci95"][1] for e in analysis["main_effects"]["final_return"]]
    assert f"lies within {min(lows):.1f} and {max(highs):+.1f} points" in reading
    returns = [c["final_return"]["mean"] for c in analysis["configurations"]]
    kills = [c["final_kill_rate"]["mean"] for c in analysis["configurations"]]
    baseline = next(c for c in analysis["configurations"] if c["label"] == analysis["baseline"])
    assert baseline["final_return"]["mean"] == max(returns)  # "the baseline has the highest mean"
    assert (
        f"means span {max(returns):.1f} to {min(returns):.1f} (kill rates {min(kills):.2f} to {max(kills):.2f})"
        in reading
    )


def test_the_sweep_files_header_counts_the_family_the_analysis_tests(analysis: dict[str, Any]) -> None:
    """experiments/sweep_feedback.yaml says how many comparisons Holm runs over and the fewest seeds that can
    make one significant: both from the analysis (it once said 15 and 10, counting the repeats)."""
    from spikeloop.experiments.analysis.stats import smallest_signed_rank_p

    header = " ".join(
        line.lstrip("# ") for line in (REPO / "experiments" / "sweep_feedback.yaml").read_text().splitlines()
    )
    rows = analysis["comparisons"]["final_return"]
    (family,) = {row["family_size"] for row in rows}
    fewest = next(n for n in range(2, 40) if smallest_signed_rank_p(n, "two-sided") <= analysis["alpha"] / family)
    assert f"the {len(rows)} other points are {family} distinct comparisons" in header
    assert f"with Holm over {family} no seed count below {fewest} can make one significant" in header
