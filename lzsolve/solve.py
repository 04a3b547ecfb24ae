"""The solver: per op signature, a small decision tree over the dynamic dims.

The tree minimises regret, not misclassification: a point's regret under a
choice is time(choice) / time(best admitted kernel) - 1, and a node costs the
sum of its points' regrets. A split is kept only when it removes more regret
than the measurement noise could explain; a leaf keeps the op's fallback when
the best kernel's gain over it is within noise. Splits sit at the geometric
midpoint between neighbouring buckets (the grid is log-spaced).
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from runtime_loader.specs import CUDA_GRAPH_UNSAFE

MAX_DEPTH = 6
MIN_NOISE = 0.02  # regret per point below this is never worth a split or a non-default kernel


@dataclass
class Points:
    """The measured grid of one signature: dims of each point, times per kernel."""

    dims: list[dict]
    times: dict[str, list[float]]  # kernel_id -> time per point (inf where not admitted)
    noise: float

    def best(self, i: int) -> float:
        return min(t[i] for t in self.times.values())


def _leaf(pts: Points, idx: list[int], fallback: str) -> tuple[float, dict]:
    """(regret cost, leaf) for choosing one kernel over the points `idx`."""
    best = {i: pts.best(i) for i in idx}
    costs = {k: sum(t[i] / best[i] - 1 for i in idx) for k, t in pts.times.items()
             if all(math.isfinite(t[i]) for i in idx)}
    if not costs:  # no kernel measured on every point: the fallback, whose semantics always hold
        return float("inf"), {"kernel_id": fallback, "points": len(idx)}
    ranked = sorted(costs, key=costs.get)
    chosen = ranked[0]
    if fallback in costs and (costs[fallback] - costs[chosen]) / len(idx) <= pts.noise:
        chosen = fallback  # the win is within noise: keep the simpler default
    t = pts.times[chosen]

    def geomean_ratio(other: str) -> float:
        o = pts.times[other]
        return math.exp(sum(math.log(o[i] / t[i]) for i in idx) / len(idx))

    runner_up = next((k for k in ranked if k != chosen), None)
    leaf = {
        "kernel_id": chosen,
        "gain": round(geomean_ratio(fallback), 4) if fallback in costs else None,
        "runner_up": runner_up,
        "margin": round(geomean_ratio(runner_up) - 1, 4) if runner_up else None,
        "regret": round(costs[chosen] / len(idx), 4),
        "points": len(idx),
    }
    return costs[chosen], leaf


def _build(pts: Points, idx: list[int], dynamic: tuple[str, ...], fallback: str, depth: int) -> tuple[float, dict]:
    cost, leaf = _leaf(pts, idx, fallback)
    if depth >= MAX_DEPTH or len(idx) < 2 or cost == 0:
        return cost, leaf
    best = None
    for dim in dynamic:
        values = sorted({pts.dims[i][dim] for i in idx})
        for lo, hi in zip(values, values[1:]):
            threshold = math.sqrt(lo * hi)
            left = [i for i in idx if pts.dims[i][dim] <= threshold]
            right = [i for i in idx if pts.dims[i][dim] > threshold]
            split_cost = _leaf(pts, left, fallback)[0] + _leaf(pts, right, fallback)[0]
            if best is None or split_cost < best[0]:
                best = (split_cost, dim, threshold, left, right)
    if best is None or cost - best[0] <= pts.noise * len(idx):
        return cost, leaf
    _, dim, threshold, left, right = best
    left_cost, le = _build(pts, left, dynamic, fallback, depth + 1)
    right_cost, gt = _build(pts, right, dynamic, fallback, depth + 1)
    return left_cost + right_cost, {"dim": dim, "threshold": round(threshold, 3), "le": le, "gt": gt}


def _points(records: list[dict], mode: str) -> Points:
    keys = sorted({r["dims"] for r in records})
    index = {k: i for i, k in enumerate(keys)}
    times: dict[str, list[float]] = defaultdict(lambda: [math.inf] * len(keys))
    spreads = []
    for r in records:
        if r["status"] == "ok" and r.get(f"{mode}_ms") is not None:
            times[r["kernel_id"]][index[r["dims"]]] = r[f"{mode}_ms"]
            spreads.append(r.get(f"{mode}_spread") or 0.0)
    spreads.sort()
    noise = max(MIN_NOISE, spreads[len(spreads) // 2] if spreads else 0.0)
    dims = [json.loads(k) for k in keys]
    measured = [i for i in range(len(keys)) if any(math.isfinite(t[i]) for t in times.values())]
    return Points([dims[i] for i in measured], {k: [t[i] for i in measured] for k, t in times.items()}, noise)


def candidates_summary(records: list[dict], mode: str) -> dict[str, dict]:
    """Per kernel: on how many grid points it was admitted, and why it was rejected elsewhere.
    In graph mode a kernel that could not be captured in a CUDA graph is rejected there."""
    summary: dict[str, dict] = {}
    for r in records:
        entry = summary.setdefault(r["kernel_id"], {"admitted": 0, "rejected": Counter(), "messages": {}})
        if r["status"] == "ok" and r.get(f"{mode}_ms") is not None:
            entry["admitted"] += 1
            continue
        code, message = r["reason_code"], r["reason_message"]
        if r["status"] == "ok":
            code, message = CUDA_GRAPH_UNSAFE, r.get("graph_error") or f"no {mode} timing"
        entry["rejected"][code] += 1
        entry["messages"].setdefault(code, message)
    return {k: {"admitted": v["admitted"],
                "rejected": [{"code": c, "count": n, "message": v["messages"][c]} for c, n in v["rejected"].items()]}
            for k, v in sorted(summary.items())}


def solve_signature(records: list[dict], dynamic: tuple[str, ...], fallback: str, mode: str) -> dict:
    """The tree for one signature's records, plus how well it does on the grid."""
    pts = _points(records, mode)
    if not pts.dims:
        return {"tree": {"kernel_id": fallback, "points": 0}, "grid_regret": None, "noise": pts.noise}
    cost, tree = _build(pts, list(range(len(pts.dims))), dynamic, fallback, 0)
    return {"tree": tree, "grid_regret": round(cost / len(pts.dims), 4), "noise": round(pts.noise, 4)}
