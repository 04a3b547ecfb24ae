"""Validation: every tune judges its table on random shapes it was not solved on.

After solving, each signature's tree meets `shapes` seeded random shapes per dynamic dim, drawn
inside its buckets and up to 1.5x past the largest (grid.random_points), mostly lengths that are no
power of two. At each one the table's choice, the fallback and the contenders around it are
timed (in the table's mode), and the shapes join the points the tree is solved on: where the
tree lost (beyond noise to the best kernel, or at all to the fallback) the solve refines it
there or falls back for that region. The artifact carries both figures per signature: before
refinement (shapes the tree never saw) and after. `lzsolve evaluate` judges with the same
code on shapes of the user's choosing.

Where the tree lost at a shape, kernels' times are rough there (FA3 at small prefill shapes is
not monotone in batch and seq: its tiles x heads x batch against the SM count), so a second
round times NEAR_SHAPES more shapes around each such loss before the final solve: the
refinement then rests on the neighbourhood, not on one point.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from lzsolve.decide.solve import client_ms, host_bound, pick, points_from, solve_signature
from lzsolve.measure.devices import run_sharded
from lzsolve.measure.grid import buckets, points_near, random_points
from lzsolve.measure.tuner import Lane, Plan, Session, SignaturePlan, Work, by_signature, contenders
from lzsolve.store.perfdb import dims_key
from runtime_loader.ops import OPS

VALIDATION_SHAPES = 8  # random shapes per dynamic dim of each op signature in every tune: a plane of
# (batch, seq) needs more than a line of tokens to meet its rough spots (FA3's small prefills, benchmarks/device.sh decisions)
NEAR_SHAPES = 6  # shapes timed around each validation shape where the table lost...
LOSS = 0.05  # ...by this much, to the best kernel timed there or to the fallback


@dataclass(frozen=True)
class PointResult:
    signature: str
    dims: dict
    chosen: str
    best: str | None
    chosen_ms: float | None
    best_ms: float | None
    fallback_ms: float | None
    problem: str | None = None  # the chosen kernel failed here: the table would be wrong at this shape
    fallback_problem: str | None = None  # why the fallback has no time here
    first_loss: float | None = None  # the loss that had the kernels concerned timed again (evaluate.retimed)
    fallback: str | None = None  # its kernel id: what a loss is timed again against

    @property
    def regret(self) -> float | None:
        return self.chosen_ms / self.best_ms if self.chosen_ms and self.best_ms else None

    @property
    def vs_default(self) -> float | None:
        return self.chosen_ms / self.fallback_ms if self.chosen_ms and self.fallback_ms else None

    @property
    def loss(self) -> float:
        """How much slower than the best kernel or the fallback the table's choice was (1: not at all)."""
        return max(self.regret or 1, self.vs_default or 1)


def _missing(kernel: str, recs: list[dict], mode: str) -> str:
    rec = next((r for r in recs if r["kernel_id"] == kernel), None)
    if rec is None:
        return f"{kernel} was not measured here"
    if rec.get("reason_code"):
        return f"{kernel} failed here: {rec['reason_code']}: {rec['reason_message']}"
    return f"{kernel} has no {mode} timing here" + (f" ({rec['graph_error']})" if rec.get("graph_error") else "")


def judge(signature: str, dims: dict, chosen: str, fallback: str, recs: list[dict], mode: str,
          calls_per_forward: int = 1) -> PointResult:
    """The table's choice at one shape against the best kernel and the fallback timed there (a
    kernel timed more than once there counts at its fastest: evaluate.retimed; client_ms). In eager
    mode the best is of the kernels that may serve there: not one that costs the host more than the
    fallback (solve.host_bound), which an eager table keeps off (a table that chose one anyway, tuned
    before that rule, is timed as chosen)."""
    times: dict[str, float] = {}
    for r in recs:
        if r["status"] == "ok" and r.get(f"{mode}_ms"):
            times[r["kernel_id"]] = min(client_ms(r, mode, calls_per_forward), times.get(r["kernel_id"], math.inf))
    off = host_bound(recs, fallback) if mode == "eager" else set()
    best = min((k for k in times if k not in off), key=times.get, default=None)
    return PointResult(signature, dims, chosen, best, times.get(chosen), times.get(best) if best else None,
                       times.get(fallback), None if chosen in times else _missing(chosen, recs, mode),
                       None if fallback in times else _missing(fallback, recs, mode), fallback=fallback)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def stats(results: list[PointResult]) -> dict:
    regrets = [r.regret for r in results if r.regret]
    vs_default = [r.vs_default for r in results if r.vs_default]
    return {"points": len(results), "problems": sum(r.problem is not None for r in results),
            "retimed": sum(r.first_loss is not None for r in results),
            "regret_geomean": geomean(regrets), "regret_worst": max(regrets) if regrets else None,
            "vs_default_geomean": geomean(vs_default), "vs_default_worst": max(vs_default) if vs_default else None}


def summarize(results: list[PointResult]) -> dict:
    by_sig: dict[str, list[PointResult]] = {}
    for r in results:
        by_sig.setdefault(r.signature, []).append(r)
    return {"overall": stats(results), "signatures": {s: stats(rs) for s, rs in by_sig.items()},
            "problems": [f"{r.signature} at {r.dims}: {r.problem}" for r in results if r.problem],
            "fallback_problems": [f"{r.signature} at {r.dims}: {r.fallback_problem}"
                                  for r in results if r.fallback_problem],
            "points": [{"signature": r.signature, "dims": r.dims, "chosen": r.chosen, "best": r.best,
                        "chosen_ms": r.chosen_ms, "best_ms": r.best_ms, "fallback_ms": r.fallback_ms,
                        "regret": r.regret, "vs_default": r.vs_default, "problem": r.problem,
                        "fallback_problem": r.fallback_problem, "first_loss": r.first_loss} for r in results]}


@dataclass(frozen=True)
class Planned:
    signature: SignaturePlan
    tree: dict  # the tree solved before validation
    work: Work


def plan_validation(plan: Plan, records: list[dict], mode: str, shapes: int = VALIDATION_SHAPES) -> list[Planned]:
    """Per signature with a choice to make: its tree, its random shapes (seeded by the signature,
    so a re-run draws the same ones and reuses their records) and the kernels to time at each."""
    recs = by_signature(records)
    out = []
    for sp in plan.signatures:
        sig, op, calls = str(sp.instance.signature), sp.instance.signature.op, sp.instance.calls_per_forward
        pts = points_from(recs.get(sig, []), mode, sp.fallback, calls)
        if not pts.has_choice or shapes <= 0:
            continue
        tree = solve_signature(recs[sig], OPS[op].dynamic, sp.fallback, mode, calls)["tree"]
        drawn = random_points(buckets(plan.grid, op), shapes * len(OPS[op].dynamic), random.Random(f"validation:{sig}"))
        out.append(Planned(sp, tree, [(dims, contenders(sp, pts, dims, (pick(tree, dims),))) for dims in drawn]))
    return out


def _structure(node: dict):
    if "kernel_id" in node:
        return node["kernel_id"]
    return node["dim"], node["threshold"], _structure(node["le"]), _structure(node["gt"])


def validate(session: Session, planned: list[Planned], records: list[dict], mode: str,
             on_step: Callable[[str], None] = lambda label: None,
             on_more: Callable[[int], None] = lambda measurements: None) -> tuple[list[dict], dict[str, dict]]:
    """Time the planned shapes; returns their records and, per signature, the validation summary:
    figures before refinement (the tree as solved without these shapes), after (solved with
    them), and whether the tree changed. `on_more` hears of each second round's measurements
    before they start (a progress bar's total). On several devices each signature goes whole
    to the next free one (its second round depends on its first), the largest first, a device
    taking the signatures it measured before while there are any (tuner.Lane.warm)."""
    recs = by_signature(records)

    def one(lane: Lane, p: Planned) -> list[tuple[str, list[dict], dict]]:
        sp = p.signature
        sig, dynamic = str(sp.instance.signature), OPS[sp.instance.signature.op].dynamic
        measured = session.measure(sp, p.work, "validation", (mode,), on_step, lane)
        judged = _judge_all(sp, p.tree, p.work, measured, mode)
        near = _around_losses(sp, p.tree, judged, recs[sig] + measured, mode)
        on_more(sum(len(candidates) for _, candidates in near))
        measured += session.measure(sp, near, "validation", (mode,), on_step, lane)
        after = solve_signature(recs[sig] + measured, dynamic, sp.fallback, mode, sp.instance.calls_per_forward)["tree"]
        return [(sig, measured, {"shapes": len(p.work), "near_shapes": len(near), "before": stats(judged),
                                 "after": stats(_judge_all(sp, after, p.work + near, measured, mode)),
                                 "refined": _structure(after) != _structure(p.tree)})]

    sharded = run_sharded(in_order(planned), session.lanes, one, group=lambda p: str(p.signature.instance.signature),
                          warm=[lane.warm for lane in session.lanes])
    done = {sig: (measured, summary) for sig, measured, summary in sharded}
    order = [str(p.signature.instance.signature) for p in planned]  # records and summaries in the plan's order
    return [r for sig in order for r in done[sig][0]], {sig: done[sig][1] for sig in order}


def in_order(planned: list[Planned]) -> list[Planned]:
    """The signatures in the order validate takes them: the most measurements first."""
    return sorted(planned, key=lambda p: sum(len(c) for _, c in p.work), reverse=True)


def _judge_all(sp: SignaturePlan, tree: dict, work: Work, measured: list[dict], mode: str) -> list[PointResult]:
    at: dict[str, list[dict]] = {}
    for r in measured:
        at.setdefault(r["dims"], []).append(r)
    return [judge(str(sp.instance.signature), dims, pick(tree, dims), sp.fallback, at.get(dims_key(dims), []), mode,
                  sp.instance.calls_per_forward) for dims, _ in work]


def _around_losses(sp: SignaturePlan, tree: dict, judged: list[PointResult], records: list[dict], mode: str) -> Work:
    """NEAR_SHAPES shapes around each judged shape where the tree lost by LOSS, the worst losses
    first and at most twice as many shapes as the first round (on a noisy host many shapes
    "lose"), each seeded by the signature and the shape (a re-run draws the same ones), with the
    kernels to time there."""
    sig = str(sp.instance.signature)
    lost = sorted((r for r in judged if r.loss > 1 + LOSS), key=lambda r: r.loss, reverse=True)
    pts = points_from(records, mode, sp.fallback, sp.instance.calls_per_forward)
    shapes = {dims_key(dims): dims for r in lost  # two losses may share a neighbour: timed once
              for dims in points_near(r.dims, NEAR_SHAPES, random.Random(f"near:{sig}:{dims_key(r.dims)}"))}
    for r in judged:  # nor are the first round's shapes timed again
        shapes.pop(dims_key(r.dims), None)
    return [(dims, contenders(sp, pts, dims, (pick(tree, dims),))) for dims in list(shapes.values())[:2 * len(judged)]]
