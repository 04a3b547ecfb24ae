"""Liger-Kernel (Triton) adapters: RMSNorm (plain and with the residual add), LayerNorm,
SwiGLU, GeGLU and split-half RoPE.

Each adapter calls the forward function that Liger's autograd Function runs
(liger_kernel.ops.<op>.<op>_forward): no autograd node, no saved tensors. They come
from the op modules themselves, not from liger_kernel.ops or liger_kernel.functional,
whose names Liger may rebind to another DSL's kernels (LIGER_KERNEL_IMPL, CuTe DSL on
Hopper): liger.* is always Liger's Triton kernels. Liger is imported inside the
adapters, so this module imports without it.
"""
from __future__ import annotations

import torch

from ..dtypes import ALL_DTYPES
from ..specs import HEAD_DIM_ANY, KernelSpec

LLAMA_CASTING = "llama"  # fp32 statistics, the normalised row cast back before the weight: HF Llama's RMSNorm
GEMMA_CASTING = "gemma"  # everything in fp32, one rounding at the end: Gemma's (1 + weight) RMSNorm


def _offset_casting(unit_offset: bool) -> tuple[float, str]:
    """Liger's y = x_hat * (offset + weight): offset 1 with Gemma casting is our unit_offset."""
    return (1.0, GEMMA_CASTING) if unit_offset else (0.0, LLAMA_CASTING)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as Liger's row kernels take it: they walk rows by x.stride(0) but columns at unit stride.
    A 2-D tensor with unit column stride (e.g. a slice of wider rows) goes as it is; anything
    else is made contiguous, a copy only when it is not already."""
    return x if x.dim() == 2 and x.stride(1) == 1 else x.contiguous()


def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    from liger_kernel.ops.rms_norm import rms_norm_forward

    # row_mode=None: Liger picks its one-row or 16-row-block kernel from the shape
    return rms_norm_forward(_rows(x), weight.contiguous(), eps, *_offset_casting(unit_offset), None)[0]


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False):
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

    # Writes both results to new tensors: x and residual are left as they were.
    normed, total = fused_add_rms_norm_forward(_rows(x), _rows(residual), weight.contiguous(), eps,
                                               *_offset_casting(unit_offset))[:2]
    return normed, total


def layer_norm(x, weight, bias, eps: float):
    from liger_kernel.ops.layer_norm import layer_norm_forward

    return layer_norm_forward(_rows(x), weight.contiguous(), bias.contiguous(), eps)[0]


def _gate_up_buffer(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The (tokens, 2 * width) buffer whose two halves gate and up are, as a view of it; None
    when they are not such halves (e.g. two separate projections)."""
    width = gate.shape[-1]
    halves = (gate.dim() == 2 and up.shape == gate.shape and up.stride() == gate.stride()
              and gate.stride(1) == 1 and gate.stride(0) >= 2 * width and up.dtype == gate.dtype
              and up.untyped_storage().data_ptr() == gate.untyped_storage().data_ptr()
              and up.data_ptr() == gate.data_ptr() + width * gate.element_size())
    return gate.as_strided((gate.shape[0], 2 * width), gate.stride()) if halves else None


def swiglu(gate, up):
    from liger_kernel.ops.swiglu import swiglu_forward, swiglu_fused_gate_up_forward

    # LigerSiLUMulFunction's kernel walks gate, up and the output with one row stride, so the two
    # halves of a gate_up buffer would need a contiguous copy each; Liger's fused gate-up kernel
    # (same math: silu in fp32, cast, times up) reads them in place from the buffer instead.
    gate_up = _gate_up_buffer(gate, up)
    if gate_up is not None:
        return swiglu_fused_gate_up_forward(gate_up)[1]
    return swiglu_forward(gate.contiguous(), up.contiguous())[2]


def geglu(gate, up):
    from liger_kernel.ops.geglu import geglu_forward

    # One row stride for gate, up and the output, and no gate-up variant: the halves of a
    # gate_up buffer are copied (a no-op for separate contiguous projections).
    return geglu_forward(gate.contiguous(), up.contiguous())[2]


def rope(q, k, cos, sin, interleaved: bool):
    """Split-half RoPE. Liger rotates in place, in a (batch, seq, heads, d) contiguous buffer;
    its own .contiguous() is a no-op whenever the caller's q already has that layout (Hugging
    Face's q_proj(x).view(b, s, h, d).transpose(1, 2), or any one-token step), and the caller's
    q and k would be overwritten. So q and k are copied once each, into that layout, and those
    copies are rotated and returned as (batch, heads, seq, d) views. Liger reads only the first
    half of cos and sin: the duplicated cat(freqs, freqs) layout of Hugging Face and of the op."""
    if interleaved:
        raise ValueError("liger.rope implements split-half RoPE only, not interleaved pairs")
    from liger_kernel.ops.rope import rope_forward

    q_out = q.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
    k_out = k.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
    rope_forward(q_out, k_out, cos, sin)
    return q_out, k_out


def _spec(kernel_id: str, op: str, impl, notes: str, **capabilities) -> KernelSpec:
    # Triton kernels (compiled on first use, into Triton's cache); Triton supports sm80 and newer. Any
    # liger_kernel module imports the package, which imports torch._dynamo, transformers and (where
    # installed) PEFT: 10.8 s to a first call on the H100's host (benchmarks/runs/2026-12-06-f.txt,
    # --quick), 2.5 s past torch's import on the CPU VM without PEFT
    return KernelSpec(kernel_id, frozenset({op}), "liger-kernel", impl, platforms=frozenset({"cuda"}), min_sm=80,
                      dtypes=ALL_DTYPES, graph_safe=True, deterministic=True, jit=True, jit_caches=("triton",),
                      requires=("liger_kernel",), notes=notes, slow_start=True, **capabilities)


ROW_LIMIT = "rows up to 65536 wide (one Triton block per row)"
SPECS = [
    _spec("liger.rms_norm", "norm.rms", rms_norm, f"Llama casting, offset 0 (unit_offset: Gemma casting, offset 1); "
          f"{ROW_LIMIT}", features=frozenset({"unit_offset"})),
    _spec("liger.rms_norm_add", "norm.rms_add", rms_norm_add,
          f"LigerFusedAddRMSNorm forward, Llama casting (unit_offset: Gemma casting, offset 1); new output tensors; "
          f"{ROW_LIMIT}", features=frozenset({"unit_offset", "keep_inputs"})),
    _spec("liger.layer_norm", "norm.layer", layer_norm, f"fp32 statistics and affine; {ROW_LIMIT}"),
    _spec("liger.swiglu", "act.swiglu", swiglu,
          "halves of one gate_up buffer: Liger's fused gate-up kernel, zero-copy; otherwise LigerSiLUMul "
          "(non-contiguous inputs copied)"),
    _spec("liger.geglu", "act.geglu", geglu,
          "gelu tanh approximation; gate and up copied to contiguous when they are halves of a gate_up buffer"),
    _spec("liger.rope", "posenc.rope", rope,
          "q and k copied once each into (batch, seq, heads, d): Liger rotates in place and the caller's "
          "q and k must stay untouched",
          head_dim_max=HEAD_DIM_ANY, head_dim_multiple=2, features=frozenset({"gqa", "rope_split_half"})),
]
