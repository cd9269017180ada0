"""Reading the result dataclasses back from plain JSON data, each field checked against its annotation.

``build(cls, data, where)`` makes one dataclass from a dict: a missing field without a default, or a value
of the wrong type, raises ReportFormatError naming it by ``where`` (``ranks[0].extra.comm.by_type[2].calls``).
A field annotated with a dataclass (``X``, ``X | None``) or a tuple of one (``tuple[X, ...]``) is built from
its dict (dicts) the same way, so a section of the report reads back in one call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any


class ReportFormatError(ValueError):
    """A report document that does not have the shape of skalpel.report/1; the message names the field."""


def build(cls: type, data: Any, where: str, *, check: bool = True) -> Any:
    """Construct a dataclass from a dict, checking each field's type (``check``); unknown keys are ignored.

    ``check=False`` only builds: for figures the analyses just gave (numpy scalars among them), not a file.
    """
    if not isinstance(data, dict):
        raise ReportFormatError(f"{where}: expected an object, got {kind(data)}")
    hints = _hints(cls)
    values = {}
    for spec in dataclasses.fields(cls):
        if spec.name not in data:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ReportFormatError(f"{where}: the field '{spec.name}' is missing")
            continue
        value, hint, at = data[spec.name], hints[spec.name], f"{where}.{spec.name}"
        row, inner = _row_class(hint), _inner_class(hint)
        if row is not None and isinstance(value, (list, tuple)):
            value = tuple(item if isinstance(item, row) else build(row, item, f"{at}[{i}]", check=check)
                          for i, item in enumerate(value))  # fmt: skip
        elif inner is not None and isinstance(value, dict):
            value = build(inner, value, at, check=check)
        elif isinstance(value, list):
            value = tuple(tuple(item) if isinstance(item, list) else item for item in value)
        values[spec.name] = checked(value, hint, at) if check else value
    return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _row_class(hint: Any) -> type | None:
    """``X`` for a field annotated ``tuple[X, ...]`` (or ``... | None``) with ``X`` a dataclass."""
    hint = _optional(hint)
    args = typing.get_args(hint)
    if typing.get_origin(hint) is not tuple or len(args) != 2 or args[1] is not Ellipsis:
        return None
    return args[0] if dataclasses.is_dataclass(args[0]) else None


def _inner_class(hint: Any) -> type | None:
    """``X`` for a field annotated ``X`` or ``X | None`` with ``X`` a dataclass."""
    hint = _optional(hint)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _optional(hint: Any) -> Any:
    """``X`` for ``X | None``; any other annotation as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return found[0] if len(found) == 1 else hint
    return hint


def checked(value: Any, hint: Any, where: str) -> Any:
    if not _conforms(value, hint):
        raise ReportFormatError(f"{where}: expected {_describe(hint)}, got {kind(value)}")
    return value


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's annotation (lists stand for tuples; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return _writable(value)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and _writable(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and _writable(value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())  # fmt: skip
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(item, args[0]) for item in value)
        return len(value) == len(args) and all(_conforms(item, arg) for item, arg in zip(value, args))
    return isinstance(value, hint) if isinstance(hint, type) else True


def _writable(value: Any) -> bool:
    """Whether the report can write ``value`` back as JSON: integers within 64 bits, finite numbers, at any depth."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_writable(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return all(_writable(item) for item in value)
    return True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is tuple or origin is list:
        return "a list"
    if origin is dict:
        return "an object"
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false", type(None): "null"}.get(
        hint, f"a {getattr(hint, '__name__', hint)} object"
    )


def kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            tuple: "a list", dict: "an object"}.get(type(value), type(value).__name__)  # fmt: skip


def items(data: dict, key: str, where: str) -> list | tuple:
    """``data[key]``, a list (none: empty)."""
    value = data.get(key, ())
    if not isinstance(value, (list, tuple)):
        raise ReportFormatError(f"{where + '.' if where else ''}{key}: expected a list, got {kind(value)}")
    return value


def required(data: dict, key: str, where: str) -> Any:
    if key not in data:
        raise ReportFormatError(f"{where + '.' if where else ''}{key}: the field is missing")
    return data[key]
