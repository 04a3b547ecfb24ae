"""Shape grids: buckets, unaligned probes between them, random shapes past them."""
import random

from lzsolve.measure.grid import (
    GRIDS,
    NEAR,
    PAST_GRID,
    buckets,
    edge_values,
    points_near,
    probe_points,
    probe_values,
    random_points,
    workloads,
)
from runtime_loader.ops import OPS


def power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def test_probe_values_are_odd_mid_tile_inside_each_bucket_interval_and_one_past_the_last():
    assert probe_values([1, 4, 16, 64]) == [3, 7, 9, 27, 39, 97]
    assert probe_values([1, 2, 8]) == [3, 5, 13]  # no integer strictly inside (1, 2)
    # never where a 128-wide tile has just been paid for (257 = 2 x 128 + 1 was the old middle)
    assert probe_values([128, 512]) == [217, 303, 769] and all(p % 128 > 16 for p in probe_values([128, 512, 2048])[:-1])
    for values in ([128, 512, 2048, 8192], [1, 8, 32, 128], [1, 4, 16, 64, 256, 1024, 4096, 16384]):
        probes = probe_values(values)
        assert all(p % 2 == 1 and not power_of_two(p) for p in probes)
        for lo, hi in zip(values, values[1:]):
            assert 1 <= len([p for p in probes if lo < p < hi]) <= 2
        assert max(values) < probes[-1] <= max(values) * PAST_GRID + 2


def test_probe_points_move_one_or_every_dim_off_the_grid():
    for grid in GRIDS:
        for op in OPS:
            dims = buckets(grid, op)
            grid_points = workloads(grid, op)
            points = probe_points(grid, op)
            assert points and not [p for p in points if p in grid_points]
            off = [sum(p[d] not in dims[d] for d in dims) for p in points]
            assert all(list(p) == list(dims) for p in points) and min(off) == 1 and max(off) == len(dims)
    prefill = probe_points("full", "attention.prefill")
    # every combination of buckets, probes and edges (batch 1 2 3 5 8 9 13, seq 4 buckets + 7 probes
    # + 4 edges), less the 12 grid points
    assert len(prefill) == 7 * 15 - 12 and {"batch": 5, "seq": 217} in prefill
    assert {"batch": 3, "seq": 512} in prefill and {"batch": 2, "seq": 2049} in prefill
    # an edge at the other dim's probe and edge values too: past the largest batch bucket, seq 129
    # is where SDPA's second tile spills into a second wave of CTAs (benchmark log §10.12)
    assert {"batch": 13, "seq": 129} in prefill and {"batch": 9, "seq": 129} in prefill
    assert probe_points("full", "attention.prefill", units=132) == prefill, "SM waves are for rows only"


def test_edges_are_just_past_each_bucket_and_each_wave_of_the_sms():
    tokens = [1, 4, 16, 64, 256, 1024, 4096, 16384]
    assert edge_values(tokens) == [2, 5, 17, 65, 257, 1025, 4097, 16385]
    # 132 SMs x 1, 2, 4, ...: the first row of a second wave at any power-of-two occupancy
    assert set(edge_values(tokens, 132)) - set(edge_values(tokens)) == {133, 265, 529, 1057, 2113, 4225, 8449, 16897}
    assert edge_values([1, 2, 8]) == [3, 9] and edge_values([1, 8], units=64) == [2, 9]  # waves past the grid: none
    rows = probe_points("full", "norm.rms", units=132)
    assert {"tokens": 17} in rows and {"tokens": 265} in rows and {"tokens": 265} not in probe_points("full", "norm.rms")
    assert len(rows) == len({p["tokens"] for p in rows}) == 14 + 8 + 8  # probes, bucket edges, SM waves


def test_random_points_are_seeded_distinct_and_mostly_unaligned():
    dims = buckets("full", "attention.prefill")
    a = random_points(dims, 40, random.Random("s"))
    assert a == random_points(dims, 40, random.Random("s")) and a != random_points(dims, 40, random.Random("t"))
    assert len({tuple(p.values()) for p in a}) == 40
    for p in a:
        for d, values in dims.items():
            assert min(values) <= p[d] <= max(values) * PAST_GRID
    assert sum(power_of_two(p["seq"]) for p in a) <= 2
    assert any(p["seq"] > max(dims["seq"]) for p in a), "some go past the largest bucket"
    # a dim with no room to vary gives fewer distinct shapes, never an endless draw
    assert len(random_points({"batch": [1], "seq": [2]}, 10, random.Random(0))) <= 2


def test_points_near_a_shape_are_seeded_distinct_and_around_it():
    center = {"batch": 2, "seq": 559}
    near = points_near(center, 3, random.Random("x"))
    assert near == points_near(center, 3, random.Random("x")) and len(near) == 3
    assert center not in near and len({tuple(p.values()) for p in near}) == 3
    for p in near:
        assert all(center[d] / NEAR - 1 <= p[d] <= center[d] * NEAR + 1 for d in center), p
    assert points_near({"tokens": 1}, 2, random.Random(0)) == []  # no room around it: none
