"""How close the table's kernels come to what the device can do: fractions of the roofline.

A call's time at the roofline is max(flops / compute peak, bytes / memory peak): the op's FLOP and
byte counts (its contract's: build_table counts them anew, the notebook reads those stored with each
record, the same but in a warm PerfDB's records from before a count was fixed) against the device's ceilings (the PerfDB's
`ceilings`, measured by the tune in the same timing mode: lzsolve/measure/tasks.py, run_ceilings).
A kernel's fraction of the roofline is that time over its measured time: 1.0 runs on the roof, 0.25
takes four times what the device's peaks allow. Per op signature, over the points the table was
solved on, the chosen kernel's fractions (the tree's choice at each point) and the best
candidate's (the fastest kernel timed there), as geometric means, and the same per tree leaf.
report.md, `lzsolve explain` (from dispatch.json, where build_table stores them) and the PerfDB
notebook all compute them here.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from lzsolve.decide.solve import leaves
from lzsolve.decide.validate import geomean
from lzsolve.measure.harness import MODES, CudaHarness
from lzsolve.measure.tasks import PLAIN_BURST_MS, PLAIN_BURSTS
from lzsolve.store.perfdb import PLAIN_MODE
from runtime_loader.specs import IMPLAUSIBLE_TIME


@dataclass(frozen=True)
class Peak:
    compute: float  # FLOP/s
    memory: float  # bytes/s, read + written


def peaks(ceilings: list[dict], mode: str) -> dict[tuple[str, str], Peak]:
    """(hw_slug, dtype) -> the device's compute and memory ceilings in `mode`, the latest row of
    each (a warm PerfDB may keep an older probe's); only where both were measured."""
    latest: dict[tuple[str, str, str], dict] = {}

    def newer(row: dict, than: dict) -> bool:  # rows without a time count as the oldest
        return than.get("ts") is None or (row.get("ts") is not None and row["ts"] >= than["ts"])
    for row in ceilings:
        if row.get("mode") != mode or not row.get("per_s") or row["per_s"] <= 0:
            continue
        key = (row["hw_slug"], row["dtype"], row["kind"])
        if key not in latest or newer(row, latest[key]):
            latest[key] = row
    pairs = {(hw, dtype) for hw, dtype, _ in latest}
    return {(hw, dtype): Peak(latest[hw, dtype, "compute"]["per_s"], latest[hw, dtype, "memory"]["per_s"])
            for hw, dtype in sorted(pairs) if (hw, dtype, "compute") in latest and (hw, dtype, "memory") in latest}


def roof_ms(flops: float, nbytes: float, peak: Peak) -> float:
    """The call's time at the roofline: its FLOPs at the compute peak or its bytes at the memory
    peak, whichever takes longer."""
    return max(flops / peak.compute, nbytes / peak.memory) * 1e3


def fraction(flops: float | None, nbytes: float | None, ms: float | None, peak: Peak) -> float | None:
    """roof_ms / the measured time; None without a time or without any work counted."""
    flops, nbytes = flops or 0.0, nbytes or 0.0
    if ms is None or not math.isfinite(ms) or ms <= 0 or flops + nbytes <= 0:
        return None
    return roof_ms(flops, nbytes, peak) / ms


# A kernel timed above this fraction of the roofline ran what no device can. With CUDA events the
# harness flushes the L2 before each sample and rotates fresh inputs, so every call reads what its op
# counts from memory. The margin holds what the ceilings do not: FP8 math runs at up to twice the bf16
# matmul the compute ceiling times, a read-mostly kernel passes a copy's rate by some 10%, and MoE's
# bytes are an expectation over the routings drawn at the tune's skew, which one draw may undercut.
# What it catches skips most of its work: Helion 1.4.0's RMSNorm, right on its parity calls (by the
# allocator's luck, it seems: gates.poison_output_blocks), ran 16384 rows of 8192 in 4.8 us on an H100,
# 37x its roofline, and a tune chose it (benchmarks/runs/2026-12-07-e.txt). The CPU's clock reads warm caches (no
# flush there): only CUDA events' times are held to it.
IMPLAUSIBLE_FRACTION = 3.0


def reject_implausible(records: list[dict], ceilings: list[dict],
                       counts: Callable[[dict], tuple[float, float]]) -> list[dict]:
    """`records` with each kernel caught faster than the roofline allows (above IMPLAUSIBLE_FRACTION,
    in either mode, at any point of a signature) rejected at every point of that signature, its
    fallback's aside: one impossible time says the kernel, or its timing, cannot be trusted there.
    counts: a record -> its op's (FLOPs, bytes) at its dims. Without ceilings, records as they are."""
    device_peaks = {mode: peaks(ceilings, mode) for mode in MODES}
    caught: dict[tuple[str, str], str] = {}
    for r in records:
        key = (r.get("signature"), r["kernel_id"])
        if r["status"] != "ok" or r.get("is_fallback") or r.get("timer") != CudaHarness.name or key in caught:
            continue
        for mode in MODES:
            peak = device_peaks[mode].get((r.get("hw_slug"), r.get("dtype")))
            value = fraction(*counts(r), r.get(f"{mode}_ms"), peak) if peak else None
            if value is not None and value > IMPLAUSIBLE_FRACTION:
                caught[key] = (f"{mode} {r[f'{mode}_ms'] * 1e3:.3g} us at {r['dims']} is {value:.3g}x the device's "
                               f"roofline (more than {IMPLAUSIBLE_FRACTION:g}x: a kernel that skipped work, or a "
                               f"timing that missed it)")
                break
    return [{**r, "status": "rejected", "reason_code": IMPLAUSIBLE_TIME, "reason_message": caught[key]}
            if r["status"] == "ok" and (key := (r.get("signature"), r["kernel_id"])) in caught else r
            for r in records]


def _leaf_index(tree: dict, dims: dict) -> int:
    """The left-to-right index (solve.leaves' order) of the leaf a tree picks for these dims."""
    index, node = 0, tree
    while "kernel_id" not in node:
        if dims[node["dim"]] <= node["threshold"]:
            node = node["le"]
        else:
            index += sum(1 for _ in leaves(node["le"]))
            node = node["gt"]
    return index


def signature_roofline(tree: dict, records: list[dict], peak: Peak, mode: str,
                       counts: Callable[[dict], tuple[float, float]] | None = None) -> dict | None:
    """One op signature's figures from its records: {'chosen', 'best' (geometric means of the
    fractions at the points where the chosen kernel has a `mode` time), 'points', 'leaves': [{the
    same, and 'kernel_id'} per leaf of `tree`, left to right]}; None where no point counts.
    counts: dims -> (FLOPs, bytes), the contract's today (build_table), over those the records
    were stored with (a warm PerfDB's records keep the counts of the tune that measured them)."""
    points: dict[str, dict] = {}
    for r in records:
        ms = r.get(f"{mode}_ms")
        if r.get("status") != "ok" or ms is None or not (r.get("flops") or r.get("bytes")):
            continue
        point = points.setdefault(r["dims"], {"flops": r.get("flops"), "bytes": r.get("bytes"), "times": {}})
        point["times"][r["kernel_id"]] = min(ms, point["times"].get(r["kernel_id"], math.inf))
    per_leaf: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for key, point in points.items():
        dims = json.loads(key) if isinstance(key, str) else key
        if counts:
            point["flops"], point["bytes"] = counts(dims)
        index = _leaf_index(tree, dims)
        kernel = list(leaves(tree))[index]["kernel_id"]
        chosen = fraction(point["flops"], point["bytes"], point["times"].get(kernel), peak)
        best = fraction(point["flops"], point["bytes"], min(point["times"].values()), peak)
        if chosen is not None:
            per_leaf[index].append((chosen, best))
    if not per_leaf:
        return None

    def summary(pairs: list[tuple[float, float]]) -> dict:
        return {"chosen": round(geomean([c for c, _ in pairs]), 4), "best": round(geomean([b for _, b in pairs]), 4),
                "points": len(pairs)}
    every = [pair for pairs in per_leaf.values() for pair in pairs]
    return {**summary(every), "leaves": [{"kernel_id": leaf["kernel_id"], **summary(per_leaf[i])} if per_leaf.get(i)
                                         else {"kernel_id": leaf["kernel_id"], "chosen": None, "best": None, "points": 0}
                                         for i, leaf in enumerate(leaves(tree))]}


CEILING_BAR = 0.05  # a ceiling this far from torch's own form puts every fraction off by as much (issue 58)


def ceilings_check(ceilings: list[dict], hw_slug: str, dtype: str, mode: str) -> tuple[Peak, Peak | None] | None:
    """(the ceilings fractions divide by in `mode`, torch's own copy and matmul timed apart in the
    run that measured them: the PLAIN_MODE rows, None where it timed none: a CPU, an older tune);
    None without ceilings."""
    probe = peaks(ceilings, mode).get((hw_slug, dtype))
    return (probe, peaks(ceilings, PLAIN_MODE).get((hw_slug, dtype))) if probe else None


def format_ceilings(check: tuple[Peak, Peak | None] | None, mode: str) -> str | None:
    """report.md's line on the ceilings: their rates, and how far from torch's own forms."""
    if check is None:
        return None
    probe, plain = check
    rates = (f"compute {probe.compute / 1e12:.4g} TFLOP/s (a matmul), memory {probe.memory / 1e12:.4g} TB/s "
             f"(a copy, read + written)")
    if plain is None:
        return f"- ceilings ({mode} mode): {rates}; not checked against torch's own forms (none timed in that run)"
    ratios = {"compute": probe.compute / plain.compute, "memory": probe.memory / plain.memory}
    off = [kind for kind, ratio in ratios.items() if abs(ratio - 1) > CEILING_BAR]
    verdict = (f"OUTSIDE {CEILING_BAR:.0%} for {' and '.join(off)}: fractions are off by as much" if off
               else f"within {CEILING_BAR:.0%}")
    return (f"- ceilings ({mode} mode): {rates}; {ratios['compute']:.3f}x and {ratios['memory']:.3f}x torch's "
            f"own mm / linear ({plain.compute / 1e12:.4g} TFLOP/s) and copy_ ({plain.memory / 1e12:.4g} TB/s), "
            f"timed apart in the same run by Triton's do_bench (best of {PLAIN_BURSTS} x {PLAIN_BURST_MS} ms): {verdict}")


def format_fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}" if value >= 0.01 else f"{value:.1%}"


def format_roofline(entry: dict) -> list[str]:
    """An op entry's roofline (build_table's) in words, for report.md and `lzsolve explain`: nothing
    for a table without ceilings (an older tune, or a probe that failed)."""
    roof = entry.get("roofline")
    if not roof:
        return []
    lines = [f"  roofline: chosen {format_fraction(roof['chosen'])}, best candidate {format_fraction(roof['best'])} "
             f"(time at the roofline / measured time, geomean over {roof['points']} point(s))"]
    if len(roof["leaves"]) > 1:
        lines += [f"    leaf {n} ({leaf['kernel_id']}): chosen {format_fraction(leaf['chosen'])}, best "
                  f"{format_fraction(leaf['best'])}, {leaf['points']} point(s)" for n, leaf in enumerate(roof["leaves"], 1)]
    return lines
