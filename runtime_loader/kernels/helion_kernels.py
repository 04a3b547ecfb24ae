"""RMSNorm, plain and with the residual add, in Helion (PyTorch's tile language, compiled to Triton).

Imported at a configuration's first call (runtime_loader/kernels/helion.py declares them), as it
imports helion. A program normalises a tile of rows; Helion generates the loads, the reduction
(the whole row in registers, or a loop over chunks of it: the configuration's reduction loop) and
the launch. Sizes are dynamic (static_shapes=False): one compile serves every token count of a
hidden size, which hl.specialize fixes. The statistics are fp32; the casting is our Triton
kernels' (triton_ops/norm.py): Llama's rounds the normalised row before the weight, Gemma's
(unit_offset) multiplies (1 + weight) in fp32 and rounds once.
"""
from __future__ import annotations

import functools

import helion
import helion.language as hl
import torch


def _normed(total, scale, eps: float, unit_offset, dtype):
    # 1 / sqrt rather than rsqrt: the same arithmetic to the bf16 output, and a form the Triton
    # interpreter runs (its libdevice has no rsqrt), so the CPU tests run the generated kernel
    rstd = 1.0 / torch.sqrt(torch.mean(total * total, dim=-1, keepdim=True) + eps)
    if unit_offset:
        return total * rstd * (1.0 + scale)
    return (total * rstd).to(dtype).to(torch.float32) * scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: hl.constexpr) -> torch.Tensor:
    tokens, hidden = x.size()
    hidden = hl.specialize(hidden)  # the row's width a constant of the compiled kernel; tokens stay dynamic
    out = torch.empty_like(x)
    for rows in hl.tile(tokens):
        total = x[rows, :].to(torch.float32)
        out[rows, :] = _normed(total, weight[:].to(torch.float32), eps, unit_offset, x.dtype).to(out.dtype)
    return out


def rms_norm_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 unit_offset: hl.constexpr) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, hidden = x.size()
    hidden = hl.specialize(hidden)  # the row's width a constant of the compiled kernel; tokens stay dynamic
    out, summed = torch.empty_like(x), torch.empty_like(x)
    for rows in hl.tile(tokens):
        # x + residual rounded to the input dtype, as eager's add: that total is written and normalised
        total = (x[rows, :].to(torch.float32) + residual[rows, :].to(torch.float32)).to(x.dtype)
        summed[rows, :] = total
        out[rows, :] = _normed(total.to(torch.float32), weight[:].to(torch.float32), eps, unit_offset, x.dtype).to(out.dtype)
    return out, summed


KERNELS = {"rms_norm": rms_norm, "rms_norm_add": rms_norm_add}


@functools.cache
def configured(function: str, rows: int, loop: int, warps: int, tokens_bucket: int = 2):
    """The Helion kernel at one configuration: `rows` rows a program, the row walked in chunks of
    `loop` (0: whole, in registers), `warps` warps. tokens_bucket: min(tokens, 2), a kernel for each:
    helion 1.4.0 binds every size of a dynamic dim to one compiled kernel, and one first called with
    a single row is compiled for one row: it normalised only the first row of every later call (on an
    H100 it was timed 40x past the roofline, the rest of its output whatever the allocator's block held,
    benchmarks/runs/2026-12-07-e.txt), and read past an empty one (the interpreter crashed). helion 1.5
    compiles sizes 0 and 1 apart."""
    config = helion.Config(block_sizes=[rows], reduction_loops=[loop or None], num_warps=warps, num_stages=1)
    return helion.kernel(KERNELS[function], config=config, static_shapes=False)
