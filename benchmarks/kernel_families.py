"""Per op family: the best admitted kernel versus the PyTorch default, and the optuna-searched
Triton configurations versus their family's default configuration, from one tuning run.

    lzsolve tune --model llama3-70b --tp 8 --device cuda --out DIR
    python benchmarks/kernel_families.py DIR [--mode graph] [--json out.json]

Every ratio compares two kernels timed interleaved in the same timing task of that run
(same inputs, same clocks), never numbers from different runs. The default is the op's
fallback, i.e. what a server gets without lzsolve (sdpa.default for attention, the
eager Hugging Face formulation for norms, RoPE and activations, F.linear for linear);
"PyTorch best" is the fastest PyTorch-only candidate at each bucket (SDPA backends, F.*
built-ins, torch.compile), so the last column is what the other libraries add beyond it.
For a tunable family, the search's gain at a bucket is default / min(default, every searched
configuration), all timed at that bucket: what the solver can choose from.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

from lzsolve.store.perfdb import PerfDB


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def buckets(artifact: Path, mode: str) -> dict[tuple[str, str], dict[str, float]]:
    """(signature, dims) -> kernel id -> time, from the newest admitted record of each."""
    rows = PerfDB(artifact / "perfdb").rows(
        f"SELECT signature, op, dims, kernel_id, {mode}_ms AS ms, is_fallback FROM admitted "
        f"WHERE {mode}_ms IS NOT NULL QUALIFY row_number() OVER "
        f"(PARTITION BY signature, dims, kernel_id ORDER BY ts DESC) = 1")
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        out.setdefault((r["signature"], r["dims"]), {})[r["kernel_id"]] = r["ms"]
    return out


def fallbacks(artifact: Path) -> dict[str, str]:
    rows = PerfDB(artifact / "perfdb").rows("SELECT DISTINCT signature, kernel_id FROM records WHERE is_fallback")
    return {r["signature"]: r["kernel_id"] for r in rows}


PYTORCH_ONLY = ("sdpa.", "torch.", "eager.", "compile.")


def family_table(times: dict, fallback: dict[str, str]) -> list[dict]:
    by_op: dict[str, dict] = {}
    for (signature, _dims), kernels in times.items():
        default = fallback.get(signature)
        if default not in kernels:
            continue
        best = min(kernels.values())
        pytorch_best = min(t for k, t in kernels.items() if k.startswith(PYTORCH_ONLY))
        entry = by_op.setdefault(signature.split("[")[0], {"speedups": [], "over_pytorch": [], "winners": Counter(),
                                                           "default": default})
        entry["speedups"].append(kernels[default] / best)
        entry["over_pytorch"].append(pytorch_best / best)
        entry["winners"][min(kernels, key=kernels.get)] += 1
    return [{"op": op, "default": e["default"], "buckets": len(e["speedups"]),
             "geomean_speedup": geomean(e["speedups"]), "max_speedup": max(e["speedups"]),
             "geomean_over_pytorch_best": geomean(e["over_pytorch"]), "winners": dict(e["winners"].most_common())}
            for op, e in sorted(by_op.items())]


def search_table(times: dict) -> list[dict]:
    """Per tunable family and op signature: the search's gain per bucket over the default configuration."""
    by_family: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for (signature, _dims), kernels in times.items():
        for base in {k.split("[")[0] for k in kernels if "[" in k}:
            searched = {k: t for k, t in kernels.items() if k.startswith(base + "[")}
            if base in kernels:
                best = min(searched, key=searched.get)
                gain = kernels[base] / min(kernels[base], searched[best])
                by_family.setdefault((base, signature), []).append((gain, best if gain > 1 else base))
    return [{"kernel": base, "signature": signature, "buckets": len(gains),
             "geomean_gain": geomean([g for g, _ in gains]), "max_gain": max(g for g, _ in gains),
             "buckets_gaining_5pct": sum(g > 1.05 for g, _ in gains),
             "searched_configs": len({k for k in times_of(times, signature) if k.startswith(base + "[")})}
            for (base, signature), gains in sorted(by_family.items())]


def times_of(times: dict, signature: str) -> set[str]:
    return {k for (sig, _), kernels in times.items() if sig == signature for k in kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--mode", default="graph", choices=["graph", "eager"])
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    times = buckets(args.artifact, args.mode)
    families = family_table(times, fallbacks(args.artifact))
    searched = search_table(times)
    print(f"best admitted kernel vs PyTorch default ({args.mode} mode), per op over the grid buckets")
    print(f"{'op':<18} {'default':<18} {'buckets':>7} {'geomean':>8} {'max':>7} {'vs PyTorch best':>15}  "
          f"winners (buckets)")
    for row in families:
        winners = ", ".join(f"{k} ({n})" for k, n in row["winners"].items())
        print(f"{row['op']:<18} {row['default']:<18} {row['buckets']:>7} {row['geomean_speedup']:>7.2f}x "
              f"{row['max_speedup']:>6.2f}x {row['geomean_over_pytorch_best']:>14.2f}x  {winners}")
    print(f"\noptuna search: gain of the searched configurations over the family's default ({args.mode} mode)")
    print(f"{'kernel':<20} {'signature':<52} {'configs':>7} {'geomean':>8} {'max':>6} {'buckets >5%':>12}")
    for row in searched:
        print(f"{row['kernel']:<20} {row['signature']:<52} {row['searched_configs']:>7} {row['geomean_gain']:>7.2f}x "
              f"{row['max_gain']:>5.2f}x {row['buckets_gaining_5pct']:>6}/{row['buckets']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"mode": args.mode, "families": families, "search": searched},
                                                  indent=1))


if __name__ == "__main__":
    main()
