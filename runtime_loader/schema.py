"""Validation of dispatch.json against dispatch.schema.json, without third-party packages.

The runtime must not depend on more than torch, so this implements the part of
JSON Schema (draft 2020-12) that our schema uses: type, enum, const, required,
properties, additionalProperties, items, minimum, pattern, anyOf and local
$ref. tests/test_schema.py checks it against the `jsonschema` package.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

SCHEMA_PATH = Path(__file__).with_name("dispatch.schema.json")
MAX_DEPTH = 64

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_KNOWN = {"$schema", "$id", "title", "$defs", "type", "enum", "const", "required", "properties",
          "additionalProperties", "items", "minimum", "pattern", "anyOf", "$ref"}


@lru_cache(maxsize=1)
def dispatch_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def errors(value, schema: dict, root: dict | None = None, path: str = "$", depth: int = 0,
           memo: dict | None = None) -> list[str]:
    """Every violation of `schema` by `value`, as 'path: problem' strings (empty: valid).
    Results are memoised per (object, subschema), so data that shares subtrees in memory
    costs its distinct nodes, not its paths."""
    root = root if root is not None else schema
    memo = {} if memo is None else memo
    key = (id(value), id(schema))
    if key not in memo:
        memo[key] = _errors(value, schema, root, path, depth, memo)
    return memo[key]


def _errors(value, schema: dict, root: dict, path: str, depth: int, memo: dict) -> list[str]:
    if depth > MAX_DEPTH:
        return [f"{path}: nested deeper than {MAX_DEPTH}"]
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema uses unsupported keywords {sorted(unknown)}")
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return errors(value, root["$defs"][name], root, path, depth + 1, memo)
    if "anyOf" in schema:
        options = [errors(value, option, root, path, depth + 1, memo) for option in schema["anyOf"]]
        if all(options):
            return [min(options, key=len)[0]]
    found = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            return [f"{path}: expected {' or '.join(types)}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        found.append(f"{path}: {value} is below {schema['minimum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        found.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        found += [f"{path}: missing '{key}'" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                found += errors(item, properties[key], root, f"{path}.{key}", depth + 1, memo)
            elif extra is False:
                found.append(f"{path}: unexpected '{key}'")
            elif isinstance(extra, dict) and not (set(extra) <= _SCALAR_KEYWORDS and _scalar_ok(item, extra)):
                found += errors(item, extra, root, f"{path}.{key}", depth + 1, memo)
    if isinstance(value, list) and "items" in schema:
        items = schema["items"]
        for i, item in enumerate(value):
            if set(items) <= _SCALAR_KEYWORDS and _scalar_ok(item, items):
                continue  # the common case, checked without a path string or a memo entry per item
            found += errors(item, items, root, f"{path}[{i}]", depth + 1, memo)
    return found


_SCALAR_KEYWORDS = {"type", "minimum"}


def _scalar_ok(value, schema: dict) -> bool:
    """Whether `value` passes a schema of only type and minimum (flags, bucket values, static dims:
    a hostile table may hold millions of them, and validation must stay fast)."""
    types = schema.get("type", ())
    types = [types] if isinstance(types, str) else types
    if types and not any(_TYPES[t](value) for t in types):
        return False
    return "minimum" not in schema or not _TYPES["number"](value) or value >= schema["minimum"]


def validate_dispatch(table) -> list[str]:
    return errors(table, dispatch_schema())
