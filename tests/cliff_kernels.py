"""A plugin with an alignment cliff (lzsolve tune --plugin tests.cliff_kernels): `cliff.rms_norm`
is right everywhere, fast where the token count is a power of two (every bucket of the grids)
and many times slower elsewhere, as a tiled kernel that pads to its tile can be."""
import torch

from runtime_loader.registry import register
from runtime_loader.specs import KernelSpec

PADDED_PASSES = 200  # the work an unaligned call wastes, in passes of the aligned kernel


def aligned(tokens: int) -> bool:
    return tokens & (tokens - 1) == 0


def _cliff_rms_norm(x, weight, eps):
    out = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    if not aligned(x.numel() // x.shape[-1]):
        for _ in range(PADDED_PASSES):
            out = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    return out


register(KernelSpec("cliff.rms_norm", frozenset({"norm.rms"}), "torch", _cliff_rms_norm,
                    platforms=frozenset({"cpu", "cuda"}), dtypes=frozenset({"bf16", "fp16", "fp32"})))
