"""The Dispatcher: table replay, fallbacks, SDPA semantics."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from runtime_loader import Dispatcher, registry
from runtime_loader.table import parse_table

from .tables import table


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
