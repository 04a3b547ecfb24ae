"""What the last bit of an FP8 activation scale changes (issue 18, benchmark log §16.7).

1. On any device: rows of bf16 x quantised per token to e4m3 with the scale computed two ways,
   amax / 448 (a division) and amax times the fp32 reciprocal of 448 (what torch's CUDA kernels
   do for a division by a number): how many rows' scales differ, and on how many rows, and how
   many elements at most, the e4m3 values differ.
2. On CUDA: the linear.fp8 kernels that quantise otherwise than the reference (the Triton pass,
   then cuBLASLt) against the reference and eager's own path, at one and 16 tokens of llama3-70b
   TP8's lm_head, down_proj and q/k/v shapes: rel_l2 of each, and whether the Triton
   quantisation gives eager's values and scales exactly.

    python benchmarks/archive/fp8_scale_rounding.py [--device cuda] [--rows 20000]
"""
from __future__ import annotations

import argparse

import torch

from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.ops import Signature
from runtime_loader.quant import E4M3_MAX, quantize_per_token

SHAPES = {"lm_head": (8192, 16032), "down_proj": (3584, 8192), "qkv_proj": (8192, 1280)}  # (k, n) per rank


def rows_moved(rows: int, width: int, device: torch.device) -> None:
    x = torch.randn(rows, width, generator=torch.Generator(device=device).manual_seed(0), device=device)
    x = x.to(torch.bfloat16).float()
    amax = x.abs().amax(-1, keepdim=True)
    # a tensor of 448s, not a number: torch divides by a number as a multiplication on CUDA
    divided = amax / torch.full_like(amax, E4M3_MAX)
    multiplied = amax * (torch.tensor(1.0) / torch.tensor(E4M3_MAX))
    q = [(x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() for scale in (divided, multiplied)]
    moved = (q[0] != q[1]).sum(-1)
    print(f"{rows} rows of {width}: scales differ on {int((divided != multiplied).sum())}, e4m3 values on "
          f"{int((moved > 0).sum())} rows ({(moved > 0).float().mean().item():.1%}), at most {int(moved.max())} "
          f"elements of a row")


def kernels_against_reference(device: torch.device) -> None:
    from runtime_loader.kernels.triton_ops import fp8

    contract, gen = CONTRACTS["linear.fp8"], torch.Generator(device=device).manual_seed(0)
    for name, (k, n) in SHAPES.items():
        sig = Signature.make("linear.fp8", {"k": k, "n": n}, ("per_channel",), "bf16")
        for tokens in (1, 1, 1, 1, 16):
            x, w, w_scale, bias = contract.make_inputs(sig, {"tokens": tokens}, device, gen)
            reference = contract.reference(*to_fp32((x, w, w_scale, bias)))
            expected_q, expected_scale = quantize_per_token(x)
            q, scale = fp8.quantize_per_token(x, 8)
            errors = {kernel_id: compare(registry.get(kernel_id).impl(x, w, w_scale, bias), reference,
                                         contract.tolerances["bf16"])[1]["rel_l2"]
                      for kernel_id in ("torch.scaled_mm_fp8", "triton.scaled_mm_fp8", "eager.linear_fp8")}
            print(f"{name:9} {tokens:3} tokens: values differ at {int((q.float() != expected_q.float()).sum())}, "
                  f"scales equal {torch.equal(scale, expected_scale)}; rel_l2 "
                  + ", ".join(f"{kernel_id} {e:.2e}" for kernel_id, e in errors.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows_moved(args.rows, 1024, device)
    if device.type == "cuda":
        kernels_against_reference(device)


if __name__ == "__main__":
    main()
