"""run_log.scalars: the per-name feedback telemetry becomes `feedback/...` tags however RLlib nests its keys."""

from __future__ import annotations

from spikeloop.experiments.dotted import flatten
from spikeloop.experiments.run_log import scalars
from spikeloop.models.closed_loop.sent_feedback import FEEDBACK_BY_NAME


def test_flatten_joins_nested_keys_and_keeps_lists_as_values() -> None:
    tree = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": "x"}
    assert flatten(tree) == {"a.b": 1, "a.c.d": [1, 2], "e": "x"}
    assert flatten(tree, "/") == {"a/b": 1, "a/c/d": [1, 2], "e": "x"}
    assert flatten({}) == {}


def test_feedback_metrics_nested_or_flat_become_feedback_tags() -> None:
    culture, by_name = FEEDBACK_BY_NAME.strip("/").split("/")
    result = {
        "env_runners": {
            culture: {by_name: {"reward_positive": {"count": 3, "freq_scale": 0.5}}},
            f"{FEEDBACK_BY_NAME}step/count": 2,
            f"{FEEDBACK_BY_NAME}step/amp_scale": float("nan"),  # not finite: left out
        }
    }
    tags = {k: v for k, v in scalars(result).items() if k.startswith("feedback/")}
    assert tags == {
        "feedback/reward_positive/count": 3.0,
        "feedback/reward_positive/freq_scale": 0.5,
        "feedback/step/count": 2.0,
    }
