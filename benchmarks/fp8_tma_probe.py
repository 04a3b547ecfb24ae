"""Would a Hopper-style Triton FP8 GEMM close the gap to cuBLASLt (issue 18, benchmark log §16.5)?

cuBLASLt's FP8 GEMM with one unit scale per tensor reaches 1.60-1.87x bf16 from 1024 tokens, and
with this format's scales (one per token of x, one per channel of the weight) it loses 0.1-0.4x of
that; our `triton.linear_fp8_prequantised` (pointer loads, one output tile per program) is behind
both. This probe times, on an x quantised beforehand (linear.fp8_prequantised, as the norm before
the projection leaves it), `triton.linear_fp8_prequantised_tma` (kernels/triton_ops/fp8.py: a
persistent grid, one program per SM walking output tiles, both operands loaded by TMA through
tensor descriptors, the row and column scales and the bias applied to the fp32 accumulator) at a
few tiles. Each configuration is checked against the op's fp32 reference first, then timed
interleaved with bf16 cuBLAS, cuBLASLt row-wise (`torch.scaled_mm`), the per-tensor ceiling
(unchecked) and our pointer-based kernel (`triton.linear_fp8_prequantised`).

    python benchmarks/fp8_tma_probe.py [--tokens 256,1024,4096,16384] [--shapes qkv_proj,o_proj] [--json out.json]
"""
from __future__ import annotations

import argparse

import torch
from checked_timing import agreeing, timed, write_figures
from fp8 import SHAPES

from lzsolve.measure.harness import Budget, make_harness
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.ops import Signature
from runtime_loader.specs import config_id

# (block_m, block_n, block_k, warps, stages): Triton's tutorial FP8 tiles (128 rows; 128 or 256
# columns; K 64 or 128), and 64-row tiles for a few hundred tokens over q/k/v's 1280 columns
TMA_CONFIGS = ((128, 256, 128, 8, 3), (128, 256, 64, 8, 4), (128, 128, 128, 8, 4), (128, 128, 128, 4, 4),
               (64, 128, 128, 4, 4), (64, 256, 128, 4, 3), (64, 64, 256, 4, 4))
OURS = ({"block_m": 128, "block_n": 256, "block_k": 128, "warps": 8, "stages": 3, "split_k": 1},
        {"block_m": 64, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4, "split_k": 1})

# each printed as its best configuration's ratio to bf16
COLUMNS = ("triton.linear_fp8_prequantised_tma", "triton.linear_fp8_prequantised[", "torch.scaled_mm")


def tma_id(config: tuple) -> str:
    return config_id("triton.linear_fp8_prequantised_tma", dict(zip(("block_m", "block_n", "block_k", "warps", "stages"),
                                                                    config)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="256,1024,4096,16384")
    parser.add_argument("--shapes", default="qkv_proj,o_proj,gate_up_proj,down_proj")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda")
    harness = make_harness(device, Budget(min_samples=10, max_samples=40))
    gen = torch.Generator(device=device).manual_seed(0)
    contract, rows = CONTRACTS["linear.fp8_prequantised"], []
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        sig = Signature.make("linear.fp8_prequantised", {"k": k, "n": n}, ("per_channel",), "bf16")
        dense = Signature.make("linear", {"k": k, "n": n}, (), "bf16")
        for tokens in map(int, args.tokens.split(",")):
            inputs = contract.make_inputs(sig, {"tokens": tokens}, device, gen)
            q, x_scale, weight, weight_scale = inputs[:4]
            specs = [registry.get("torch.scaled_mm")] + [registry.get(config_id("triton.linear_fp8_prequantised", c))
                                                         for c in OURS] + [registry.get(tma_id(c)) for c in TMA_CONFIGS]
            agreed, errors = agreeing(contract.op, sig, specs, inputs)
            bf16 = CONTRACTS["linear"].make_inputs(dense, {"tokens": tokens}, device, gen)
            one = torch.ones((), device=device)
            calls = {"bf16 cuBLAS": [lambda: registry.get("torch.linear").impl(*bf16)],
                     "per-tensor ceiling": [lambda: torch._scaled_mm(q, weight.t(), scale_a=one, scale_b=one,
                                                                     out_dtype=torch.bfloat16)],
                     **{s.kernel_id: [lambda impl=s.impl: impl(*inputs)] for s in agreed}}
            us = timed(harness, calls)
            base = us["bf16 cuBLAS"]
            best = {label: min((v, key) for key, v in us.items() if v and key.startswith(label))
                    for label in COLUMNS if any(key.startswith(label) and v for key, v in us.items())}
            print(f"{name:12} tokens={tokens:5} bf16={base:7.1f}us  ceiling {base / us['per-tensor ceiling']:.2f}x  "
                  + "  ".join(f"{label} {base / v:.2f}x ({key})" for label, (v, key) in best.items()))
            for kernel_id, message in errors.items():
                print(f"    {kernel_id}: {message}")
            rows.append({"shape": name, "k": k, "n": n, "tokens": tokens, "us": us, "errors": errors})
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
