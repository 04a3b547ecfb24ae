"""Reading and validating dispatch.json: data in, nothing imported or evaluated.

Every kernel id a tree names is resolved through the registry; every dim and
threshold is checked against the op schema. Anything off raises TableError,
which `load` turns into a fallback-only dispatcher (or re-raises when strict).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import registry, safeio
from .dtypes import DTYPES
from .ops import OPS, Signature
from .safeio import json_depth, one_line, shown
from .schema import MAX_PROBLEMS, first_dispatch_problem, same_json

SCHEMA_VERSION = 1
MAX_TREE_DEPTH = 32
# How far past its largest bucket a table was checked: the tune's probes and validation, and
# `lzsolve evaluate --random`, draw shapes up to this factor beyond it. Calls further out are
# outside what was measured, and the Dispatcher serves them with the fallback.
PAST_GRID = 1.5
LABEL_CHARS = 256  # of a hardware field or a kernel's version (the longest real one: ~60)


class TableError(ValueError):
    """The artifact cannot be trusted; the message says why in one line (escaped and bounded: it
    may echo the artifact's data, and ends up in a server's log)."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(message))


@dataclass(frozen=True)
class Leaf:
    kernel_id: str
    # the runner-ups the solver measured within a margin of kernel_id, best first, each with
    # time(runner-up) / time(kernel_id) over the leaf's points: who serves when kernel_id cannot
    # (avoided by policy, stale, or failing); the fallback after them. Empty in older tables.
    ranked: tuple[tuple[str, float], ...] = ()
    gain: float | None = None  # time(fallback) / time(kernel_id) over the leaf's points, as solved


@dataclass(frozen=True)
class Split:
    dim: str
    threshold: float
    le: Leaf | Split
    gt: Leaf | Split


def tuned_range(buckets: dict) -> dict[str, dict[str, float]]:
    """op -> dynamic dim -> the largest value a table was checked at (PAST_GRID past its buckets)."""
    return {op: {dim: max(values) * PAST_GRID for dim, values in dims.items() if values}
            for op, dims in buckets.items()}


def leaf_for(node: Leaf | Split, dims: dict) -> Leaf:
    """Walk a tree to the leaf that serves these dynamic dims (<= threshold goes left)."""
    while isinstance(node, Split):
        node = node.le if dims[node.dim] <= node.threshold else node.gt
    return node


def choose(node: Leaf | Split, dims: dict) -> str:
    """The kernel id a tree names for these dynamic dims."""
    return leaf_for(node, dims).kernel_id


@dataclass(frozen=True)
class Table:
    source: str
    raw: dict
    hardware: dict
    trees: dict[Signature, Leaf | Split]
    kernels: dict[str, dict]  # kernel id -> library, version and capabilities hash it was measured with
    jit: dict | None  # {"archive": "jit/....tar", "caches": [...]} when JIT caches travel


def _known(kernel_id, sig: Signature, resolve: bool = True) -> str:
    if not isinstance(kernel_id, str) or resolve and not registry.known(kernel_id):
        raise TableError(f"{sig}: unknown kernel id {shown(kernel_id)} (not in this runtime's registry)")
    return kernel_id


def _parse_node(node, sig: Signature, depth: int, resolve: bool = True) -> Leaf | Split:
    if depth > MAX_TREE_DEPTH:
        raise TableError(f"{sig}: tree deeper than {MAX_TREE_DEPTH}")
    if not isinstance(node, dict):
        raise TableError(f"{sig}: tree node is not an object")
    if "kernel_id" in node:
        kernel_id = _known(node["kernel_id"], sig, resolve)
        ranked = tuple((_known(r.get("kernel_id"), sig, resolve), _finite(r.get("ratio"), f"{sig}: a ranked ratio"))
                       for r in node.get("ranked") or ())
        gain = node.get("gain")
        return Leaf(kernel_id, ranked, None if gain is None else _finite(gain, f"{sig}: a leaf's gain"))
    dim, threshold = node.get("dim"), node.get("threshold")
    if dim not in sig.schema.dynamic:
        raise TableError(f"{sig}: split on {shown(dim)}, which is not a dynamic dim of {sig.op}")
    return Split(dim, _finite(threshold, f"{sig}: split threshold"), _parse_node(node.get("le"), sig, depth + 1, resolve),
                 _parse_node(node.get("gt"), sig, depth + 1, resolve))


def finite_number(value) -> float | None:
    """value as a float, where it is a number a float holds; None for anything else (a bool, NaN, an
    infinity, an integer past a float's range, which raises OverflowError in float() and
    math.isfinite alike, or no number at all)."""
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _finite(value, what: str) -> float:
    number = finite_number(value)
    if number is None:
        raise TableError(f"{what} {shown(value)} is not a finite number")
    return number


def _buckets_problem(buckets: dict, ops: set[str]) -> str | None:
    """Where the grid a table was tuned at (its buckets) is not one load's warm-up and checks can
    walk: for each op the table serves, every dynamic dim (those its trees split on and its calls
    take), each value an integer up to MAX_BUCKET, at most MAX_GRID_POINTS points."""
    for op in sorted(ops & set(buckets)):
        dims = buckets[op]
        if dims and set(dims) != set(OPS[op].dynamic):
            return f"buckets[{op}] name {shown(sorted(dims))}, not {op}'s dynamic dims {list(OPS[op].dynamic)}"
        if any(not 1 <= value <= MAX_BUCKET for values in dims.values() for value in values):
            return f"buckets[{op}] hold a value past {MAX_BUCKET:,}"
        if math.prod(len(values) for values in dims.values()) > MAX_GRID_POINTS:
            return f"buckets[{op}] make over {MAX_GRID_POINTS:,} grid points"
    return None


def _parse_signature(entry) -> Signature:
    if not isinstance(entry, dict):
        raise TableError("an ops entry is not an object")
    op, static, flags, dtype = entry.get("op"), entry.get("static"), entry.get("flags", []), entry.get("dtype")
    if op not in OPS or not isinstance(static, dict) or not isinstance(flags, list) or dtype not in DTYPES:
        raise TableError(f"malformed op entry {shown(entry.get('signature', op))}")
    try:
        return Signature.from_data(op, static, flags, dtype)
    except (ValueError, TypeError) as e:
        raise TableError(f"malformed op entry {shown(entry.get('signature', op))}: {e}") from None


def leaf_kernels(leaf: Leaf) -> tuple[str, ...]:
    """The kernels a leaf may be served by, in order: its choice, then its ranked runner-ups."""
    return (leaf.kernel_id, *(kernel_id for kernel_id, _ in leaf.ranked))


def leaves(node: Leaf | Split):
    """The leaves of a tree, left to right (without recursion: a nested generator per level made
    this cost nodes x depth)."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, Leaf):
            yield node
        else:
            stack += (node.gt, node.le)


MAX_JSON_DEPTH = MAX_TREE_DEPTH + 8  # table > ops > entry > tree > 32 levels of nodes
MAX_TABLE_BYTES = 8 << 20  # a tuned model's dispatch.json is tens to hundreds of KB
MAX_OPS = 4096  # one entry per op signature of one model: tens (checked before the schema, whose cost grows with it)
# Tree nodes and ranked runner-ups in all: a solved tree has at most 2 ** lzsolve.decide.solve.MAX_DEPTH
# leaves (depth 4: 31 nodes, each leaf ranking at most 3 runner-ups), and the largest plan of the
# catalogue has 21 op signatures (qwen3.5-0.8b), so a real table holds at most about 650 nodes and
# 1,000 ranked entries (the tests' tuned tiny Llama at tp 2: 45 in all, for 11 signatures). 16,384
# leaves room for tables ten times the largest and bounds what the schema and the parse walk:
# 130,000 nodes under the byte limit took 4-15 s (issue 55).
MAX_TREE_NODES = 1 << 14
# JSON values in all (safeio.parse_json counts them before decoding: 8 MiB of empty objects decode to
# 2.8 million of them, 300 MB, and the schema visits each value): the tests' tuned tiny Llama's table
# holds 1,139 for 11 op signatures (1,358 counted), so 262,144 leaves room for hundreds of signatures
MAX_TABLE_VALUES = 1 << 18
# An op's grid points (the product of its dims' bucket counts), which load(warmup=True) and verify=True
# walk: the default GPU grid's largest is attention's, under 300; two lists of 40,000 values (1.6e9
# points, under MAX_TABLE_VALUES) kept a warm-up from returning
MAX_GRID_POINTS = 1 << 14
MAX_BUCKET = 1 << 40  # a token count or a cache length: floats hold it exactly, and 10**400 overflowed them


def _count_nodes(ops: list) -> int:
    """The tree nodes and ranked entries of the op entries, counted on data not validated yet,
    stopping just past MAX_TREE_NODES (a subtree shared in memory counts once per path)."""
    count, stack = 0, [entry.get("tree") for entry in ops if isinstance(entry, dict)]
    while stack and count <= MAX_TREE_NODES:
        node = stack.pop()
        if isinstance(node, dict):
            ranked = node.get("ranked")
            count += 1 + (len(ranked) if isinstance(ranked, list) else 0)
            stack += [node[side] for side in ("le", "gt") if side in node]
    return count


def _labels_problem(raw: dict) -> str | None:
    """The hardware signature's and the kernels' provenance strings (a name, a version), which
    warnings echo when the software changed: each printable and at most LABEL_CHARS long (a
    version holding ESC would clear the terminal of the server that logs it)."""
    fields = [("hardware", raw["hardware"])] + [(f"kernels[{shown(k)}]", v) for k, v in raw["kernels"].items()]
    for where, mapping in fields:
        for key, value in mapping.items():
            if isinstance(value, str) and (len(value) > LABEL_CHARS or not value.isprintable()):
                return f"{where}.{shown(key)} is {shown(value)}: not a name or version (printable, at most " \
                       f"{LABEL_CHARS} characters)"
    return None


def parse_table(raw, source: str = "<memory>", depth_checked: bool = False, resolve: bool = True) -> Table:
    """The table `raw` holds, checked (depth_checked: its nesting was, as it was decoded). resolve=False
    checks all but its kernel ids against this process's registry (lzsolve explain reads a table of a
    plugin's kernels without the plugin)."""
    if not isinstance(raw, dict):
        raise TableError("top level is not a JSON object")
    if not depth_checked and json_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise TableError(f"nested deeper than {MAX_JSON_DEPTH} levels (trees are at most {MAX_TREE_DEPTH} deep)")
    version = raw.get("schema_version")
    if not same_json(version, SCHEMA_VERSION):
        raise TableError(f"schema_version {shown(version)} is not supported (this runtime reads {SCHEMA_VERSION})")
    if isinstance(raw.get("ops"), list) and len(raw["ops"]) > MAX_OPS:
        raise TableError(f"{len(raw['ops'])} op entries, over the {MAX_OPS} a table may hold")
    if isinstance(raw.get("ops"), list) and _count_nodes(raw["ops"]) > MAX_TREE_NODES:
        raise TableError(f"over {MAX_TREE_NODES:,} tree nodes and ranked kernels in all (a tuned table holds hundreds)")
    problem, count = first_dispatch_problem(raw)
    if problem:
        more = f" (and {count - 1:,}{'+' if count >= MAX_PROBLEMS else ''} more)" if count > 1 else ""
        raise TableError(f"does not match dispatch.schema.json: {problem}{more}")
    labels = _labels_problem(raw)
    if labels:
        raise TableError(labels)
    trees = {}
    for entry in raw["ops"]:
        sig = _parse_signature(entry)
        if sig in trees:
            raise TableError(f"{sig}: listed twice")
        tree = _parse_node(entry.get("tree"), sig, 0, resolve)
        for kernel_id in dict.fromkeys(k for leaf in leaves(tree) for k in leaf_kernels(leaf)):
            # A table that picks (or ranks) a kernel lacking a required feature lies: refuse it.
            wrong = registry.get(kernel_id).semantic_reasons(sig) if resolve else ()
            if wrong:
                raise TableError(f"{sig}: kernel {kernel_id} cannot compute it ({wrong[0]})")
            if kernel_id not in raw["kernels"]:
                raise TableError(f"{sig}: kernel {kernel_id} has no entry under 'kernels'")
        trees[sig] = tree
    _finite(raw["model"].get("routing_skew", 0), "model.routing_skew")  # (evaluate draws MoE routings with it)
    grid = _buckets_problem(raw["buckets"], {sig.op for sig in trees})
    if grid:
        raise TableError(grid)
    return Table(source, raw, raw["hardware"], trees, raw["kernels"], raw.get("jit"))


def read_table(path: str | Path) -> Table:
    """dispatch.json at `path` (or in the folder `path`), through the same checks as `load`: a
    regular file of at most MAX_TABLE_BYTES, JSON at most MAX_JSON_DEPTH deep."""
    path = Path(path)
    file = path / "dispatch.json" if path.is_dir() else path
    return table_from_bytes(safeio.read_regular(file, MAX_TABLE_BYTES, TableError), str(file))


def table_from_bytes(data: bytes, source: str) -> Table:
    raw = safeio.parse_json(data, MAX_JSON_DEPTH, TableError, source, MAX_TABLE_VALUES)
    return parse_table(raw, source, depth_checked=True)
