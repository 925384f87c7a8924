"""`spikeloop analyze` on runs whose unit is a culture: a design's run, and a sweep that ran on real dishes.

A design's run directory holds `schedule.json` (the orders as dealt) and, per culture, a trial directory with
`sequence.json` (each block's final-window return and kill rate). Its blocks go to the crossover analysis
(crossover.py) as they are, with the culture as the unit.

A sweep without a design whose devices are real (cl1) ran every trial on the same dishes, one trial after
another in Tune's order: its trials are repeated measures of those cultures, not independent units. Its
trials are read as the blocks of a fixed order on those cultures (in the order they started), so the report
is the culture-level one, and says what a fixed order cannot tell apart; no per-trial p-value is given.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from spikeloop.experiments.analysis.crossover import Analysis, Blocks, analyse, lines
from spikeloop.experiments.design.schedule import Condition, Schedule
from spikeloop.experiments.strict_json import json_safe
from spikeloop.experiments.trial_files import SCHEDULE_FILE, SEQUENCE_FILE

METRICS = {"final_return": "final return (last 100 episodes of the block)", "final_kill_rate": "kill rate"}
ANALYSIS_FILE = "analysis.json"


def is_design_run(run_dir: Path) -> bool:
    return (run_dir / SCHEDULE_FILE).is_file()


def on_real_cultures(run_dir: Path) -> list[str]:
    """The cl1 device ids of a run's experiment (empty: every device simulated)."""
    path = run_dir / "experiment.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    devices = (data or {}).get("devices") or []
    return [str(d.get("device_id")) for d in devices if isinstance(d, dict) and d.get("backend") == "cl1"]


def design_blocks(run_dir: Path, metric: str, include_unfinished: bool = False) -> tuple[Schedule, Blocks, list]:
    """The schedule and its blocks' values (cultures with every block done; the others named)."""
    plan = Schedule.from_json(json.loads((run_dir / SCHEDULE_FILE).read_text()))
    records = {}
    for path in run_dir.glob(f"*/{SEQUENCE_FILE}"):
        record = json.loads(path.read_text())
        records[record["culture_id"]] = record
    expected = len(plan.cultures[0]["sequence"])
    missing = []
    for culture in plan.cultures:
        done = len(records.get(culture["culture_id"], {}).get("blocks", []))
        if done < expected:
            missing.append(f"{culture['culture_id']}: {done} of {expected} blocks")
    if missing and not include_unfinished:
        raise ValueError(
            f"{run_dir}: not every culture has finished its blocks ({'; '.join(missing)}): resume the run "
            "(`spikeloop tune EXP --resume`), or add --include-unfinished to analyse the cultures that have"
        )
    if missing:
        complete = [c for c in plan.cultures if len(records.get(c["culture_id"], {}).get("blocks", [])) >= expected]
        if not complete:
            raise ValueError(f"{run_dir}: no culture has finished its blocks yet ({'; '.join(missing)})")
        plan = Schedule(plan.order, plan.seed, plan.conditions, complete, plan.repeats, plan.rows)
    values = []
    for block in plan.blocks():
        entry = next(b for b in records[block.culture_id]["blocks"] if b["period"] == block.period)
        value = entry.get(metric)
        if value is None:
            raise ValueError(
                f"{run_dir}: culture {block.culture_id}'s block {block.period + 1} ({entry['directory']}) finished "
                f"no episode, so it has no {metric}; give the blocks a budget of several episodes"
            )
        values.append(float(value))
    return plan, Blocks.from_schedule(plan, values), missing


def sweep_as_blocks(data, run_dir: Path, metric: str) -> tuple[Schedule, Blocks]:
    """A hardware sweep's trials as the blocks of one culture (its dishes), in the order the trials started."""
    from spikeloop.experiments.analysis.runs import RESULT_FILE

    def started(source: str) -> float:
        path = Path(source) / RESULT_FILE
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        return float(rows[0]["timestamp"] - rows[0].get("time_total_s", 0.0)) if rows else math.inf

    units = sorted(data.units, key=lambda u: started(u.source))
    configurations = data.configurations
    conditions = [
        Condition(i, dict(zip(data.factors, configuration, strict=True)))
        for i, configuration in enumerate(configurations)
    ]
    order = [configurations.index(u.configuration) for u in units]
    devices = ", ".join(on_real_cultures(run_dir))
    plan = Schedule(
        "fixed",
        0,
        conditions,
        [{"culture_id": devices, "device": devices, "culture_seed": None, "sequence": order}],
        1,
        [order],
    )
    return plan, Blocks.from_schedule(plan, [u.final(metric) for u in units])


def report(plan: Schedule, analyses: dict[str, Analysis], notes: list[str]) -> list[str]:
    out: list[str] = []
    for metric, analysis in analyses.items():
        out.append(f"{METRICS[metric]}:")
        out += ["  " + line for line in lines(plan, analysis)]
    return out + [f"note: {n}" for n in notes]


def write(run_dir: Path, plan: Schedule, analyses: dict[str, Analysis], notes: list[str], out_dir: Path | None) -> Path:
    """analysis.json (and the printed text as analysis.md) in the run directory or `out_dir`."""
    target = out_dir or run_dir
    target.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "unit": "culture",
        "schedule": plan.to_json(),
        "notes": notes,
        "metrics": {metric: analysis_json(analysis) for metric, analysis in analyses.items()},
    }
    path = target / ANALYSIS_FILE
    path.write_text(json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")
    (target / "analysis.md").write_text("```\n" + "\n".join(report(plan, analyses, notes)) + "\n```\n")
    return path


def analysis_json(analysis: Analysis) -> dict[str, Any]:
    """An analysis as its JSON files hold it (analysis.json, docs/benchmarks/design.json)."""
    return json_safe(asdict(analysis))


def analyse_run(run_dir: Path, data=None, include_unfinished: bool = False, alpha: float = 0.05):
    """(schedule, {metric: Analysis}, notes) of a design run, or of a sweep on real cultures (`data`: its
    SweepData)."""
    analyses: dict[str, Analysis] = {}
    notes: list[str] = []
    for metric in METRICS:
        if data is None:
            plan, blocks, missing = design_blocks(run_dir, metric, include_unfinished)
            if missing:
                notes.append("analysed without the unfinished cultures (" + "; ".join(missing) + ")")
        else:
            plan, blocks = sweep_as_blocks(data, run_dir, metric)
        analyses[metric] = analyse(plan, blocks, alpha)
    if data is not None:
        notes.insert(
            0,
            f"every trial ran on the same dish(es) ({plan.cultures[0]['culture_id']}), one after another: the "
            "trials are repeated measures of one culture, not independent units, so no test treats them as such; "
            "compare conditions across cultures with a design (`design:` in the experiment)",
        )
    return plan, analyses, sorted(set(notes), key=notes.index)
