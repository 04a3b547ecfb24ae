"""Op contracts: references against independent float64 formulas, inputs, signatures, compare."""
import math

import pytest
import torch

from lzsolve.ops import CONTRACTS, TOLERANCES, compare, to_fp32
from lzsolve.ops.rope import cos_sin
from runtime_loader import ops as rops
from runtime_loader.ops import Signature

CPU = torch.device("cpu")

SIGS = [
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32"), {"batch": 2, "seq": 7}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 4, "d": 16}, (), "fp32"), {"batch": 1, "seq": 5}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8}, (), "fp32"), {"batch": 3, "kv_len": 9}),
    (Signature.make("norm.rms", {"hidden": 32}, (), "fp32"), {"tokens": 5}),
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "split_half"}, (), "fp32"), {"tokens": 6}),
    (Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 8, "layout": "interleaved"}, (), "fp32"), {"tokens": 6}),
    (Signature.make("act.swiglu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("linear", {"k": 16, "n": 12}, ("bias",), "fp32"), {"tokens": 4}),
    (Signature.make("linear", {"k": 16, "n": 12}, (), "fp32"), {"tokens": 4}),
]


def attention64(q, k, v, causal, scale):
    """Textbook attention, one (batch, head) at a time, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h] @ k[b, h // groups].T * scale
            if causal:
                s = s + torch.full_like(s, -math.inf).triu(1)
            out[b, h] = s.softmax(-1) @ v[b, h // groups]
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


INDEPENDENT = {
    "attention.prefill": attention64,
    "attention.decode": attention64,
    "norm.rms": lambda x, w, eps: x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + eps) * w.double(),
    "posenc.rope": rope64,
    "act.swiglu": lambda g, u: g.double() * torch.sigmoid(g.double()) * u.double(),
    "linear": lambda x, w, b: x.double() @ w.double().T + (b.double() if b is not None else 0),
}


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_reference_matches_float64_formula(sig, dims, gen):
    contract = CONTRACTS[sig.op]
    args = contract.make_inputs(sig, dims, CPU, gen)
    ref = contract.reference(*to_fp32(args))
    expected = INDEPENDENT[sig.op](*args)
    for r, e in zip(ref if isinstance(ref, tuple) else (ref,), expected if isinstance(expected, tuple) else (expected,)):
        assert r.dtype == torch.float32
        torch.testing.assert_close(r.double(), e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sig,dims", SIGS, ids=[str(s) for s, _ in SIGS])
def test_inputs_are_random_and_match_the_runtime_signature(sig, dims, gen):
    contract = CONTRACTS[sig.op]
    a = contract.make_inputs(sig, dims, CPU, gen)
    b = contract.make_inputs(sig, dims, CPU, gen)
    tensors = [t for t in a if isinstance(t, torch.Tensor)]
    assert all(t.abs().sum() > 0 for t in tensors), "never zeros"
    assert not torch.equal(a[0], b[0]), "drawn afresh each time"
    derive = {
        "attention.prefill": lambda: rops.attention_call(a[0], a[1], a[2], a[3]),
        "attention.decode": lambda: rops.attention_call(a[0], a[1], a[2], a[3]),
        "posenc.rope": lambda: rops.rope_call(a[0], a[1], a[4]),
        "linear": lambda: rops.linear_call(a[0], a[1], a[2]),
    }.get(sig.op, lambda: rops.rows_call(sig.op, a[0]))
    assert derive() == (sig, dims)


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
    with pytest.raises(ValueError):
        Signature.make("attention.prefill", {"hq": 8}, (), "bf16")
    with pytest.raises(ValueError):
        Signature.make("linear", {"k": 1, "n": 1}, ("causal",), "bf16")
    with pytest.raises(ValueError):
        Signature.make("nope", {}, (), "bf16")
