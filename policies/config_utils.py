"""Dataclass configs <-> plain dicts (what checkpoints carry: no pickled classes)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def to_plain(value: Any) -> Any:
    """A (nested) dataclass / tuple / dict as plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def from_plain(cls: type[T], data: Mapping[str, Any] | T) -> T:
    """Build dataclass ``cls`` from a plain dict (nested dataclass fields recursively).

    Unknown keys raise, so a misspelt setting never passes silently.
    """
    if isinstance(data, cls):
        return data
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} settings {unknown} (known: {sorted(names)})")
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        nested = _dataclass_in(hint)
        if nested is not None and isinstance(value, Mapping):
            value = from_plain(nested, value)
        elif _is_tuple(hint) and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _is_tuple(hint: Any) -> bool:
    if typing.get_origin(hint) is tuple:
        return True
    return any(typing.get_origin(arg) is tuple for arg in typing.get_args(hint))
