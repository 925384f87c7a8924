"""The trial's side of the protocol: rest, play (the training loop), rest, then the statistics.

`experiments/runner.py` calls `before_play` once the algorithm is built (unless a resumed trial already
recorded its rest before play) and `after_play` when the play's stop is reached, before the trial's last
report: its result carries the per-trial outcome (`OUTCOME_TAGS`), so that a sweep can compare conditions.
Everything lands in the trial directory: `rest_before.npz`, `rest_after.npz` (experiments/protocol/rest.py)
and `protocol.json` (the phases, the settings and both comparisons; printed at the end).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.experiments.protocol.rest import PHASE_FILES, RestRecord, rest
from spikeloop.experiments.protocol.settings import tick_s, whole
from spikeloop.experiments.protocol.stats import early_late, rest_change
from spikeloop.experiments.strict_json import json_safe

PROTOCOL_FILE = "protocol.json"
OUTCOME_TAGS = {
    "protocol/return_late_minus_early": ("early_late", "return", "late_minus_early"),
    "protocol/return_p": ("early_late", "return", "p_one_sided"),
    "protocol/kill_rate_late_minus_early": ("early_late", "kill_rate", "late_minus_early"),
    "protocol/kill_rate_p": ("early_late", "kill_rate", "p_one_sided"),
    "protocol/early_episodes": ("early_late", "early", "episodes"),
    "protocol/late_episodes": ("early_late", "late", "episodes"),
    "protocol/rest_change_total": ("rest", "groups", "total", "change"),
    "protocol/rest_change_total_p": ("rest", "groups", "total", "p_two_sided"),
}
"""The per-trial outcome, as the trial reports it to Tune (key: the tag with '/' as '_', e.g.
`protocol_return_late_minus_early`) and writes it under "outcome" in protocol.json: where in protocol.json each
comes from. The effect a sweep compares across conditions is `protocol/return_late_minus_early` (late - early
mean return); NaN when a window holds no episode."""


class ProtocolSession:
    """One trial's rest-play-rest session."""

    def __init__(self, experiment, trial_dir: Path) -> None:
        assert experiment.protocol is not None
        self.protocol = experiment.protocol
        self.experiment = experiment
        self.trial_dir = trial_dir
        self.tick_s = tick_s(experiment.devices)
        self.step_s = self.tick_s * experiment.model.same_frame_rounds
        """Culture time of one env step: one exchange per same-frame round."""
        self.resumed = False
        """Whether this driver resumed the trial (its play's env_steps_taken are then only this driver's)."""

    def _path(self, phase: str) -> Path:
        return self.trial_dir / PHASE_FILES[phase]

    def _rest(self, algo, phase: str, seconds: float) -> RestRecord:
        ticks = whole(seconds / self.tick_s)
        print(f"[protocol] {phase}: {ticks} record-only ticks ({ticks * self.tick_s:g} s of culture time)", flush=True)
        record = rest(algo, phase, ticks, self.tick_s)
        record.save(self._path(phase))
        print(
            f"[protocol] {phase}: done in {record.wall_end - record.wall_start:.1f} s, "
            f"{int((~record.answered).sum())} tick(s) unanswered",
            flush=True,
        )
        return record

    def before_play(self, algo, resumed: bool) -> None:
        """Record the rest before play, unless this resumed trial already has it."""
        self.resumed = resumed
        if resumed and self._path("rest_before").exists():
            print("[protocol] rest_before: recorded before the resume; play goes on", flush=True)
            return
        self._rest(algo, "rest_before", self.protocol.rest_before_s)
        print(f"[protocol] play: {self.protocol.play_s:g} s of culture time (whole iterations)", flush=True)

    def after_play(self, algo, episodes_file: Path) -> dict[str, float]:
        """Record the rest after play, compute the statistics, write protocol.json; the outcome metrics."""
        steps = _play_steps(algo)
        unfinished = {runner: counts["unfinished_episode_steps"] for runner, counts in steps.items()}
        after = self._rest(algo, "rest_after", self.protocol.rest_after_s)
        before = RestRecord.load(self._path("rest_before"))
        episodes = _read_episodes(episodes_file)
        rng = np.random.default_rng(self.experiment.seed)
        p = self.protocol
        play = early_late(
            episodes,
            step_s=self.step_s,
            unfinished_steps=unfinished,
            early_s=p.early_s,
            late_s=p.late_s,
            resamples=p.bootstrap_resamples,
            rng=rng,
        )
        result: dict[str, Any] = {
            "design": p.design,
            "condition": p.condition,
            "seed": self.experiment.seed,
            "device_seeds": [d.seed for d in self.experiment.devices],
            "settings": p.model_dump(),
            "condition_applied": _condition_applied(self.experiment),
            "culture_time": {
                "tick_s": self.tick_s,
                "step_s": self.step_s,
                "definition": "one exchange (stimulation or rest tick) lasts the device's artifact wait + "
                "collection window of culture time; a step is one exchange per same-frame round",
            },
            "phases": [
                before.summary(),
                {
                    "phase": "play",
                    "env_steps_taken": sum(counts["env_steps_taken"] for counts in steps.values()),
                    "episodes": len(episodes),
                    "iterations": int(algo.iteration),
                    "culture_s": play["play_s"],
                    "resumed": self.resumed,
                    "wall_start": before.wall_end,
                    "wall_end": after.wall_start,
                },
                after.summary(),
            ],
            "early_late": play,
            "rest": rest_change(
                before,
                after,
                settle_s=p.rest_settle_s,
                block_s=p.rest_block_s,
                resamples=p.bootstrap_resamples,
                rng=rng,
            ),
        }
        result["outcome"] = {tag: _at(result, path) for tag, path in OUTCOME_TAGS.items()}
        (self.trial_dir / PROTOCOL_FILE).write_text(json.dumps(json_safe(result), indent=2, allow_nan=False))
        for line in summary_lines(result):
            print(f"[protocol] {line}", flush=True)
        print(f"[protocol] statistics: {self.trial_dir / PROTOCOL_FILE}", flush=True)
        return {tag: (math.nan if value is None else float(value)) for tag, value in result["outcome"].items()}


def _condition_applied(experiment) -> dict[str, Any]:
    """What the condition made of the experiment's keys, as the run was built (experiments/protocol/settings.py)."""
    culture = experiment.culture_settings()
    return {
        "feedback.enabled": culture.feedback.enabled,
        "model.ablation": experiment.model.ablation,
        "devices.backend": [d.backend for d in culture.devices],
    }


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What the end of a protocol trial prints: both comparisons in a few lines."""
    play = result["early_late"]
    lines = [
        f"{result['condition']}: early play {play['early']['episodes']} episode(s), "
        f"late play {play['late']['episodes']} episode(s)"
    ]
    for name in ("return", "kill_rate"):
        stat = play[name]
        if stat["late_minus_early"] is None:
            lines.append(f"{name}: no episode lies wholly in a window; lengthen protocol.early_s / late_s")
            continue
        low, high = stat["ci95"]
        lines.append(
            f"{name} late - early {stat['late_minus_early']:+.3g} (95% CI {low:+.3g} .. {high:+.3g}; "
            f"early {stat['early_mean']:.3g}, late {stat['late_mean']:.3g}), one-sided Mann-Whitney "
            f"p {stat['p_one_sided']:.3g} ({stat['method']})"
        )
    rest_stats = result["rest"]
    if "error" in rest_stats:
        lines.append(f"rest: {rest_stats['error']}")
        return lines
    total = rest_stats["groups"]["total"]
    low, high = total["ci95"]
    lines.append(
        f"rest after - before, counts per tick: total {total['change']:+.3g} (95% CI {low:+.3g} .. {high:+.3g}, "
        f"p {total['p_two_sided']:.3g}; before {total['before_mean']:.3g}, after {total['after_mean']:.3g})"
    )
    groups = {k: v for k, v in rest_stats["groups"].items() if k != "total"}
    name, stat = min(groups.items(), key=lambda kv: kv[1]["p_holm"])
    lines.append(
        f"rest, the group that changed most surely: {name} {stat['change']:+.3g} (Holm p {stat['p_holm']:.3g}, "
        f"block bootstrap of {rest_stats['block_ticks']} ticks)"
    )
    return lines


def _play_steps(algo) -> dict[int, dict[str, int]]:
    """Per env runner that drives a culture: env steps it took (in this process) and those of its running episode."""

    def here(_runner) -> tuple[int, dict[str, int]] | None:
        from spikeloop.models.closed_loop.callbacks import step_accounting
        from spikeloop.models.closed_loop.link import current_link

        try:
            link = current_link()
        except RuntimeError:
            return None
        return link.runner_index, step_accounting()

    rows = algo.env_runner_group.foreach_env_runner(here, local_env_runner=True)
    return {runner: steps for runner, steps in (r for r in rows if r is not None)}


def _read_episodes(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _at(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
