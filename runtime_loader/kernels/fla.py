"""flash-linear-attention (the fla-core wheel: Triton kernels) for Qwen3.5's Gated DeltaNet layers:
the gated delta rule and the short causal conv1d before it.

Its gated delta rule takes our layout as it is: q, k (batch, seq, hk, dk), v (batch, seq, hv,
dv) with hv a multiple of hk (its "grouped value attention"), g the log decay and beta per
value head, the state (batch, hv, dk, dv); q is scaled by dk ** -0.5 by default, as ours, and
use_qk_l2norm_in_kernel is our qk_l2norm flag (eps 1e-6 inside the rsqrt, as transformers
copied it from FLA). Two algorithms:
- chunk: the WY form over chunks of 16, 32 or 64 tokens (a family: the grid picks the chunk);
  what a prompt wants;
- fused_recurrent: one program per (batch, value head, dv block) that walks the tokens with the
  state in registers; what a decode step wants.
Both return the final state, which we hand back in fp32 as the op's contract says.
Its causal conv1d takes x as (batch, seq, channels), weight (channels, width) and a state of the
last width inputs (batch, channels, width), as our op; a decode step goes to its update kernel,
which rolls the state in place (the op lets a kernel consume it).
"""
from __future__ import annotations

import functools

from ..dtypes import ALL_DTYPES
from ..specs import KernelSpec, Tunable

REQUIRES = ("fla",)
DELTANET = frozenset({"recurrent.gated_deltanet"})
FEATURES = frozenset({"gqa", "qk_l2norm"})


def chunk_gated_deltanet(q, k, v, g, beta, state, qk_l2norm: bool, *, chunk: int):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    out, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                        use_qk_l2norm_in_kernel=qk_l2norm, chunk_size=chunk)
    return out, final.float()


def recurrent_gated_deltanet(q, k, v, g, beta, state, qk_l2norm: bool):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    out, final = fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=qk_l2norm)
    return out, final.float()


def causal_conv1d(x, weight, bias, state, silu: bool):
    from fla.modules.causal_conv1d import causal_conv1d as conv
    from fla.modules.causal_conv1d import causal_conv1d_update

    activation = "silu" if silu else None
    if state is not None and x.shape[1] == 1:
        out = causal_conv1d_update(x, state, weight=weight, bias=bias, activation=activation)
        return (out[0] if isinstance(out, tuple) else out), state  # 0.6.0 returns (out, the rolled cache)
    return conv(x, weight=weight, bias=bias, initial_state=state, output_final_state=True, activation=activation)


def _spec(kernel_id: str, impl, notes: str, ops=DELTANET, features=FEATURES) -> KernelSpec:
    return KernelSpec(kernel_id, ops, "fla-core", impl, platforms=frozenset({"cuda"}), min_sm=80,
                      dtypes=ALL_DTYPES, features=features, graph_safe=True, jit=True, jit_caches=("triton",),
                      requires=REQUIRES, notes=notes)


def _chunk_config(config: dict[str, int]):
    return functools.partial(chunk_gated_deltanet, **config)


CHUNK_DEFAULT = {"chunk": 64}  # FLA's own default
SPECS = [_spec("fla.recurrent_gated_deltanet", recurrent_gated_deltanet,
               "fused recurrent: the state in registers, a walk over the tokens; for decode steps"),
         _spec("fla.causal_conv1d", causal_conv1d, "Triton conv over (batch, seq, channels); a decode step rolls the "
               "state in place", ops=frozenset({"conv.causal_depthwise"}), features=frozenset({"silu", "bias"}))]
TUNABLES = [Tunable(spec=_spec("fla.chunk_gated_deltanet", _chunk_config(CHUNK_DEFAULT),
                               "chunked (WY) gated delta rule; chunk tokens per block"),
                    params={"chunk": (16, 32, 64)}, default=CHUNK_DEFAULT, build=_chunk_config)]
