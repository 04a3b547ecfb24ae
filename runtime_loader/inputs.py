"""What the ops' example inputs share: fresh random values in a signature's dtype, and the routing
skew mixture-of-experts inputs are drawn with. Each op's own input maker lives with its record in
runtime_loader.ops.<family>; one definition serves the tuner (parity checks and timing, through
lzsolve.ops) and the runtime (Dispatcher.warmup, through runtime_loader.ops.example_args).

Each maker is (signature, dynamic dims, device, generator) -> the kernel's arguments. Inputs
look like a real model's (random, never zeros; trained norm weights near 1; gate and up as
halves of one buffer), so kernels are checked and timed on what they will serve.
"""
from __future__ import annotations

import contextlib
import os

import torch

from .dtypes import DTYPES


def randn(shape, sig, device, gen, scale: float = 1.0) -> torch.Tensor:
    """Fresh normal samples in the signature's dtype (drawn in it directly: half the
    time of drawing fp32 and casting, which matters for CPU-sized lm_head weights)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=DTYPES[sig.dtype])
    return x.mul_(scale) if scale != 1.0 else x


def starts_from_state(dims) -> bool:
    """A prompt's chunk starts from no state (seq > 1), a decode step (seq == 1) from one."""
    return dims["seq"] == 1


# --- mixture of experts ---------------------------------------------------------------------------------
# Real routers load experts unevenly, and kernels react to it (the fullest expert sets a grouped
# GEMM's longest segment): the expert of popularity rank r gets a Zipf-like -s * log(r) on its
# router logit, scaled by log(8) / log(experts) so that the spread does not grow with the expert
# count. At s = 0.3 (4096 tokens) the fullest expert gets 1.6x the mean load of 8 experts (top 2),
# 2.4x of 128 (top 8) and 3.0x of 512 (top 10): trained routers with a balancing loss, roughly.
# `lzsolve tune --routing-skew S` measures at another skew (0: uniform): it sets SKEW_ENV, which
# its worker processes inherit, and records the skew with each moe.experts record.
ROUTING_SKEW = 0.3
SKEW_ENV = "LZSOLVE_ROUTING_SKEW"
ROUTED_OPS = ("moe.experts",)  # the ops whose inputs hold a routing


def routing_skew() -> float:
    """The skew routings are drawn with here: SKEW_ENV's when a tune set it, else ROUTING_SKEW."""
    return float(os.environ.get(SKEW_ENV, ROUTING_SKEW))


@contextlib.contextmanager
def skewed_routing(skew: float):
    """Routings drawn with `skew` inside, in this process and in the processes it starts."""
    before = os.environ.get(SKEW_ENV)
    os.environ[SKEW_ENV] = repr(float(skew))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SKEW_ENV, None)
        else:
            os.environ[SKEW_ENV] = before
