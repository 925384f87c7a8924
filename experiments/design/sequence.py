"""One culture's sequence of blocks: the Tune trial of a design.

`spikeloop tune` on an experiment with a `design:` runs one trial per culture; cultures on different devices run
side by side, cultures on one device take turns (the device's resource is held by one trial at a time). A trial
trains each block of its culture's order in turn, into `block-NN-C<condition>/` of its trial directory: a fresh
learner (`fresh: learner`) on the same culture, the condition's settings applied, the block's budget as its stop.
Before every block but the first, the culture rests: `rest_s` of record-only exchanges (no stimulation), kept as
`rest_before.npz` in the block's directory.

`sequence.json` in the trial directory is the culture's record: each block's condition, period, start and end
(wall clock), final-window return and kill rate, and what happened to blocks that did not finish. It is written
after every block, so a killed driver loses at most the block it was in: `--resume` starts that block again
from its start (a block cut short is moved to `abandoned-<time>/`, never deleted, and named in the record,
because the culture has had it).
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from spikeloop.experiments.design.block import Block
from spikeloop.experiments.design.schedule import conditions_of
from spikeloop.experiments.design.settings import DesignSection
from spikeloop.experiments.trial_files import ABANDONED_PREFIX, DESIGN_CULTURE, SEQUENCE_FILE

CULTURE_FILE = "culture.npz"
"""In a trial directory: a simulated culture's state between its blocks (bridge/device/culture_state.py)."""


def trial_name(trial) -> str:
    """A design trial's directory: its culture (Tune's default name would spell out the whole schedule row)."""
    return f"culture-{trial.config[DESIGN_CULTURE]['culture_id']}-{trial.trial_id}"


def block_name(period: int, condition: int) -> str:
    return f"block-{period:02d}-C{condition}"


def block_experiment(
    base: dict[str, Any], culture: dict[str, Any], values: dict[str, Any], state: Path | None = None
) -> dict:
    """The experiment one block trains, but for its stop (the default until the block's budget is known): the
    culture's device alone, one env runner, the condition's values, no design or sweep of its own. A simulated
    culture gets its culture seed and `state`, the file it is kept in from block to block (carry-over)."""
    from spikeloop.experiments.schema import set_path

    data = copy.deepcopy(base)
    data.pop("design", None)
    data["tune"] = {**(data.get("tune") or {}), "search_space": {}, "seeds": 1}
    device = next(d for d in data["devices"] if d.get("device_id", "sim") == culture["device"])
    if culture.get("culture_seed") is not None:
        device["culture_seed"] = culture["culture_seed"]
        if state is not None:
            device["culture_state"] = str(state)
    data["devices"] = [device]
    data.setdefault("resources", {})["num_env_runners"] = 1
    data.pop("stop", None)
    for key, value in values.items():
        set_path(data, key, value)
    return data


def culture_block(base: dict[str, Any], culture: dict[str, Any]):
    """The experiment of the culture's first block (its device, one env runner): what a trial asks Ray for."""
    from spikeloop.experiments.schema import experiment_from_dict

    design = DesignSection.model_validate(base["design"])
    first = conditions_of(design)[culture["sequence"][0]].values
    return experiment_from_dict(
        block_experiment(base, culture, first), source=f"design culture {culture['culture_id']}"
    )


def block_env_steps(design: DesignSection, exchange_s: float, rounds: int) -> int:
    """A block's budget in env steps (block_minutes: the culture time at `exchange_s` per exchange)."""
    if design.block_env_steps is not None:
        return design.block_env_steps
    assert design.block_minutes is not None
    return max(1, round(design.block_minutes * 60.0 / (exchange_s * rounds)))


def read_sequence(trial_dir: Path) -> dict[str, Any]:
    path = trial_dir / SEQUENCE_FILE
    if not path.is_file():
        return {"blocks": [], "abandoned": []}
    return json.loads(path.read_text())


def _write_sequence(trial_dir: Path, record: dict[str, Any]) -> None:
    temporary = trial_dir / (SEQUENCE_FILE + ".tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(temporary, trial_dir / SEQUENCE_FILE)  # never half a record, whenever the driver dies


def _set_aside(trial_dir: Path, directory: Path, record: dict[str, Any], period: int) -> None:
    """A block a stop cut short: its files kept under abandoned-<time>/, the cut named in the record."""
    aside = trial_dir / f"{ABANDONED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{directory.name}"
    directory.rename(aside)
    record["abandoned"].append({"period": period, "directory": aside.name, "set_aside_at": time.time()})


def block_outcome(directory: Path) -> dict[str, Any]:
    """The block's final-window return and kill rate, and its episodes, from its episodes.jsonl."""

    from spikeloop.experiments.analysis.runs import episode_arrays
    from spikeloop.experiments.analysis.sweep import final_window, killed

    arrays = episode_arrays(directory, ["episode_reward", "kill_count"])
    final_return, kill_rate = final_window(arrays["episode_reward"], killed(arrays["kill_count"]))

    def number(value: float) -> float | None:  # JSON has no NaN: a block without episodes has no figure
        return None if math.isnan(value) else value

    return {
        "final_return": number(final_return),
        "final_kill_rate": number(kill_rate),
        "episodes": len(arrays["episode_reward"]),
    }


def run_sequence(tune_config: dict[str, Any], trial_dir: Path, train_block) -> bool:
    """Train the culture's blocks not yet in its record; True when the sequence is complete.

    `train_block(block_tune_config, block, progress)` trains one block (experiments/runner.py's `_train`).
    """
    from spikeloop.experiments.protocol.rest import rest
    from spikeloop.experiments.protocol.settings import tick_s, whole
    from spikeloop.experiments.schema import experiment_from_dict

    base = tune_config["experiment"]
    design = DesignSection.model_validate(base["design"])
    culture = tune_config[DESIGN_CULTURE]
    conditions = conditions_of(design)
    record = read_sequence(trial_dir)
    record.update({"culture_id": culture["culture_id"], "device": culture["device"], "order": culture["sequence"]})
    record.setdefault("culture_seed", culture.get("culture_seed"))
    order = culture["sequence"]
    done = {b["period"] for b in record["blocks"]}
    for period, condition in enumerate(order):
        if period in done:
            continue
        directory = trial_dir / block_name(period, condition)
        if directory.exists():
            _set_aside(trial_dir, directory, record, period)
            _write_sequence(trial_dir, record)
        directory.mkdir()
        data = block_experiment(base, culture, conditions[condition].values, trial_dir / CULTURE_FILE)
        # Resolved once for the exchange's culture time, which the condition could change (its windows, its rounds).
        resolved = experiment_from_dict(data, source=f"block {period + 1} of {culture['culture_id']}")
        exchange_s, rounds = tick_s(resolved.devices), resolved.model.same_frame_rounds
        data["stop"] = {"env_steps": block_env_steps(design, exchange_s, rounds)}
        rest_ticks = whole(design.rest_s / exchange_s) if period > 0 and design.rest_s > 0 else 0

        def before_play(algo, directory=directory, rest_ticks=rest_ticks, exchange_s=exchange_s) -> None:
            if rest_ticks:
                print(f"[design] rest: {rest_ticks} record-only ticks before this block", flush=True)
                rest(algo, "rest_before", rest_ticks, exchange_s).save(directory / "rest_before.npz")

        label = f"[design] {culture['culture_id']} block {period + 1}/{len(order)}: C{condition} {conditions[condition].label}"
        print(label, flush=True)
        started = time.time()
        progress: dict[str, Any] = {"iterations": 0, "trained": 0, "device_lost": False}
        last = period == len(order) - 1
        train_block({"experiment": data}, Block(directory, before_play, last), progress)
        if progress["device_lost"]:
            return False  # the block is cut short: --resume starts it again once the device answers
        record["blocks"].append(
            {
                "period": period,
                "condition": condition,
                "values": conditions[condition].values,
                "directory": directory.name,
                "started": started,
                "ended": time.time(),
                "rest_s": rest_ticks * exchange_s,
                **block_outcome(directory),
            }
        )
        _write_sequence(trial_dir, record)
    return True
