"""The ops, one family per module: each holds its ops' records (OpSchema: dims, flags, fallback,
how a call is served and read), their example inputs, their eager kernels (the fallbacks written
as transformers computes the ops) and the tuner's grid hints. Their contracts (fp32 references,
tolerances, FLOPs and bytes) are the modules of the same names in lzsolve.ops.

    attention  prefill, decode, decode over an FP8 cache
    norm       RMSNorm, its fused residual add and FP8 forms, QK-norm, LayerNorm
    rope       rotary position embedding
    embedding  token embedding, learned positions
    act        SwiGLU (and FP8), GeGLU, GELU, sigmoid gate
    linear     GEMM, FP8 GEMMs
    moe        router, experts
    conv       causal depthwise conv1d
    recurrent  Gated DeltaNet and its gates

base.py holds what records are made of (OpSchema, Signature) and the registry OPS.
"""
from ..specs import required_features
from . import act, attention, conv, embedding, linear, moe, norm, recurrent, rope
from .base import (
    MAX_DIM,
    NAMED_DIMS,
    OPS,
    ROPE_LAYOUTS,
    OpSchema,
    Signature,
    check_op,
    example_args,
    method_args,
    register_op,
    static_problem,
)

# in the order OPS lists them (the Dispatcher's methods and the custom ops are made in this order)
FAMILIES = {module.__name__.rsplit(".", 1)[1]: module
            for module in (attention, norm, rope, embedding, act, linear, moe, conv, recurrent)}
for _family in FAMILIES.values():
    for _record in _family.RECORDS:
        register_op(_record)

# the eager kernels of every family (registered by runtime_loader.kernels, beside the libraries')
SPECS = [spec for family in FAMILIES.values() for spec in family.SPECS]

__all__ = ["FAMILIES", "MAX_DIM", "NAMED_DIMS", "OPS", "ROPE_LAYOUTS", "SPECS", "OpSchema", "Signature", "check_op",
           "example_args", "method_args", "register_op", "required_features", "static_problem"]
