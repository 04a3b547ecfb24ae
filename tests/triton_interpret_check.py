"""Parity of lzsolve's Triton kernels on CPU, through the Triton interpreter; and of Helion's
RMSNorms, whose generated Triton runs the same way, where helion is installed.

Run by tests/test_triton_kernels.py as `python -m tests.triton_interpret_check`, in a process
of its own: TRITON_INTERPRET must be set before triton is first imported. For every family,
its default configuration and a few others (chunked rows, partial head blocks, split-K with
empty splits...) are checked against the op's fp32 reference on tiny shapes, in fp32 and
bf16 (the GEMMs in fp16: the interpreter's tl.dot multiplies bf16 operands as their raw
integer bits, a Triton 3.9 interpreter bug; on a GPU the kernel takes bf16 like fp16).
Prints one line per failure and exits 1 if there was any.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import importlib.util  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from lzsolve.ops import CONTRACTS, compare, to_fp32  # noqa: E402
from runtime_loader import registry  # noqa: E402
from runtime_loader.ops import OPS, Signature  # noqa: E402
from runtime_loader.specs import config_id  # noqa: E402

CPU = torch.device("cpu")
NORM_CHUNKED = {"block": 256, "warps": 2}  # rows of 320: two chunks
ACT_CHUNKED = {"block": 128, "warps": 2}  # rows of 300: three chunks, the last partial

# (base id, op, static dims, flags, dynamic dims, configurations besides the default)
CASES = [
    *[(base, op, {"hidden": 320}, flags, {"tokens": 5}, [NORM_CHUNKED])
      for base, op in (("triton.rms_norm", "norm.rms"), ("triton.rms_norm_add", "norm.rms_add"),
                       ("triton.rms_norm_fp8", "norm.rms_fp8"), ("triton.rms_norm_add_fp8", "norm.rms_add_fp8"))
      for flags in ((), ("unit_offset",))],
    # new tensors for the results, x and residual left as they were (check() compares them)
    *[("triton.rms_norm_add", "norm.rms_add", {"hidden": 320}, flags, {"tokens": 5}, [NORM_CHUNKED])
      for flags in (("keep_inputs",), ("unit_offset", "keep_inputs"))],
    # 3 heads of 48 per token: rows of one head, in one tile and in three chunks of 16
    *[("triton.qk_norm", "norm.qk", {"heads": 3, "d": 48}, flags, {"tokens": 5}, [{"block": 16, "warps": 1}])
      for flags in ((), ("unit_offset",))],
    ("triton.layer_norm", "norm.layer", {"hidden": 320}, (), {"tokens": 5}, [NORM_CHUNKED]),
    ("triton.swiglu", "act.swiglu", {"width": 300}, (), {"tokens": 3}, [ACT_CHUNKED]),
    ("triton.swiglu_fp8", "act.swiglu_fp8", {"width": 300}, (), {"tokens": 3}, [NORM_CHUNKED]),  # a row per program
    ("triton.geglu", "act.geglu", {"width": 300}, (), {"tokens": 3}, [ACT_CHUNKED]),
    ("triton.gelu", "act.gelu", {"width": 300}, (), {"tokens": 3}, [ACT_CHUNKED]),
    ("triton.sigmoid_gate", "act.sigmoid_gate", {"width": 300}, (), {"tokens": 3}, [ACT_CHUNKED]),
    # 6 heads in a tile of 8, 5 tokens in blocks of 2 (the last partial) and of the default's 32
    ("triton.deltanet_gates", "recurrent.deltanet_gates", {"heads": 6}, (), {"tokens": 5},
     [{"block_t": 2, "warps": 1}]),
    # 40 channels in blocks of 16 (the last partial); 19 tokens in blocks of 4 (taps before the first
    # token read zeros); a decode step on a state, rolled in place; width 3 without bias or SiLU
    ("triton.causal_conv1d", "conv.causal_depthwise", {"channels": 40, "width": 4}, ("silu", "bias"),
     {"batch": 2, "seq": 19}, [{"block_t": 4, "block_c": 16, "warps": 1}]),
    ("triton.causal_conv1d", "conv.causal_depthwise", {"channels": 40, "width": 4}, ("silu",), {"batch": 3, "seq": 1},
     [{"block_t": 1, "block_c": 16, "warps": 1}]),
    ("triton.causal_conv1d", "conv.causal_depthwise", {"channels": 40, "width": 3}, (), {"batch": 2, "seq": 1}, []),
    # 6 q heads and 2 kv heads in blocks of 4: a full and a partial q block, a partial k block;
    # head_dim 48 leaves part of the pair tile (32 lanes for 24 pairs) masked.
    *[("triton.rope", "posenc.rope", {"hq": 6, "hkv": 2, "d": 48, "layout": layout}, (), {"tokens": 5},
       [{"block_h": 4, "warps": 1}]) for layout in ("split_half", "interleaved")],
    # 20 x 48 outputs in 16 x 16 tiles: 2 x 3 tiles. K = 80 in 16s split 4 ways: 32, 32, 16 and
    # an empty split that must still write its zeros; in 32s split 2 ways: 64 and a partial 16.
    *[("triton.linear", "linear", {"k": 80, "n": 48}, flags, {"tokens": 20},
       [{"block_m": 16, "block_n": 16, "block_k": 16, "warps": 2, "stages": 2, "split_k": 4},
        {"block_m": 16, "block_n": 32, "block_k": 32, "warps": 4, "stages": 3, "split_k": 2}])
      for flags in (("bias",), ())],
    # our FP8 GEMM on an input quantised beforehand, through the wrapper's reshapes; K split 4 ways as above
    ("triton.linear_fp8_prequantised", "linear.fp8_prequantised", {"k": 80, "n": 48}, ("per_channel", "bias"),
     {"tokens": 20}, [{"block_m": 16, "block_n": 16, "block_k": 32, "warps": 2, "stages": 2, "split_k": 4}]),
    # the TMA GEMM on an input quantised beforehand (quantising inside, as triton.linear_fp8, it would
    # meet the interpreter's e4m3 cast: undo_dropped_carries): 20 x 48 outputs in 16 x 16 tiles walked
    # by the interpreter's two programs (three tiles each), K = 80 in 32s (the last partial, read as
    # zeros past the edge), the partial last row block stored only inside; one weight scale or one per column
    *[("triton.linear_fp8_prequantised_tma", "linear.fp8_prequantised", {"k": 80, "n": 48}, flags, {"tokens": 20},
       [{"block_m": 16, "block_n": 16, "block_k": 32, "warps": 2, "stages": 2}])
      for flags in (("per_channel", "bias"), ())],
    # 6 experts, 2 slots, 9 tokens: 18 pairs in segments padded to 16 (most one short of a block,
    # an idle expert); 40 and 24 columns leave partial n and k blocks; the default's block_m 64
    # puts every expert in one mostly empty block
    ("triton.moe_experts", "moe.experts", {"experts": 6, "top_k": 2, "hidden": 40, "inter": 24}, (), {"tokens": 9},
     [{"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 4, "warps": 2, "stages": 2},
      {"block_m": 16, "block_n": 32, "block_k": 32, "group_m": 1, "warps": 2, "stages": 2}]),
    # the same in GPT-OSS's form: weights read through transposed strides, gate and up rows in
    # turn, both biases, and a limit of 0.5 so both clamps bite
    ("triton.moe_experts", "moe.experts", {"experts": 6, "top_k": 2, "hidden": 40, "inter": 24, "alpha": 1.702,
                                           "limit": 0.5}, ("interleaved", "bias", "transposed"), {"tokens": 9},
     [{"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 4, "warps": 2, "stages": 2}]),
    # a rank of three under expert parallelism: 4 of 12 experts, two thirds of the slots other
    # ranks' (the sentinel id 4): they land in no block, and their slots stay zero
    ("triton.moe_experts", "moe.experts", {"experts": 4, "top_k": 2, "hidden": 40, "inter": 24, "ep": 3}, (),
     {"tokens": 9}, [{"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 4, "warps": 2, "stages": 2}]),
    # 60 experts in a block of 64 (padding never picked), 3 of them per token, with and without renormalisation
    *[("triton.moe_router", "moe.router", {"experts": 60, "top_k": 3}, flags, {"tokens": 5}, [{"warps": 1}])
      for flags in (("renorm",), ())],
]
# Helion's RMSNorms, where helion is installed (the dev extra has it): the Triton it generates, run by
# the interpreter. Rows of 320 whole in registers (Helion's tile is the row's power of two) and walked
# in chunks of 256 (the last partial); 5 tokens in tiles of 2 rows (the last partial)
HELION_CASES = [
    (base, op, {"hidden": 320}, flags, {"tokens": 5}, [{"rows": 2, "loop": 256, "warps": 2}])
    for base, op in (("helion.rms_norm", "norm.rms"), ("helion.rms_norm_add", "norm.rms_add"))
    for flags in ((), ("unit_offset",), *((("keep_inputs",),) if op == "norm.rms_add" else ()))]


def helion_sizes_in_any_order() -> list[str]:
    """Each Helion norm called first with one row, then none, then more: helion 1.4.0 binds every
    size to the kernel its first call compiled, and a one-row kernel then normalised only the first
    row of larger calls (runtime_loader/kernels/helion_kernels.py, configured)."""
    from runtime_loader.kernels.helion_kernels import configured

    failures = []
    for base, op, static, flags, _, _ in [case for case in HELION_CASES if not case[3]]:  # plain, and with the add
        configured.cache_clear()  # the first calls of this process
        sig = Signature.make(op, static, flags, "bf16")
        for tokens in (1, 0, 5, 64):
            if not tokens:  # nothing to compare: an empty result, not a read past the rows (a crash)
                registry.get(base).impl(*CONTRACTS[op].make_inputs(sig, {"tokens": 0}, CPU, torch.Generator()))
                continue
            failures += [f"{f} (after fewer rows)" for f in check(base, sig, {"tokens": tokens})]
    return failures


def separate(args):
    """gate and up as two contiguous tensors instead of the halves of one gate_up buffer."""
    return tuple(a.clone() for a in args)


def with_leading_dims(args):
    """x (and a residual of its shape) as (1, tokens, ...): every leading dim is a row."""
    rows = args[0].shape
    return tuple(a.unsqueeze(0) if isinstance(a, torch.Tensor) and a.shape == rows else a for a in args)


def strided_rows(args):
    """x as the first columns of wider rows, as it arrives from the fused q/k/v projection."""
    x, *rest = args
    wide = torch.zeros(*x.shape[:-1], x.shape[-1] + 7, dtype=x.dtype)
    wide[..., :x.shape[-1]] = x
    return (wide[..., :x.shape[-1]], *rest)


DOT_OPS = ("linear", "linear.fp8_prequantised", "moe.experts")  # tl.dot: fp16, not bf16, in the interpreter (see above)
VARIANTS = {"act.swiglu": separate, "act.swiglu_fp8": separate, "act.geglu": separate, "norm.rms_add": with_leading_dims,
            "norm.rms_add_fp8": with_leading_dims,
            "linear": with_leading_dims, "conv.causal_depthwise": strided_rows}


FP8_OUT_OPS = ("norm.rms_fp8", "norm.rms_add_fp8", "act.swiglu_fp8")  # q (e4m3) first among their outputs


def undo_dropped_carries(got, expected):
    """got, with the carries the interpreter's e4m3 cast dropped put back (fp8_quantisation: 31.76
    gives 16, not 32): a power of two whose double lies nearer the expected value is doubled."""
    power_of_two = (got != 0) & (got.abs().log2() == got.abs().log2().round())
    return torch.where(power_of_two & ((got * 2 - expected).abs() < (got - expected).abs()), got * 2, got)


def check(kernel_id: str, sig: Signature, dims: dict, variant=None) -> list[str]:
    contract = CONTRACTS[sig.op]
    args = contract.make_inputs(sig, dims, CPU, torch.Generator().manual_seed(3))
    if variant:
        args = variant(args)
    reference = contract.reference(*to_fp32(args))  # first: norm.rms_add writes into its inputs
    kept = {i: args[i].clone() for i in OPS[sig.op].consumed(args)} if "keep_inputs" in sig.flags else {}
    try:
        out = registry.get(kernel_id).impl(*args)
    except Exception as e:  # one failing case must not hide the others
        return [f"{kernel_id} on {sig}: raised {type(e).__name__}: {e}"]
    if any(not torch.equal(args[i], before) for i, before in kept.items()):
        return [f"{kernel_id} on {sig}: wrote over an input keep_inputs leaves as it was"]
    if sig.op in FP8_OUT_OPS:  # q first, by value: the interpreter's e4m3 cast drops carries (fp8_quantisation)
        out = (undo_dropped_carries(out[0].float(), reference[0]), *out[1:])
    ok, _, message = compare(out, reference, contract.tolerances[sig.dtype])
    label = f" ({variant.__name__})" if variant else ""
    return [] if ok else [f"{kernel_id} on {sig}{label}: {message}"]


def moe_rows_are_aligned(device: torch.device = CPU) -> list[str]:
    """The fused MoE's sort (align_blocks): every pair of this rank's experts in exactly one row,
    in a block of its expert; blocks in expert order, unused ones -1; other ranks' pairs nowhere.
    `device`: cuda for real atomics (`benchmarks/device.sh moe`, with TRITON_INTERPRET unset)."""
    from runtime_loader.kernels.triton_ops.moe import align_blocks
    failures, gen = [], torch.Generator().manual_seed(5)
    # (tokens, top_k, experts, block_m, ids past `experts`: another rank's), over several programs too
    for tokens, top_k, experts, block_m, elsewhere in ((1, 2, 8, 16, 0), (9, 2, 6, 16, 0), (50, 2, 4, 16, 8),
                                                       (600, 4, 60, 32, 0)):
        ids = torch.randint(0, experts + elsewhere, (tokens, top_k), generator=gen)
        rows, block_expert = (t.cpu() for t in align_blocks(ids.to(device), experts, block_m))
        flat, pairs = ids.reshape(-1), ids.numel()
        placed = rows[rows < pairs].long()
        where = (rows < pairs).nonzero().flatten()
        used = block_expert[block_expert >= 0]
        if (sorted(placed.tolist()) != (flat < experts).nonzero().flatten().tolist()
                or not torch.equal(block_expert[where // block_m].long(), flat[placed])
                or (used[1:] < used[:-1]).any() or (block_expert[len(used):] != -1).any()):
            failures.append(f"align_blocks misplaced pairs: tokens {tokens}, top_k {top_k}, experts {experts}")
    return failures


def split_k_is_deterministic() -> list[str]:
    sig = Signature.make("linear", {"k": 80, "n": 48}, ("bias",), "fp32")
    args = CONTRACTS["linear"].make_inputs(sig, {"tokens": 20}, CPU, torch.Generator().manual_seed(4))
    impl = registry.get(config_id("triton.linear", {"block_m": 16, "block_n": 16, "block_k": 16, "warps": 2,
                                                    "stages": 2, "split_k": 4})).impl
    return [] if torch.equal(impl(*args), impl(*args)) else ["triton.linear with split_k=4 is not deterministic"]


def fp8_quantisation() -> list[str]:
    """The per-token e4m3 quantisation against eager's (the reference and the FP8 GEMMs take it as
    the format): the scales exactly, each element to eager's value. The interpreter's cast to e4m3
    is not a GPU's (round to nearest even): it rounds ties away from zero (10.5 gives 11) and, where
    the rounding carries into the next power of two, drops the carry (31.76 gives 16, not 32), a
    Triton 3.9 interpreter bug. So an element may also be the other e4m3 neighbour of x / scale,
    or half of a power of two it should have reached; nothing else."""
    from runtime_loader.kernels.triton_ops import fp8
    from runtime_loader.quant import quantize_per_token as eager_quantisation

    failures = []
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(7, 300, generator=gen) * 3).to(dtype)
        x[2] = 0  # an all-zero row: the scale's floor
        strided = torch.zeros(7, 307, dtype=dtype)
        strided[:, :300] = x
        for rows in (x, strided[:, :300]):
            q, scale = fp8.quantize_per_token(rows, 2)
            expected_q, expected_scale = eager_quantisation(x)
            got, expected, exact = q.float(), expected_q.float(), x.float() / expected_scale
            step = torch.exp2(exact.abs().clamp(min=2.0 ** -6).log2().floor() - 3)  # e4m3: 3 mantissa bits
            got = undo_dropped_carries(got, expected)
            allowed = (got == expected) | ((got - exact).abs() <= step)
            if not torch.equal(scale, expected_scale) or not bool(allowed.all()):
                failures.append(f"fp8 quantisation of {dtype} rows (row stride {rows.stride(0)}) differs from eager's")
    return failures


def fp8_gemm() -> list[str]:
    """triton.linear_fp8's GEMM on x quantised by eager (see fp8_quantisation), against the
    reference: 20 x 48 outputs in 16 x 16 tiles, K = 80 in 32s (the last partial), whole and split
    4 ways (the last split empty: it must still write its zeros), per channel with a bias and per
    tensor."""
    from runtime_loader.kernels.triton_ops import TUNABLES, fp8
    from runtime_loader.quant import quantize_per_token as eager_quantisation

    default = next(t.default for t in TUNABLES if t.spec.kernel_id == "triton.linear_fp8")
    small = {"block_m": 16, "block_n": 16, "block_k": 32, "warps": 2, "stages": 2, "split_k": 1}
    failures = []
    for flags in (("per_channel", "bias"), ()):
        for dtype in ("fp32", "bf16"):
            sig = Signature.make("linear.fp8", {"k": 80, "n": 48}, flags, dtype)
            contract = CONTRACTS["linear.fp8"]
            x, weight, weight_scale, bias = contract.make_inputs(sig, {"tokens": 20}, CPU, torch.Generator().manual_seed(3))
            reference = contract.reference(*to_fp32((x, weight, weight_scale, bias)))
            q, scale = eager_quantisation(x)
            for config in (default, small, dict(small, split_k=4)):
                out = fp8.fp8_matmul(q, scale, weight, weight_scale, bias, x.dtype, **config)
                ok, _, message = compare(out, reference, contract.tolerances[dtype])
                if not ok:
                    failures.append(f"triton.linear_fp8's GEMM {config} on {sig}: {message}")
    return failures


CHECKED_APART = {  # families without a case in CASES, and why
    "triton.linear_fp8": "fp8_gemm() checks its GEMM on an input quantised beforehand",
    # its quantisation meets the interpreter's e4m3 cast (undo_dropped_carries); its GEMM is
    # triton.linear_fp8_prequantised_tma's, which CASES checks
    "triton.linear_fp8_tma": "its GEMM is triton.linear_fp8_prequantised_tma's",
    "triton.scaled_mm_fp8": "its GEMM is torch._scaled_mm (cuBLASLt, CUDA only); its quantisation is fp8_quantisation()'s",
}


def unchecked_families() -> list[str]:
    """Every Triton family of the registry has a case here (a new kernel fails until it has one)."""
    from runtime_loader.kernels.triton_ops import TUNABLES

    covered = {case[0] for case in CASES} | set(CHECKED_APART)
    return [f"{t.base_id} has no case in tests/triton_interpret_check.py's CASES" for t in TUNABLES
            if t.base_id not in covered]


def main() -> int:
    failures = (unchecked_families() + split_k_is_deterministic() + fp8_quantisation() + fp8_gemm()
                + moe_rows_are_aligned())
    checked = 1 + 4 + 12 + 4
    helion = importlib.util.find_spec("helion") is not None
    if helion:
        failures += helion_sizes_in_any_order()
        checked += 6
    for base, op, static, flags, dims, configs in CASES + (HELION_CASES if helion else []):
        for dtype in ("fp32", "fp16" if op in DOT_OPS else "bf16"):
            sig = Signature.make(op, static, flags, dtype)
            ids = [base] + [config_id(base, config) for config in configs]
            for kernel_id in ids:
                failures += check(kernel_id, sig, dims)
                checked += 1
            if op in VARIANTS:
                failures += check(base, sig, dims, VARIANTS[op])
                checked += 1
    skipped = "" if helion else " (helion is not installed: its kernels were not checked)"
    print("\n".join(failures) or f"{checked} checks agree with the references{skipped}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
