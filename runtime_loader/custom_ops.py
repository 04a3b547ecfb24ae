"""The Dispatcher as torch.library custom ops, for code under torch.compile.

torch.compile(fullgraph=True) cannot trace into the Dispatcher's Python (dict
lookups keyed on shapes) without graph breaks, so these ops present each call
as one opaque node with a fake (meta) implementation for shape propagation; at
run time the node calls the active Dispatcher. `activate(d)` chooses it
(`load` does not, so several dispatchers can coexist).

    runtime_loader.custom_ops.activate(d)
    y = torch.ops.lzsolve.rms_norm(x, w, 1e-6)

There is one custom op per Dispatcher method, generated from the op records
(runtime_loader.ops.OPS): the same name and parameters as the method, the record's
`fake` for output shapes.
"""
from __future__ import annotations

import inspect

import torch

from .dispatcher import Dispatcher, serve_op
from .ops import OPS, OpSchema, register_op

_active = Dispatcher(None)
CUSTOM_OPS: dict[str, object] = {}  # method -> its torch.library custom op


def activate(dispatcher: Dispatcher) -> None:
    global _active
    _active = dispatcher


def active() -> Dispatcher:
    return _active


def _aliases(out, args) -> bool:
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    return out.untyped_storage().data_ptr() in inputs


def _unaliased(outputs, args):
    """A custom op may not return its inputs' storage: copies of what a consuming kernel wrote in place."""
    if isinstance(outputs, tuple):
        return tuple(o.clone() if _aliases(o, args) else o for o in outputs)
    return outputs.clone() if _aliases(outputs, args) else outputs


def define(op: OpSchema):
    """torch.ops.lzsolve.<method>: calls the active Dispatcher's method; schema from the record's
    front (parameters) and fake (output type)."""
    if op.method in CUSTOM_OPS:
        return CUSTOM_OPS[op.method]
    method = op.method

    def body(*args, **kwargs):
        return getattr(_active, method)(*args, **kwargs)

    def consuming_body(*args, **kwargs):
        return _unaliased(getattr(_active, method)(*args, **kwargs), args + tuple(kwargs.values()))

    fn = consuming_body if op.consumes else body
    fn.__name__ = method
    returns = inspect.signature(op.fake, eval_str=True).return_annotation
    fn.__signature__ = inspect.Signature(op.parameters, return_annotation=returns)
    custom = torch.library.custom_op(f"lzsolve::{method}", fn, mutates_args=op.consumes)
    custom.register_fake(op.fake)
    CUSTOM_OPS[method] = custom
    return custom


for _op in OPS.values():
    define(_op)


def add_op(op: OpSchema) -> OpSchema:
    """A new op, served like the built-in ones: its record known to signatures and the registry
    (runtime_loader.ops.register_op), its Dispatcher method (dispatcher.serve_op) and its
    torch.ops.lzsolve custom op. A plugin adds its ops with this, its contracts with
    lzsolve.ops.register_contract and its kernels with runtime_loader.registry.register (see
    CONTRIBUTING.md)."""
    register_op(op)
    serve_op(op)
    define(op)
    return op
