"""JSON: each result's own versioned document, as UTF-8 bytes.

A Report writes ``skalpel.report/1`` and a tune result ``skalpel.tune/1`` themselves (``to_json``);
a DiffResult is written here as ``skalpel.diff/1``. No rich, no HTML: ``--json -`` imports only this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson


class JsonRenderer:
    """A Report or a TuneResult as its JSON document."""

    name = "json"
    extension = ".json"
    binary = True  # orjson's UTF-8, written as it is

    def render(self, result: Any) -> bytes:
        return result.to_json()


class DiffJsonRenderer(JsonRenderer):
    """A DiffResult as ``skalpel.diff/1`` (``diff.schema.json``)."""

    def render(self, result: Any) -> bytes:
        return orjson.dumps(dataclasses.asdict(result), option=orjson.OPT_INDENT_2)
