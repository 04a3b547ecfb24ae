"""FA3's split-KV on a GPU: num_splits=0 (FA3's heuristic) against 1 (never split), beside SDPA's default.

Prefill (causal, seq_q == kv_len) and decode shapes of llama3-70b TP8 (8 q heads, 1 kv head) and
llama3-8b (32 q, 8 kv heads), head dim 128, bf16, over batch x length grids that are mostly not
powers of two. Every variant is checked against SDPA first, then all are timed interleaved by
lzsolve's harness (graph replay, median µs). Why runtime_loader/kernels/flash_attn.fa3_splits
splits decode and never a causal prefill: benchmark log §10.10.

    python benchmarks/archive/fa3_splits.py [--json out.json]     # needs a Hopper GPU and fa3-fwd
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from lzsolve.measure.harness import Budget, make_harness
from runtime_loader import registry

HEADS = ((8, 1), (32, 8))  # (q heads, kv heads)
PREFILL_BATCHES = (1, 2, 3, 4, 5, 8)
PREFILL_SEQS = (100, 128, 180, 248, 256, 300, 384, 450, 512, 530, 600, 656, 700, 768, 800, 900, 1000, 1024,
                1100, 1300, 1536, 1800, 2048, 3000)
DECODE_BATCHES, DECODE_KV = (1, 4, 16, 64), (512, 2048, 8192, 32768)
SPLITS = {"fa3_split_heuristic": 0, "fa3_unsplit": 1}


def fa3(q, k, v, causal: bool, num_splits: int):
    from fa3_fwd_interface import flash_attn_func
    t = lambda x: x.transpose(1, 2)  # noqa: E731 - (batch, heads, seq, d) <-> FA's (batch, seq, heads, d)
    return t(flash_attn_func(t(q), t(k), t(v), causal=causal, num_splits=num_splits))


def time_shape(harness, kind: str, hq: int, hkv: int, batch: int, seq_q: int, kv_len: int) -> dict:
    device, causal = torch.device("cuda"), kind == "prefill"
    q = torch.randn(batch, hq, seq_q, 128, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, hkv, kv_len, 128, device=device, dtype=torch.bfloat16) for _ in range(2))
    sdpa = registry.get("sdpa.default").impl
    reference = sdpa(q, k, v, causal, None).float()
    candidates = {"sdpa_default": [lambda: sdpa(q, k, v, causal, None)]}
    for name, splits in SPLITS.items():
        error = (fa3(q, k, v, causal, splits).float() - reference).abs().max().item()
        assert error < 2e-2, f"{name} disagrees with SDPA by {error} at {kind} b{batch} {seq_q}x{kv_len}"
        candidates[name] = [lambda splits=splits: fa3(q, k, v, causal, splits)]
    timed = harness.measure(candidates, modes=("graph",))
    return {"kind": kind, "hq": hq, "hkv": hkv, "batch": batch, "seq_q": seq_q, "kv_len": kv_len,
            **{name: round(m.graph.median_ms * 1e3, 2) for name, m in timed.items()}}


def summary(rows: list[dict]) -> None:
    for kind in ("prefill", "decode"):
        for hq, hkv in HEADS:
            sel = [r for r in rows if r["kind"] == kind and r["hq"] == hq]
            print(f"{kind} {hq} q / {hkv} kv heads, {len(sel)} shapes (ratios to SDPA's default; >1 slower)")
            for name in SPLITS:
                ratios = [r[name] / r["sdpa_default"] for r in sel]
                geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
                print(f"  {name:20} geomean {geomean:.3f}  worst {max(ratios):.3f}  best {min(ratios):.3f}")
            worse = [r for r in sel if r["fa3_split_heuristic"] > 1.1 * r["fa3_unsplit"]]
            better = [r for r in sel if r["fa3_unsplit"] > 1.1 * r["fa3_split_heuristic"]]
            for label, found in (("split >1.1x slower", worse), ("unsplit >1.1x slower", better)):
                shapes = ", ".join(f"{r['batch']}x{r['kv_len']}" for r in found[:10])
                print(f"  {label}: {len(found)} shapes {shapes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every timing here")
    args = parser.parse_args()
    harness = make_harness(torch.device("cuda"), Budget(time_cap_s=0.12, max_samples=60, warmup_s=0.02))
    print("device:", torch.cuda.get_device_name())
    rows = [time_shape(harness, "prefill", hq, hkv, b, s, s)
            for hq, hkv in HEADS for b in PREFILL_BATCHES for s in PREFILL_SEQS]
    rows += [time_shape(harness, "decode", hq, hkv, b, 1, kv)
             for hq, hkv in HEADS for b in DECODE_BATCHES for kv in DECODE_KV]
    summary(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
