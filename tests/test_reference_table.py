"""README's "Differences from the reference trainer" against experiments/reference.yaml and the defaults.

Each row of the section's tables names an experiment key (or says "(no setting)") and gives its value in the
`reference.yaml` and `spikeloop default` columns as a YAML literal in backticks at the start of the cell. The
values must be what reference.yaml and an empty experiment resolve to, and every setting reference.yaml gives
a value other than the default must be a row (or be one of the few that do not concern the reference trainer),
so the README and the file cannot drift apart.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spikeloop.experiments.schema import Experiment, env_section_model, experiment_from_dict, load_experiment

ROOT = Path(__file__).resolve().parent.parent
SECTION = "### Differences from the reference trainer"
NO_SETTING = "(no setting)"
NOT_ABOUT_THE_REFERENCE = {
    "name": "the run's name",
    "devices.0.device_id": "a name",
    "devices.0.backend": "cl1: a device program at host, as the reference's; `--set devices.0.backend=sim` rehearses",
    "env.curriculum.scenarios": "the reference's deadly corridor stages, in the env.curriculum.threshold row",
    "env.curriculum.window_episodes": "the curriculum's rule, in the env.curriculum.threshold row",
}
"""Settings reference.yaml changes from the default that are not a difference from the reference trainer."""


def _rows(markdown: str) -> list[dict[str, str]]:
    """Every row of every table in the section, as {column header: cell}."""
    section = markdown.split(SECTION, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            assert len(cells) == len(header), f"a row with {len(cells)} cells under {len(header)} headers: {line}"
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _literal(cell: str) -> Any:
    """The YAML literal in backticks that starts a value cell."""
    match = re.match(r"`([^`]*)`", cell)
    assert match, f"a value cell must start with a YAML literal in backticks: {cell!r}"
    return yaml.safe_load(match.group(1))


def resolved(plain: dict[str, Any], key: str) -> Any:
    """The value `key` takes in a resolved experiment (`_plain`), defaults filled in (env and ppo keys too)."""
    from spikeloop.models.ppo_config import ClosedLoopPPOConfig

    section, _, rest = key.partition(".")
    if section == "env":
        top, _, deeper = rest.partition(".")
        env_defaults = {name: field.default for name, field in env_section_model().model_fields.items()}
        node = plain["env"].get(top, env_defaults[top])
        for part in deeper.split(".") if deeper else ():
            node = None if node is None else node[part]
        return node
    if section == "ppo" and plain["ppo"].get(rest) is None:
        return getattr(ClosedLoopPPOConfig(), rest)
    node: Any = plain
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) | isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def _leaves(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{prefix}{i}.")]
    return [prefix[:-1]]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return _rows((ROOT / "README.md").read_text(encoding="utf-8"))


def _plain(experiment: Experiment) -> dict[str, Any]:
    """The experiment fully resolved, as the run directory's experiment.yaml writes it."""
    return yaml.safe_load(experiment.to_yaml())


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _plain(load_experiment(ROOT / "experiments" / "reference.yaml"))


@pytest.fixture(scope="module")
def default() -> dict[str, Any]:
    return _plain(experiment_from_dict({}))


def test_every_row_is_what_reference_yaml_and_the_defaults_resolve_to(rows, reference, default) -> None:
    assert len(rows) >= 20
    keyed = 0
    for row in rows:
        assert set(row) == {"area", "key", "reference trainer", "`reference.yaml`", "spikeloop default"}, row
        if row["key"] == NO_SETTING:
            continue
        key = row["key"].strip("`")
        assert row["key"] == f"`{key}`", f"the key cell is `a.key` or {NO_SETTING}: {row['key']!r}"
        for column, experiment in (("`reference.yaml`", reference), ("spikeloop default", default)):
            stated, actual = _literal(row[column]), resolved(experiment, key)
            assert _same(stated, actual), f"README says {key} is {stated!r} in {column}, it resolves to {actual!r}"
        keyed += 1
    assert keyed >= 15


def test_every_setting_reference_yaml_changes_is_in_the_tables(rows, reference, default) -> None:
    listed = {row["key"].strip("`") for row in rows}
    raw = yaml.safe_load((ROOT / "experiments" / "reference.yaml").read_text(encoding="utf-8"))
    changed = [
        key
        for key in _leaves(raw)
        if not _same(resolved(reference, key), resolved(default, key)) and key not in NOT_ABOUT_THE_REFERENCE
    ]
    missing = [key for key in changed if key not in listed]
    assert not missing, f"reference.yaml sets {missing} away from the default, and the README's tables do not say so"


def test_the_parser_reads_tables_and_refuses_a_bad_cell() -> None:
    text = f"{SECTION}\n\n| a | b |\n|---|---|\n| `1` | x \\| y |\n\nprose\n\n| a | b |\n|---|---|\n| y | `[2, 3]` |\n"
    rows = _rows(text)
    assert rows == [{"a": "`1`", "b": "x | y"}, {"a": "y", "b": "`[2, 3]`"}]
    assert _literal(rows[1]["b"]) == [2, 3]
    with pytest.raises(AssertionError, match="YAML literal"):
        _literal("two")
