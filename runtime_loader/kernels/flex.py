"""FlexAttention (torch.nn.attention.flex_attention) under torch.compile: one fused kernel per shape.

Uncompiled, flex_attention materialises the whole score matrix; it is fast only compiled.
Dynamo keeps compiled graphs per *code object*, and once one code object holds
torch._dynamo.config.recompile_limit graphs (8) it runs that code eagerly: the unfused path.
Compiled with dynamic=False, every shape is a graph of its own, and a tuner visits dozens.
So each shape key gets its own compiled function whose code object is a private copy of
`_attend`'s: its cache holds that one graph, however many shapes the others see. (Functions
sharing a code object share its cache, so fresh function objects alone would not help.)
fullgraph=True turns any limit hit or graph break that remains into an error, never a
silent fallback to the unfused path.

A static graph per shape gives each shape the kernel Inductor picks for it (flex decoding
with split-KV for short queries, unmasked loads when lengths divide the tile); the price
is a compile the first time a shape is seen, at serving time too for shapes no table
warmed up.

The signature's options become a score mod (softcap) and a mask mod (causal, sliding
window) in `mods`; each is built once per option value, so Dynamo's guards on them hold.
Attention sinks take the row log-sum-exps flex returns (ops.attention.with_sinks).
A v head dim other than q's (attention's dv, MLA) is not declared: unchecked on a GPU here.
"""
from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from ..dtypes import ALL_DTYPES
from ..ops.attention import with_sinks
from ..specs import KernelSpec
from .sdpa import ATTENTION, ATTENTION_FEATURES, SINKS

try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:
    AuxRequest = None

BLOCK_MASKS_KEPT = 64  # a causal block mask is (seq / 128)^2 block indices; creating one costs seq_q * kv_len bools


@functools.cache
def mask_mod(causal: bool, window: int, offset: int) -> Callable | None:
    """Keys a query sees, as runtime_loader.ops.attention.visible_keys: under a causal mask query i
    sits at position i (SDPA's top-left), otherwise at offset + i (offset = kv_len - seq_q, so a
    decode query is the last position); a window keeps keys j > position - window."""
    if not causal and not window:
        return None

    def visible(batch, head, q_idx, kv_idx):
        position = q_idx if causal else q_idx + offset
        keep = kv_idx <= position if causal else kv_idx >= 0
        return keep & (kv_idx > position - window) if window else keep
    return visible


@functools.cache
def score_mod(softcap: float) -> Callable | None:
    if not softcap:
        return None

    def capped(score, batch, head, q_idx, kv_idx):  # Gemma 2: after scaling, before masking
        return softcap * torch.tanh(score / softcap)
    return capped


def mods(causal: bool, window: int, softcap: float, seq_q: int, kv_len: int) -> tuple[Callable | None, Callable | None]:
    """(score_mod, mask_mod) for the signature's options; None where nothing is modified."""
    return score_mod(softcap), mask_mod(causal, window, 0 if causal else kv_len - seq_q)


@functools.lru_cache(maxsize=BLOCK_MASKS_KEPT)
def block_mask(mask_mod: Callable, seq_q: int, kv_len: int, device: torch.device):
    # batch and heads broadcast (None): one mask for every head, which flex decoding requires under GQA
    return create_block_mask(mask_mod, None, None, seq_q, kv_len, device=device)


def _attend(q, k, v, score_mod, block_mask, scale, enable_gqa):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _attend_lse(q, k, v, score_mod, block_mask, scale, enable_gqa):
    """(out, each row's natural log-sum-exp): for attention sinks (ops.attention.with_sinks)."""
    if AuxRequest is None:  # a torch before return_aux
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=enable_gqa, return_lse=True)
    out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa,
                              return_aux=AuxRequest(lse=True))
    return out, aux.lse


def with_own_code(fn: Callable) -> Callable:
    """A copy of fn whose code object is its own (code.replace() always makes a new one)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def shape_key(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0) -> tuple:
    """Everything a dynamic=False graph is specialised on: shapes, strides, dtype, device, options, scale."""
    return (*((tuple(t.shape), t.stride()) for t in (q, k, v)), q.dtype, q.device, causal, scale, window, softcap)


class CompiledPerShape:
    """Compiled callables of `fn`, one per shape key, each with a Dynamo cache of its own."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: dict[tuple, Callable] = {}
        self.lock = threading.Lock()

    def __call__(self, key: tuple) -> Callable:
        with self.lock:
            compiled = self.compiled.get(key)
            if compiled is None:
                compiled = torch.compile(with_own_code(self.fn), dynamic=False, fullgraph=True)
                self.compiled[key] = compiled
            return compiled


_compiled_attend = CompiledPerShape(_attend)
_compiled_attend_lse = CompiledPerShape(_attend_lse)


def attention(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    scores, visible = mods(causal, window, softcap, q.shape[2], k.shape[2])
    mask = block_mask(visible, q.shape[2], k.shape[2], q.device) if visible else None
    key = shape_key(q, k, v, causal, scale, window, softcap)
    if sinks is None:
        return _compiled_attend(key)(q, k, v, scores, mask, scale, q.shape[1] != k.shape[1])
    out, lse = _compiled_attend_lse(key)(q, k, v, scores, mask, scale, q.shape[1] != k.shape[1])
    return with_sinks(out, lse, sinks)


SPECS = [
    # Triton templates need d >= 16 (tl.dot); other head dims are rounded up to a power of two inside.
    KernelSpec("flex.attention", ATTENTION, "torch", attention, platforms=frozenset({"cuda"}), min_sm=80,
               dtypes=ALL_DTYPES,
               head_dim_max=256, head_dim_multiple=16,
               # no sliding_window: a windowed causal prefill (seq 70, window 16) failed to lower on the H100
               # (torch 2.11: Inductor "NoValidChoicesError" for flex_attention); the mask mod is kept for it
               features=ATTENTION_FEATURES | SINKS | {"softcap"}, graph_safe=True, jit=True,
               jit_caches=("inductor", "triton"),
               notes="torch.compile(flex_attention, dynamic=False), one code object per shape: a compile per "
                     "new shape, never the unfused fallback"),
]
