"""Shape grids: the bucketed values of each op's dynamic dims that tuning measures."""
from __future__ import annotations

import itertools

from runtime_loader.ops import OPS

# Per grid: op -> dim -> values; "*" covers the ops keyed by tokens only.
GRIDS: dict[str, dict[str, dict[str, list[int]]]] = {
    # seconds: for tests and smoke runs
    "tiny": {
        "attention.prefill": {"batch": [1], "seq": [16, 64]},
        "attention.decode": {"batch": [1, 2], "kv_len": [64]},
        "recurrent.gated_deltanet": {"batch": [1], "seq": [1, 16]},
        "*": {"tokens": [1, 8]},
    },
    # minutes on a 2-core CPU: the default without a GPU
    "small": {
        "attention.prefill": {"batch": [1, 2], "seq": [32, 128, 512]},
        "attention.decode": {"batch": [1, 8], "kv_len": [128, 1024]},
        "recurrent.gated_deltanet": {"batch": [1, 8], "seq": [1, 64]},  # seq 1: a decode step on the state
        "*": {"tokens": [1, 8, 64]},
    },
    # the default on a GPU: decode and prefill sizes a server sees. Prefill measures batch 1
    # and 2 both: adapters switch paths there (FlashInfer: single prefill vs paged batch
    # prefill), and a tree fed batch 1 and 4 alone sent batch 2 to the batch-1 winner (1.9x
    # regret on the H100, BENCHMARKS.md §9).
    "full": {
        "attention.prefill": {"batch": [1, 2, 8], "seq": [128, 512, 2048, 8192]},
        "attention.decode": {"batch": [1, 8, 32, 128], "kv_len": [512, 2048, 8192]},
        "recurrent.gated_deltanet": {"batch": [1, 8, 32], "seq": [1, 512, 2048]},
        "*": {"tokens": [1, 4, 16, 64, 256, 1024, 4096, 16384]},
    },
}


def default_grid(device_type: str) -> str:
    return "full" if device_type == "cuda" else "small"


def buckets(grid: str, op: str) -> dict[str, list[int]]:
    per_op = GRIDS[grid]
    values = per_op.get(op, per_op["*"])
    return {dim: values[dim] for dim in OPS[op].dynamic}


def workloads(grid: str, op: str) -> list[dict[str, int]]:
    """Every point of the grid for `op`, as {dim: value}."""
    dims = buckets(grid, op)
    return [dict(zip(dims, point)) for point in itertools.product(*dims.values())]
