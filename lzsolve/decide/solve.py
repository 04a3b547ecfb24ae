"""The solver: per op signature, the decision tree over the dynamic dims that is optimal for
the points measured there (grid buckets, unaligned probes, validation shapes).

Every point counts on its own. At a point, a kernel's *excess* is how much slower than the
best kernel it is beyond that point's noise (the measured spreads of the two kernels there,
clamped to [MIN_NOISE, MAX_NOISE]); a kernel that is slower than the fallback beyond noise
(with a lower floor, FALLBACK_LOSS_NOISE: that loss is the one the tool promises never to make)
at a point, or was not measured there, is barred from any leaf holding that point. In an eager
table a kernel whose host time per call at a point exceeds the fallback's by more than HOST_LOSS
counts as not measured there (host_ms: an eager model that is host-bound pays a call's host time,
not its GPU time), so that it is neither chosen nor the best that regret is measured from. A leaf
costs the sum of its points' excesses, with the part of a point's excess above WORST_BOUND
weighted WORST_WEIGHT times (the worst point is bounded, not averaged away), plus LEAF_COST
(a split must buy a real gain at some point, however few points that is). The cheapest tree
is found exactly, by dynamic programming over the sets of points that axis-aligned splits
can separate, up to MAX_DEPTH: the grids are small, so there is no need for a greedy
look-ahead that cannot see a second split coming. A leaf keeps the fallback unless its kernel
beats it by SWITCH_GAIN over the leaf's points (geomean; more where the leaf holds fewer than
four points): two timings of one cuBLAS GEMM, minutes apart, differed by up to 10% on the H100
(benchmarks/device.sh decisions), far more than the spread of either run's samples, so a smaller measured gain
is no evidence, and leaving the default for it risks a loss at the shapes between the points.
On CPU the bars are higher (DEVICE_SWITCH_GAIN, ONE_POINT_GAIN): there a kernel's speed moves with
its process's history by more than a GPU's, so a leaf leaves the fallback only for a gain that
exceeds those swings.
Thresholds sit at the geometric midpoint of the neighbouring measured values (the grids are
log-spaced).

Each leaf is a decision: its kernel over the fallback (or, where it kept the fallback, over the best
other kernel). A decision rests on noisy data when its timings' spread is larger than the difference
it decided on (MIN_NOISE at least): on a busy host 427 of 755 timings of one tune spread over 10%,
and one RMSNorm ran 84 ms in the tune and 0.19 ms a minute later. Such a leaf is marked (`noisy`);
report.md, `tune --json` and `lzsolve explain` count them (decision_noise).
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from runtime_loader.specs import CUDA_GRAPH_UNSAFE

MAX_DEPTH = 4
MIN_NOISE = 0.02  # no measured difference below this counts as real...
# ...except a loss to the fallback, which counts from this (or the points' measured spreads):
# the promise is never slower than the default, and a kernel 1-2% behind it at a measured point
# ran 2-3.5% behind it at shapes next to that point (FA3 against SDPA at 3x361 tokens on the
# H100, benchmarks/device.sh decisions), past the 3% that promise allows
FALLBACK_LOSS_NOISE = 0.01
MAX_NOISE = 0.05  # a noisy point still may not hide a loss larger than this
# An eager table serves clients whose forward may be bound by the host (small models, decode, short
# prompts): there a call costs its host time, whatever its GPU time saves. Gemma 3's half table (a
# Triton GeGLU in place of two ATen ops, faster on the GPU and in the eager timing) made its prefill
# 0.93-0.96x of the unpatched model (benchmarks/runs/2026-12-06-b.txt). So a kernel that costs the host more
# than the fallback by HOST_LOSS (and HOST_SLACK_MS, the timer's reach) may not serve an eager table.
HOST_LOSS = 0.05
HOST_SLACK_MS = 0.001
WORST_BOUND = 0.05  # excess regret at one point above this...
WORST_WEIGHT = 10.0  # ...costs this many times more
LEAF_COST = 0.01  # what a split must remove, in summed excess regret
SWITCH_GAIN = 0.05  # a leaf leaves the fallback only for a kernel this much faster over >= 4 points
# On CPU, 15%: on this project's 2-core VM the ratio of two torch kernels moved by up to 13%
# between the rounds of one timing task (benchmarks/cpu_modes.py), and torch's fused RMSNorm + add,
# 1.11x the fallback over 17 points of a tune, lost to it by 1.13-1.17x at two held-out shapes
# (docs/benchmark-log.md §10.16). A gain inside those swings is no evidence; the promise is never slower than the default.
DEVICE_SWITCH_GAIN = {"cpu": 0.15}
TIE_BREAK = 1e-3  # weight of raw regret (noise included): picks among trees of equal excess
RANK_MARGIN = 0.5  # a leaf ranks the runner-ups at most this much slower than its kernel...
RANK_MAX = 3  # ...and at most this many of them
# On CPU a gain at one point alone is weak evidence: the same kernel at the same shape ran up to
# 1.3x apart between processes of one machine (Inductor's RMSNorm + add, docs/benchmark-log.md §10.13-10.15),
# and a one-point leaf where it had run 18% ahead lost 1.39x to the fallback when evaluated
# (docs/benchmark-log.md §10.14, run B). Such a gain must hold at a second point, or exceed that 1.3x (a real cliff
# does). GPU timings repeat, and a GPU kernel's single-point cliffs are real (a second wave of tiles).
ONE_POINT_GAIN = {"cpu": 1.3}
BARRED = 1e9  # cost of a kernel at a point where it was not measured, or loses to the fallback: above any excess


def _known(ms) -> bool:
    return ms is not None and math.isfinite(ms)  # a PerfDB's missing value may read as NaN


def costs_host_more(host_ms: float | None, fallback_host_ms: float | None) -> bool:
    """Whether a kernel's host time per call exceeds the fallback's by HOST_LOSS (False where either
    is unknown: records of older runs)."""
    return (_known(host_ms) and _known(fallback_host_ms)
            and host_ms > fallback_host_ms * (1 + HOST_LOSS) + HOST_SLACK_MS)


def host_bound(records: list[dict], fallback: str) -> set[str]:
    """The kernels of one point's eager records that cost the host more than its fallback."""
    hosts = {r["kernel_id"]: r.get("host_ms") for r in records if r["status"] == "ok"}
    return {k for k, ms in hosts.items() if k != fallback and costs_host_more(ms, hosts.get(fallback))}


@dataclass
class Points:
    """The measured points of one signature: their dims, and per kernel its time and spread
    at each point (inf / 0 where it was not measured or not admitted)."""

    dims: list[dict]
    times: dict[str, list[float]]
    spreads: dict[str, list[float]]
    fallback: str
    one_point_gain: float = 1.0  # the gain a kernel faster than the fallback at one point alone must have there
    switch_gain: float = SWITCH_GAIN  # the geomean gain over >= 4 points for which a leaf leaves the fallback
    # eager: per kernel, its time at the points where its host time kept it off (inf elsewhere)
    kept_off: dict[str, list[float]] = field(default_factory=dict)

    @property
    def has_choice(self) -> bool:
        """Whether any kernel but the fallback was measured: else there is nothing to decide."""
        return any(k != self.fallback and any(map(math.isfinite, t)) for k, t in self.times.items())

    def best(self, i: int) -> float:
        return min(t[i] for t in self.times.values())

    def best_kernel(self, i: int) -> str:
        return min(self.times, key=lambda k: self.times[k][i])

    def noise(self, i: int, *kernels: str, floor: float = MIN_NOISE) -> float:
        """How much of a difference between these kernels at point i the measurements can explain."""
        spread = max(self.spreads[k][i] for k in kernels if k in self.spreads)
        return min(MAX_NOISE, max(floor, spread))

    def loses_to_fallback(self, kernel: str, i: int) -> bool:
        t, fb = self.times[kernel][i], self.times.get(self.fallback, [math.inf] * len(self.dims))[i]
        return (kernel != self.fallback and math.isfinite(fb)
                and t > fb * (1 + self.noise(i, kernel, self.fallback, floor=FALLBACK_LOSS_NOISE)))

    def timed_both(self, other: str, kernel: str, idx: list[int]) -> list[int]:
        """The points of `idx` where both kernels were timed (none if `other` never was)."""
        if other not in self.times:
            return []
        a, b = self.times[other], self.times[kernel]
        return [i for i in idx if math.isfinite(a[i]) and math.isfinite(b[i])]

    def ratio(self, other: str, kernel: str, idx: list[int]) -> float | None:
        """Geomean of time(other) / time(kernel) over the points of `idx` where both were timed."""
        both = self.timed_both(other, kernel, idx)
        a, b = self.times.get(other), self.times[kernel]
        return math.exp(sum(math.log(a[i] / b[i]) for i in both) / len(both)) if both else None

    @functools.cached_property
    def kernels(self) -> list[str]:
        """The kernels in the order of the solver's arrays (and of its ties)."""
        return sorted(self.times)

    @functools.cached_property
    def against_fallback(self) -> np.ndarray:
        """Per kernel (rows, in `kernels` order) and point: whether it and the fallback were both
        timed there, whether it was the faster, and log(fallback's time / its time) (0 where not
        both), stacked (3 x kernels x points): clearly_faster's terms, which a leaf sums over its
        points for every kernel at once."""
        times = np.array([self.times[k] for k in self.kernels], dtype=float).reshape(len(self.kernels), len(self.dims))
        fallback = np.array(self.times.get(self.fallback, [math.inf] * len(self.dims)), dtype=float)
        both = np.isfinite(times) & np.isfinite(fallback)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_gain = np.where(both, np.log(fallback / times), 0.0)
        return np.stack([both, both & (times < fallback), log_gain]).astype(float)

    def clearly_faster_all(self, summed: np.ndarray) -> np.ndarray:
        """clearly_faster of every kernel (in `kernels` order), from `against_fallback` summed over
        the points concerned (3 x kernels)."""
        timed, faster_at, log_gain = summed
        gain_needed = 1 + self.switch_gain * np.sqrt(4 / np.minimum(np.maximum(timed, 1), 4))
        gain_needed = np.where(faster_at < 2, np.maximum(gain_needed, self.one_point_gain), gain_needed)
        gain = np.exp(log_gain / np.maximum(timed, 1))
        # nothing says the fallback is there to keep where the two were never timed together
        return (timed == 0) | (gain >= gain_needed) | self._is_fallback

    @functools.cached_property
    def _is_fallback(self) -> np.ndarray:
        return np.array([k == self.fallback for k in self.kernels])

    def clearly_faster(self, kernel: str, idx: list[int]) -> bool:
        """Whether `kernel` beats the fallback over these points by more than timing can make up:
        switch_gain (geomean) over four points or more, up to twice that at a single point, and
        one_point_gain where it is faster at one of them alone."""
        summed = self.against_fallback[:, :, list(idx)].sum(axis=2)
        return bool(self.clearly_faster_all(summed)[self.kernels.index(kernel)])

    def leading(self, dims: dict, margin: float) -> set[str]:
        """The kernels within `margin` of the best at any measured point around `dims`: per dim
        the nearest measured values at or below and at or above it (the nearest one past the
        ends), and every point inside that box; the nearest point if none is."""
        box = {}
        for d, v in dims.items():
            values = sorted({p[d] for p in self.dims})
            below, above = [x for x in values if x <= v], [x for x in values if x >= v]
            box[d] = (below[-1] if below else above[0], above[0] if above else below[-1])
        around = [i for i, p in enumerate(self.dims) if all(lo <= p[d] <= hi for d, (lo, hi) in box.items())]
        if not around:
            around = [min(range(len(self.dims)), key=lambda i: sum(abs(math.log(self.dims[i][d] / v))
                                                                    for d, v in dims.items()))]
        return {k for i in around for k, t in self.times.items() if t[i] <= self.best(i) * (1 + margin)}

    def cost(self, kernel: str, i: int) -> tuple[float, float]:
        """(penalised excess, raw regret) of choosing `kernel` at point i."""
        t = self.times[kernel][i]
        if not math.isfinite(t) or self.loses_to_fallback(kernel, i):
            return BARRED, BARRED
        ratio = t / self.best(i)
        excess = max(0.0, ratio - 1 - self.noise(i, kernel, self.best_kernel(i)))
        return excess + WORST_WEIGHT * max(0.0, excess - WORST_BOUND), ratio - 1


def client_ms(record: dict, mode: str, calls_per_forward: int = 1) -> float | None:
    """What one call of the record's kernel costs the client a `mode` table is for. Graph mode:
    the replayed GPU time (a CUDA-graph client plans once per captured shape). Eager mode: the
    launch's time plus the kernel's setup per call layout (FlashInfer's plan, `setup_ms`), shared
    by the calls of one forward: an eager client's shapes change every step (decode's kv_len grows
    by one), so each forward plans again, once for all its layers (the adapter keeps a plan per
    layout), while the benchmark's repeated calls of one shape time only the planned run."""
    ms, setup = record.get(f"{mode}_ms"), record.get("setup_ms")
    if ms is None or mode != "eager" or not _known(setup):
        return ms
    return ms + setup / max(1, calls_per_forward)


def points_from(records: list[dict], mode: str, fallback: str, calls_per_forward: int = 1) -> Points:
    """The points of one signature's records: those where at least one kernel has a `mode` time
    (client_ms: in eager mode with its setup's share). In eager mode a kernel that costs the host
    more than the fallback at a point (host_bound) has no time there: `kept_off` keeps it."""
    keys = sorted({r["dims"] for r in records})
    index = {k: i for i, k in enumerate(keys)}
    times: dict[str, list[float]] = defaultdict(lambda: [math.inf] * len(keys))
    spreads: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(keys))
    kept_off: dict[str, list[float]] = defaultdict(lambda: [math.inf] * len(keys))
    timed = [r for r in records if r["status"] == "ok" and r.get(f"{mode}_ms") is not None]
    barred = set()  # (kernel, dims) an eager table keeps off for its host time
    if mode == "eager":
        at: dict[str, list[dict]] = defaultdict(list)
        for r in timed:
            at[r["dims"]].append(r)
        barred = {(k, d) for d, recs in at.items() for k in host_bound(recs, fallback)}
    for r in timed:
        kernel, i = r["kernel_id"], index[r["dims"]]
        if (kernel, r["dims"]) in barred:
            kept_off[kernel][i] = client_ms(r, mode, calls_per_forward)
            continue
        times[kernel][i] = client_ms(r, mode, calls_per_forward)
        spreads[kernel][i] = r.get(f"{mode}_spread") or 0.0
    measured = [i for i in range(len(keys)) if any(math.isfinite(t[i]) for t in times.values())]
    device_types = {str(r.get("device") or "").split(":")[0] for r in records}

    def strictest(per_device: dict[str, float], default: float) -> float:
        return max((per_device.get(d, default) for d in device_types), default=default)
    return Points([json.loads(keys[i]) for i in measured], {k: [t[i] for i in measured] for k, t in times.items()},
                  {k: [s[i] for i in measured] for k, s in spreads.items()}, fallback,
                  strictest(ONE_POINT_GAIN, 1.0), strictest(DEVICE_SWITCH_GAIN, SWITCH_GAIN),
                  {k: [t[i] for i in measured] for k, t in kept_off.items()})


class _Solver:
    """Exact search over trees; a node is the bitmask of the points it holds. A leaf's cost is
    summed for every kernel at once over arrays (kernels x points): the trees of a 2-D attention
    signature visit tens of thousands of leaves, and summed one kernel and one point at a time they
    took 7.2 s for attention.decode on this project's VM (2.5 s now), in phases no second device
    shortens (benchmarks/device.sh devices)."""

    def __init__(self, pts: Points, dynamic: tuple[str, ...]):
        self.pts, self.n = pts, len(pts.dims)
        self.kernels = pts.kernels
        costs = np.array([[pts.cost(k, i) for i in range(self.n)] for k in self.kernels], dtype=float)
        costs = costs.reshape(len(self.kernels), self.n, 2).transpose(2, 0, 1)  # penalised excess, raw regret
        self.terms = np.concatenate([costs, pts.against_fallback])  # what a leaf sums: 5 x kernels x points
        self.fallback = self.kernels.index(pts.fallback) if pts.fallback in self.kernels else None
        self.dims = [d for d in dynamic if all(d in p for p in pts.dims)]
        self.values = {d: np.array([p[d] for p in pts.dims]) for d in self.dims}
        # per dim and measured value: the mask of the points at or below it
        self.at_or_below = {d: {v: sum(1 << i for i, p in enumerate(pts.dims) if p[d] <= v)
                                for v in {p[d] for p in pts.dims}} for d in self.dims}
        self.solve = functools.lru_cache(maxsize=None)(self._solve)
        self.leaf = functools.lru_cache(maxsize=None)(self._leaf)

    def members(self, mask: int) -> list[int]:
        return [i for i in range(self.n) if mask >> i & 1]

    def member(self, mask: int) -> np.ndarray:
        """The mask as one bool per point."""
        packed = np.frombuffer(mask.to_bytes((self.n + 7) // 8, "little"), dtype=np.uint8)
        return np.unpackbits(packed, count=self.n, bitorder="little").astype(bool)

    def _leaf(self, mask: int) -> tuple[float, str]:
        """(cost, kernel) of the best single kernel for these points among the fallback and the
        kernels clearly faster than it there; the fallback when no kernel has less excess."""
        summed = self.terms[:, :, self.member(mask)].sum(axis=2)
        excess, regret = summed[0], summed[1]
        allowed = self.pts.clearly_faster_all(summed[2:])
        chosen = int(np.argmin(np.where(allowed, excess + TIE_BREAK * regret, np.inf)))  # ties: the first
        if self.fallback is not None and excess[self.fallback] <= excess[chosen] + 1e-12:
            chosen = self.fallback
        return float(excess[chosen] + TIE_BREAK * regret[chosen] + LEAF_COST), self.kernels[chosen]

    def _solve(self, mask: int, depth: int) -> tuple[float, tuple]:
        """(cost, node) of the cheapest tree of at most MAX_DEPTH - depth levels over `mask`;
        a node is ('leaf', kernel) or ('split', dim, threshold, le, gt)."""
        cost, kernel = self.leaf(mask)
        best = (cost, ("leaf", kernel))
        if depth >= MAX_DEPTH or cost <= 2 * LEAF_COST:  # a split costs two leaves at least
            return best
        member = self.member(mask)
        for dim in self.dims:
            present = np.unique(self.values[dim][member]).tolist()
            for lo, hi in zip(present, present[1:]):
                le = mask & self.at_or_below[dim][lo]
                left, right = self.solve(le, depth + 1), self.solve(mask & ~le, depth + 1)
                if left[0] + right[0] < best[0] - 1e-12:
                    best = (left[0] + right[0], ("split", dim, math.sqrt(lo * hi), left[1], right[1]))
        return best


def _ranked(pts: Points, idx: list[int], kernel: str) -> list[dict]:
    """The runner-ups that may serve a leaf when its kernel cannot (avoided, stale, failing), best
    first: measured at every point of the leaf, never slower than the fallback beyond noise there,
    and at most RANK_MARGIN slower than the kernel (geomean). The fallback is not ranked: it is
    always the last resort, and a leaf that chose it has nothing to rank."""
    if kernel == pts.fallback:
        return []
    ratios = {}
    for other in pts.times:
        if other in (kernel, pts.fallback) or any(pts.cost(other, i)[0] >= BARRED for i in idx):
            continue
        ratio = pts.ratio(other, kernel, idx)
        if ratio is not None and ratio <= 1 + RANK_MARGIN:
            ratios[other] = ratio
    best = sorted(ratios, key=lambda k: (ratios[k], k))[:RANK_MAX]
    return [{"kernel_id": k, "ratio": round(ratios[k], 4)} for k in best]


def decision_noise(pts: Points, idx: list[int], kernel: str, other: str | None) -> tuple[float, float] | None:
    """(noise, difference) of choosing `kernel` over `other` at the points `idx`, over those where
    both were timed: noise is the median of the larger of the two kernels' spreads there, difference
    |time(other) / time(kernel) - 1| (geomean). None where they were never timed together."""
    both = pts.timed_both(other, kernel, idx) if other else []
    if not both:
        return None
    noise = statistics.median(max(pts.spreads[kernel][i], pts.spreads[other][i]) for i in both)
    return noise, abs(pts.ratio(other, kernel, both) - 1)


def is_noisy(noise: float, difference: float) -> bool:
    """Whether the timings' spread could hold the difference decided on (or reverse it)."""
    return noise > max(difference, MIN_NOISE)


def _leaf_entry(pts: Points, idx: list[int], kernel: str) -> dict:
    """What a leaf records: its kernel, the gain over the fallback, the runner-up and its margin,
    the mean and worst regret over its points, the ranked runner-ups (_ranked), and how noisy the
    decision's timings were (decision_noise: against the fallback it left, or the kernel it kept
    the fallback over)."""
    t = pts.times[kernel]
    regrets = [t[i] / pts.best(i) - 1 for i in idx if math.isfinite(t[i])]
    covering = [k for k in pts.times if k != kernel and all(math.isfinite(pts.times[k][i]) for i in idx)]
    runner_up = min(covering, key=lambda k: sum(pts.times[k][i] / pts.best(i) for i in idx), default=None)
    gain = pts.ratio(pts.fallback, kernel, idx)
    margin = pts.ratio(runner_up, kernel, idx) if runner_up else None
    decided = decision_noise(pts, idx, kernel, pts.fallback if gain is not None and kernel != pts.fallback
                             else runner_up)
    # faster than the leaf's kernel at some of its points, kept off there for their host time (HOST_LOSS)
    kept_off = sorted(k for k, off in pts.kept_off.items() if any(off[i] < t[i] for i in idx))
    return {
        "kernel_id": kernel,
        "gain": round(gain, 4) if gain is not None else None,
        "runner_up": runner_up,
        "margin": round(margin - 1, 4) if margin is not None else None,
        "regret": round(sum(regrets) / len(regrets), 4) if regrets else None,
        "worst": round(max(regrets), 4) if regrets else None,
        "points": len(idx),
        "ranked": _ranked(pts, idx, kernel),
        "noise": round(decided[0], 4) if decided else None,
        "noisy": is_noisy(*decided) if decided else None,  # None: nothing decided (no other kernel timed)
        **({"host_bound": kept_off} if kept_off else {}),
    }


def _to_json(pts: Points, solver: _Solver, node: tuple, mask: int) -> dict:
    if node[0] == "leaf":
        return _leaf_entry(pts, solver.members(mask), node[1])
    _, dim, threshold, le, gt = node
    below = mask & sum(1 << i for i in solver.members(mask) if pts.dims[i][dim] <= threshold)
    return {"dim": dim, "threshold": round(threshold, 3),
            "le": _to_json(pts, solver, le, below), "gt": _to_json(pts, solver, gt, mask & ~below)}


def leaves(node: dict):
    """The leaves of a tree (in its dispatch.json form), left to right."""
    if "kernel_id" in node:
        yield node
    else:
        yield from leaves(node["le"])
        yield from leaves(node["gt"])


def pick(node: dict, dims: dict) -> str:
    """The kernel a tree (in its dispatch.json form) chooses for these dims."""
    while "kernel_id" not in node:
        node = node["le"] if dims[node["dim"]] <= node["threshold"] else node["gt"]
    return node["kernel_id"]


def candidates_summary(records: list[dict], mode: str) -> dict[str, dict]:
    """Per kernel: on how many points it was admitted, and why it was rejected elsewhere.
    In graph mode a kernel that could not be captured in a CUDA graph is rejected there."""
    summary: dict[str, dict] = {}
    for r in records:
        entry = summary.setdefault(r["kernel_id"], {"admitted": 0, "rejected": Counter(), "messages": {}})
        if r["status"] == "ok" and r.get(f"{mode}_ms") is not None:
            entry["admitted"] += 1
            continue
        if r["status"] == "ok":  # measured, but not in this mode: a kernel no CUDA graph can capture
            code, message = CUDA_GRAPH_UNSAFE, r.get("graph_error") or f"no {mode} timing"
        else:
            code, message = r["reason_code"], r["reason_message"]
        entry["rejected"][code] += 1
        entry["messages"].setdefault(code, message)
    return {k: {"admitted": v["admitted"],
                "rejected": [{"code": c, "count": n, "message": v["messages"][c]} for c, n in v["rejected"].items()]}
            for k, v in sorted(summary.items())}


def solve_signature(records: list[dict], dynamic: tuple[str, ...], fallback: str, mode: str,
                    calls_per_forward: int = 1) -> dict:
    """The tree for one signature's records, and how well it does on the points it was solved on:
    mean and worst regret (time(choice) / time(best) - 1), the median measured spread, and how
    many points each phase (grid, probe, validation) contributed."""
    pts = points_from(records, mode, fallback, calls_per_forward)
    by_phase = Counter(phase_of(records).get(json.dumps(p, sort_keys=True), "grid") for p in pts.dims)
    spreads = sorted(s[i] for k, s in pts.spreads.items() for i in range(len(pts.dims)) if math.isfinite(pts.times[k][i]))
    noise = round(max(MIN_NOISE, spreads[len(spreads) // 2] if spreads else 0.0), 4)
    if not pts.dims:
        return {"tree": {"kernel_id": fallback, "points": 0}, "grid_regret": None, "worst_regret": None,
                "noise": noise, "points_by_phase": {}}
    solver = _Solver(pts, dynamic)
    everything = (1 << len(pts.dims)) - 1
    tree = _to_json(pts, solver, solver.solve(everything, 0)[1], everything)
    chosen = [pts.times[pick(tree, p)][i] for i, p in enumerate(pts.dims)]
    regrets = [t / pts.best(i) - 1 for i, t in enumerate(chosen) if math.isfinite(t)]
    return {"tree": tree, "grid_regret": round(sum(regrets) / len(regrets), 4) if regrets else None,
            "worst_regret": round(max(regrets), 4) if regrets else None, "noise": noise,
            "points_by_phase": dict(sorted(by_phase.items()))}


def phase_of(records: list[dict]) -> dict[str, str]:
    """dims key -> the phase that first measured it (records of older PerfDBs have none: grid)."""
    out: dict[str, str] = {}
    for r in records:
        out.setdefault(r["dims"], r.get("phase") or "grid")
    return out
