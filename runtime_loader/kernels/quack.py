"""QuACK adapters (quack-kernels: CuTe DSL kernels for Hopper and Blackwell): RMSNorm, plain and
with the residual add.

quack.rmsnorm computes x_hat * (weight + weight_offset) in fp32 and rounds once at the end
(Gemma's casting; Llama's rounds the normalised row before the weight: both within the op's bf16
contract, which the parity gate checks). With a residual and prenorm it returns (normed, x +
residual), both new tensors, which is norm.rms_add with keep_inputs. Each (shape, dtype) compiles
at its first call through the CuTe DSL. QuACK is imported inside the adapters, so this module
imports without it. Written from rmsnorm() of quack-kernels 0.6.5; its parity cases pass on an H100.
"""
from __future__ import annotations

from ..dtypes import ALL_DTYPES
from ..specs import KernelSpec
from .flash_attn import CUTE_DSL


def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    from quack import rmsnorm

    return rmsnorm(x, weight, eps=eps, weight_offset=1.0 if unit_offset else 0.0)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False):
    from quack import rmsnorm

    normed, total = rmsnorm(x, weight, residual=residual, eps=eps, prenorm=True,
                            weight_offset=1.0 if unit_offset else 0.0)
    return normed, total


def _spec(kernel_id: str, op: str, impl, notes: str, **capabilities) -> KernelSpec:
    # quack's kernels refuse architectures before sm90 (RMSNorm's cluster setup)
    return KernelSpec(kernel_id, frozenset({op}), "quack-kernels", impl, platforms=frozenset({"cuda"}), min_sm=90,
                      dtypes=ALL_DTYPES, graph_safe=True, deterministic=True, jit=True, requires=("quack",),
                      slow_start=True,  # the CuTe DSL's import, and its kernels compiled in process memory
                      notes=f"{notes}; {CUTE_DSL}", **capabilities)


SPECS = [
    _spec("quack.rms_norm", "norm.rms", rms_norm, "fp32 throughout, one rounding (unit_offset: weight_offset 1)",
          features=frozenset({"unit_offset"})),
    _spec("quack.rms_norm_add", "norm.rms_add", rms_norm_add,
          "the residual added in the kernel (prenorm); new output tensors", features=frozenset({"unit_offset", "keep_inputs"})),
]
