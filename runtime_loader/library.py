"""The Dispatcher as torch.library custom ops, for code under torch.compile.

torch.compile(fullgraph=True) cannot trace into the Dispatcher's Python (dict
lookups keyed on shapes) without graph breaks, so these ops present each call
as one opaque node with a fake (meta) implementation for shape propagation; at
run time the node calls the active Dispatcher. `activate(d)` chooses it
(`load` does not, so several dispatchers can coexist).

    runtime_loader.library.activate(d)
    y = torch.ops.lzsolve.rms_norm(x, w, 1e-6)
"""
from __future__ import annotations

import torch
from torch import Tensor

from .dispatcher import Dispatcher

_active = Dispatcher(None)


def activate(dispatcher: Dispatcher) -> None:
    global _active
    _active = dispatcher


def active() -> Dispatcher:
    return _active


def _like_first(x, *args):
    """The fake (meta) result of the ops whose output is shaped like their first input."""
    return torch.empty_like(x)


@torch.library.custom_op("lzsolve::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None, qk_norm: bool = False,
              window: int = 0, softcap: float = 0.0) -> Tensor:
    """qk_norm: q and k come from a per-head norm (Qwen3, Gemma 3): the table's qk_norm signatures serve it.
    window, softcap: as Dispatcher.attention (sliding layers, Gemma 2's score softcap)."""
    return _active.attention(q, k, v, causal, scale, window, softcap, qk_norm)


@attention.register_fake
def _(q, k, v, causal, scale, qk_norm=False, window=0, softcap=0.0):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("lzsolve::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float, unit_offset: bool = False) -> Tensor:
    return _active.rms_norm(x, weight, eps, unit_offset)


rms_norm.register_fake(_like_first)


@torch.library.custom_op("lzsolve::qk_norm", mutates_args=())
def qk_norm(x: Tensor, weight: Tensor, eps: float, unit_offset: bool = False) -> Tensor:
    return _active.qk_norm(x, weight, eps, unit_offset)


qk_norm.register_fake(_like_first)


@torch.library.custom_op("lzsolve::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    return _active.layer_norm(x, weight, bias, eps)


layer_norm.register_fake(_like_first)


@torch.library.custom_op("lzsolve::rope", mutates_args=())
def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> tuple[Tensor, Tensor]:
    return _active.rope(q, k, cos, sin, interleaved)


@rope.register_fake
def _(q, k, cos, sin, interleaved):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("lzsolve::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return _active.swiglu(gate, up)


swiglu.register_fake(_like_first)


@torch.library.custom_op("lzsolve::geglu", mutates_args=())
def geglu(gate: Tensor, up: Tensor) -> Tensor:
    return _active.geglu(gate, up)


geglu.register_fake(_like_first)


@torch.library.custom_op("lzsolve::gelu", mutates_args=())
def gelu(x: Tensor) -> Tensor:
    return _active.gelu(x)


gelu.register_fake(_like_first)


@torch.library.custom_op("lzsolve::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return _active.linear(x, weight, bias)


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
