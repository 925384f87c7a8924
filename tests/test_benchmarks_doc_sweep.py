"""docs/benchmarks.md's feedback sweep figures are its committed analysis, as measured.

The interim reading (docs/benchmarks/sweep-interim/analysis.json, `spikeloop analyze` of the first, abandoned
run): each figure the doc gives is rebuilt from the JSON with the doc's rounding and must appear in the doc
verbatim, so an edited figure or a re-analysed JSON without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
INTERIM = REPO / "docs" / "benchmarks" / "sweep-interim" / "analysis.json"
EFFECT_NAMES = {  # the doc's words for each factor's main effect, in the JSON's order
    "feedback.use_reward_feedback": "reward feedback",
    "feedback.use_episode_feedback": "episode feedback",
    "feedback.episode_feedback_surprise_scaling": "its surprise scaling",
    "feedback.surprise.enabled": "step surprise",
}


def _section(doc: str, title: str) -> str:
    start = doc.index(title)
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else None]


def test_the_interim_sweep_reading_is_its_analysis_file() -> None:
    result = json.loads(INTERIM.read_text())
    section = _section(DOC.read_text(), "## feedback sweep (")
    effects = result["main_effects"]["final_return"]
    assert [e["factor"] for e in effects] == list(EFFECT_NAMES)
    parts = []
    for effect in effects:
        low, high = effect["difference_ci95"]
        words = "95% bootstrap interval " if effect is effects[0] else ""
        parts.append(
            f"{EFFECT_NAMES[effect['factor']]} {effect['mean_difference']:+.1f} ({words}{low:+.1f} to {high:+.1f})"
        )
        assert effect["p_holm"] == 1.0  # "Holm p = 1 for each"
    flat = " ".join(section.split())
    assert ", ".join(parts) in flat, ", ".join(parts)
    kills = result["main_effects"]["final_kill_rate"]
    assert max(abs(e["mean_difference"]) for e in kills) <= 0.04  # "every main effect within 0.04"

    baseline = next(c for c in result["configurations"] if c["label"] == result["baseline"])["final_return"]
    assert f"({baseline['mean']:.1f}, {len(baseline['per_seed'])} seeds)" in flat
    means = sorted(c["final_return"]["mean"] for c in result["configurations"])
    assert f"Configurations span {means[-1]:.0f} to {means[0]:.0f}." in flat
    differences = [r["mean_difference"] for r in result["comparisons"]["final_return"]]
    above = sum(d > 0 for d in differences)
    assert (above, len(differences)) == (15, 15)  # "all 15 others are above it"
    assert f"by {min(differences):.1f} to {max(differences):.1f} points (paired mean differences" in flat
    by_mean = sum(m > baseline["mean"] for m in means)
    assert f"by their means {by_mean} of the {len(means) - 1} are" in flat

    pairing = result["pairing"]["final_return"]
    assert (
        f"{pairing['sd_paired']:.1f} paired against {pairing['sd_unpaired']:.1f} unpaired over the "
        f"{pairing['comparisons']} comparisons (ratio {pairing['ratio']:.2f})"
    ) in flat
