"""Dotted keys (`feedback.surprise.enabled`, `devices.0.seed`) into plain experiment data: one reader for all."""

from __future__ import annotations

from typing import Any


def get_path(tree: Any, dotted: str) -> Any:
    """The value at a dotted key of plain experiment data (`env.reward_settings.kill`, list items by index).

    KeyError if absent.
    """
    node: Any = tree
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(dotted)
    return node


def flatten(node: dict[str, Any], separator: str = ".", prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of joined keys (`{"a": {"b": 1}}` -> `{"a.b": 1}`); lists stay values."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flatten(value, separator, path + separator)
        else:
            out[path] = value
    return out
