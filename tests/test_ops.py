"""Op contracts: references against independent float64 formulas, inputs, signatures, compare."""
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from lzsolve.ops import CONTRACTS, TOLERANCES, compare, to_fp32
from lzsolve.ops.rope import cos_sin
from runtime_loader import ops as rops
from runtime_loader.dispatcher import _inlined
from runtime_loader.ops import Signature

CPU = torch.device("cpu")

SIGS = [
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32"), {"batch": 2, "seq": 7}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 4, "d": 16}, (), "fp32"), {"batch": 1, "seq": 5}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "window": 3}, ("causal",), "fp32"),
     {"batch": 2, "seq": 9}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "softcap": 1.5}, ("causal", "qk_norm"), "fp32"),
     {"batch": 1, "seq": 6}),
    (Signature.make("attention.prefill", {"hq": 2, "hkv": 2, "d": 8, "window": 2, "softcap": 1.0}, (), "fp32"),
     {"batch": 1, "seq": 6}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8}, (), "fp32"), {"batch": 3, "kv_len": 9}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "window": 3}, ("causal", "sinks"), "fp32"),
     {"batch": 2, "seq": 7}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8}, ("sinks",), "fp32"), {"batch": 3, "kv_len": 9}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8, "window": 4, "softcap": 2.0}, (), "fp32"),
     {"batch": 2, "kv_len": 9}),
    (Signature.make("attention.decode_fp8kv", {"hq": 6, "hkv": 2, "d": 8}, (), "bf16"), {"batch": 2, "kv_len": 9}),
    (Signature.make("norm.rms", {"hidden": 32}, (), "fp32"), {"tokens": 5}),
    (Signature.make("norm.rms", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 5}),
    (Signature.make("norm.rms_add", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 3}),
    (Signature.make("norm.rms_fp8", {"hidden": 32}, (), "fp32"), {"tokens": 3}),
    (Signature.make("norm.rms_add_fp8", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 3}),
    (Signature.make("norm.qk", {"heads": 3, "d": 16}, (), "fp32"), {"tokens": 4}),
    (Signature.make("norm.qk", {"heads": 3, "d": 16}, ("unit_offset",), "fp32"), {"tokens": 4}),
    (Signature.make("norm.layer", {"hidden": 32}, (), "fp32"), {"tokens": 5}),
    (Signature.make("norm.layer", {"hidden": 32}, ("no_bias",), "fp32"), {"tokens": 5}),
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "split_half"}, (), "fp32"), {"tokens": 6}),
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "interleaved"}, (), "fp32"), {"tokens": 6}),
    (Signature.make("posenc.learned", {"hidden": 24}, (), "fp32"), {"tokens": 5}),
    (Signature.make("embedding", {"vocab": 50, "hidden": 24}, (), "fp32"), {"tokens": 7}),
    (Signature.make("embedding", {"vocab": 50, "hidden": 24}, ("scaled",), "fp32"), {"tokens": 7}),
    (Signature.make("act.swiglu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.swiglu_fp8", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.sigmoid_gate", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.geglu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.gelu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("linear", {"k": 16, "n": 12}, ("bias",), "fp32"), {"tokens": 4}),
    (Signature.make("linear", {"k": 16, "n": 12}, (), "fp32"), {"tokens": 4}),
    (Signature.make("linear.fp8", {"k": 32, "n": 12}, ("per_channel", "bias"), "bf16"), {"tokens": 4}),
    (Signature.make("linear.fp8", {"k": 32, "n": 12}, (), "fp32"), {"tokens": 3}),
    (Signature.make("linear.fp8_prequantised", {"k": 32, "n": 12}, ("per_channel", "bias"), "bf16"), {"tokens": 4}),
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 4}, ("silu",), "fp32"), {"batch": 2, "seq": 6}),
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 4}, ("silu", "bias"), "fp32"),
     {"batch": 2, "seq": 1}),
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 3}, (), "bf16"), {"batch": 1, "seq": 2}),
    (Signature.make("recurrent.deltanet_gates", {"heads": 5}, (), "fp32"), {"tokens": 4}),
    (Signature.make("recurrent.deltanet_gates", {"heads": 16}, (), "bf16"), {"tokens": 2}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 1, "hv": 2, "dk": 8, "dv": 4}, ("qk_l2norm",), "fp32"),
     {"batch": 2, "seq": 6}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 2, "hv": 2, "dk": 8, "dv": 8}, ("qk_l2norm",), "fp32"),
     {"batch": 2, "seq": 1}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 2, "hv": 4, "dk": 4, "dv": 8}, (), "fp32"),
     {"batch": 1, "seq": 5}),
    (Signature.make("moe.experts", {"experts": 6, "top_k": 2, "hidden": 16, "inter": 12}, (), "fp32"), {"tokens": 9}),
    (Signature.make("moe.experts", {"experts": 5, "top_k": 2, "hidden": 16, "inter": 12, "alpha": 1.702, "limit": 0.4},
                    ("interleaved", "bias", "transposed"), "fp32"), {"tokens": 7}),
    (Signature.make("moe.experts", {"experts": 4, "top_k": 2, "hidden": 16, "inter": 12, "ep": 2}, (), "fp32"),
     {"tokens": 9}),
    (Signature.make("moe.router", {"experts": 12, "top_k": 3}, ("renorm",), "fp32"), {"tokens": 6}),
    (Signature.make("moe.router", {"experts": 12, "top_k": 3}, (), "bf16"), {"tokens": 6}),
]


def attention64(q, k, v, causal, scale, window=0, softcap=0.0, sinks=None):
    """Textbook attention, one (batch, head) at a time, in float64; masks as -inf triangles, the
    window's diagonal moved to the query's position (i, or kv_len - 1 for a decode query); a
    sink adds exp(sink) to each row's denominator."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    offset = 0 if causal else k.shape[2] - q.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h] @ k[b, h // groups].T * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            if causal:
                s = s + torch.full_like(s, -math.inf).triu(1)
            if window:
                s = s + torch.full_like(s, -math.inf).tril(offset - window)
            weights = torch.exp(s - s.max(-1, keepdim=True).values)
            total = weights.sum(-1, keepdim=True)
            if sinks is not None:
                total = total + torch.exp(sinks[h].double() - s.max(-1, keepdim=True).values)
            out[b, h] = weights / total @ v[b, h // groups]
    return out


def rope64(q, k, cos, sin, interleaved):
    """RoPE as a complex rotation of each pair, in float64."""
    def rotate(x):
        x = x.double()
        d = x.shape[-1]
        if interleaved:
            pairs = torch.complex(x[..., 0::2], x[..., 1::2])
            angle = torch.atan2(sin[..., 0::2].double(), cos[..., 0::2].double()).unsqueeze(1)
        else:
            pairs = torch.complex(x[..., : d // 2], x[..., d // 2:])
            angle = torch.atan2(sin[..., : d // 2].double(), cos[..., : d // 2].double()).unsqueeze(1)
        rotated = pairs * torch.polar(torch.ones_like(angle), angle)
        if interleaved:
            return torch.stack((rotated.real, rotated.imag), -1).flatten(-2)
        return torch.cat((rotated.real, rotated.imag), -1)
    return rotate(q), rotate(k)


def rms64(x, w, eps, unit_offset=False):
    x = x.double()
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * (w.double() + (1 if unit_offset else 0))


def layer64(x, w, b, eps):
    x = x.double()
    centred = x - x.mean(-1, keepdim=True)
    out = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + eps) * w.double()
    return out if b is None else out + b.double()


def gelu64(x):
    """GELU's tanh approximation, written out."""
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def rows64(ids, table):
    """table[ids] as a one-hot matrix product."""
    return F.one_hot(ids, table.shape[0]).double() @ table.double()


def fp8_linear64(x, weight, scale, bias):
    """Each token's row divided by its amax / 448 and cast to e4m3 (in fp32, as the format is
    defined), then every product and sum in float64."""
    q, step = quantised64(x)
    out = (q * step) @ (weight.double() * scale.double().reshape(-1, 1)).T
    return out + bias.double() if bias is not None else out


def quantised64(rows):
    """Each row divided by its amax / 448 and cast to e4m3 (in fp32, as the format is defined): the
    values of q, and the scales."""
    step = rows.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (rows.float() / step).clamp(-448, 448).to(torch.float8_e4m3fn).double(), step.double()


def rms_fp8_64(x, weight, eps, unit_offset=False):
    return quantised64(rms64(x, weight, eps, unit_offset))


def conv64(x, weight, bias, state, silu):
    """Each output a dot product of the channel's weights with the last width inputs (zeros before
    the first), written per token and channel; the new state the last width inputs."""
    batch, seq, channels = x.shape
    width = weight.shape[1]
    history = torch.zeros(batch, channels, width, dtype=torch.float64) if state is None else state.double()
    out = torch.empty(batch, seq, channels, dtype=torch.float64)
    for t in range(seq):
        history = torch.cat([history[..., 1:], x[:, t, :, None].double()], dim=-1)  # the window ending at t
        out[:, t] = (history * weight.double()).sum(-1) + (0 if bias is None else bias.double())
    return (out * torch.sigmoid(out) if silu else out), history


def deltanet64(q, k, v, g, beta, state, qk_l2norm):
    """The gated delta rule per (batch, value head) in float64, with the state update as the
    matrix product S <- (I - beta k k^T) exp(g) S + beta k v^T."""
    batch, seq, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    out = torch.empty(batch, seq, hv, dv, dtype=torch.float64)
    final = torch.empty(batch, hv, dk, dv, dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for b in range(batch):
        for h in range(hv):
            s = torch.zeros(dk, dv, dtype=torch.float64) if state is None else state[b, h].double()
            for t in range(seq):
                qt, kt = q[b, t, h * hk // hv].double(), k[b, t, h * hk // hv].double()
                if qk_l2norm:
                    qt, kt = qt / torch.sqrt((qt ** 2).sum() + 1e-6), kt / torch.sqrt((kt ** 2).sum() + 1e-6)
                bt = beta[b, t, h].double()
                decayed = math.exp(g[b, t, h]) * s
                s = (eye - bt * torch.outer(kt, kt)) @ decayed + bt * torch.outer(kt, v[b, t, h].double())
                out[b, t, h] = s.T @ qt / math.sqrt(dk)
            final[b, h] = s
    return out, final


def moe64(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
          alpha=0.0, limit=0.0, ep=1):
    """Token by token, slot by slot: the weighted sum of its experts' gated MLPs, in float64; a slot
    of another rank's expert (an id past this rank's) adds nothing."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = down.shape[2]
    for t in range(x.shape[0]):
        for slot in range(topk_ids.shape[1]):
            e = topk_ids[t, slot]
            if e >= gate_up.shape[0]:
                continue
            h = gate_up[e].double() @ x[t].double() + (0 if gate_up_bias is None else gate_up_bias[e].double())
            gate, up = (h[0::2], h[1::2]) if interleaved else (h[:inter], h[inter:])
            if limit:  # GPT-OSS: gate clamped from above, up both ways, (up + 1)
                gate, up, scale = torch.minimum(gate, torch.tensor(limit)), up.clamp(-limit, limit) + 1, alpha
            else:
                scale = 1.0
            y = down[e].double() @ (gate / (1 + torch.exp(-scale * gate)) * up)
            out[t] += topk_weights[t, slot].double() * (y + (0 if down_bias is None else down_bias[e].double()))
    return out


def router64(logits, top_k, renorm):
    """Row by row: exp / sum in float64, the top_k by a full descending sort."""
    weights, ids = [], []
    for row in logits.double():
        probs = torch.exp(row - row.max()) / torch.exp(row - row.max()).sum()
        order = sorted(range(len(row)), key=lambda e: -probs[e].item())[:top_k]
        picked = probs[order]
        weights.append(picked / picked.sum() if renorm else picked)
        ids.append(torch.tensor(order))
    return torch.stack(weights), torch.stack(ids)


INDEPENDENT = {
    "attention.prefill": attention64,
    "attention.decode": attention64,
    "attention.decode_fp8kv": lambda q, k, v, k_scale, v_scale, scale: attention64(
        q, k.double() * k_scale, v.double() * v_scale, False, scale),
    "norm.rms": rms64,
    "norm.rms_add": lambda x, r, w, eps, unit_offset=False: (rms64(x.double() + r.double(), w, eps, unit_offset),
                                                             x.double() + r.double()),
    "norm.rms_fp8": rms_fp8_64,
    "norm.rms_add_fp8": lambda x, r, w, eps, unit_offset=False: (
        *rms_fp8_64(x.double() + r.double(), w, eps, unit_offset), x.double() + r.double()),
    "norm.qk": rms64,
    "norm.layer": layer64,
    "posenc.rope": rope64,
    "posenc.learned": lambda x, positions, table: x.double() + rows64(positions, table),
    "embedding": lambda ids, table, scale: rows64(ids, table) * (1 if scale is None else scale),
    "act.swiglu": lambda g, u: g.double() * torch.sigmoid(g.double()) * u.double(),
    "act.sigmoid_gate": lambda x, g: x.double() / (1 + torch.exp(-g.double())),
    "act.swiglu_fp8": lambda g, u: quantised64(g.double() * torch.sigmoid(g.double()) * u.double()),
    "act.geglu": lambda g, u: gelu64(g) * u.double(),
    "act.gelu": gelu64,
    "linear": lambda x, w, b: x.double() @ w.double().T + (b.double() if b is not None else 0),
    "linear.fp8": fp8_linear64,
    "linear.fp8_prequantised": lambda q, x_scale, w, w_scale, b, out_dtype: (
        (q.double() * x_scale.double()) @ (w.double() * w_scale.double().reshape(-1, 1)).T
        + (b.double() if b is not None else 0)),
    "conv.causal_depthwise": conv64,
    # -A times softplus written as log(1 + e^x); the sigmoid as 1 / (1 + e^-x)
    "recurrent.deltanet_gates": lambda a, b, a_log, dt: (-torch.exp(a_log.double()) * torch.log1p(
        torch.exp(a.double() + dt.double())), 1 / (1 + torch.exp(-b.double()))),
    "recurrent.gated_deltanet": deltanet64,
    "moe.experts": moe64,
    "moe.router": router64,
}

def test_every_op_has_an_independent_formula_and_signatures_here():
    """A new op fails here until its reference is checked against a formula of its own."""
    assert set(INDEPENDENT) == set(rops.OPS)
    assert {sig.op for sig, _ in SIGS} == set(rops.OPS)


def derive(op, args):
    """The runtime's derivation of a signature from a Dispatcher method's positional arguments."""
    return rops.OPS[op].call(*args)


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_reference_matches_float64_formula(sig, dims, gen):
    contract = CONTRACTS[sig.op]
    args = contract.make_inputs(sig, dims, CPU, gen)
    ref = contract.reference(*to_fp32(args))
    expected = INDEPENDENT[sig.op](*args)
    for r, e in zip(ref if isinstance(ref, tuple) else (ref,), expected if isinstance(expected, tuple) else (expected,)):
        if not e.is_floating_point():  # indices (a router's choice): the same ones
            assert torch.equal(r, e)
            continue
        assert r.dtype == torch.float32
        torch.testing.assert_close(r.double(), e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_inputs_are_random_and_match_the_runtime_signature(sig, dims, gen):
    contract = CONTRACTS[sig.op]
    a = contract.make_inputs(sig, dims, CPU, gen)
    b = contract.make_inputs(sig, dims, CPU, gen)
    tensors = [t for t in a if isinstance(t, torch.Tensor)]
    assert all(t.float().abs().sum() > 0 for t in tensors), "never zeros"
    assert not torch.equal(a[0], b[0]), "drawn afresh each time"
    # the kernel call is the method call without qk_norm, a marker no kernel is handed
    assert derive(sig.op, a) == (Signature(sig.op, sig.static, sig.flags - {"qk_norm"}, sig.dtype), dims)


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_example_args_call_the_method_of_their_signature(sig, dims):
    assert derive(sig.op, rops.example_args(sig, dims, CPU)) == (sig, dims)


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_each_method_computes_its_fronts_key_and_arguments_inline(sig, dims):
    """Every op's front is compiled into its Dispatcher method (a call less per call), and the
    inlined expressions give what calling the front gives."""
    op = rops.OPS[sig.op]
    args = rops.example_args(sig, dims, CPU)
    bound = inspect.signature(op.front).bind(*args)
    bound.apply_defaults()
    inlined = _inlined(op)
    assert inlined is not None, f"{op.name}: its front is called on every call (see _inlined)"
    key, kernel_args = (eval(source, {}, dict(bound.arguments)) for source in inlined[:2])  # noqa: S307 - our own records
    assert (key, kernel_args) == op.front(*args)
    if inlined.spread is not None:  # what the kernel is called with
        assert eval(f"({inlined.spread},)", {}, dict(bound.arguments)) == kernel_args  # noqa: S307


def test_realistic_recurrent_inputs(gen):
    sig = Signature.make("recurrent.gated_deltanet", {"hk": 2, "hv": 4, "dk": 16, "dv": 16}, (), "bf16")
    q, k, v, g, beta, state, qk_l2norm = CONTRACTS[sig.op].make_inputs(sig, {"batch": 2, "seq": 1}, CPU, gen)
    assert g.dtype == torch.float32 and (g < 0).all() and (g > -10).all(), "log decays, mostly near 0"
    assert ((beta > 0) & (beta < 1)).all() and state.dtype == torch.float32 and not qk_l2norm
    torch.testing.assert_close(k.float().norm(dim=-1), torch.ones(2, 1, 2), atol=1e-2, rtol=0)


def test_options_change_the_reference(gen):
    """A kernel that ignored the window, the softcap or the unit offset would fail parity."""
    for op, static, flags, dims in [
            ("attention.prefill", {"hq": 2, "hkv": 2, "d": 128, "window": 16}, ("causal",), {"batch": 1, "seq": 70}),
            ("attention.prefill", {"hq": 2, "hkv": 2, "d": 128, "softcap": 1.0}, ("causal",), {"batch": 1, "seq": 33}),
            ("attention.decode", {"hq": 2, "hkv": 2, "d": 128, "window": 32}, (), {"batch": 1, "kv_len": 70}),
            ("norm.rms", {"hidden": 64}, ("unit_offset",), {"tokens": 4})]:
        sig = Signature.make(op, static, flags, "fp32")
        args = CONTRACTS[op].make_inputs(sig, dims, CPU, gen)
        base = len(args) - (2 if op.startswith("attention") else 1)  # the canonical call without the options
        with_options, without = CONTRACTS[op].reference(*args), CONTRACTS[op].reference(*args[:base])
        assert not compare(without, with_options, TOLERANCES["bf16"])[0], f"{sig} needs its options"


def test_rope_cos_sin_layouts():
    pos = torch.tensor([0, 3])
    cos, sin = cos_sin(pos, 8, interleaved=False)
    assert torch.equal(cos[:, :4], cos[:, 4:])
    cos_i, _ = cos_sin(pos, 8, interleaved=True)
    assert torch.equal(cos_i[:, 0::2], cos_i[:, 1::2])
    assert torch.equal(cos_i[:, 0::2], cos[:, :4])
    assert torch.allclose(cos[0], torch.ones(8)) and torch.allclose(sin[0], torch.zeros(8))


def test_flops_and_bytes():
    sig = Signature.make("linear", {"k": 8192, "n": 1280}, (), "bf16")
    assert CONTRACTS["linear"].flops(sig, {"tokens": 16}) == 2 * 16 * 8192 * 1280
    assert CONTRACTS["linear"].bytes_moved(sig, {"tokens": 16}) == 2 * (16 * 8192 + 8192 * 1280 + 16 * 1280)
    causal = Signature.make("attention.prefill", {"hq": 8, "hkv": 1, "d": 128}, ("causal",), "bf16")
    full = Signature.make("attention.prefill", {"hq": 8, "hkv": 1, "d": 128}, (), "bf16")
    dims = {"batch": 1, "seq": 1024}
    assert CONTRACTS["attention.prefill"].flops(causal, dims) * 2 == CONTRACTS["attention.prefill"].flops(full, dims)
    windowed = Signature.make("attention.decode", {"hq": 8, "hkv": 1, "d": 128, "window": 512}, (), "bf16")
    unwindowed = Signature.make("attention.decode", {"hq": 8, "hkv": 1, "d": 128}, (), "bf16")
    long, short = {"batch": 1, "kv_len": 8192}, {"batch": 1, "kv_len": 512}
    assert CONTRACTS["attention.decode"].bytes_moved(windowed, long) == CONTRACTS["attention.decode"].bytes_moved(
        unwindowed, short), "a decode query reads only its window"
    assert CONTRACTS["attention.decode"].flops(windowed, long) == CONTRACTS["attention.decode"].flops(unwindowed, short)


def test_compare_rejects_wrong_outputs():
    ref = torch.randn(64, 128)
    tol = TOLERANCES["bf16"]
    assert compare(ref.bfloat16(), ref, tol)[0]
    one_bad_row = ref.clone()
    one_bad_row[3] = -one_bad_row[3]
    ok, errors, message = compare(one_bad_row, ref, tol)
    assert not ok and errors["max_rel"] > tol.max_rel, "a single wrong row must fail"
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert compare(nan, ref, tol) == (False, {}, "output 0 has NaN or Inf")
    assert not compare(ref[:10], ref, tol)[0]
    assert not compare((ref, ref), ref, tol)[0]
    assert not compare(ref * 1.05, ref, tol)[0]


def test_signature_format_and_validation():
    sig = Signature.make("attention.prefill", {"hkv": 1, "hq": 8, "d": 128}, ("causal",), "bf16")
    assert str(sig) == "attention.prefill[hq=8,hkv=1,d=128,causal,bf16]"
    assert rops.required_features(sig) == {"causal", "gqa"}
    gemma2 = Signature.make("attention.prefill", {"hq": 8, "hkv": 4, "d": 256, "window": 4096, "softcap": 50.0},
                            ("causal",), "bf16")
    assert str(gemma2) == "attention.prefill[hq=8,hkv=4,d=256,window=4096,softcap=50.0,causal,bf16]"
    assert rops.required_features(gemma2) == {"causal", "gqa", "sliding_window", "softcap"}
    q, k = torch.zeros(1, 8, 5, 256, dtype=torch.bfloat16), torch.zeros(1, 4, 5, 256, dtype=torch.bfloat16)
    call = rops.attention_call(q, k, k, True, window=4096, softcap=50)
    assert str(call[0]) == str(gemma2), "an int softcap names the same signature as a float one"
    with pytest.raises(ValueError):
        Signature.make("attention.prefill", {"hq": 8}, (), "bf16")
    with pytest.raises(ValueError):
        Signature.make("linear", {"k": 1, "n": 1}, ("causal",), "bf16")
    with pytest.raises(ValueError):
        Signature.make("nope", {}, (), "bf16")


def test_compare_takes_integer_outputs_exactly(gen):
    """A router's expert ids must be the reference's, not close to them."""
    sig = Signature.make("moe.router", {"experts": 12, "top_k": 3}, ("renorm",), "bf16")
    args = CONTRACTS["moe.router"].make_inputs(sig, {"tokens": 6}, CPU, gen)
    weights, ids = CONTRACTS["moe.router"].reference(*to_fp32(args))
    assert compare((weights, ids), (weights, ids), TOLERANCES["bf16"])[0]
    swapped = ids.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    ok, _, message = compare((weights, swapped), (weights, ids), TOLERANCES["bf16"])
    assert not ok and "integers differ" in message
