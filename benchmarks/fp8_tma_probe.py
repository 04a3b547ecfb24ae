"""Would a Hopper-style Triton FP8 GEMM close the gap to cuBLASLt (issue 18, BENCHMARKS §16.5)?

cuBLASLt's FP8 GEMM with one unit scale per tensor reaches 1.60-1.87x bf16 from 1024 tokens, and
with this format's scales (one per token of x, one per channel of the weight) it loses 0.1-0.4x of
that; our `triton.linear_fp8_prequantised` (pointer loads, one output tile per program) is behind
both. This probe times, on an x quantised beforehand (linear.fp8_prequantised, as the norm before
the projection leaves it), an experimental kernel: a persistent grid (one program per SM walking
output tiles), both operands loaded by TMA through tensor descriptors, the row and column scales
and the bias applied to the fp32 accumulator, the bf16 tile stored by TMA. Each configuration is
checked against the op's fp32 reference first, then timed interleaved with bf16 cuBLAS, cuBLASLt
row-wise (`torch.scaled_mm`), the per-tensor ceiling (unchecked) and our current kernel.

    python benchmarks/fp8_tma_probe.py [--tokens 256,1024,4096,16384] [--shapes qkv_proj,o_proj] [--json out.json]
"""
from __future__ import annotations

import argparse
import types

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from checked_timing import agreeing, timed, write_figures
from fp8 import SHAPES
from lzsolve.bench import Budget, make_harness
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.kernels.triton_ops.linear import output_tile
from runtime_loader.ops import Signature
from runtime_loader.specs import config_id

GROUP_M = 8


@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_tma_kernel(q_desc, w_desc, out_desc, x_scale_ptr, w_scale_ptr, bias_ptr, M, N, K, w_scale_stride,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           NUM_PROGRAMS: tl.constexpr):
    """out = (q @ w.T) * x_scale[m] * w_scale[n] (+ bias): q (M, K), w (N, K) e4m3 through TMA
    descriptors (zero-filled past the edges, so no masks on the loads), a program per SM walking
    the output tiles. The tile's position is recomputed for the epilogue from a second counter, as
    Triton's persistent-matmul tutorial does, so the software pipeliner can overlap a tile's loads
    with the previous tile's epilogue."""
    start = tl.program_id(0)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_out = start - NUM_PROGRAMS
    for tile in tl.range(start, tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = output_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = q_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        tile_out += NUM_PROGRAMS
        pid_m, pid_n = output_tile(tile_out, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc *= tl.load(x_scale_ptr + rows, mask=rows < M, other=0.0)[:, None]
        acc *= tl.load(w_scale_ptr + cols * w_scale_stride, mask=cols < N, other=0.0)[None, :]
        if bias_ptr is not None:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(out_desc.dtype))


def fp8_matmul_tma(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16, *, block_m: int,
                   block_n: int, block_k: int, warps: int, stages: int):
    """linear.fp8_prequantised's call through the TMA kernel: q (..., k) e4m3, x_scale one per row."""
    rows = q.reshape(-1, q.shape[-1]).contiguous()
    (m, k), n = rows.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    scales = weight_scale.reshape(-1).float()
    programs = min(torch.cuda.get_device_properties(q.device).multi_processor_count,
                   triton.cdiv(m, block_m) * triton.cdiv(n, block_n))
    _fp8_matmul_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(rows, [block_m, block_k]),
        TensorDescriptor.from_tensor(weight.contiguous(), [block_n, block_k]),
        TensorDescriptor.from_tensor(out, [block_m, block_n]), x_scale.reshape(-1).float(), scales,
        bias, m, n, k, 1 if scales.numel() > 1 else 0, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=GROUP_M, NUM_PROGRAMS=programs, num_warps=warps, num_stages=stages)
    return out.view(*q.shape[:-1], n)


# (block_m, block_n, block_k, warps, stages): the tutorial's FP8 tiles (128 rows; 128 or 256
# columns; K 64 or 128), and 64-row tiles for a few hundred tokens over q/k/v's 1280 columns
TMA_CONFIGS = ((128, 256, 128, 8, 3), (128, 256, 64, 8, 4), (128, 128, 128, 8, 4), (128, 128, 128, 4, 4),
               (64, 128, 128, 4, 4), (64, 256, 128, 4, 3), (64, 64, 256, 4, 4))
OURS = ({"block_m": 128, "block_n": 256, "block_k": 128, "warps": 8, "stages": 3, "split_k": 1},
        {"block_m": 64, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4, "split_k": 1})


def tma_spec(config: tuple) -> types.SimpleNamespace:
    block_m, block_n, block_k, warps, stages = config
    return types.SimpleNamespace(
        kernel_id=f"tma[{block_m}x{block_n}x{block_k},w{warps},s{stages}]",
        impl=lambda *a: fp8_matmul_tma(*a, block_m=block_m, block_n=block_n, block_k=block_k, warps=warps,
                                       stages=stages))


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
                                                         for c in OURS] + [tma_spec(c) for c in TMA_CONFIGS]
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
                    for label in ("tma", "triton.", "torch.scaled_mm") if any(key.startswith(label) and v for key, v in us.items())}
            print(f"{name:12} tokens={tokens:5} bf16={base:7.1f}us  ceiling {base / us['per-tensor ceiling']:.2f}x  "
                  + "  ".join(f"{label} {base / v:.2f}x ({key})" for label, (v, key) in best.items()))
            for kernel_id, message in errors.items():
                print(f"    {kernel_id}: {message}")
            rows.append({"shape": name, "k": k, "n": n, "tokens": tokens, "us": us, "errors": errors})
    if args.json:
        write_figures(args.json, device, rows)


if __name__ == "__main__":
    main()
