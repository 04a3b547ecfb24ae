"""Norms over the last dim: RMSNorm, its fused residual add, their FP8-quantised forms, the per-head
QK-norm and LayerNorm. Their records, how a call is read, example inputs and eager kernels.
Contract (references, FLOPs, bytes): lzsolve.ops.norm.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES
from ..inputs import randn
from ..quant import quantised_rows_fake, quantize_per_token
from ..specs import BOTH, HEAD_DIM_ANY, KernelSpec
from .base import OpSchema, Signature, promoted, rows_call

UNIT_OFFSET = ("unit_offset",)
KEEP_INPUTS = ("keep_inputs",)  # norm.rms_add leaves x and residual as they were (see rms_norm_add_front)
# the parameters tuned in x's dtype (OpSchema.same_dtype): an fp32 weight with bf16 x takes the fallback,
# in the dtype the module returns: transformers' RMSNorm weight * x.to(input_dtype) promotes (fp32), its
# (1 + weight) norms (Gemma) and F.layer_norm return x's; the fakes below say the same
WEIGHT = ("weight",)
RESIDUAL_WEIGHT = ("residual", "weight")


def rms_norm_front(x: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """x / rms(x) * weight; unit_offset: * (1 + weight) in fp32, rounded once (Gemma, Qwen3.5)."""
    return (x.shape, x.dtype, weight.dtype, x.is_cuda, unit_offset), (
        (x, weight, eps, True) if unit_offset else (x, weight, eps))


def rms_norm_call(x, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms", x, UNIT_OFFSET if unit_offset else ())


def rms_norm_add_front(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False,
                       keep_inputs: bool = False):
    """(rms_norm(x + residual) * weight, x + residual), the fused residual add of a pre-norm
    block. x and residual are consumed: a kernel may write the results into their storage, as
    serving engines do with their residual stream; keep_inputs: both are left as they were (the
    results in new tensors), for a caller that does not own them (a Hugging Face decoder layer's
    input may be a kept hidden state, or the user's inputs_embeds)."""
    return (x.shape, x.dtype, residual.dtype, weight.dtype, x.is_cuda, unit_offset, keep_inputs), (
        (x, residual, weight, eps, unit_offset, True) if keep_inputs else
        (x, residual, weight, eps, True) if unit_offset else (x, residual, weight, eps))


def rms_norm_add_fp8_front(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """rms_norm_add's normed rows quantised per token in the same pass: (q, scale, total); x and
    residual are consumed, as rms_norm_add's are."""
    return (x.shape, x.dtype, residual.dtype, weight.dtype, x.is_cuda, unit_offset), (
        (x, residual, weight, eps, True) if unit_offset else (x, residual, weight, eps))


def rms_norm_add_call(x, residual, weight, eps=1e-6, unit_offset=False, keep_inputs=False):
    return rows_call("norm.rms_add", x, (UNIT_OFFSET if unit_offset else ()) + (KEEP_INPUTS if keep_inputs else ()))


def rms_norm_fp8_call(x, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms_fp8", x, UNIT_OFFSET if unit_offset else ())


def rms_norm_add_fp8_call(x, residual, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms_add_fp8", x, UNIT_OFFSET if unit_offset else ())


def normed_dtype(x: Tensor, weight: Tensor, unit_offset: bool) -> torch.dtype:
    """What rms_norm returns: weight * x.to(input_dtype), promoted (Llama, Qwen3), or, under
    unit_offset, x's dtype ((1 + weight) in fp32, then .type_as(x): Gemma)."""
    return x.dtype if unit_offset else promoted(x, weight)


def rms_norm_fake(x: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False) -> Tensor:
    return torch.empty_like(x, dtype=normed_dtype(x, weight, unit_offset))


def rms_norm_add_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False,
                      keep_inputs: bool = False) -> tuple[Tensor, Tensor]:
    """(normed, total): the total in x + residual's promoted dtype, the norm of it as rms_norm_fake's."""
    total = torch.empty_like(x, dtype=promoted(x, residual))
    return torch.empty_like(x, dtype=normed_dtype(total, weight, unit_offset)), total


def quantised_rows_add_fake(x: Tensor, residual: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
    """The fake result of norm.rms_add_fp8: quantised_rows_fake's, then the total like residual, in
    x + residual's promoted dtype."""
    return (*quantised_rows_fake(x), torch.empty_like(residual, dtype=promoted(x, residual)))


def qk_norm_front(x: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """rms_norm of each head of x (..., heads, d) with one weight (d,) (Qwen3's q_norm, k_norm)."""
    return (x.shape, x.dtype, weight.dtype, x.is_cuda, unit_offset), (
        (x, weight, eps, True) if unit_offset else (x, weight, eps))


def qk_norm_call(x, weight=None, eps=1e-6, unit_offset=False):
    """x: (..., heads, d), every leading dim a token."""
    if x.dtype not in DTYPE_NAMES or x.dim() < 2:
        return None
    heads, d = x.shape[-2], x.shape[-1]
    flags = UNIT_OFFSET if unit_offset else ()
    return (Signature.make("norm.qk", {"heads": heads, "d": d}, flags, DTYPE_NAMES[x.dtype]),
            {"tokens": x.numel() // max(heads * d, 1)})


def layer_norm_front(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5):
    """bias None: a LayerNorm without a bias (its own signature, flag no_bias)."""
    return (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype, x.is_cuda), (x, weight, bias, eps)


def layer_norm_call(x, weight, bias, eps=1e-5):
    return rows_call("norm.layer", x, ("no_bias",) if bias is None else ())


# --- example inputs ---------------------------------------------------------------------------------
NORM_EPS = 1e-5


def _norm_weight(sig, size, device, gen):
    """Trained norms scale by about 1: weight near 1, or near 0 under (1 + weight)."""
    weight = randn((size,), sig, device, gen, scale=0.1)
    return weight if "unit_offset" in sig.flags else weight + 1


def _rows(sig, dims, device, gen):
    return randn((dims["tokens"], sig.dim("hidden")), sig, device, gen)


def _unit_offset(sig) -> tuple:
    """unit_offset is appended to the call only when the signature sets it."""
    return (True,) if "unit_offset" in sig.flags else ()


def rms_norm_inputs(sig, dims, device, gen):
    return (_rows(sig, dims, device, gen), _norm_weight(sig, sig.dim("hidden"), device, gen), NORM_EPS) \
        + _unit_offset(sig)


def rms_norm_add_inputs(sig, dims, device, gen):
    """keep_inputs: the call then names unit_offset either way, as the op's front passes it."""
    tail = ("unit_offset" in sig.flags, True) if "keep_inputs" in sig.flags else _unit_offset(sig)
    return (_rows(sig, dims, device, gen), _rows(sig, dims, device, gen),
            _norm_weight(sig, sig.dim("hidden"), device, gen), NORM_EPS) + tail


def qk_norm_inputs(sig, dims, device, gen):
    heads, d = sig.dim("heads"), sig.dim("d")
    x = randn((dims["tokens"], heads, d), sig, device, gen)
    return (x, _norm_weight(sig, d, device, gen), NORM_EPS) + _unit_offset(sig)


def layer_norm_inputs(sig, dims, device, gen):
    bias = None if "no_bias" in sig.flags else randn((sig.dim("hidden"),), sig, device, gen, scale=0.1)
    return _rows(sig, dims, device, gen), _norm_weight(sig, sig.dim("hidden"), device, gen), bias, NORM_EPS


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    """Over the last dim; also norm.qk's per-head norm, x (..., heads, d) with weight (d,)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:  # Gemma: (1 + weight) applied in fp32, one rounding at the end
        return (xf * (1.0 + weight.float())).to(x.dtype)
    return weight * xf.to(x.dtype)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False):
    """New tensors, whether or not the call asks for them (keep_inputs)."""
    total = x + residual
    return rms_norm(total, weight, eps, unit_offset), total


def rms_norm_fp8(x, weight, eps: float, unit_offset: bool = False):
    """The norm, then the per-token quantisation: two passes (about ten launches) where a fused
    kernel makes one; the norm's output rounded to x's dtype first, as an unfused server has it."""
    return quantize_per_token(rms_norm(x, weight, eps, unit_offset))


def rms_norm_add_fp8(x, residual, weight, eps: float, unit_offset: bool = False):
    normed, total = rms_norm_add(x, residual, weight, eps, unit_offset)
    return (*quantize_per_token(normed), total)


def layer_norm(x, weight, bias, eps: float):
    """bias None: LayerNorm without a bias (Cohere, OLMo). As F.layer_norm (nn.LayerNorm): weight and
    bias applied in fp32, one rounding to x's dtype, which the result keeps whatever theirs (an fp32
    LayerNorm in a bf16 model returns bf16: it does not promote)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    xf = (xf - mean) * torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
    out = xf * weight.float()
    return (out if bias is None else out + bias.float()).to(x.dtype)


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    # unit_offset: Gemma's norms scale by (1 + weight)
    OpSchema("norm.rms", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm", method="rms_norm",
             front=rms_norm_front, call=rms_norm_call, inputs=rms_norm_inputs, fake=rms_norm_fake, same_dtype=WEIGHT,
             fusible=True),
    OpSchema("norm.rms_add", ("hidden",), ("unit_offset", "keep_inputs"), ("tokens",), "eager.rms_norm_add",
             method="rms_norm_add", front=rms_norm_add_front, call=rms_norm_add_call, inputs=rms_norm_add_inputs,
             fake=rms_norm_add_fake, consumes=("x", "residual"), same_dtype=RESIDUAL_WEIGHT, fusible=True),
    # the norm before an FP8 W8A8 linear, its output quantised per token to float8 e4m3 in the same
    # pass, as linear.fp8 quantises its input: (q, scale (..., 1) fp32), q * scale ~ the normed rows;
    # the _add form returns the total third (written into residual's storage, as norm.rms_add may)
    OpSchema("norm.rms_fp8", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm_fp8",
             method="rms_norm_fp8", front=rms_norm_front, call=rms_norm_fp8_call, inputs=rms_norm_inputs,
             fake=quantised_rows_fake, same_dtype=WEIGHT),
    OpSchema("norm.rms_add_fp8", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm_add_fp8",
             method="rms_norm_add_fp8", front=rms_norm_add_fp8_front, call=rms_norm_add_fp8_call,
             inputs=rms_norm_add_inputs, fake=quantised_rows_add_fake, consumes=("x", "residual"),
             same_dtype=RESIDUAL_WEIGHT),
    OpSchema("norm.qk", ("heads", "d"), ("unit_offset",), ("tokens",), "eager.qk_norm", method="qk_norm",
             front=qk_norm_front, call=qk_norm_call, inputs=qk_norm_inputs, fake=rms_norm_fake, same_dtype=WEIGHT,
             fusible=True),
    # no_bias: LayerNorm without a bias (Cohere, StableLM-2 variants): bias None in the call
    OpSchema("norm.layer", ("hidden",), ("no_bias",), ("tokens",), "eager.layer_norm", method="layer_norm",
             front=layer_norm_front, call=layer_norm_call, inputs=layer_norm_inputs, same_dtype=("weight", "bias"),
             fusible=True),
)


SPECS = [
    KernelSpec("eager.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add, platforms=BOTH,
               dtypes=ALL_DTYPES, features=frozenset(UNIT_OFFSET + KEEP_INPUTS), graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_fp8", frozenset({"norm.rms_fp8"}), "torch", rms_norm_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_add_fp8", frozenset({"norm.rms_add_fp8"}), "torch", rms_norm_add_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True),
    KernelSpec("eager.qk_norm", frozenset({"norm.qk"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True),
    KernelSpec("eager.layer_norm", frozenset({"norm.layer"}), "torch", layer_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"no_bias"}), graph_safe=True, deterministic=True),
]
