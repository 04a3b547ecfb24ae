"""Roofline figures: every op's FLOP and byte counts against cases counted by hand here, and the
fraction of the roofline the report, `lzsolve explain` and the notebook show (lzsolve.decide.roofline)."""
import itertools
import json

import pytest
import torch

from lzsolve.decide.roofline import format_fraction
from lzsolve.ops import CONTRACTS
from lzsolve.ops.moe import experts_reached
from runtime_loader import ops as rops
from runtime_loader.inputs import skewed_routing
from runtime_loader.ops import Signature
from runtime_loader.ops.moe import moe_experts_inputs


def sig(op, static, flags=(), dtype="bf16"):
    return Signature.make(op, static, flags, dtype)


# (signature, dynamic dims, FLOPs, bytes), counted by hand. bf16 and fp16 are 2 bytes an element,
# fp32 4, e4m3 1, int64 ids 8. Counted: each tensor read or written once; a (hidden,)-like
# parameter read once; Python floats (eps, scales of the fp8 cache) not at all; softmax, masks and
# exp not at all in attention (its FLOPs are the two matmuls).
COUNTS = [
    # --- attention: 2 d FLOPs for q . k and 2 d for p v, per (query, key) pair the mask keeps ---
    # GQA, no mask: 4 q heads x 3 queries x 3 keys x 4 x d 8 = 1152;
    # q 4*3*8 = 96, out 96, k 2*3*8 = 48, v 48 -> 288 elements x 2 = 576
    (sig("attention.prefill", {"hq": 4, "hkv": 2, "d": 8}), {"batch": 1, "seq": 3}, 1152, 576),
    # causal: query i sees i + 1 keys: 1 + 2 + 3 + 4 = 10 pairs (not 4*4/2 = 8);
    # 4 x d 4 x 10 pairs x 2 q heads x batch 2 = 640. q 2*2*4*4 = 64, out 64, k 2*1*4*4 = 32, v 32 -> 192 x 2 = 384
    (sig("attention.prefill", {"hq": 2, "hkv": 1, "d": 4}, ("causal",)), {"batch": 2, "seq": 4}, 640, 384),
    # causal, window 2: queries see 1, 2, 2, 2, 2 keys = 9 pairs (not min(5/2, 2) * 5 = 10);
    # 4 x d 2 x 9 = 72. Every key is some query's: q 5*2 = 10, out 10, k 10, v 10 -> 40 x 2 = 80
    (sig("attention.prefill", {"hq": 1, "hkv": 1, "d": 2, "window": 2}, ("causal",)), {"batch": 1, "seq": 5}, 72, 80),
    # sinks, fp32: causal pairs 1 + 2 = 3 per head; 4 x 4 x 3 x 2 heads = 96.
    # q 2*2*4 = 16, out 16, k 1*2*4 = 8, v 8, the sinks 2 -> 50 elements x 4 = 200
    (sig("attention.prefill", {"hq": 2, "hkv": 1, "d": 4}, ("causal", "sinks"), "fp32"), {"batch": 1, "seq": 2},
     96, 200),
    # ALiBi adds a bias per pair (a mask's work, not counted): as plain causal, 1 + 2 = 3 pairs; 4 x 4 x 3 x 2 heads
    # = 96. q 2*2*4 = 16, out 16, k 16, v 16 (MHA) -> 64 x 2 = 128; decode with ALiBi: as decode, 4 x 2 x 3 x 2 = 48,
    # q 4, out 4, k 2*3*2 = 12, v 12 -> 32 x 2 = 64
    (sig("attention.prefill", {"hq": 2, "hkv": 2, "d": 4}, ("causal", "alibi")), {"batch": 1, "seq": 2}, 96, 128),
    (sig("attention.decode", {"hq": 2, "hkv": 2, "d": 2}, ("alibi",)), {"batch": 1, "kv_len": 3}, 48, 64),
    # qk_norm is a marker (the norm is norm.qk's work): as plain causal, 1 + 2 + 3 = 6 pairs;
    # 4 x 2 x 6 x 1 = 48. q 3*2 = 6, out 6, k 6, v 6 -> 24 x 2 = 48
    (sig("attention.prefill", {"hq": 1, "hkv": 1, "d": 2}, ("causal", "qk_norm")), {"batch": 1, "seq": 3}, 48, 48),
    # decode, GQA 8/2, fp16: one query, 5 keys; 4 x 2 batch x 8 heads x 5 x d 4 = 1280.
    # q 2*8*4 = 64, out 64, k 2*2*5*4 = 80, v 80 -> 288 x 2 = 576
    (sig("attention.decode", {"hq": 8, "hkv": 2, "d": 4}, (), "fp16"), {"batch": 2, "kv_len": 5}, 1280, 576),
    # decode, window 3 of 10 keys: the newest query sees 3; 4 x 2 heads x 3 x 4 = 96.
    # q 2*4 = 8, out 8, k 2*3*4 = 24 (only the window is read), v 24 -> 64 x 2 = 128
    (sig("attention.decode", {"hq": 2, "hkv": 2, "d": 4, "window": 3}), {"batch": 1, "kv_len": 10}, 96, 128),
    # decode, window 16 past the 10 keys: all 10; 4 x 1 x 10 x 4 = 160. q 4, out 4, k 40, v 40 -> 88 x 2 = 176
    (sig("attention.decode", {"hq": 1, "hkv": 1, "d": 4, "window": 16}), {"batch": 1, "kv_len": 10}, 160, 176),
    # decode with sinks: 4 x 2 heads x 3 keys x 2 = 48; q 2*2 = 4, out 4, k 1*3*2 = 6, v 6, sinks 2 -> 22 x 2 = 44
    (sig("attention.decode", {"hq": 2, "hkv": 1, "d": 2}, ("sinks",)), {"batch": 1, "kv_len": 3}, 48, 44),
    # a value head dim other than q's (MLA's 192/128, small): 2 (d 6 + dv 4) = 20 a pair, no mask 2 x 2 pairs
    # x 2 heads = 8 -> 160. q 2*2*6 = 24, out (dv) 2*2*4 = 16, k 24, v 16 -> 80 x 2 = 160
    (sig("attention.prefill", {"hq": 2, "hkv": 2, "d": 6, "dv": 4}), {"batch": 1, "seq": 2}, 160, 160),
    # MLA's decode over the latent cache (rank 4, rope 2): a score is 2 (4 + 2) = 12, a value 2 x 4 = 8
    # -> 20 per (head, cached token) x 2 heads x 3 tokens = 120. The cache 3 x (4 + 2) = 18, q 2 heads x 6 = 12,
    # out 2 x 4 = 8 -> 38 x 2 = 76
    (sig("attention.mla_decode", {"hq": 2, "rank": 4, "rope": 2}), {"batch": 1, "kv_len": 3}, 120, 76),
    # FP8 cache: 4 x 4 heads x 6 keys x 8 = 768. q 4*8 = 32 x 2 = 64, out 64, k 2*6*8 = 96 x 1, v 96 -> 320
    (sig("attention.decode_fp8kv", {"hq": 4, "hkv": 2, "d": 8}), {"batch": 1, "kv_len": 6}, 768, 320),
    # --- norms: per element x^2, sum, scale, weight = 4 (rms); + residual add = 5; + amax and divide for fp8 ---
    # 3 x 4 = 12 elements: 48; x 12, out 12, weight 4 -> 28 x 2 = 56
    (sig("norm.rms", {"hidden": 4}), {"tokens": 3}, 48, 56),
    # unit_offset's 1 + weight is per hidden, not counted: the same
    (sig("norm.rms", {"hidden": 4}, ("unit_offset",)), {"tokens": 3}, 48, 56),
    # fp32: 5 x 12 = 60; x, residual read, out, total written 4 x 12 = 48, weight 4 -> 52 x 4 = 208
    (sig("norm.rms_add", {"hidden": 4}, (), "fp32"), {"tokens": 3}, 60, 208),
    # 6 x 16 = 96; x 16 x 2 = 32, q 16 x 1, a scale a token 2 x 4 = 8, weight 8 x 2 = 16 -> 72
    (sig("norm.rms_fp8", {"hidden": 8}), {"tokens": 2}, 96, 72),
    # 7 x 16 = 112; x 32, residual 32, total 32, q 16, scales 8, weight 16 -> 136
    (sig("norm.rms_add_fp8", {"hidden": 8}), {"tokens": 2}, 112, 136),
    # per head of d 4: 4 x 2 tokens x 3 heads x 4 = 96; x 24, out 24, one weight 4 -> 52 x 2 = 104
    (sig("norm.qk", {"heads": 3, "d": 4}), {"tokens": 2}, 96, 104),
    # mean, subtract, square, sum, scale, weight, bias = 7 x 8 = 56; x 8, out 8, weight 4, bias 4 -> 24 x 2 = 48
    (sig("norm.layer", {"hidden": 4}), {"tokens": 2}, 56, 48),
    # no bias: 6 x 8 = 48; x 8, out 8, weight 4 -> 20 x 2 = 40
    (sig("norm.layer", {"hidden": 4}, ("no_bias",)), {"tokens": 2}, 48, 40),
    # --- rope: a cos - b sin per element, 3; q, k read and written, cos and sin (tokens, d) read ---
    # 3 x 3 tokens x 3 heads x 4 = 108; q 2*3*4 = 24 twice, k 1*3*4 = 12 twice, cos 12, sin 12 -> 96 x 2 = 192
    (sig("posenc.rope", {"hq": 2, "hkv": 1, "d": 4, "layout": "split_half"}), {"tokens": 3}, 108, 192),
    (sig("posenc.rope", {"hq": 2, "hkv": 1, "d": 4, "layout": "interleaved"}), {"tokens": 3}, 108, 192),
    # --- embedding: int64 ids (8 bytes), rows read and written ---
    # no FLOPs; ids 3 x 8 = 24, rows 12 x 2 = 24, out 24 -> 72
    (sig("embedding", {"vocab": 10, "hidden": 4}), {"tokens": 3}, 0, 72),
    # scaled: a multiply an element, 12
    (sig("embedding", {"vocab": 10, "hidden": 4}, ("scaled",)), {"tokens": 3}, 12, 72),
    # x + table[positions]: 12 adds; positions 24, x 24, rows 24, out 24 -> 96
    (sig("posenc.learned", {"hidden": 4}), {"tokens": 3}, 12, 96),
    # --- activations, over 3 tokens x width 4 = 12 outputs ---
    # silu (3) * up: 5 x 12 = 60; gate 12, up 12, out 12 -> 36 x 2 = 72
    (sig("act.swiglu", {"width": 4}), {"tokens": 3}, 60, 72),
    # + amax, divide: 6 x 12 = 72; gate 24, up 24, q 12 x 1, scales 3 x 4 = 12 -> 72
    (sig("act.swiglu_fp8", {"width": 4}), {"tokens": 3}, 72, 72),
    (sig("act.geglu", {"width": 4}), {"tokens": 3}, 9 * 12, 72),
    # x read, out written: 24 x 2 = 48
    (sig("act.gelu", {"width": 4}), {"tokens": 3}, 8 * 12, 48),
    (sig("act.sigmoid_gate", {"width": 4}), {"tokens": 3}, 60, 72),
    # --- linear: 2 t k n; x, W, out (and the bias) ---
    # 2 x 2 x 4 x 3 = 48; x 8, W 12, out 6, bias 3 -> 29 x 2 = 58
    (sig("linear", {"k": 4, "n": 3}, ("bias",)), {"tokens": 2}, 48, 58),
    # 2 x 1 x 2 x 2 = 8, fp32; x 2, W 4, out 2 -> 8 x 4 = 32
    (sig("linear", {"k": 2, "n": 2}, (), "fp32"), {"tokens": 1}, 8, 32),
    # W8A8: x 8 x 2 = 16, W 12 x 1, out 6 x 2 = 12, bias 3 x 2 = 6, a scale a channel 3 x 4 = 12, a token 2 x 4 = 8 -> 66
    (sig("linear.fp8", {"k": 4, "n": 3}, ("per_channel", "bias")), {"tokens": 2}, 48, 66),
    # per tensor, no bias: 16 + 12 + 12 + one scale 4 + 8 -> 52
    (sig("linear.fp8", {"k": 4, "n": 3}), {"tokens": 2}, 48, 52),
    # q read at a byte: 8, its scales 8, W 12, W's scales 12, out 12, bias 6 -> 58
    (sig("linear.fp8_prequantised", {"k": 4, "n": 3}, ("per_channel", "bias")), {"tokens": 2}, 48, 58),
    # --- moe ---
    # router: exp, sum, divide, top-k: 5 x 3 tokens x 4 experts = 60;
    # logits 12 x 2 = 24, fp32 weights 3 x 2 x 4 = 24, int64 ids 3 x 2 x 8 = 48 -> 96
    (sig("moe.router", {"experts": 4, "top_k": 2}, ("renorm",)), {"tokens": 3}, 60, 96),
    # experts, 1 token to 1 of 2: gate_up 2 x 4 x 6 = 48 + down 2 x 3 x 4 = 24 -> 72.
    # One expert reached, its weights 3 x 3 x 4 = 36; x 4, out 4 -> 44 x 2 = 88; the slot's id 8 + weight 2 -> 98
    (sig("moe.experts", {"experts": 2, "top_k": 1, "hidden": 4, "inter": 3}), {"tokens": 1}, 72, 98),
    # 2 tokens: 144 FLOPs; experts reached 2 x (1 - (1/2)^2) = 1.5 expected: weights 54, x 8, out 8 -> 70 x 2 = 140;
    # routing 2 slots x 10 = 20 -> 160
    (sig("moe.experts", {"experts": 2, "top_k": 1, "hidden": 4, "inter": 3}), {"tokens": 2}, 144, 160),
    # a rank of 2 under expert parallelism, 2 of 4 experts: half a slot expected here, 72 / 2 = 36 FLOPs;
    # reached 2 x (1 - 3/4) = 0.5: weights 18, x 4, out 4 -> 26 x 2 = 52; routing 10 -> 62
    (sig("moe.experts", {"experts": 2, "top_k": 1, "hidden": 4, "inter": 3, "ep": 2}), {"tokens": 1}, 36, 62),
    # biases, top 2 of 2: 2 x 72 = 144; both reached, each 36 + gate_up bias 6 + down bias 4 = 46 -> 92;
    # x 4, out 4 -> 100 x 2 = 200; routing 2 x 10 = 20 -> 220
    (sig("moe.experts", {"experts": 2, "top_k": 2, "hidden": 4, "inter": 3}, ("bias",)), {"tokens": 1}, 144, 220),
    # --- conv: a multiply-add per tap, the bias add, SiLU 4 ---
    # prompt with silu: (2 x 4 + 4) x 2 x 5 x 3 = 360; x 30, out 30, the new state 2 x 3 x 4 = 24, weight 12
    # -> 96 x 2 = 192 (not 180: the weight was not counted, nor the SiLU's absence below)
    (sig("conv.causal_depthwise", {"channels": 3, "width": 4}, ("silu",)), {"batch": 2, "seq": 5}, 360, 192),
    # decode step, bias, no silu: (8 + 1) x 3 = 27; x 3, out 3, state read 12 and written 12, weight 12, bias 3
    # -> 45 x 2 = 90
    (sig("conv.causal_depthwise", {"channels": 3, "width": 4}, ("bias",)), {"batch": 1, "seq": 1}, 27, 90),
    # --- recurrent ---
    # gated deltanet prompt: 7 dk dv per token and value head: 7 x 3 x 2 x 4 x 2 = 336;
    # q 3 x 4 = 12, k 12, v 3 x 2 x 2 = 12, out 12, beta 6 -> 54 x 2 = 108; g 6 x 4 = 24; fp32 state written
    # 2 x 4 x 2 x 4 = 64 -> 196
    (sig("recurrent.gated_deltanet", {"hk": 1, "hv": 2, "dk": 4, "dv": 2}, ("qk_l2norm",)), {"batch": 1, "seq": 3},
     336, 196),
    # decode, batch 2: 7 x 2 x 1 x 2 x 8 = 224; q 8, k 8, v 8, out 8, beta 4 -> 36 x 2 = 72; g 16;
    # state read and written 2 x 2 x 2 x 4 x 2 x 4 = 256 -> 344
    (sig("recurrent.gated_deltanet", {"hk": 1, "hv": 2, "dk": 4, "dv": 2}), {"batch": 2, "seq": 1}, 224, 344),
    # gates: ~10 per token and head: 60; a, b, beta 3 x 6 x 2 = 36, g 6 x 4 = 24, A_log and dt_bias 2 x 3 x 2 = 12 -> 72
    (sig("recurrent.deltanet_gates", {"heads": 3}), {"tokens": 2}, 60, 72),
]


@pytest.mark.parametrize("signature,dims,flops,nbytes", COUNTS, ids=[f"{s}-{d}" for s, d, *_ in COUNTS])
def test_flops_and_bytes_match_the_hand_count(signature, dims, flops, nbytes):
    contract = CONTRACTS[signature.op]
    with skewed_routing(0.0):  # MoE's cases are counted for a uniform routing
        assert contract.flops(signature, dims) == pytest.approx(flops, rel=1e-12), "FLOPs"
        assert contract.bytes_moved(signature, dims) == pytest.approx(nbytes, rel=1e-12), "bytes"


@pytest.mark.parametrize("skew", [0.3, 3.0])
@pytest.mark.parametrize("ep", [1, 4])
def test_moe_counts_the_experts_a_skewed_routing_reaches(skew, ep):
    """The experts' weights count for the experts some token reaches under the skew the inputs are
    drawn with: at skew 3, 64 tokens over 256 experts (top 8) reach about 50, where a uniform routing
    reaches 222, and a kernel reading only theirs would sit at 4x its roofline (IMPLAUSIBLE_TIME)."""
    signature = sig("moe.experts", {"experts": 256 // ep, "top_k": 8, "hidden": 64, "inter": 64, "ep": ep})
    with skewed_routing(skew):
        expected = experts_reached(signature, 64)
        drawn = [moe_experts_inputs(signature, {"tokens": 64}, "cpu", torch.Generator().manual_seed(seed))[1]
                 for seed in range(8)]
    reached = [ids[ids < 256 // ep].unique().numel() for ids in drawn]
    assert expected == pytest.approx(sum(reached) / len(reached), rel=0.1)


def test_every_op_has_a_hand_counted_case():
    """A new op (a family's record) fails here until its FLOPs and bytes are counted above; a
    plugin's op (tests/toy_op.py) counts its own."""
    family_ops = {record.name for runtime in rops.FAMILIES.values() for record in runtime.RECORDS}
    assert family_ops <= set(rops.base.OPS)
    assert family_ops - {s.op for s, *_ in COUNTS} == set()


@pytest.mark.parametrize("causal", [True, False])
def test_attention_pairs_are_the_reference_mask(causal):
    """The closed form of the pairs a query scores (query_key_pairs) against the mask the reference
    builds, counted element by element, for every small prompt and cache, windowed or not."""
    from lzsolve.ops.attention import query_key_pairs

    for n, window in itertools.product(range(1, 12), (0, 1, 2, 3, 5, 20)):
        shapes = [("attention.prefill", {"batch": 1, "seq": n}, n)] + ([] if causal else [
            ("attention.decode", {"batch": 1, "kv_len": n}, 1)])
        for op, dims, seq_q in shapes:
            s = sig(op, {"hq": 1, "hkv": 1, "d": 2, **({"window": window} if window else {})},
                    ("causal",) if causal else ())
            row, col = torch.arange(seq_q)[:, None], torch.arange(n)[None, :]
            keep = (col <= row) if causal else torch.ones(seq_q, n, dtype=torch.bool)
            if window:
                position = row if causal else row + (n - seq_q)
                keep &= col > position - window
            assert query_key_pairs(s, dims) == keep.sum().item(), (op, n, window)


# --- fractions of the roofline (lzsolve.decide.roofline), report.md and explain ---------------------------
def ceiling(kind, per_s, mode="eager", hw="hw", dtype="fp32", hour=12):
    import datetime as dt

    return {"run_id": "r", "ts": dt.datetime(2026, 12, 5, hour), "hw_slug": hw, "device": "cuda:0",
            "timer": "cuda_events", "dtype": dtype, "kind": kind, "mode": mode, "per_s": per_s,
            "probe": f"{kind} probe", "spread": 0.01}


def test_peaks_take_the_latest_of_each_and_need_both():
    from lzsolve.decide.roofline import Peak, peaks

    rows = [ceiling("compute", 1e12), ceiling("memory", 2e11, hour=10), ceiling("memory", 3e11, hour=11),
            ceiling("compute", 5e12, mode="graph"),  # graph mode: no memory ceiling, no peak
            ceiling("compute", 7e12, dtype="bf16"), ceiling("memory", 3e11, dtype="bf16")]
    assert peaks(rows, "eager") == {("hw", "fp32"): Peak(1e12, 3e11), ("hw", "bf16"): Peak(7e12, 3e11)}
    assert peaks(rows, "graph") == {} == peaks([], "eager")


def test_fraction_is_the_time_at_the_roofline_over_the_measured_time():
    from lzsolve.decide.roofline import Peak, fraction, roof_ms

    peak = Peak(compute=1e12, memory=1e11)  # 1 TFLOP/s, 100 GB/s
    # 4e6 FLOPs take 4 us at the peak, 1e6 bytes 10 us: memory-bound, 0.01 ms on the roof
    assert roof_ms(4e6, 1e6, peak) == pytest.approx(0.01)
    assert fraction(4e6, 1e6, 0.04, peak) == pytest.approx(0.25)
    # 4e7 FLOPs, 40 us, compute-bound: at 0.05 ms, 0.8 of the roofline
    assert fraction(4e7, 1e6, 0.05, peak) == pytest.approx(0.8)
    assert fraction(0.0, 2e6, 0.02, peak) == pytest.approx(1.0)  # an embedding: bytes alone
    assert fraction(0.0, 0.0, 1.0, peak) is None and fraction(4e6, 1e6, None, peak) is None


def timed(kernel, tokens, ms, flops=4e6, nbytes=1e6):
    return {"kernel_id": kernel, "status": "ok", "dims": json.dumps({"tokens": tokens}), "eager_ms": ms,
            "eager_spread": 0.0, "flops": flops, "bytes": nbytes, "device": "cuda:0", "phase": "grid"}


def test_signature_roofline_per_point_and_per_leaf():
    from lzsolve.decide.roofline import Peak, signature_roofline

    peak = Peak(compute=1e12, memory=1e11)  # every point below sits at 0.01 ms on the roof
    tree = {"dim": "tokens", "threshold": 8, "le": {"kernel_id": "a"}, "gt": {"kernel_id": "b"}}
    records = [timed("a", 1, 0.02), timed("b", 1, 0.01),  # chosen a: 0.5, best b: 1.0
               timed("a", 4, 0.02), timed("b", 4, 0.04),  # chosen a: 0.5, best a: 0.5
               timed("a", 16, 0.01), timed("b", 16, 0.04),  # chosen b: 0.25, best a: 1.0
               {**timed("c", 16, 0.001), "status": "rejected"}]  # a rejection counts for nothing
    roof = signature_roofline(tree, records, peak, "eager")
    assert roof["points"] == 3
    assert roof["chosen"] == pytest.approx((0.5 * 0.5 * 0.25) ** (1 / 3), abs=1e-4)
    assert roof["best"] == pytest.approx((1.0 * 0.5 * 1.0) ** (1 / 3), abs=1e-4)
    assert roof["leaves"] == [{"kernel_id": "a", "chosen": 0.5, "best": pytest.approx(0.7071, abs=1e-4), "points": 2},
                              {"kernel_id": "b", "chosen": 0.25, "best": 1.0, "points": 1}]
    assert signature_roofline(tree, records, peak, "graph") is None, "no graph times"
    assert signature_roofline(tree, [timed("a", 1, 0.02, flops=0.0, nbytes=0.0)], peak, "eager") is None


def test_a_kernel_timed_past_the_roofline_is_rejected_on_its_signature():
    """A time the device's ceilings rule out (Helion 1.4.0's RMSNorm on an H100: 40x its roofline, right
    on its parity calls) rejects the kernel at every point of that signature; the fallback, other kernels,
    other signatures, the CPU's clock and a tune without ceilings are left as they were."""
    from lzsolve.decide.roofline import IMPLAUSIBLE_FRACTION, reject_implausible

    ceilings = [ceiling("compute", 1e12), ceiling("memory", 1e11)]  # eager: every point below is 0.01 ms on the roof

    def at(kernel, tokens, ms, sig="norm.rms[hidden=8]", **fields):
        return {**timed(kernel, tokens, ms), "signature": sig, "timer": "cuda_events", "hw_slug": "hw",
                "dtype": "fp32", "is_fallback": kernel == "eager", **fields}
    edge = 0.01 / IMPLAUSIBLE_FRACTION
    records = [at("fast", 1, 0.02), at("fast", 16, 0.01 / 40), at("fast", 16, 0.01 / 40, sig="norm.rms[hidden=16]",
                                                                      timer="cpu_clock"),
               at("quick", 1, edge * 1.01), at("eager", 1, 0.001), at("fast", 4, 0.02, sig="other[hidden=8]"),
               {**at("fast", 2, 0.001), "status": "rejected", "reason_code": "PARITY_FAILED", "reason_message": "m"}]
    out = reject_implausible(records, ceilings, lambda r: (r["flops"], r["bytes"]))
    assert [r["status"] for r in out] == ["rejected", "rejected", "ok", "ok", "ok", "ok", "rejected"]
    assert out[0]["reason_code"] == out[1]["reason_code"] == "IMPLAUSIBLE_TIME"
    assert out[0]["reason_message"].startswith('eager 0.25 us at {"tokens": 16} is 40x the device\'s roofline'), out[0]
    assert out[6]["reason_code"] == "PARITY_FAILED", "a rejection keeps its own reason"
    assert records[0]["status"] == "ok", "the records given are not changed"
    assert reject_implausible(records, [], lambda r: (r["flops"], r["bytes"])) == records, "no ceilings: no verdict"
    # the counts come from the caller (the contract's): a record's own stale counts are not read
    assert reject_implausible(records[:2], ceilings, lambda r: (0.0, 1.0))[1]["status"] == "ok"


def test_a_tune_rejects_what_beats_the_roofline_before_probing_and_solving(plan):
    """Tune._hold_to_roofline: the grid's records, held to the run's own ceilings, before the probes
    and the validation read them; the table then never chooses the kernel."""
    from lzsolve.pipeline import Tune
    from lzsolve.store.artifact import build_table
    from runtime_loader.hardware import slug

    sp, records = rms_records(plan)
    other = next(r["kernel_id"] for r in records if r["kernel_id"] != sp.fallback)
    hw = slug(plan.hardware)
    records = [{**r, "timer": "cuda_events", "hw_slug": hw, "dtype": "fp32", "is_fallback": r["kernel_id"] == sp.fallback,
                "eager_ms": r["eager_ms"] / (60 if r["kernel_id"] == other else 1)} for r in records]
    tune = Tune.__new__(Tune)
    tune.plan, tune.records = plan, records
    tune.session = type("S", (), {"db": type("D", (), {"ceilings": lambda self: [
        ceiling("compute", 1e12, hw=hw), ceiling("memory", 1e11, hw=hw)]})()})()

    def entry(records):
        return next(e for e in build_table(plan, records, "eager", "r")["ops"]
                    if e["signature"] == str(sp.instance.signature))
    assert entry(records)["tree"]["kernel_id"] == other, "60x the fallback's speed: chosen, unheld"
    tune._hold_to_roofline()
    assert {r["status"] for r in tune.records if r["kernel_id"] == other} == {"rejected"}
    held = entry(tune.records)
    assert held["tree"]["kernel_id"] == sp.fallback
    assert held["candidates"][other]["rejected"][0]["code"] == "IMPLAUSIBLE_TIME"


@pytest.fixture(scope="module")
def plan():
    from lzsolve.measure.tuner import make_plan
    from lzsolve.models.capture import capture
    from tests.test_cli import TINY_LLAMA

    return make_plan(capture(TINY_LLAMA, "tiny", dtype="fp32"), "fp32", torch.device("cpu"), "tiny")


def rms_records(plan):
    """norm.rms's records with known times: the fallback 1% slower than a kernel, too little to leave it (SWITCH_GAIN), so the table keeps the fallback,
    the slower of the two. Each record carries stale counts (as a warm PerfDB's from before a count
    was fixed): the table counts by the contract."""
    sp = next(sp for sp in plan.signatures if sp.instance.signature.op == "norm.rms")
    other = next(c.spec.kernel_id for c in sp.candidates if c.admitted and c.spec.kernel_id != sp.fallback)
    hidden = sp.instance.signature.dim("hidden")  # fp32: 4 bytes
    records = []
    for tokens in (1, 2, 4, 8, 16):
        # x read and out written, the weight once: 4 (2 tokens + 1) hidden bytes at 1e11 B/s, above the
        # 4 tokens hidden FLOPs at 1e12 FLOP/s: memory-bound. The kernel at 0.8 of it, the fallback 1% slower
        roof = 4 * (2 * tokens + 1) * hidden / 1e11 * 1e3
        records += [{**timed(kernel, tokens, ms, flops=1.0, nbytes=1.0), "signature": str(sp.instance.signature),
                     "op": "norm.rms"} for kernel, ms in ((other, roof / 0.8), (sp.fallback, roof / 0.8 * 1.01))]
    return sp, records


def test_report_and_explain_show_the_chosen_and_best_fractions(plan):
    from lzsolve.store.artifact import build_table, format_op, report

    sp, records = rms_records(plan)
    from runtime_loader.hardware import slug

    hw = slug(plan.hardware)
    ceilings = [ceiling("compute", 1e12, hw=hw), ceiling("memory", 1e11, hw=hw),
                ceiling("compute", 1.0, hw=hw, hour=9), ceiling("memory", 1.0, hw=hw, hour=9)]  # older, ignored
    table = build_table(plan, records, "eager", "r", ceilings=ceilings)
    entry = next(e for e in table["ops"] if e["signature"] == str(sp.instance.signature))
    assert entry["tree"]["kernel_id"] == sp.fallback
    assert entry["roofline"]["chosen"] == pytest.approx(0.8 / 1.01, abs=1e-4)
    assert entry["roofline"]["best"] == pytest.approx(0.8) and entry["roofline"]["points"] == 5
    md = report(table, 1.0, len(records))
    row = next(line for line in md.splitlines() if line.startswith(f"| {sp.instance.signature} |"))
    assert row.endswith("| 79% | 80% |"), row
    assert "| roofline chosen | best |" in md and "1.0 is on the roof" in md
    others = [line for line in md.splitlines() if line.startswith("| ") and "norm.rms[" not in line
              and "signature" not in line]
    assert others and all(line.endswith("| - | - |") for line in others), "no records: no figures"
    assert "  roofline: chosen 79%, best candidate 80% (time at the roofline / measured time, geomean over 5 " \
           "point(s))" in format_op(entry), "lzsolve explain prints format_op"


@pytest.mark.parametrize("plain_memory, verdict", [(1.02e11, "within 5%"),
                                                   (1.2e11, "OUTSIDE 5% for memory: fractions are off by as much")])
def test_report_states_the_ceilings_and_their_distance_from_torchs_own_forms(plan, plain_memory, verdict):
    """The ceilings rows of mode 'plain' (torch's own mm / linear and copy_, timed apart in the same
    run) check the probe's: report.md gives the rates and both ratios, and says whether within 5%."""
    from lzsolve.store.artifact import build_table, report
    from runtime_loader.hardware import slug

    sp, records = rms_records(plan)
    hw = slug(plan.hardware)
    probed = [ceiling("compute", 1e12, hw=hw), ceiling("memory", 1e11, hw=hw)]
    plain = [ceiling("compute", 0.98e12, mode="plain", hw=hw), ceiling("memory", plain_memory, mode="plain", hw=hw)]
    table = build_table(plan, records, "eager", "r", ceilings=probed + plain)
    line = next(line for line in report(table, 1.0, len(records), ceilings=probed + plain).splitlines()
                if line.startswith("- ceilings"))
    assert line.startswith("- ceilings (eager mode): compute 1 TFLOP/s (a matmul), memory 0.1 TB/s"), line
    assert f"1.020x and {1e11 / plain_memory:.3f}x torch's own mm / linear (0.98 TFLOP/s)" in line, line
    assert line.endswith(verdict), line
    alone = next(line for line in report(table, 1.0, 0, ceilings=probed).splitlines() if line.startswith("- ceilings"))
    assert alone.endswith("not checked against torch's own forms (none timed in that run)"), alone
    assert not any(line.startswith("- ceilings") for line in report(table, 1.0, 0).splitlines())
    assert build_table(plan, records, "eager", "r", ceilings=plain)["ops"][0]["roofline"] is None, \
        "torch's own forms are never the ceilings"


def test_report_escapes_the_name_a_workload_file_gave_the_model(plan):
    from lzsolve.store.artifact import build_table, report

    table = build_table(plan, rms_records(plan)[1], "eager", "r")
    table["model"]["id"] = "w\n# forged\x1b[2J"
    md = report(table, 1.0, 0)
    assert md.splitlines()[0] == "# lzsolve report: w\\n# forged\\x1b[2J (tp=1, fp32)", md.splitlines()[0]


def test_report_without_ceilings_skips_the_roofline(plan):
    from lzsolve.store.artifact import build_table, format_op, report

    sp, records = rms_records(plan)
    table = build_table(plan, records, "eager", "r")  # no ceilings (an older PerfDB, a failed probe)
    assert all(entry["roofline"] is None for entry in table["ops"])
    md = report(table, 1.0, len(records))
    assert "roofline: not shown (no compute and memory ceilings measured in this timing mode)" in md
    assert not any("roofline:" in line for entry in table["ops"] for line in format_op(entry))
    table = build_table(plan, records, "graph", "r", ceilings=[ceiling("compute", 1e12), ceiling("memory", 1e11)])
    assert all(entry["roofline"] is None for entry in table["ops"]), "another device's, another mode's"
    old = {**table, "ops": [{k: v for k, v in e.items() if k != "roofline"} for e in table["ops"]]}
    assert "roofline: not shown" in report(old, 1.0, 0), "a table written before the roofline"


def test_a_tune_reports_the_roofline_of_its_own_ceilings(tiny_llama_artifact):
    """End to end on this CPU: the tune measures eager ceilings, its table stores each signature's
    fractions, report.md has them in its columns and `lzsolve explain` prints them."""
    from click.testing import CliRunner

    from lzsolve.cli import cli

    table = json.loads((tiny_llama_artifact / "dispatch.json").read_text())
    roofs = {e["signature"]: e["roofline"] for e in table["ops"] if e.get("roofline")}
    assert roofs, "the tune's own ceilings reach the table"
    assert all(r["chosen"] > 0 and r["best"] >= r["chosen"] * 0.999 and r["points"] > 0 for r in roofs.values())
    md = (tiny_llama_artifact / "report.md").read_text()
    signature, roof = next(iter(roofs.items()))
    row = next(line for line in md.splitlines() if line.startswith(f"| {signature} |"))
    assert row.endswith(f"| {format_fraction(roof['chosen'])} | {format_fraction(roof['best'])} |"), row
    out = CliRunner().invoke(cli, ["explain", str(tiny_llama_artifact)])
    shown = out.output.split(f"\n{signature}   roles:")[1].split("\n\n")[0]  # its section
    assert out.exit_code == 0 and f"roofline: chosen {format_fraction(roof['chosen'])}, best candidate " \
        f"{format_fraction(roof['best'])}" in shown, out.output
