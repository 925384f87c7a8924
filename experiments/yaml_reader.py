"""The YAML reader of experiment files: strict where YAML is silent, YAML where a plain reader is not.

A key given twice in one mapping is refused (YAML keeps the last, silently); 3e-4 and 1e7 are numbers, as
in YAML 1.2 (YAML 1.1 reads them as text); merge keys (`<<: *anchor`) are
YAML and are read, with the mapping's own keys overriding the merged ones; a list or mapping used as a key
(`? [a, b]`) is refused naming the key path it sits under, since no setting is named so.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from spikeloop.experiments.schema_types import shown_path

MERGE_TAG = "tag:yaml.org,2002:merge"


class KeyNotAName(yaml.constructor.ConstructorError):
    """A list or mapping used as a key; `where` is the `key.path: problem (line N)` line a refusal prints."""

    where = ""


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader refusing a key given twice in one mapping, and a key that is not a name."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    # Only the mapping's own keys must differ from each other: they override what a merge key brings.
    own = [key_node for key_node, _ in node.value if key_node.tag != MERGE_TAG]
    loader.flatten_mapping(node)
    for key_node in own:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (list, dict)):
            kind = "list" if isinstance(key, list) else "mapping"
            raise KeyNotAName(
                None,
                None,
                f"a {kind} is used as a key; a key is a setting's name: write `name: value`",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# YAML 1.2 reads 3e-4 and 1e7 as numbers; PyYAML (YAML 1.1) as text, which a number setting now refuses.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """The data of YAML `text` (yaml.YAMLError if it is not YAML; KeyNotAName with its key path)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except KeyNotAName as exc:
        mark = exc.problem_mark
        where = yaml_path_at(text, mark.line, mark.column) if mark else ""
        exc.where = f"{where or '(top level)'}: {exc.problem}" + (f" (line {mark.line + 1})" if mark else "")
        raise


def yaml_path_at(text: str, line: int, column: int) -> str:
    """The dotted key path of the mapping holding the node that starts at (line, column) of YAML `text` (0-based,
    as a yaml Mark), read from the parser's events; "" at the top level."""
    frames: list[list[Any]] = []  # per open collection: [is_mapping, key or index, awaiting a key]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        mark = event.start_mark
        if (mark.line, mark.column) == (line, column) and not isinstance(
            event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)
        ):
            return shown_path([f[1] for f in frames[:-1]] + ([] if not frames or frames[-1][0] else [frames[-1][1]]))
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            frames.append([True, None, True] if isinstance(event, yaml.MappingStartEvent) else [False, 0, False])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            frames.pop()
        elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)) and frames and frames[-1][0] and frames[-1][2]:
            frames[-1][1] = getattr(event, "value", None) or "*"
        if frames:  # a node is done: a mapping now awaits its value or its next key; a list its next item
            top = frames[-1]
            if top[0]:
                top[2] = not top[2]
            else:
                top[1] += 1
    return ""
