""" "Did you mean `port`?" for an unknown kiln.toml key.

Owns ``known_keys`` (the keys a table of the configuration model accepts,
found by walking the error's location through the pydantic models: model
fields, ``dict`` values, ``list`` items, optional and union members) and
``suggestion`` (the closest of them by ``difflib``, or nothing when none is
close).  Pure: standard library and pydantic only; it reads the model
classes, never a file.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

MAX_DEPTH = 16  # a key path deeper than any table of kiln.toml
MAX_KEY_CHARS = 200  # an overlong unknown key is not compared at all
CUTOFF = 0.6


def _field_keys(model: type[BaseModel]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        keys[name] = info.annotation
        if isinstance(info.alias, str):
            keys[info.alias] = info.annotation
    return keys


def _members(annotation: Any) -> list[Any]:
    """The types an annotation may hold (Optional / Union / Annotated unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def _step(annotation: Any, key: int | str) -> Any:
    """The annotation one location step below ``annotation``, or None."""
    for member in _members(annotation):
        origin = typing.get_origin(member)
        if isinstance(member, type) and issubclass(member, BaseModel) and isinstance(key, str):
            if key in (fields := _field_keys(member)):
                return fields[key]
        elif origin in (dict, Mapping):
            args = typing.get_args(member)
            return args[-1] if args else None
        elif origin in (list, tuple, Sequence) and isinstance(key, int):
            args = typing.get_args(member)
            return args[0] if args else None
    return None


def known_keys(model: type[BaseModel], table: Sequence[int | str]) -> list[str]:
    """The keys the table at location ``table`` accepts (empty when unknown)."""
    annotation: Any = model
    for key in list(table)[:MAX_DEPTH]:
        annotation = _step(annotation, key)
        if annotation is None:
            return []
    return sorted(
        {
            key
            for member in _members(annotation)
            if isinstance(member, type) and issubclass(member, BaseModel)
            for key in _field_keys(member)
        }
    )


def suggestion(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The known key closest to the unknown last key of ``loc``, or None."""
    if not loc or not isinstance(loc[-1], str) or len(loc[-1]) > MAX_KEY_CHARS:
        return None
    close = difflib.get_close_matches(loc[-1], known_keys(model, loc[:-1]), n=1, cutoff=CUTOFF)
    return close[0] if close else None
