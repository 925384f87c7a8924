"""`spikeloop bench design`: the design validations read from finished design runs (issue 50, item 5).

The runs themselves are `spikeloop tune` on experiments/validation/*.yaml (committed in docs/benchmarks/design.json;
tests/test_design_run.py runs a design through the loop). Here the command reads run directories laid out as the
runner writes them (schedule.json from the design's own deal, one sequence.json per culture) with values whose
truth is known, and the committed result is checked against its own blocks and the docs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spikeloop.experiments.analysis import doc_blocks
from spikeloop.experiments.analysis.crossover import Blocks, analyse, previous_of, randomisation
from spikeloop.experiments.benchmarks.design import (
    DOCS_BLOCK,
    _conditions,
    read_run,
    relabelled_p,
    render,
    with_orders,
)
from spikeloop.experiments.design.schedule import schedule
from spikeloop.experiments.design.settings import DesignSection

ROOT = Path(__file__).resolve().parents[1]


def write_run(root: Path, cultures: int, conditions: list, effect: float = 0.0, seed: int = 0) -> Path:
    """A finished design run as the runner leaves it: the dealt schedule and each culture's sequence.json, each
    block worth its culture's level + noise (s.d. 10) + `effect` under condition 1."""
    design = DesignSection.model_validate(
        {
            "cultures": [{"culture_id": f"c{i}", "device": "sim", "culture_seed": i} for i in range(cultures)],
            "conditions": {"checkpoint.keep": conditions},
            "block_env_steps": 2048,
            "seed": 7,
        }
    )
    plan = schedule(design, {"sim"})
    root.mkdir(parents=True)
    (root / "schedule.json").write_text(json.dumps(plan.to_json()))
    rng = np.random.default_rng(seed)
    for culture in plan.cultures:
        trial = root / f"culture-{culture['culture_id']}-00000"
        trial.mkdir()
        level = rng.normal(-500.0, 20.0)
        blocks = [
            {
                "period": period,
                "condition": condition,
                "directory": f"block-{period:02d}-C{condition}",
                "final_return": level + rng.normal(0.0, 10.0) + (effect if condition == 1 else 0.0),
                "final_kill_rate": 0.5,
            }
            for period, condition in enumerate(culture["sequence"])
        ]
        record = {"culture_id": culture["culture_id"], "blocks": blocks, "abandoned": []}
        (trial / "sequence.json").write_text(json.dumps(record))
    return root


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spikeloop.experiments.cli", "bench", "design", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_each_deal_gets_the_p_its_own_analysis_would_give(tmp_path: Path) -> None:
    """The null rate is read over every deal at once; each deal's p must be the one `spikeloop analyze` would have
    printed had that deal been dealt, with the blocks as they would have come out under it."""
    plan, blocks = read_run(write_run(tmp_path / "run", 6, [1, 2, 3]))
    randomised = randomisation(plan)
    orders = randomised.orders
    conditions = _conditions(orders)
    # Blocks that depend on the deal: a carry-over after condition 1 and an effect of condition 2.
    planted = blocks.value + 8.0 * (previous_of(blocks.culture, conditions) == 1) + 15.0 * (conditions == 2)
    p = relabelled_p(randomised, planted)
    for d in [0, 1, 7, len(orders) // 2, len(orders) - 1]:
        own = analyse(with_orders(plan, orders[d]), replace(blocks, condition=conditions[d], value=planted[d]))
        for comparison in own.comparisons:
            assert p[comparison.a][d] == pytest.approx(comparison.randomisation_p, abs=1e-12), (d, comparison.a)


def test_bench_design_finds_a_planted_effect_and_writes_its_tables(tmp_path: Path) -> None:
    null = write_run(tmp_path / "null", 6, [1, 2, 3])
    effect = write_run(tmp_path / "effect", 16, [1, 2], effect=-40.0, seed=1)
    docs = tmp_path / "benchmarks.md"
    begin, end = doc_blocks.markers(DOCS_BLOCK, "x")
    docs.write_text(f"# b\n{begin}\nold\n{end}\n")
    output = tmp_path / "design.json"
    done = bench(
        "--null", str(null), "--effect", str(effect), "--output", str(output), "--update-docs", str(docs),
        "--whole-analyses", "20",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(output.read_text())
    met = {r["item"]: r["met"] for r in result["readings"]}
    assert met["planted effect found"] is True
    assert met["carry-over: a fixed order's estimate moves"] is True
    assert met["carry-over: balanced design's estimates move"] is True
    assert result["effect"]["analysis"]["comparisons"][0]["estimate"] == pytest.approx(-40.0, abs=10.0)
    assert len(result["runs"]["effect"]["blocks"]) == 32 and len(result["runs"]["null"]["blocks"]) == 18
    assert doc_blocks.read(docs, DOCS_BLOCK) == render(result).strip()
    assert "planted effect found: " in done.stdout

    # No effect planted: nothing is found, and the reading says so.
    flat = write_run(tmp_path / "flat", 16, [1, 2], effect=0.0, seed=2)
    done = bench("--effect", str(flat), "--output", str(tmp_path / "flat.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "flat.json").read_text())["readings"][0]["met"] is False


def test_bench_design_refuses_what_is_not_a_finished_design_run(tmp_path: Path) -> None:
    done = bench("--null", str(tmp_path))
    assert done.returncode == 1 and "not a design run" in done.stderr and "Traceback" not in done.stderr
    run = write_run(tmp_path / "cut", 6, [1, 2, 3])
    sequence = next(run.glob("*/sequence.json"))
    record = json.loads(sequence.read_text())
    sequence.write_text(json.dumps(record | {"blocks": record["blocks"][:1]}))
    done = bench("--effect", str(run))
    assert done.returncode == 1 and "--resume" in done.stderr and "Traceback" not in done.stderr
    done = bench()
    assert done.returncode == 2 and "--null RUN" in done.stderr
    done = bench("--null", str(run), "--whole-analyses", "0")
    assert done.returncode == 2 and "--whole-analyses 0" in done.stderr


def test_the_committed_validation_is_its_own_blocks_and_the_docs_are_its_tables() -> None:
    """docs/benchmarks/design.json: every estimate recomputes from the blocks it holds, and docs/benchmarks.md
    shows the tables generated from it."""
    path = ROOT / "docs" / "benchmarks" / "design.json"
    result = json.loads(path.read_text())
    from spikeloop.experiments.design.schedule import Schedule

    for name in ("effect", "null"):
        run = result["runs"][name]
        plan = Schedule.from_json(run["schedule"])
        ids = [c["culture_id"] for c in plan.cultures]
        by_place = {(b["culture"], b["period"]): b for b in run["blocks"]}
        values = [by_place[(b.culture_id, b.period)]["final_return"] for b in plan.blocks()]
        assert [by_place[(b.culture_id, b.period)]["condition"] for b in plan.blocks()] == [
            b.condition for b in plan.blocks()
        ]
        again = analyse(plan, Blocks.from_schedule(plan, values))
        for stored, now in zip(result[name]["analysis"]["comparisons"], again.comparisons, strict=True):
            assert stored["estimate"] == pytest.approx(now.estimate, abs=1e-9)
            assert stored["randomisation_p"] == pytest.approx(now.randomisation_p, abs=1e-12)
        assert len(ids) == result[name]["analysis"]["cultures"]
    assert doc_blocks.read(ROOT / "docs" / "benchmarks.md", DOCS_BLOCK) == render(result).strip()


def test_the_reading_quotes_the_committed_figures() -> None:
    """The prose under the generated tables quotes figures of docs/benchmarks/design.json; each is rebuilt here."""
    result = json.loads((ROOT / "docs" / "benchmarks" / "design.json").read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    reading = " ".join(doc[doc.index(f"<!-- {DOCS_BLOCK}: end -->") :].split())
    effect, null = result["effect"], result["null"]
    first = effect["analysis"]["comparisons"][0]
    per_culture = first["per_culture"]
    quoted = [
        f"fell by {-first['estimate']:.1f} (every one of the {effect['analysis']['cultures']} cultures lower: "
        f"{max(per_culture):.1f} to {min(per_culture):.1f})",
        f"randomisation p was {first['randomisation_p']:.4f} over all {first['assignments']} deals",
        f"within-culture spread was {effect['analysis']['spread']['within_culture']:.1f}, at which the design "
        f"shows {effect['detectable_at_own_spread']:.1f}",
        f"Over all {null['deals']:,} deals",
        f"found a difference after Holm in {null['null']['randomisation_family_wise']['rate']:.1%}",
        f"came to {null['null']['signed_rank_family_wise']['rate']:.1%} (of "
        f"{null['null']['signed_rank_family_wise']['deals']} deals",
        f"Wald p came to {null['null']['mixed_model_family_wise']['rate']:.1%}",
        f"left C1's estimate {-null['carry_over']['balanced_without_term_mean_shift_sd']['1']:.2f} s.d. off",
        f"the randomisation test stayed at {null['carry_over']['balanced_family_wise']['rate']:.1%}",
        f"({null['power']['planted_effect']:.1f}, {null['within_culture']:.1f} within) was found in "
        f"{null['power']['found']:.0%} of the deals",
    ]
    for text in quoted:
        assert text in reading, text
    assert max(per_culture) < 0  # "every one of the cultures lower"
    assert null["carry_over"]["fixed_shift_sd"]["2"] == pytest.approx(1.0)  # "by exactly that s.d."
