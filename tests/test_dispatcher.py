"""The Dispatcher: table replay, fallbacks, SDPA semantics."""
import dataclasses
import functools
import importlib
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

from runtime_loader import Dispatcher, Policy, registry
from runtime_loader.dispatcher import _inlined, _method
from runtime_loader.ops import FAMILIES, OPS, Signature, example_args
from runtime_loader.specs import HEAD_DIM_ANY, KernelSpec
from runtime_loader.table import parse_table

from .tables import RMS, entry, table


@pytest.fixture
def d():
    return Dispatcher(parse_table(table()))


def test_tree_routes_by_dynamic_dims(d):
    w = torch.randn(64)
    assert d.kernel_for("rms_norm", torch.randn(2, 3, 64), w) == "torch.rms_norm"  # 6 tokens
    assert d.kernel_for("rms_norm", torch.randn(3, 3, 64), w) == "eager.rms_norm"  # 9 tokens


def test_outside_the_table_goes_to_fallback(d):
    w = torch.randn(32)
    assert d.kernel_for("rms_norm", torch.randn(4, 32), w) == "eager.rms_norm"  # other hidden size
    assert d.kernel_for("rms_norm", torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)) == "eager.rms_norm"
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert d.kernel_for("attention", q, k, k, causal=True) == "sdpa.math"
    assert d.kernel_for("attention", q, k, k, causal=False) == "sdpa.default"  # not in the table
    assert d.kernel_for("linear", torch.randn(2, 8), torch.randn(4, 8)) == "torch.linear"


def test_attention_keeps_sdpa_semantics(d):
    for seq_q, kv_len, causal in [(8, 8, True), (1, 9, False), (3, 9, True), (1, 9, True), (5, 5, False)]:
        q, k, v = torch.randn(2, 4, seq_q, 16), torch.randn(2, 2, kv_len, 16), torch.randn(2, 2, kv_len, 16)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.3)
        torch.testing.assert_close(d.attention(q, k, v, causal=causal, scale=0.3), expected, rtol=1e-5, atol=1e-5)


def test_unavailable_kernel_falls_back_with_a_warning(monkeypatch):
    import dataclasses
    cpu_only_missing = dataclasses.replace(registry.REGISTRY["sdpa.math"], requires=("no_such_module_abc",))
    monkeypatch.setitem(registry.REGISTRY, "sdpa.math", cpu_only_missing)
    with pytest.warns(RuntimeWarning, match="sdpa.math is not used .NOT_INSTALLED"):
        d = Dispatcher(parse_table(table()))
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert d.kernel_for("attention", q, k, k) == "sdpa.default"


def test_empty_dispatcher_is_plain_torch():
    d = Dispatcher()
    x, w = torch.randn(5, 64), torch.randn(64)
    torch.testing.assert_close(d.rms_norm(x, w, 1e-6), registry.get("eager.rms_norm").impl(x, w, 1e-6))
    g, u = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(d.swiglu(g, u), F.silu(g) * u)
    x, w, b = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4)
    torch.testing.assert_close(d.linear(x, w, b), F.linear(x, w, b))


def test_cache_is_bounded(d, monkeypatch):
    import runtime_loader.dispatcher as mod
    monkeypatch.setattr(mod, "MAX_CACHED_KEYS", 3)
    w = torch.randn(64)
    with warnings.catch_warnings():
        for tokens in range(1, 10):
            d.rms_norm(torch.randn(tokens, 64), w)
    assert d.cached_keys() == 3


def test_warm_up_leaves_the_callers_random_stream_alone(tmp_path):
    import runtime_loader

    from .tables import write
    d = runtime_loader.load(write(tmp_path, table()), strict=True)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert d.warmup(strict=True) > 0
    assert torch.equal(torch.rand(3), expected)


def test_new_methods_on_an_empty_dispatcher_are_the_eager_ops():
    d, eager = Dispatcher(), registry.get
    x, w = torch.randn(5, 3, 16), torch.randn(16) * 0.1
    torch.testing.assert_close(d.qk_norm(x, w, 1e-6), eager("eager.qk_norm").impl(x, w, 1e-6))
    torch.testing.assert_close(d.qk_norm(x, w, 1e-6, unit_offset=True),
                               F.rms_norm(x, (16,), 1 + w, 1e-6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d.rms_norm(x, w, 1e-6, unit_offset=True), F.rms_norm(x, (16,), 1 + w, 1e-6),
                               rtol=1e-5, atol=1e-5)
    r = torch.randn(5, 3, 16)
    out, total = d.rms_norm_add(x, r, w, 1e-6, unit_offset=True)
    torch.testing.assert_close(out, F.rms_norm(x + r, (16,), 1 + w, 1e-6), rtol=1e-5, atol=1e-5)
    assert torch.equal(total, x + r)
    ids, table = torch.tensor([[3, 0, 9]]), torch.randn(10, 16, dtype=torch.bfloat16)
    assert torch.equal(d.embedding(ids, table), table[ids])
    # Gemma rounds sqrt(hidden) to the table's dtype before multiplying: 25.298 -> 25.25 in bf16
    rounded = torch.tensor(25.25, dtype=torch.bfloat16)
    assert torch.equal(d.embedding(ids, table, scale=640 ** 0.5), table[ids] * rounded)
    positions, wpe = torch.arange(3)[None], torch.randn(8, 16)
    torch.testing.assert_close(d.learned_positions(x[None, :3, 0], positions, wpe), x[None, :3, 0] + wpe[:3])
    gate = torch.randn(5, 3, 16)
    torch.testing.assert_close(d.sigmoid_gate(x, gate), x * torch.sigmoid(gate))
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8), torch.randn(2, 4, 2, 8)
    g, beta = -torch.rand(2, 4, 2), torch.rand(2, 4, 2)
    out, state = d.gated_deltanet(q, k, v, g, beta)
    expected = eager("eager.gated_deltanet").impl(q, k, v, g, beta, None, True)
    torch.testing.assert_close((out, state), expected)
    assert state.shape == (2, 2, 8, 8) and state.dtype == torch.float32


def test_attention_window_and_softcap():
    """Prefill windows count back from each query; a decode query sits at kv_len - 1 and sees the
    last `window` keys; softcap squashes the scaled scores before the mask."""
    d = Dispatcher()
    q, k, v = torch.randn(1, 4, 12, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    keep = (j <= i) & (j > i - 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    torch.testing.assert_close(d.attention(q, k, v, causal=True, window=5), expected, rtol=1e-5, atol=1e-5)
    assert d.kernel_for("attention", q, k, v, causal=True, window=5) == "sdpa.default"
    decode = d.attention(q[:, :, -1:], k, v, causal=False, window=5)
    expected = F.scaled_dot_product_attention(q[:, :, -1:], k[:, :, -5:], v[:, :, -5:], enable_gqa=True)
    torch.testing.assert_close(decode, expected, rtol=1e-5, atol=1e-5)
    softcapped = d.attention(q, k, v, causal=True, softcap=0.5, scale=0.3)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.3 / 0.5).tanh() * 0.5
    expected = scores.masked_fill(j > i, float("-inf")).softmax(-1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(softcapped, expected, rtol=1e-5, atol=1e-5)
    assert d.kernel_for("attention", q, k, v, causal=True, softcap=0.5) == "eager.attention"
    chunk = q[:, :, -3:]  # outside every signature: SDPA cannot softcap, so the reference serves it
    assert d.kernel_for("attention", chunk, k, v, causal=False, softcap=0.5) == "eager.attention"
    assert d.kernel_for("attention", chunk, k, v, causal=False) == "sdpa.default"


def test_flags_and_options_are_part_of_the_key():
    from .tables import entry
    sigs = [Signature.make("norm.qk", {"heads": 2, "d": 16}, ("unit_offset",), "fp32"),
            Signature.make("embedding", {"vocab": 10, "hidden": 16}, ("scaled",), "fp32"),
            Signature.make("attention.decode", {"hq": 4, "hkv": 2, "d": 16, "window": 8}, ("qk_norm",), "fp32")]
    leaves = ["torch.qk_norm", "torch.embedding", "eager.attention"]
    d = Dispatcher(parse_table(table(ops=[entry(RMS, {"kernel_id": "torch.rms_norm"})]
                                     + [entry(s, {"kernel_id": k}) for s, k in zip(sigs, leaves)])))
    x, w = torch.randn(4, 64), torch.randn(64)
    assert d.kernel_for("rms_norm", x, w) == "torch.rms_norm"
    assert d.kernel_for("rms_norm", x, w, 1e-6, True) == "eager.rms_norm", "unit_offset is another signature"
    heads = torch.randn(3, 2, 16)
    assert d.kernel_for("qk_norm", heads, w[:16], unit_offset=True) == "torch.qk_norm"
    assert d.kernel_for("qk_norm", heads, w[:16]) == "eager.qk_norm"
    ids, rows = torch.tensor([1, 2]), torch.randn(10, 16)
    assert d.kernel_for("embedding", ids, rows, 4.0) == "torch.embedding"
    assert d.kernel_for("embedding", ids, rows) == "eager.embedding"
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 20, 16)
    assert d.kernel_for("attention", q, k, k, False, None, 8, 0.0, None, qk_norm=True) == "eager.attention"
    assert d.kernel_for("attention", q, k, k, causal=False, window=8) == "sdpa.default", "qk_norm is in the key"
    assert d.kernel_for("attention", q, k, k, causal=False, qk_norm=True) == "sdpa.default", "so is the window"


def test_warm_up_calls_every_new_method(tmp_path):
    import runtime_loader

    from .tables import entry, write
    sigs = {Signature.make("norm.qk", {"heads": 2, "d": 16}, ("unit_offset",), "fp32"): "torch.qk_norm",
            Signature.make("norm.rms_add", {"hidden": 16}, ("unit_offset",), "fp32"): "torch.rms_norm_add",
            Signature.make("embedding", {"vocab": 10, "hidden": 16}, ("scaled",), "fp32"): "torch.embedding",
            Signature.make("posenc.learned", {"hidden": 16}, (), "fp32"): "torch.learned_positions",
            Signature.make("act.sigmoid_gate", {"width": 16}, (), "fp32"): "eager.sigmoid_gate",
            Signature.make("recurrent.gated_deltanet", {"hk": 1, "hv": 2, "dk": 8, "dv": 8}, ("qk_l2norm",),
                           "fp32"): "eager.gated_deltanet",
            Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "window": 4}, ("causal", "qk_norm"),
                           "fp32"): "eager.attention"}
    buckets = {sig.op: {dim: [1, 3] for dim in sig.schema.dynamic} for sig in sigs}
    raw = table(ops=[entry(sig, {"kernel_id": kernel_id}) for sig, kernel_id in sigs.items()], buckets=buckets)
    d = runtime_loader.load(write(tmp_path, raw), strict=True)
    assert d.warmup(strict=True) == 2 * len(sigs), "the smallest and largest grid point of each leaf"
    for sig, kernel_id in sigs.items():  # each warm-up call resolved its table entry, not a fallback
        assert {e.kernel_id for e in d._caches[Dispatcher.METHODS[sig.op]].values()} == {kernel_id}


def test_warm_up_calls_every_op(tmp_path):
    """Every op of the registry, at its contract's first case, is warmed up from its table entry:
    a new op without example inputs or a method fails here, not in a warm-up warning."""
    import runtime_loader
    from lzsolve.ops import CONTRACTS

    from .tables import entry, write
    sigs, buckets = {}, {}
    for op, record in OPS.items():
        static, flags, dims = CONTRACTS[op].cases[0]
        sig = Signature.make(op, static, flags, "fp32")
        sigs[sig] = registry.fallback_for(sig).kernel_id
        buckets[op] = {dim: [dims[dim]] for dim in record.dynamic}
    raw = table(ops=[entry(sig, {"kernel_id": kernel_id}) for sig, kernel_id in sigs.items()], buckets=buckets)
    d = runtime_loader.load(write(tmp_path, raw), strict=True)
    assert d.warmup(strict=True) == len(OPS)
    for sig, kernel_id in sigs.items():
        assert kernel_id in {e.kernel_id for e in d._caches[OPS[sig.op].method].values() if e.from_table}, sig


def test_chunked_prefill_window_follows_the_causal_diagonal():
    """Outside the signatures (seq_q < kv_len), causal keeps SDPA's top-left alignment and the
    window counts back from that same diagonal, so no query is left without a key."""
    d = Dispatcher()
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    i, j = torch.arange(3)[:, None], torch.arange(10)[None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - 2))
    torch.testing.assert_close(d.attention(q, k, v, causal=True, window=2), expected, rtol=1e-5, atol=1e-5)
    softcapped = d.attention(q, k, v, causal=True, window=2, softcap=30.0)  # the reference serves it
    torch.testing.assert_close(softcapped, registry.get("eager.attention").impl(q, k, v, True, None, 2, 30.0))
    assert torch.isfinite(softcapped).all()


def test_stats_count_calls_per_op_and_kernel(d):
    w = torch.randn(64)
    for _ in range(3):
        d.rms_norm(torch.randn(2, 64), w)  # 2 tokens: the tree's torch.rms_norm
    d.rms_norm(torch.randn(9, 64), w)  # 9 tokens: eager.rms_norm
    d.rms_norm(torch.randn(4, 32), torch.randn(32))  # no signature: the fallback
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    d.attention(q, k, k, causal=True)
    d.kernel_for("rms_norm", torch.randn(2, 64), w)  # asking is not calling
    assert d.stats() == {"norm.rms": {"torch.rms_norm": 3, "eager.rms_norm": 1, "eager.rms_norm (fallback)": 1},
                         "attention.prefill": {"sdpa.math": 1}}
    d.clear_cache()  # counts outlive the cache
    d.rms_norm(torch.randn(2, 64), w)
    assert d.stats()["norm.rms"]["torch.rms_norm"] == 4


def test_stats_are_exact_under_threads(d):
    import threading
    w, x = torch.randn(64), torch.randn(2, 64)
    d.rms_norm(x, w)

    def work():
        for _ in range(2000):
            d.rms_norm(x, w)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.stats()["norm.rms"]["torch.rms_norm"] == 8001


def test_each_dispatcher_binds_its_own_methods(d):
    """A method is bound to its Dispatcher (a closure over its cache) on first use: each counts its
    own calls, and the method keeps the front's parameters, annotations and docstring."""
    other = Dispatcher()
    x, w = torch.randn(2, 64), torch.randn(64)
    d.rms_norm(x, w)
    other.rms_norm(x, w, eps=1e-5)
    other.rms_norm(x, weight=w)
    assert d.stats() == {"norm.rms": {"torch.rms_norm": 1}}
    assert other.stats() == {"norm.rms": {"eager.rms_norm (fallback)": 2}}
    front = OPS["norm.rms"].front
    assert inspect.signature(other.rms_norm) == inspect.signature(front)
    assert other.rms_norm.__doc__ == Dispatcher.rms_norm.__doc__ == front.__doc__
    assert other.rms_norm.__qualname__ == "Dispatcher.rms_norm" and other.rms_norm is not d.rms_norm


def test_a_subclass_overrides_a_method_and_calls_it_through_super():
    class Counting(Dispatcher):
        calls = 0

        def rms_norm(self, *args, **kwargs):
            self.calls += 1
            return super().rms_norm(*args, **kwargs)

    d = Counting()
    for _ in range(3):
        d.rms_norm(torch.randn(2, 8), torch.randn(8))
    assert d.calls == 3 and d.stats() == {"norm.rms": {"eager.rms_norm (fallback)": 3}}


def test_a_front_may_not_take_the_method_templates_names():
    def takes_get(x, get):
        return (x.shape,), (x, get)

    with pytest.raises(ValueError, match=r"\['get'\]"):
        _method(dataclasses.replace(OPS["act.swiglu"], front=takes_get))


GLOBAL_FLAG = False


def test_only_a_front_that_reads_its_parameters_alone_is_inlined():
    """Any other front is called by its method (tests/toy_op.py's calls another front)."""
    rms = OPS["norm.rms"]

    def calls_another(x, weight, eps=1e-6, unit_offset=False):
        return rms.front(x, weight, eps, unit_offset)

    def reads_a_global(x, weight, eps=1e-6, unit_offset=False):
        return (x.shape, x.dtype, x.is_cuda, GLOBAL_FLAG), (x, weight, eps)

    def two_statements(x, weight, eps=1e-6, unit_offset=False):
        key = (x.shape, x.dtype, x.is_cuda, unit_offset)
        return key, (x, weight, eps)

    @functools.wraps(rms.front)
    def wrapped(x, weight, eps=1e-6, unit_offset=False):
        return (x.shape, x.dtype, x.is_cuda, unit_offset), (x, weight, eps)

    assert _inlined(rms) is not None  # (what it computes: tests/test_ops.py)
    for front in (calls_another, reads_a_global, two_statements, wrapped):
        assert _inlined(dataclasses.replace(rms, front=front)) is None, front.__name__


def test_traced_calls_of_fusible_ops_keep_their_torch_form(d):
    """Under a traced patch (torch.compile) a norm, activation, RoPE or embedding call takes its
    fallback, whose torch ops Inductor fuses with the model's, and the table still serves the other
    ops; fuse off or a lock gives the table's or the lock's kernel back. Eager calls are unchanged."""
    from runtime_loader import Policy

    x, w = torch.randn(2, 3, 64), torch.randn(64)  # 6 tokens: the table's torch.rms_norm
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert d.kernel_for("rms_norm", x, w) == "torch.rms_norm"
    assert d.traced_kernel_for("rms_norm", x, w) == "eager.rms_norm" == OPS["norm.rms"].fallback
    assert d.traced_kernel_for("attention", q, k, k, causal=True) == "sdpa.math", "not fusible: the table's"
    torch.testing.assert_close(d.traced_ops.rms_norm(x, w, 1e-6), d.rms_norm(x, w, 1e-6))
    d.traced_fuse = False
    assert d.traced_kernel_for("rms_norm", x, w) == "torch.rms_norm"
    locked = Dispatcher(parse_table(table()), policy=Policy(lock={"norm.rms": "torch.rms_norm"}))
    assert locked.traced_kernel_for("rms_norm", torch.randn(5, 64), w) == "torch.rms_norm", "a lock is kept"


def test_the_fusible_ops_are_row_ops_whose_fallback_is_torch():
    """OpSchema.fusible marks what Inductor fuses: no attention, GEMM, experts or recurrence, and a
    fallback of torch ops (an eager.* or torch.* kernel)."""
    fusible = {name for name, op in OPS.items() if op.fusible}
    assert {"norm.rms", "norm.rms_add", "act.swiglu", "posenc.rope", "embedding"} <= fusible
    assert not fusible & {"attention.prefill", "attention.decode", "linear", "moe.experts", "recurrent.gated_deltanet"}
    assert all(OPS[name].fallback.split(".")[0] in ("eager", "torch") for name in fusible)


def test_a_norm_weight_in_another_dtype_than_x_takes_the_fallback_and_its_promotion():
    """bf16 x with an fp32 weight: transformers' Qwen3RMSNorm and the fallback return fp32; the table's
    kernel, tuned with a bf16 weight, returned bf16, so the result depended on the table's coverage."""
    sig = Signature.make("norm.rms", {"hidden": 64}, (), "bf16")
    d = Dispatcher(parse_table(table([entry(sig, {"kernel_id": "torch.rms_norm"})])))
    x, weight = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)
    assert d.kernel_for("rms_norm", x, weight.bfloat16()) == "torch.rms_norm", "the table serves the tuned dtypes"
    out = d.rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, registry.get("eager.rms_norm").impl(x, weight, 1e-6))
    assert [*d.coverage()["outside"][str(sig)]["why"]][0].startswith("weight is fp32, not the signature's bf16")


def test_every_parameter_tuned_in_the_signatures_dtype_sends_another_dtype_to_the_fallback():
    """OpSchema.same_dtype, for every op: even a lock does not serve such a call (its result is the
    fallback's promotion), and the parameter's dtype is in the method's key, so a call in the tuned
    dtypes made first does not serve it from its cache entry."""
    ops = [op for op in OPS.values() if op.same_dtype]
    assert {"norm.rms", "norm.rms_add", "norm.qk", "norm.layer", "posenc.rope", "act.swiglu"} <= {o.name for o in ops}
    spec = KernelSpec("test.any_row_op", frozenset(o.name for o in ops), "testlib", lambda *args: None,
                      platforms=frozenset({"cpu"}), dtypes=frozenset({"bf16"}), head_dim_max=HEAD_DIM_ANY,
                      features=frozenset({"gqa", "rope_split_half", *(flag for o in ops for flag in o.flags)}))
    registry.register(spec)
    d = Dispatcher(None, policy=Policy(lock={o.name: spec.kernel_id for o in ops}))
    for op in ops:
        sig, dims = next(case for family in FAMILIES for case in importlib.import_module(f"tests.oracles.{family}").SIGS
                         if case[0].op == op.name)
        args = example_args(Signature.make(op.name, dict(sig.static), sig.flags, "bf16"), dims, "cpu")
        names = [p.name for p in op.parameters]
        assert d.kernel_for(op.method, *args) == spec.kernel_id, op.name
        for name in op.same_dtype:
            other = list(args)
            other[names.index(name)] = args[names.index(name)].float()
            assert d.kernel_for(op.method, *other) == op.fallback, (op.name, name)


EMPTY_ATTENTION = """
import torch, warnings, runtime_loader
warnings.simplefilter("ignore")
q, k = torch.randn(1, 4, 0, 16), torch.randn(1, 2, 0, 16)
d = runtime_loader.load("/nonexistent", lock={"attention.prefill": "sdpa.cpu_flash",
                                              "attention.decode": "sdpa.cpu_flash"})
print(tuple(d.attention(q, k, k, True).shape))
print(tuple(d.attention(torch.randn(2, 4, 1, 16), k, k, False).shape))
"""


def test_an_empty_attention_call_under_a_cpu_flash_lock_returns_sdpas_empty_result():
    """torch's CPU flash attention dies with SIGFPE on seq 0 or kv_len 0 (no except catches a signal),
    where SDPA returns an empty result: such a call takes the fallback, lock or not (in a subprocess:
    the process that made it died)."""
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", EMPTY_ATTENTION], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split("\n")[:2] == ["(1, 4, 0, 16)", "(2, 4, 1, 16)"], "SDPA's output: zeros for no keys"


def _empty_kernel(*args):
    raise AssertionError("a table kernel was called with an empty input")


def _shapes(out):
    """(shape, dtype) of an op's output, or of each of its tensors."""
    if isinstance(out, torch.Tensor):
        return tuple(out.shape), out.dtype
    return tuple(_shapes(t) for t in out)


def test_a_call_with_a_dynamic_dim_of_0_takes_the_fallback_for_every_op():
    """Every op, each dynamic dim at 0 in turn (the contract's first case otherwise), under a lock to a
    kernel that is not its fallback (a CPU one where the registry has one, else one that fails if
    called): the call is the fallback's, which returns the empty output eager torch would (the shapes
    and dtypes of the op's fake, never an error: the experts' grouped GEMM, the conv over seq 0 and
    the chunked delta rule over batch 0 raised), and coverage() says why. The fallback of every
    contract case returns that output too."""
    from lzsolve.ops import CONTRACTS
    from runtime_loader.hardware import device_info
    here, sigs, locks = device_info("cpu"), {}, {}
    for op, record in OPS.items():
        static, flags, dims = CONTRACTS[op].cases[0]
        sig = Signature.make(op, static, flags, "fp32")
        sigs[op], fallback = (sig, dims), registry.fallback_for(sig).kernel_id
        cpu = [s.kernel_id for s in registry.candidates(op) if s.kernel_id not in (fallback, "sdpa.cpu_flash")
               and not s.local_reasons(here, load=False) and not s.semantic_reasons(sig)]
        locks[op] = cpu[0] if cpu else f"test.empty.{op}"
        if not cpu and not registry.known(locks[op]):
            registry.register(KernelSpec(locks[op], frozenset({op}), "testlib", _empty_kernel,
                                         platforms=frozenset({"cpu"}), dtypes=frozenset({"fp32"}),
                                         head_dim_max=HEAD_DIM_ANY, features=frozenset(record.flags) | {"gqa"}))
    d = Dispatcher(None, policy=Policy(lock=locks), strict=True)
    assert d.locks == locks
    checked = 0
    for op, (sig, dims) in sigs.items():
        record, fallback = OPS[op], registry.fallback_for(sig)
        assert record.dynamic, op
        for dim in record.dynamic:
            empty = {**dims, dim: 0}
            args = example_args(sig, empty, "cpu")
            assert d.kernel_for(record.method, *args) == fallback.kernel_id, (op, dim, locks[op])
            expected = fallback.impl(*record.inputs(sig, empty, torch.device("cpu"), torch.Generator().manual_seed(0)))
            assert _shapes(expected) == _shapes(record.fake(*args)), (op, dim)
            torch.testing.assert_close(getattr(d, record.method)(*args), expected, equal_nan=True)
            checked += 1
    assert checked >= len(OPS)
    reasons = {why for row in d.coverage()["outside"].values() for why in row["why"]}
    assert reasons and all(why.startswith("an empty input (") for why in reasons), reasons
    for op, record in OPS.items():
        for static, flags, dims in CONTRACTS[op].cases:
            sig = Signature.make(op, static, flags, "fp32")
            for dim in record.dynamic:
                empty = {**dims, dim: 0}
                out = registry.fallback_for(sig).impl(*record.inputs(sig, empty, torch.device("cpu"),
                                                                     torch.Generator().manual_seed(0)))
                assert _shapes(out) == _shapes(record.fake(*example_args(sig, empty, "cpu"))), (sig, dim)


def test_a_causal_conv_of_no_tokens_on_a_state_returns_no_rows_and_the_state():
    """A zero-token call of the conv on a decode state (the every-op test's seq 0 has none): no output
    rows and the state as it was, as eager torch has it; the conv's first output (the state's own last
    input) was taken for x's, its [-seq:] being every output at seq 0."""
    x, weight, bias, state, silu = example_args(Signature.make("conv.causal_depthwise", {"channels": 8, "width": 4},
                                                               ("silu", "bias"), "fp32"), {"batch": 2, "seq": 1}, "cpu")
    assert state is not None
    out, new_state = Dispatcher(None).causal_conv1d(x[:, :0], weight, bias, state.clone(), silu)
    assert out.shape == (2, 0, 8)
    torch.testing.assert_close(new_state, state)


def test_coverage_shows_every_reason_of_a_signatures_calls_with_its_count():
    """Three calls past the tuned range and one with an fp32 weight, of one signature: each reason with
    its calls (the first by sorted key hid "tune with a larger grid" behind the weight's dtype), and the
    counts add up to stats()'s."""
    sig = Signature.make("norm.rms", {"hidden": 64}, (), "bf16")
    d = Dispatcher(parse_table(table([entry(sig, {"kernel_id": "torch.rms_norm"})], buckets={"norm.rms": {
        "tokens": [1, 8]}})))
    weight = torch.randn(64, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for tokens in (20, 20, 30):
            d.rms_norm(torch.randn(tokens, 64, dtype=torch.bfloat16), weight)
        d.rms_norm(torch.randn(4, 64, dtype=torch.bfloat16), weight.float())
        d.rms_norm(torch.randn(4, 64, dtype=torch.bfloat16), weight)
    coverage = d.coverage()
    row = coverage["outside"][str(sig)]
    assert row["calls"] == 4 and list(row["why"].values()) == [2, 1, 1], row
    assert [why.split(" (")[0] for why in row["why"]] == ["past the tuned range"] * 2 + [
        "weight is fp32, not the signature's bf16: the fallback computes it as PyTorch does"]
    assert coverage["calls"] == sum(sum(per_kernel.values()) for per_kernel in d.stats().values()) == 5
    assert coverage["served"] == 1 and coverage["calls"] - coverage["served"] == row["calls"]


def _mixed_dtype_cases():
    """(id, method, arguments, reference): calls with a same_dtype parameter in another dtype than the
    signature's, and what the module's own PyTorch code returns for them (transformers' modules, or
    the torch function they call), dtype included."""
    from transformers.activations import ACT2FN
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from runtime_loader.quant import quantize_per_token

    bf16, fp32 = torch.bfloat16, torch.float32
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=bf16, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    def norm(cls, weight):
        module = cls(weight.shape[-1], eps=1e-6).to(weight.dtype)
        with torch.no_grad():
            module.weight.copy_(weight)
        return module

    x, w = randn(5, 64), randn(64, scale=0.1, dtype=fp32) + 1
    heads = randn(5, 4, 16)
    w16 = randn(16, scale=0.1, dtype=fp32) + 1
    residual = randn(5, 64, dtype=fp32)
    gate, up = randn(5, 32), randn(5, 32, dtype=fp32)
    q, k = randn(1, 4, 6, 16), randn(1, 2, 6, 16)
    angles = torch.arange(6.0)[:, None] * torch.rand(8, generator=g)[None]
    cos, sin = torch.cat((angles, angles), -1).cos()[None], torch.cat((angles, angles), -1).sin()[None]
    positions, wpe = torch.tensor([0, 3, 1, 2, 7]), randn(8, 64, scale=0.02, dtype=fp32)

    def layer_norm(bias):
        module = torch.nn.LayerNorm(64, eps=1e-5, bias=bias is not None)  # fp32, in a bf16 model
        with torch.no_grad():
            module.weight.copy_(w)
            if bias is not None:
                module.bias.copy_(bias)
        return module

    bias = randn(64, scale=0.1, dtype=fp32)
    return [
        # LlamaRMSNorm / Qwen3RMSNorm: weight * x.to(input_dtype), promoted
        ("rms-fp32-weight", "rms_norm", (x, w, 1e-6), lambda: norm(LlamaRMSNorm, w)(x)),
        ("rms-fp32-x-bf16-weight", "rms_norm", (x.float(), w.bfloat16(), 1e-6),
         lambda: norm(LlamaRMSNorm, w.bfloat16())(x.float())),
        # Gemma's (1 + weight) in fp32, then .type_as(x)
        ("rms-unit-offset-fp32-weight", "rms_norm", (x, w - 1, 1e-6, True), lambda: norm(Gemma3RMSNorm, w - 1)(x)),
        ("qk-fp32-weight", "qk_norm", (heads, w16, 1e-6), lambda: norm(Qwen3RMSNorm, w16)(heads)),
        # the decoder layer's residual + hidden_states, then its RMSNorm
        ("rms-add-fp32-residual", "rms_norm_add", (x, residual, w.bfloat16(), 1e-6, False, True),
         lambda: (norm(LlamaRMSNorm, w.bfloat16())(x + residual), x + residual)),
        ("rms-add-fp32-weight", "rms_norm_add", (x, x.flip(0), w, 1e-6, False, True),
         lambda: (norm(LlamaRMSNorm, w)(x + x.flip(0)), x + x.flip(0))),
        ("rms-add-fp8-bf16-residual", "rms_norm_add_fp8", (residual, x, w, 1e-6),
         lambda: (*quantize_per_token(norm(LlamaRMSNorm, w)(residual + x)), residual + x)),
        # nn.LayerNorm (F.layer_norm): x's dtype, whatever its parameters'
        ("layer-fp32-weight-bias", "layer_norm", (x, w, bias, 1e-5), lambda: layer_norm(bias)(x)),
        ("layer-fp32-weight-no-bias", "layer_norm", (x, w, None, 1e-5), lambda: layer_norm(None)(x)),
        # apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, promoted
        ("rope-fp32-cos-sin", "rope", (q, k, cos, sin, False), lambda: apply_rotary_pos_emb(q, k, cos, sin)),
        ("rope-fp32-k", "rope", (q, k.float(), cos.bfloat16(), sin.bfloat16(), False),
         lambda: apply_rotary_pos_emb(q, k.float(), cos.bfloat16(), sin.bfloat16())),
        # LlamaMLP's act_fn(gate_proj(x)) * up_proj(x), Gemma's GELU, Qwen3.5's output * sigmoid(gate)
        ("swiglu-fp32-up", "swiglu", (gate, up), lambda: ACT2FN["silu"](gate) * up),
        ("geglu-fp32-up", "geglu", (gate, up), lambda: ACT2FN["gelu_pytorch_tanh"](gate) * up),
        ("sigmoid-gate-fp32-gate", "sigmoid_gate", (gate, up), lambda: gate * torch.sigmoid(up)),
        # GPT-2's inputs_embeds + wpe(position_ids)
        ("learned-positions-fp32-table", "learned_positions", (x, positions, wpe),
         lambda: x + torch.nn.functional.embedding(positions, wpe)),
    ]


MIXED_DTYPE_IDS = ["rms-fp32-weight", "rms-fp32-x-bf16-weight", "rms-unit-offset-fp32-weight", "qk-fp32-weight",
                   "rms-add-fp32-residual", "rms-add-fp32-weight", "rms-add-fp8-bf16-residual",
                   "layer-fp32-weight-bias", "layer-fp32-weight-no-bias", "rope-fp32-cos-sin", "rope-fp32-k",
                   "swiglu-fp32-up", "geglu-fp32-up", "sigmoid-gate-fp32-gate", "learned-positions-fp32-table"]


@pytest.mark.parametrize("case", MIXED_DTYPE_IDS)
def test_a_call_in_mixed_dtypes_returns_what_the_modules_own_code_does(case):
    """A same_dtype parameter in another dtype than the signature's sends a call to the fallback even
    where a lock names another kernel: its result must be the module's own (the dtype, the values to
    within rounding), eager and under torch.compile through the custom op, whose fake must give the
    real op's dtype (a fake in x's dtype while the fallback promoted, or a fallback promoting where
    F.layer_norm does not, broke a compiled model: 'mat1 and mat2 must have the same dtype')."""
    pytest.importorskip("transformers")
    from runtime_loader import Policy, custom_ops

    (_, method, args, reference), = [c for c in _mixed_dtype_cases() if c[0] == case]
    op = next(o for o in OPS.values() if o.method == method)
    torch_kernel = "torch." + op.fallback.removeprefix("eager.")
    lock = {op.name: torch_kernel} if torch_kernel in registry.REGISTRY else {}
    d = Dispatcher(None, policy=Policy(lock=lock))
    assert d.kernel_for(method, *args) == op.fallback
    with torch.no_grad():
        expected = _outputs(reference())
    got = _outputs(getattr(d, method)(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args)))
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.float(), e.float(), **_tolerance(e.dtype))
    custom_ops.activate(d)
    custom = getattr(torch.ops.lzsolve, method)

    def traced(*a):  # the dtypes the graph believes (the fake's), beside the real results
        outputs = _outputs(custom(*a))
        return outputs, [torch.zeros((), dtype=o.dtype) for o in outputs]

    torch._dynamo.reset()
    try:
        outputs, believed = torch.compile(traced, fullgraph=True, backend="aot_eager")(
            *(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    finally:
        custom_ops.activate(Dispatcher(None))
    assert [t.dtype for t in believed] == [t.dtype for t in expected], "the fake's dtypes"
    assert [t.dtype for t in outputs] == [t.dtype for t in expected]
    for g, e in zip(outputs, expected, strict=True):
        torch.testing.assert_close(g.float(), e.float(), **_tolerance(e.dtype))


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _tolerance(dtype) -> dict:
    """Within one rounding of the result's dtype (fp8's step is 1/8 of its magnitude)."""
    return dict(rtol=0.13, atol=0.02) if dtype == torch.float8_e4m3fn else \
        dict(rtol=1.6e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-5, atol=1e-5)
