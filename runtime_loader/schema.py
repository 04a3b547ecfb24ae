"""Validation of dispatch.json against dispatch.schema.json, without third-party packages.

The runtime must not depend on more than torch, so this implements the part of
JSON Schema (draft 2020-12) that our schema uses: type, enum, const, required,
properties, additionalProperties, items, minimum, pattern, anyOf and local
$ref. tests/test_schema.py checks it against the `jsonschema` package.

The schema is compiled once into one closure per subschema, and a value's path is built only
when it is reported: a table's every tree node passes through here, and interpreting the
schema afresh at each node cost tens of microseconds a node (issue 55: 4-15 s for a
130,000-node table; table.MAX_TREE_NODES bounds the nodes, this keeps the bounded cost low).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from .safeio import shown

SCHEMA_PATH = Path(__file__).with_name("dispatch.schema.json")
MAX_DEPTH = 64  # levels of the data (not of the schema, whose $ref and anyOf add none)
MAX_PROBLEMS = 100  # an object's or array's problems past this are not looked for (one is reported)

_CLASSES = {"object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
            "boolean": (bool,), "null": (type(None),)}


def _type_test(types: list[str]) -> Callable[[object], bool]:
    """One isinstance call for a type list (a bool is an int to Python, not to JSON Schema)."""
    classes = tuple(c for t in types for c in _CLASSES[t])
    if "boolean" in types:
        return lambda v: isinstance(v, classes)
    return lambda v: isinstance(v, classes) and not isinstance(v, bool)


_NUMBER = _type_test(["number"])


def same_json(a, b) -> bool:
    """a == b as JSON compares values: true is not 1 and false not 0, as they are to Python."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


_KNOWN = {"$schema", "$id", "title", "$defs", "type", "enum", "const", "required", "properties",
          "additionalProperties", "items", "minimum", "pattern", "anyOf", "$ref"}
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.:=,-]{1,80}")

# (value, its path, its depth in the data, the memo of $ref checks) -> problems, each (path, what);
# empty: valid. A path is "$" or (parent path, key): built in constant time per value, formatted
# only when reported (an anyOf's failing options make problems at every tree node).
Check = Callable[[object, "str | tuple", int, dict], list]
_OK: list = []  # what a passing check returns (never added to: callers add a check's problems to their own list)


def format_path(path) -> str:
    keys = []
    while isinstance(path, tuple):
        path, key = path
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}" if _PLAIN_KEY.fullmatch(key)
                    else f"[{shown(key)}]")
    return path + "".join(reversed(keys))


class _Compiler:
    def __init__(self, root: dict):
        self.root = root
        self.defs: dict[str, Check] = {}

    def ref(self, name: str) -> Check:
        """A $ref: its definition compiled once (the node definition refers to itself: the references
        inside it look it up at call time) and memoised per value, so data that shares subtrees in
        memory costs its distinct nodes, not its paths."""
        if name not in self.defs:
            self.defs[name] = None  # being compiled
            target = self.compile(self.root["$defs"][name])

            def check(value, path, depth, memo):
                slot = (id(value), name)
                if slot not in memo:
                    memo[slot] = target(value, path, depth, memo)
                return memo[slot]
            self.defs[name] = check
        defs = self.defs
        return lambda value, path, depth, memo: defs[name](value, path, depth, memo)

    def compile(self, schema: dict) -> Check:
        unknown = set(schema) - _KNOWN
        if unknown:
            raise ValueError(f"schema uses unsupported keywords {sorted(unknown)}")
        if "$ref" in schema:
            return self.ref(schema["$ref"].removeprefix("#/$defs/"))
        # anyOf and type first: when they fail, their one problem is the value's only one
        stopping = [step for step in (self._any_of(schema), self._type(schema)) if step is not None]
        steps = [step for step in (*self._scalars(schema), self._object(schema), self._array(schema))
                 if step is not None]
        if not stopping and len(steps) == 1:
            return steps[0]

        def check(value, path, depth, memo):
            for step in stopping:
                problems = step(value, path, depth, memo)
                if problems:
                    return problems
            found = []
            for step in steps:
                found += step(value, path, depth, memo)
            return found or _OK
        return check

    def _any_of(self, schema: dict) -> Check | None:
        if "anyOf" not in schema:
            return None
        options = [(self.compile(option), tuple(option.get("required", ()))) for option in schema["anyOf"]]

        def check(value, path, depth, memo):
            results = []
            for option, required in options:
                problems = option(value, path, depth, memo)
                if not problems:
                    return _OK
                # the option whose required keys the value has is the one it meant (a split node
                # with a bad subtree is reported as such, not as a leaf missing its kernel_id)
                meant = isinstance(value, dict) and all(key in value for key in required)
                results.append((not meant, len(problems), problems))
            return [min(results, key=lambda r: r[:2])[2][0]]
        return check

    def _type(self, schema: dict) -> Check | None:
        types = schema.get("type")
        if types is None:
            return None
        types = [types] if isinstance(types, str) else list(types)
        one, wanted = _type_test(types), " or ".join(types)

        def check(value, path, depth, memo):
            if one(value):
                return _OK
            return [(path, f"expected {wanted}, got {type(value).__name__}")]
        return check

    def _scalars(self, schema: dict) -> list[Check]:
        steps = []
        if "const" in schema:
            const = schema["const"]
            steps.append(lambda v, p, d, m: _OK if same_json(v, const) else [(p, f"must be {const!r}")])
        if "enum" in schema:
            enum = schema["enum"]
            steps.append(lambda v, p, d, m: _OK if any(same_json(v, e) for e in enum)
                         else [(p, f"{shown(v)} is not one of {enum}")])
        if "minimum" in schema:
            low = schema["minimum"]
            steps.append(lambda v, p, d, m: [(p, f"{v} is below {low}")] if _NUMBER(v) and v < low else _OK)
        if "pattern" in schema:
            regex = re.compile(schema["pattern"])
            steps.append(lambda v, p, d, m: [(p, f"{shown(v)} does not match {regex.pattern}")]
                         if isinstance(v, str) and not regex.search(v) else _OK)
        return steps

    def _object(self, schema: dict) -> Check | None:
        if not {"required", "properties", "additionalProperties"} & set(schema):
            return None
        required = tuple(schema.get("required", ()))
        properties = {key: self.compile(sub) for key, sub in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)
        extra_check = self.compile(extra) if isinstance(extra, dict) else None
        passing = {key: test for key, sub in schema.get("properties", {}).items() if (test := _passes(sub))}
        extra_passing = _passes(extra) if isinstance(extra, dict) else None

        def check(value, path, depth, memo):
            if not isinstance(value, dict):
                return _OK
            if depth > MAX_DEPTH:
                return [(path, f"nested deeper than {MAX_DEPTH}")]
            found = [(path, f"missing '{key}'") for key in required if key not in value]
            for key, item in value.items():
                test = passing.get(key) if key in properties else extra_passing
                if test is not None and test(item):
                    continue
                sub = properties.get(key, extra_check)
                if sub is not None:
                    found += sub(item, (path, key), depth + 1, memo)
                elif extra is False:
                    found.append((path, f"unexpected {shown(key)}"))
                if len(found) >= MAX_PROBLEMS:
                    break
            return found or _OK
        return check

    def _array(self, schema: dict) -> Check | None:
        if "items" not in schema:
            return None
        items = self.compile(schema["items"])
        test = _passes(schema["items"]) or (lambda item: False)

        def check(value, path, depth, memo):
            if not isinstance(value, list):
                return _OK
            if depth > MAX_DEPTH:
                return [(path, f"nested deeper than {MAX_DEPTH}")]
            found = []
            for i, item in enumerate(value):
                if not test(item):
                    found += items(item, (path, i), depth + 1, memo)
                    if len(found) >= MAX_PROBLEMS:
                        break
            return found or _OK
        return check


def _passes(schema: dict) -> Callable[[object], bool] | None:
    """For a schema of a type (and a minimum) alone, a test that a value passes it, run inline by
    the object or array holding the value: flags, bucket values, static dims and tree thresholds,
    which a table holds by the thousand, cost no call of their own and no path. None otherwise."""
    if not set(schema) <= {"type", "minimum"} or "type" not in schema:
        return None
    test = _type_test([schema["type"]] if isinstance(schema["type"], str) else schema["type"])
    low = schema.get("minimum")
    return test if low is None else lambda v: test(v) and (not _NUMBER(v) or v >= low)


@lru_cache(maxsize=1)
def dispatch_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def compiled(schema: dict) -> Check:
    return _Compiler(schema).compile(schema)


def _report(problems: list, most: int | None = None) -> list[str]:
    return [f"{format_path(path)}: {what}" for path, what in problems[:most]]


def errors(value, schema: dict) -> list[str]:
    """Every violation of `schema` by `value`, as 'path: problem' strings (empty: valid)."""
    return _report(compiled(schema)(value, "$", 0, {}))


@lru_cache(maxsize=1)
def _dispatch_check() -> Check:
    return compiled(dispatch_schema())


def validate_dispatch(table) -> list[str]:
    return _report(_dispatch_check()(table, "$", 0, {}))


def first_dispatch_problem(table) -> tuple[str | None, int]:
    """The first violation of the dispatch schema (None: valid) and how many were found (an object
    or array stops looking past MAX_PROBLEMS), formatting the first alone."""
    problems = _dispatch_check()(table, "$", 0, {})
    return (_report(problems, 1)[0] if problems else None), len(problems)
