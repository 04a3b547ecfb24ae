"""lzsolve's own Triton kernels, as tunable families.

Every configuration of a family is a kernel of its own ('triton.rms_norm[block=4096,warps=8]').
`params` is what the runtime accepts, a safety bound on what a table may name; the tuner
searches the narrower spaces in search_spaces/<base id>.yaml. The defaults are what a
user gets without a search: picked for an H100 and LLM shapes.

Nothing here imports triton: a configuration imports its kernel module on its first call,
so runtime_loader imports, and a table naming these kernels loads, where triton is missing
or broken; `requires` turns that into the kernel's NOT_INSTALLED or BACKEND_IMPORT_FAILED.
"""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

from ...dtypes import ALL_DTYPES
from ...ops.moe import EXPERT_FORMS
from ...ops.norm import KEEP_INPUTS, UNIT_OFFSET
from ...specs import HEAD_DIM_ANY, KernelSpec, Tunable


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    return tuple(1 << e for e in range(low.bit_length() - 1, high.bit_length()))


class DeferredKernel:
    """One configuration's impl: the kernel module (and triton) is imported at the first call."""

    def __init__(self, module: str, function: str, config: dict[str, int]):
        self.module, self.function, self.config = module, function, config
        self.source_file = Path(__file__).with_name(f"{module}.py")  # its version's source digest, unimported

    @functools.cached_property
    def kernel(self):
        module = importlib.import_module(f"{__name__}.{self.module}")
        return functools.partial(getattr(module, self.function), **self.config)

    def __call__(self, *args):
        return self.kernel(*args)


def family(base_id: str, op: str, module: str, function: str, params: dict, default: dict, notes: str,
           **capabilities) -> Tunable:
    build = functools.partial(DeferredKernel, module, function)
    capabilities = {"min_sm": 80, "dtypes": ALL_DTYPES, **capabilities}
    spec = KernelSpec(base_id, frozenset({op}), "triton", build(default), platforms=frozenset({"cuda"}),
                      graph_safe=True, deterministic=True, jit=True, jit_caches=("triton",), requires=("triton",),
                      notes=notes, **capabilities)
    return Tunable(spec=spec, params=params, default=default, build=build)


# Rows up to 16384 wide fit one tile; wider ones (or a smaller block) are walked in chunks.
NORM_PARAMS = {"block": powers_of_two(256, 16384), "warps": powers_of_two(1, 32)}
# a row up to 8192 wide in one tile of its own width (layout.row_tile). A block of 4096 walks hidden 8192
# in two chunks: 4.4 against QuACK's 2.8 us at one token, 233 against 183 us at 16384 on an H100
# (benchmarks/cute_candidates.py, benchmarks/runs/2026-12-06-j.txt). The default is what --quick runs
NORM_DEFAULT = {"block": 8192, "warps": 8}
QK_NORM_PARAMS = {"block": powers_of_two(16, 1024), "warps": powers_of_two(1, 8)}
QK_NORM_DEFAULT = {"block": 256, "warps": 1}  # rows of one head: head_dim <= 256 in one tile
ACT_PARAMS = {"block": powers_of_two(128, 8192), "warps": powers_of_two(1, 16)}
ACT_DEFAULT = {"block": 1024, "warps": 4}

FP8_GEMM_PARAMS = {"block_m": powers_of_two(16, 256), "block_n": powers_of_two(16, 256),
                   "block_k": powers_of_two(32, 256), "warps": powers_of_two(2, 8), "stages": (1, 2, 3, 4, 5, 6),
                   "split_k": powers_of_two(1, 16)}
FP8_GEMM_DEFAULT = {"block_m": 128, "block_n": 128, "block_k": 128, "warps": 8, "stages": 3, "split_k": 1}
# the TMA form: persistent, no split K. Its default fits every output dtype's staging tile in shared
# memory (128 x 256 x 128 in 3 stages, its best tile from 1024 tokens on the H200, needs 273 KiB
# with an fp32 out: benchmarks/fp8_tma_probe.py), and was its best tile at 1024-4096 tokens of q/k/v
FP8_TMA_PARAMS = {name: values for name, values in FP8_GEMM_PARAMS.items() if name != "split_k"}
FP8_TMA_DEFAULT = {"block_m": 128, "block_n": 128, "block_k": 128, "warps": 4, "stages": 4}

TUNABLES = [
    family("triton.rms_norm", "norm.rms", "norm", "rms_norm", NORM_PARAMS, NORM_DEFAULT,
           "one row per program, fp32 statistics; rows wider than block take two passes",
           features=frozenset(UNIT_OFFSET)),
    family("triton.rms_norm_add", "norm.rms_add", "norm", "rms_norm_add", NORM_PARAMS, NORM_DEFAULT,
           "in place: total into residual, normed into x (keep_inputs: both new); rows wider than block take two "
           "passes", features=frozenset(UNIT_OFFSET + KEEP_INPUTS)),
    # the norm and an FP8 linear's per-token quantisation of its output in one pass (e4m3: sm 89+)
    family("triton.rms_norm_fp8", "norm.rms_fp8", "norm", "rms_norm_fp8", NORM_PARAMS, NORM_DEFAULT,
           "one row per program, quantised in the same pass; rows wider than block take three passes",
           features=frozenset(UNIT_OFFSET), min_sm=89),
    family("triton.rms_norm_add_fp8", "norm.rms_add_fp8", "norm", "rms_norm_add_fp8", NORM_PARAMS, NORM_DEFAULT,
           "total into residual, q and scales new; rows wider than block take three passes",
           features=frozenset(UNIT_OFFSET), min_sm=89),
    # one launch where F.rms_norm over Gemma's (1 + weight) takes five (casts, the add, the norm)
    family("triton.qk_norm", "norm.qk", "norm", "rms_norm", QK_NORM_PARAMS, QK_NORM_DEFAULT,
           "the rms_norm kernel over rows of one head", head_dim_max=HEAD_DIM_ANY, features=frozenset(UNIT_OFFSET)),
    family("triton.layer_norm", "norm.layer", "norm", "layer_norm", NORM_PARAMS, NORM_DEFAULT,
           "one row per program, two-pass fp32 variance; rows wider than block take three passes"),
    family("triton.swiglu", "act.swiglu", "act", "swiglu", ACT_PARAMS, ACT_DEFAULT,
           "reads gate and up through their row strides (halves of one gate_up buffer, no copy)"),
    # a row per program (its scale needs the whole row), as the norms
    family("triton.swiglu_fp8", "act.swiglu_fp8", "act", "swiglu_fp8", NORM_PARAMS, NORM_DEFAULT,
           "one row per program, quantised in the same pass; rows wider than block take two passes", min_sm=89),
    family("triton.geglu", "act.geglu", "act", "geglu", ACT_PARAMS, ACT_DEFAULT,
           "gelu tanh approximation; reads gate and up through their row strides"),
    family("triton.gelu", "act.gelu", "act", "gelu", ACT_PARAMS, ACT_DEFAULT, "gelu tanh approximation"),
    family("triton.sigmoid_gate", "act.sigmoid_gate", "act", "sigmoid_gate", ACT_PARAMS, ACT_DEFAULT,
           "x * sigmoid(gate) in one pass, fp32 inside"),
    # heads <= 256 (the whole row in one tile): Qwen3.5 has 16-64 value heads
    family("triton.deltanet_gates", "recurrent.deltanet_gates", "gates", "deltanet_gates",
           {"block_t": powers_of_two(1, 256), "warps": powers_of_two(1, 8)}, {"block_t": 32, "warps": 1},
           "both gates in one launch, block_t tokens per program; a and b read through their row strides"),
    # one launch with the new state: FLA's conv wrapper costs ~200 us of host time a call (kernels/triton_ops/conv.py)
    family("triton.causal_conv1d", "conv.causal_depthwise", "conv", "causal_conv1d",
           {"block_t": powers_of_two(1, 128), "block_c": powers_of_two(16, 1024), "warps": powers_of_two(1, 8)},
           {"block_t": 8, "block_c": 128, "warps": 4},
           "block_t tokens x block_c channels per program; x read through its strides; a decode step rolls the "
           "state in place", features=frozenset({"silu", "bias"})),
    family("triton.rope", "posenc.rope", "rope", "rope",
           {"block_h": powers_of_two(1, 32), "warps": powers_of_two(1, 16)}, {"block_h": 8, "warps": 4},
           "q and k in one launch, block_h heads of one token per program; out of place",
           head_dim_max=256, head_dim_multiple=2, features=frozenset({"gqa", "rope_split_half", "rope_interleaved"})),
    family("triton.linear", "linear", "linear", "linear",
           {"block_m": powers_of_two(16, 256), "block_n": powers_of_two(16, 256), "block_k": powers_of_two(16, 256),
            "warps": powers_of_two(2, 8), "stages": (1, 2, 3, 4, 5, 6), "split_k": powers_of_two(1, 16)},
           {"block_m": 128, "block_n": 128, "block_k": 64, "warps": 8, "stages": 3, "split_k": 1},
           "tiled GEMM, fp32 accumulation, bias in the epilogue; split_k > 1 reduces fp32 partials in order",
           features=frozenset({"bias"})),
    # FP8 tensor cores from sm89; one Triton pass quantises x per token (eager takes ~7 launches)
    family("triton.linear_fp8", "linear.fp8", "fp8", "linear_fp8", FP8_GEMM_PARAMS, FP8_GEMM_DEFAULT,
           "x quantised per token in one pass, then a tiled e4m3 GEMM with both scales and the bias in its epilogue; "
           "split_k > 1 reduces fp32 partials in order",
           min_sm=89, features=frozenset({"per_channel", "bias"})),
    family("triton.linear_fp8_prequantised", "linear.fp8_prequantised", "fp8", "linear_fp8_prequantised",
           FP8_GEMM_PARAMS, FP8_GEMM_DEFAULT, "triton.linear_fp8's GEMM alone: x quantised beforehand (norm.rms_fp8)",
           min_sm=89, features=frozenset({"per_channel", "bias"})),
    # TMA (tensor descriptors) needs Hopper
    family("triton.linear_fp8_tma", "linear.fp8", "fp8", "linear_fp8_tma", FP8_TMA_PARAMS, FP8_TMA_DEFAULT,
           "x quantised per token in one pass, then a persistent e4m3 GEMM loading by TMA, both scales and the bias "
           "in its epilogue; k % 16 == 0 and n % 8 == 0", min_sm=90, features=frozenset({"per_channel", "bias"})),
    family("triton.linear_fp8_prequantised_tma", "linear.fp8_prequantised", "fp8", "linear_fp8_prequantised_tma",
           FP8_TMA_PARAMS, FP8_TMA_DEFAULT, "triton.linear_fp8_tma's GEMM alone: x quantised beforehand",
           min_sm=90, features=frozenset({"per_channel", "bias"})),
    # cuBLASLt's row-wise scaled FP8 GEMM needs Hopper
    family("triton.scaled_mm_fp8", "linear.fp8", "fp8", "scaled_mm_fp8", {"warps": powers_of_two(1, 16)},
           {"warps": 8}, "x quantised per token in one Triton pass, then torch._scaled_mm (cuBLASLt FP8)",
           min_sm=90, dtypes=frozenset({"bf16", "fp16"}), features=frozenset({"per_channel", "bias"})),
    # block_m 16 for decode-sized segments (a token's top_k pairs each open an expert's block)
    family("triton.moe_experts", "moe.experts", "moe", "moe_experts",
           {"block_m": powers_of_two(16, 128), "block_n": powers_of_two(16, 256), "block_k": powers_of_two(16, 256),
            "group_m": powers_of_two(1, 64), "warps": powers_of_two(2, 8), "stages": (1, 2, 3, 4, 5, 6)},
           {"block_m": 64, "block_n": 128, "block_k": 64, "group_m": 8, "warps": 4, "stages": 4},
           "pairs sorted into expert segments padded to block_m; gate and up rows interleaved in one GEMM "
           "tile with SwiGLU in its epilogue, then down times the routing weight; slots summed in token order",
           features=EXPERT_FORMS),
    family("triton.moe_router", "moe.router", "moe", "moe_router", {"warps": powers_of_two(1, 8)}, {"warps": 4},
           "one launch per call: a token per program, fp32 softmax, top_k argmax rounds, renormalisation",
           features=frozenset({"renorm"})),
]
