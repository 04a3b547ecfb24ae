"""Shape grids: the bucketed values of each op's dynamic dims that tuning measures, the
unaligned probe points between them, and random shapes for validation and evaluation.

Every bucket is a power of two, and kernels with tile-alignment cliffs look better there
than on the lengths real requests have (FA3 at batch 1 ran 1.36x slower than SDPA at
lengths between 512 and 2048 that are not multiples of 128, where the grid saw it win).
So tuning also measures odd values inside each bucket interval (mid-tile, never a power of two
plus one) and one past the last, the value just past each bucket (where a tile sized to the
bucket no longer covers a request), and, for row counts on a GPU, just past the waves that fill
its multiprocessors.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from runtime_loader.ops import OPS
from runtime_loader.table import PAST_GRID  # how far past its largest bucket a grid's shapes are checked

# The named grids: tiny (seconds: tests and smoke runs), small (minutes on a 2-core CPU: the default
# without a GPU), full (the default on a GPU). Per grid, the buckets of the ops keyed by tokens alone;
# the other ops declare theirs with their records (OpSchema.buckets, runtime_loader.ops.<family>).
TOKEN_BUCKETS: dict[str, list[int]] = {
    "tiny": [1, 8],
    "small": [1, 8, 64],
    "full": [1, 4, 16, 64, 256, 1024, 4096, 16384],
}


def _grids() -> dict[str, dict[str, dict[str, list[int]]]]:
    """Per grid: op -> dim -> values; "*" covers the ops keyed by tokens only."""
    return {name: {**{op.name: {dim: list(values) for dim, values in op.buckets[name].items()}
                      for op in OPS.values() if op.buckets and name in op.buckets},
                   "*": {"tokens": tokens}}
            for name, tokens in TOKEN_BUCKETS.items()}


GRIDS = _grids()


@dataclass(frozen=True)
class Grid:
    """Buckets by op (or "*": the ops keyed by tokens alone) and dim: a named grid of GRIDS, or
    one placed at a recorded workload's shapes (lzsolve.models.workload)."""
    name: str
    values: dict[str, dict[str, list[int]]]

    def __str__(self) -> str:
        return self.name


def as_grid(grid: Grid | str) -> Grid:
    return grid if isinstance(grid, Grid) else Grid(grid, GRIDS[grid])


def default_grid(device_type: str, quick: bool = False) -> str:
    """The grid a tune measures unless told: full on a GPU, small on a CPU; with quick (tune --quick),
    the next smaller one (small, tiny)."""
    if quick:
        return "small" if device_type == "cuda" else "tiny"
    return "full" if device_type == "cuda" else "small"


def buckets(grid: Grid | str, op: str) -> dict[str, list[int]]:
    per_op = as_grid(grid).values
    values = per_op.get(op, per_op.get("*"))
    if values is None:
        raise KeyError(f"grid {grid} has no buckets for {op}")
    return {dim: values[dim] for dim in OPS[op].dynamic}


def workloads(grid: Grid | str, op: str) -> list[dict[str, int]]:
    """Every point of the grid for `op`, as {dim: value}."""
    dims = buckets(grid, op)
    return [dict(zip(dims, point)) for point in itertools.product(*dims.values())]


def _odd(value: float) -> int:
    """The odd integer at or just above `value`: aligned to no tile size."""
    n = max(1, round(value))
    return n if n % 2 else n + 1


# Where inside a bucket interval (as fractions of its log width) the probes sit: the golden
# section points, 1 - 1/phi and 1/phi. Never a power of two between power-of-two buckets (the
# geometric middle of 128 and 512 is 256, and its odd neighbour 257 is where every 128-wide tile
# kernel, the fallback too, has just paid for one more tile: probes placed there alone showed
# SDPA at its worst and let FA3 take small prefills where it runs 3-6% slower mid-tile,
# benchmarks/device.sh decisions); those tile edges are edge_values' job.
INSIDE = ((3 - math.sqrt(5)) / 2, (math.sqrt(5) - 1) / 2)


def probe_values(values: list[int]) -> list[int]:
    """Per interval between neighbouring buckets, the odd values at its golden section points
    (INSIDE), and one odd value past the largest bucket."""
    values = sorted(values)
    inside = {_odd(lo * (hi / lo) ** f) for lo, hi in zip(values, values[1:]) for f in INSIDE}
    probes = {p for p in inside if values[0] < p < values[-1]}
    probes.add(_odd(values[-1] * PAST_GRID))
    return sorted(probes - set(values))


ROW_DIMS = ("tokens",)  # one row per CTA in row ops (FlashInfer's RMSNorm): they run in waves of the SMs


def edge_values(values: list[int], units: int | None = None) -> list[int]:
    """The first values a cliff can show at, none a bucket: one past each bucket (a kernel tiled for
    16 tokens runs two tiles at 17: the lm_head's Triton GEMM lost 5.5% to F.linear at 18 tokens,
    benchmarks/device.sh decisions), and with `units` (SMs) one past each wave of units x 2^j rows, up to the last
    probe: a kernel with occupancy k runs its (k x SMs + 1)-th row in a second wave (FlashInfer's
    RMSNorm at 8192 wide, two CTAs per SM on 132 SMs: 4.5 us at 256 tokens, 6.1 us at 279)."""
    top = max(values) * PAST_GRID
    waves = itertools.takewhile(lambda rows: rows < top, (units * 2 ** j for j in itertools.count())) if units else ()
    return sorted(e for e in {v + 1 for v in [*values, *waves]} - set(values) if e <= top)


def probe_points(grid: Grid | str, op: str, units: int | None = None) -> list[dict[str, int]]:
    """Off-grid points for `op`: every combination of the values each dim takes (its buckets,
    probe values and edge values, with `units` for row dims) with at least one dim off the grid.
    Cliffs depend on several dims at once (tiles x heads x batch against the SM count), so an edge
    is probed at every value of the other dims, not at their buckets alone: past the largest batch
    bucket, SDPA's second tile at seq 129 spills into a second wave that FA3's persistent
    scheduler does not pay (1.26x at 11x145, benchmarks/device.sh decisions), and only an edge probe at batch
    9 or 13 shows it."""
    dims = buckets(grid, op)
    values = {d: sorted({*v, *probe_values(v), *edge_values(v, units if d in ROW_DIMS else None)})
              for d, v in dims.items()}
    return [dict(zip(values, point)) for point in itertools.product(*values.values())
            if any(point[i] not in dims[d] for i, d in enumerate(dims))]


def random_points(dims: dict[str, list[int]], n: int, rng: random.Random) -> list[dict[str, int]]:
    """Up to `n` distinct shapes, each dim drawn log-uniformly between its smallest bucket and
    PAST_GRID times its largest: mostly values that are no bucket and no power of two."""
    points: list[dict[str, int]] = []
    for _ in range(20 * n):
        if len(points) == n:
            break
        point = {d: max(1, round(math.exp(rng.uniform(math.log(min(v)), math.log(max(v) * PAST_GRID)))))
                 for d, v in dims.items()}
        if point not in points:
            points.append(point)
    return points


NEAR = 1.5  # a shape's neighbourhood: each dim within this factor of its value


def points_near(center: dict[str, int], n: int, rng: random.Random) -> list[dict[str, int]]:
    """Up to `n` distinct shapes around `center` (each dim log-uniform within NEAR times its
    value), none equal to it: where a table lost, what is around the loss."""
    return [p for p in random_points({d: [max(1, round(v / NEAR)), max(1, round(v * NEAR / PAST_GRID))]
                                      for d, v in center.items()}, n + 1, rng) if p != center][:n]

