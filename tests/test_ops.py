"""Op contracts: references against independent float64 formulas, inputs, signatures, compare."""
import importlib
import inspect

import pytest
import torch

from lzsolve.ops import CONTRACTS, TOLERANCES, compare, to_fp32
from lzsolve.ops.rope import cos_sin
from runtime_loader import ops as rops
from runtime_loader.dispatcher import _inlined
from runtime_loader.ops import Signature

CPU = torch.device("cpu")

# Every family's oracles (tests/oracles/<family>.py, named as runtime_loader.ops's families)
ORACLES = {family: importlib.import_module(f"tests.oracles.{family}") for family in rops.FAMILIES}
SIGS = [case for oracle in ORACLES.values() for case in oracle.SIGS]
INDEPENDENT = {op: formula for oracle in ORACLES.values() for op, formula in oracle.INDEPENDENT.items()}


def test_every_op_has_an_independent_formula_and_signatures_here():
    """A new op fails here until its reference is checked against a formula of its own, in the
    oracle module of its family."""
    for family, runtime in rops.FAMILIES.items():
        ops = {record.name for record in runtime.RECORDS}
        assert set(ORACLES[family].INDEPENDENT) == ops, family
        assert {sig.op for sig, _ in ORACLES[family].SIGS} == ops, family
    assert set(INDEPENDENT) == set(rops.OPS)


def test_every_op_lives_in_one_family_with_all_its_parts():
    """An op's parts, each where CONTRIBUTING.md says: its record, input maker and fallback in its
    family's runtime module (runtime_loader.ops.<family>; the fallback of attention, the bf16 linear
    and the experts is a library adapter's: SDPA's, torch's), its contract in lzsolve.ops.<family>."""
    from runtime_loader import registry

    for family, runtime in rops.FAMILIES.items():
        contracts = importlib.import_module(f"lzsolve.ops.{family}").CONTRACTS
        for record in runtime.RECORDS:
            assert record.inputs.__module__ == runtime.__name__, (record.name, record.inputs)
            assert record.front.__module__ in (runtime.__name__, rops.base.__name__), record.name
            for kernel_id in filter(None, (record.fallback, record.reference)):  # eager.*: the family's own
                assert not kernel_id.startswith("eager.") or registry.get(kernel_id).impl.__module__ == runtime.__name__
            assert [c for c in contracts if c.op == record.name], f"{record.name} has no contract in lzsolve.ops.{family}"


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
    # a causal prompt of s tokens scores s (s + 1) / 2 pairs of the s^2 (tests/test_roofline.py counts every op)
    assert CONTRACTS["attention.prefill"].flops(causal, dims) * 2 * 1024 == CONTRACTS["attention.prefill"].flops(
        full, dims) * 1025
    windowed = Signature.make("attention.decode", {"hq": 8, "hkv": 1, "d": 128, "window": 512}, (), "bf16")
    unwindowed = Signature.make("attention.decode", {"hq": 8, "hkv": 1, "d": 128}, (), "bf16")
    long, short = {"batch": 1, "kv_len": 8192}, {"batch": 1, "kv_len": 512}
    assert CONTRACTS["attention.decode"].bytes_moved(windowed, long) == CONTRACTS["attention.decode"].bytes_moved(
        unwindowed, short), "a decode query reads only its window"
    assert CONTRACTS["attention.decode"].flops(windowed, long) == CONTRACTS["attention.decode"].flops(unwindowed, short)


def test_a_value_head_dim_other_than_qs_is_its_own_signature(gen):
    """MLA (DeepSeek): q and k of 192, v of 128. The signature names dv only where it differs, so
    every other model's signatures (and tables) read as before; kernels must declare it."""
    from runtime_loader import registry
    from runtime_loader.hardware import device_info
    from runtime_loader.ops.attention import attention_call
    q, k, v = torch.randn(2, 4, 5, 24), torch.randn(2, 4, 5, 24), torch.randn(2, 4, 5, 16)
    sig, dims = attention_call(q, k, v, True)
    assert str(sig) == "attention.prefill[hq=4,hkv=4,d=24,dv=16,causal,fp32]" and dims == {"batch": 2, "seq": 5}
    assert str(attention_call(q, k, k, True)[0]) == "attention.prefill[hq=4,hkv=4,d=24,causal,fp32]"
    assert attention_call(q, v, v, True) is None, "k's head dim must be q's"
    decode = Signature.make("attention.decode", {"hq": 4, "hkv": 2, "d": 24, "dv": 16}, (), "fp32")
    q, k, v, *_ = CONTRACTS[decode.op].make_inputs(decode, {"batch": 1, "kv_len": 9}, CPU, gen)
    assert (q.shape, k.shape, v.shape) == ((1, 4, 1, 24), (1, 2, 9, 24), (1, 2, 9, 16))
    assert CONTRACTS[decode.op].reference(q, k, v, False, None).shape == (1, 4, 1, 16)
    same = Signature.make("attention.decode", {"hq": 4, "hkv": 2, "d": 24}, (), "fp32")
    contract, dims = CONTRACTS[decode.op], {"batch": 1, "kv_len": 9}
    assert contract.flops(decode, dims) == contract.flops(same, dims) * (24 + 16) / 48
    assert contract.bytes_moved(decode, dims) == contract.bytes_moved(same, dims) * (24 + 16) / 48
    here = device_info("cpu")
    assert not registry.get("sdpa.default").check(decode, here) and not registry.get("sdpa.math").check(decode, here)
    assert "FEATURE_UNSUPPORTED:v_head_dim" in {r.code for r in registry.get("sdpa.cpu_flash").check(decode, here)}


def test_mla_decode_is_deepseeks_attention_with_the_weights_absorbed():
    """attention.mla_decode over the latent cache, with each head's key up-projection folded into q
    and its value up-projection applied after, is the attention transformers' DeepSeek computes over
    the expanded cache (kv_b_proj: per head, k_nope's rows then v's, from the latent)."""
    from runtime_loader import registry
    torch.manual_seed(0)
    batch, hq, kv_len, rank, nope, rope, dv = 2, 3, 7, 16, 8, 4, 6
    w_uk, w_uv = torch.randn(hq, nope + dv, rank).split([nope, dv], dim=1)  # kv_b_proj's weight, per head
    kv, k_pe = torch.randn(batch, 1, kv_len, rank), torch.randn(batch, 1, kv_len, rope)
    q_nope, q_pe = torch.randn(batch, hq, 1, nope), torch.randn(batch, hq, 1, rope)
    scale = (nope + rope) ** -0.5
    k = torch.cat([torch.einsum("btr,hnr->bhtn", kv[:, 0], w_uk), k_pe.expand(-1, hq, -1, -1)], dim=-1)
    v = torch.einsum("btr,hvr->bhtv", kv[:, 0], w_uv)
    expected = torch.nn.functional.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, scale=scale)
    absorbed = torch.einsum("bhqn,hnr->bhqr", q_nope, w_uk)
    latent = registry.get("eager.mla_decode").impl(absorbed, q_pe, kv, k_pe, scale)
    torch.testing.assert_close(torch.einsum("bhqr,hvr->bhqv", latent, w_uv), expected)
    torch.testing.assert_close(CONTRACTS["attention.mla_decode"].reference(absorbed, q_pe, kv, k_pe, scale), latent)


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
    call = rops.attention.attention_call(q, k, k, True, window=4096, softcap=50)
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


@pytest.mark.parametrize("kernel_id", ["eager.embedding", "eager.learned_positions"])
def test_the_lookups_fallbacks_refuse_negative_ids_as_torch_does(kernel_id):
    """table[ids] read id -1 as the table's last row; F.embedding (nn.Embedding) raises."""
    from runtime_loader import registry

    table, ids = torch.randn(10, 4), torch.tensor([0, -1])
    args = (ids, table, None) if kernel_id == "eager.embedding" else (torch.randn(2, 4), ids, table)
    with pytest.raises(IndexError, match="index out of range"):
        registry.get(kernel_id).impl(*args)
