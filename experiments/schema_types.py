"""What each value of an experiment must be, read from the settings' declared types before validation.

Pydantic's lax mode turns text into numbers ("20000" -> 20000), booleans into numbers (YAML 1.1 `yes` -> 1) and
2.0 into 2, and a settings dataclass's own check then sees the converted value and blames it under another
name (`window_ticks=1`). Here each value is read against its field's type first: a number takes a number only,
a whole number a whole number only, a switch true or false only; every problem names its key path.

Keys are shown visibly (`shown`): a key holding an invisible or control character (a zero-width space pasted
from a web page) is printed as Python's repr, so the message shows why it is not the key it looks like.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

NUMBERS = (int, float)


def shown(key: Any) -> str:
    """A key as a message prints it: as written, or repr-escaped when it holds a character one cannot see."""
    text = str(key)
    return text if text and text.isprintable() and text.strip() == text else repr(text)


def shown_path(parts: Sequence[Any]) -> str:
    """A dotted key path of `parts`, each shown visibly."""
    return ".".join(shown(p) for p in parts)


def _members(annotation: Any) -> list[Any]:
    """The members of a union (`int | None` -> [int, NoneType]); Annotated is unwrapped; one type -> [it]."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """Field name -> annotation of a pydantic model or a dataclass ({} if its hints cannot be read)."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a hint that cannot be resolved: its values are left to the model's own checks
        return {}
    fields = {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}
    # A dataclass field that is itself a dataclass and written flat in the YAML (a device's `address`).
    for hint in list(fields.values()):
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            fields = _field_types(hint) | fields
    return fields


def _is_model(member: Any) -> bool:
    return isinstance(member, type) and (issubclass(member, BaseModel) or dataclasses.is_dataclass(member))


def _scalar_problem(value: Any, members: list[Any]) -> str | None:
    """What is wrong with a scalar for a field of these types, or None (left to validation)."""
    if any(m is Any or m is object for m in members):
        return None
    literals = [v for m in members if typing.get_origin(m) is Literal for v in typing.get_args(m)]
    # A scalar is never a list or a mapping: those members are for other values (`lr`: a rate or a schedule).
    plain = [m for m in members if typing.get_origin(m) is None and m is not type(None) and not _is_model(m)]
    if value in literals and type(value) in {type(v) for v in literals}:
        return None
    also = f" or one of {', '.join(repr(v) for v in literals)}" if literals else ""
    if plain == [bool] and not isinstance(value, bool):
        if not literals:
            return f"a switch: give true or false (got {value!r})"
        if not isinstance(value, str):  # text is left to validation, which lists the choices
            return f"give one of {', '.join(repr(v) for v in literals)}, or true or false (got {value!r})"
    numeric = [m for m in plain if m in NUMBERS]
    if not numeric or len(numeric) != len(plain):
        return None  # text, lists, mappings also allowed: the field's own validation decides
    whole = float not in numeric
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool):
        return f"a number, not a switch: give {kind}{also} (got {value!r})"
    if isinstance(value, str):
        return f"a number, not text: give {kind}{also}, without quotes (got {value!r})"
    if whole and isinstance(value, float):
        how = ": write it without a decimal point or exponent" if value.is_integer() else ""
        return f"a whole number{how} (got {value!r})"
    return None


def type_problems(data: Any, annotation: Any, path: tuple[Any, ...] = ()) -> list[str]:
    """Every value of `data` that its declared type refuses, as `key.path: problem` lines (unknown keys skipped:
    validation names them)."""
    members = _members(annotation)
    if isinstance(data, Mapping):
        for member in members:
            if _is_model(member):
                fields = _field_types(member)
                return [
                    line
                    for key, value in data.items()
                    if isinstance(key, str) and key in fields
                    for line in type_problems(value, fields[key], (*path, key))
                ]
            if typing.get_origin(member) in (dict, Mapping):
                args = typing.get_args(member)
                inner = args[1] if len(args) == 2 else Any
                return [line for key, value in data.items() for line in type_problems(value, inner, (*path, key))]
        return []
    if isinstance(data, list):
        for member in members:
            origin = typing.get_origin(member)
            if origin in (list, tuple, set, frozenset, Sequence):
                args = typing.get_args(member)
                if origin is tuple and args and args[-1] is not Ellipsis:
                    if len(args) != len(data):
                        return []  # the wrong length: validation says so
                    inners = list(args)
                else:
                    inners = [args[0] if args else Any] * len(data)
                return [
                    line
                    for i, (value, inner) in enumerate(zip(data, inners, strict=True))
                    for line in type_problems(value, inner, (*path, i))
                ]
        return []
    problem = _scalar_problem(data, members)
    return [f"{shown_path(path)}: {problem}"] if problem and path else []
