"""Helion adapters (helion: PyTorch's tile language, compiled to Triton): RMSNorm, plain and with
the residual add, each a tunable family (rows a program, the row's reduction loop, warps).

The kernels are in helion_kernels.py, imported at a configuration's first call (it imports helion,
whose import brings in torch's Inductor), so this module imports without helion. The family's
configurations are ours to search (search_spaces/helion.*.yaml), not Helion's autotuner, which
benchmarks hundreds of configurations per kernel and shape. Both return new tensors (keep_inputs).
"""
from __future__ import annotations

import functools
from pathlib import Path

from ..dtypes import ALL_DTYPES
from ..ops.norm import KEEP_INPUTS, UNIT_OFFSET
from ..specs import KernelSpec, Tunable
from .triton_ops import powers_of_two
from .triton_ops.layout import as_rows

KERNELS = Path(__file__).with_name("helion_kernels.py")  # in the version's source digest, unimported


def _kernel(function: str, config: tuple, rows):
    """The configuration's Helion kernel for these rows: one for 0, 1 and more rows each (configured's
    tokens_bucket: helion 1.4.0 served a one-row kernel at every size)."""
    from .helion_kernels import configured

    return configured(function, *config, min(rows.shape[0], 2))


def rms_norm(x, weight, eps: float, unit_offset: bool = False, *, config: tuple):
    rows = as_rows(x)
    return _kernel("rms_norm", config, rows)(rows, weight, eps, unit_offset).view(x.shape)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False, *,
                 config: tuple):
    rows = as_rows(x)
    normed, total = _kernel("rms_norm_add", config, rows)(rows, as_rows(residual), weight, eps, unit_offset)
    return normed.view(x.shape), total.view(x.shape)


PARAMS = {"rows": powers_of_two(1, 16), "loop": (0, *powers_of_two(256, 8192)), "warps": powers_of_two(1, 32)}
DEFAULT = {"rows": 1, "loop": 0, "warps": 8}  # as triton.rms_norm's default: a row a program, in registers


def _build(impl, config: dict[str, int]):
    built = functools.partial(impl, config=tuple(config.values()))
    built.source_file = KERNELS
    return built


def _family(base_id: str, op: str, impl, notes: str, features) -> Tunable:
    build = functools.partial(_build, impl)
    spec = KernelSpec(base_id, frozenset({op}), "helion", build(DEFAULT), platforms=frozenset({"cuda"}), min_sm=80,
                      dtypes=ALL_DTYPES, features=frozenset(features), graph_safe=True, deterministic=True, jit=True,
                      jit_caches=("triton",), requires=("helion",),
                      slow_start=True,  # helion's import brings in torch's Inductor; each kernel traces at its first call
                      notes=notes)
    return Tunable(spec=spec, params=PARAMS, default=DEFAULT, build=build)


TUNABLES = [
    _family("helion.rms_norm", "norm.rms", rms_norm, "rows a program, fp32 statistics; new output",
            UNIT_OFFSET),
    _family("helion.rms_norm_add", "norm.rms_add", rms_norm_add,
            "the residual added in the kernel; total and normed rows new tensors", UNIT_OFFSET + KEEP_INPUTS),
]
