"""The Dispatcher as torch.library custom ops: same results, and torch.compile(fullgraph=True) works."""
import threading

import pytest
import torch
import torch.nn.functional as F

from lzsolve.ops import CONTRACTS
from runtime_loader import Dispatcher, custom_ops
from runtime_loader.ops import OPS, Signature, method_args
from runtime_loader.table import parse_table

from .tables import table


@pytest.fixture
def d():
    dispatcher = Dispatcher(parse_table(table()))
    custom_ops.activate(dispatcher)
    yield dispatcher
    custom_ops.activate(Dispatcher(None))


def block(x, w, q, k, v, gate, up, weight):
    """A toy decoder step touching every op."""
    h = torch.ops.lzsolve.rms_norm(x, w, 1e-6)
    cos, sin = torch.ones(1, q.shape[2], q.shape[3]), torch.zeros(1, q.shape[2], q.shape[3])
    q, k = torch.ops.lzsolve.rope(q, k, cos, sin, False)
    a = torch.ops.lzsolve.attention(q, k, v, True, None)
    m = torch.ops.lzsolve.swiglu(gate, up)
    return h.sum() + a.sum() + torch.ops.lzsolve.linear(m, weight, None).sum()


def inputs():
    torch.manual_seed(0)
    return (torch.randn(4, 64), torch.randn(64), torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16),
            torch.randn(1, 2, 8, 16), torch.randn(4, 32), torch.randn(4, 32), torch.randn(16, 32))


def test_custom_ops_match_the_dispatcher(d):
    x, w, q, k, v, gate, up, weight = inputs()
    torch.testing.assert_close(torch.ops.lzsolve.rms_norm(x, w, 1e-6), d.rms_norm(x, w, 1e-6))
    torch.testing.assert_close(torch.ops.lzsolve.attention(q, k, v, True, None), d.attention(q, k, v))
    torch.testing.assert_close(torch.ops.lzsolve.linear(gate, weight, None), F.linear(gate, weight))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_has_no_graph_breaks(d, backend):
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)  # raises on any graph break
    args = inputs()
    torch.testing.assert_close(compiled(*args), block(*args), rtol=1e-4, atol=1e-4)


def test_many_threads_dispatch_at_once(d):
    """16 threads resolving new keys and replaying cached ones concurrently all get correct results."""
    errors = []
    w = torch.randn(64)

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for i in range(200):
                x = torch.randn(1 + (seed * 7 + i) % 23, 64, generator=g)
                expected = "torch.rms_norm" if x.shape[0] <= 8 else "eager.rms_norm"
                assert d.kernel_for("rms_norm", x, w) == expected
                torch.testing.assert_close(d.rms_norm(x, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert d.cached_keys() == 23


@pytest.mark.gpu
def test_dispatch_inside_cuda_graph_capture():
    """First calls resolve during capture (pure Python, no sync); replays match eager results."""
    d = Dispatcher(None)
    # An explicit generator: a failed capture elsewhere in this process (test_harness captures a
    # host sync on purpose) leaves the default CUDA generator unusable; the tuner restarts its
    # worker after one for the same reason.
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w = torch.randn(16, 4096, device="cuda", generator=g), torch.randn(4096, device="cuda", generator=g)
    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        d.rms_norm(x, w, 1e-6), d.attention(q, k, k)  # warm the kernels, not the keys
    torch.cuda.current_stream().wait_stream(s)
    d.clear_cache()
    with torch.cuda.graph(graph):
        y = d.rms_norm(x, w, 1e-6)
        a = d.attention(q, k, k)
    x.copy_(torch.randn(x.shape, device="cuda", generator=g))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, d.rms_norm(x, w, 1e-6))
    torch.testing.assert_close(a, d.attention(q, k, k))


def _example(op: str):
    """The op's first contract case in fp32, as the Dispatcher method's arguments."""
    static, flags, dims = CONTRACTS[op].cases[0]
    sig = Signature.make(op, static, flags, "fp32")
    return method_args(sig, OPS[op].inputs(sig, dims, torch.device("cpu"), torch.Generator().manual_seed(0)))


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_is_a_custom_op_that_compiles_whole(d, op):
    """torch.ops.lzsolve.<method> exists for every op, with all of the method's parameters, and
    torch.compile(fullgraph=True) traces a call of it (through its fake) to the Dispatcher's result."""
    method = OPS[op].method
    custom = getattr(torch.ops.lzsolve, method)
    schema_names = [a.name for a in custom.default._schema.arguments]
    assert schema_names == [p.name for p in OPS[op].parameters], "the custom op takes every option of the method"
    args = _example(op)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: custom(*a), fullgraph=True, backend="aot_eager")  # raises on a graph break
    expected = getattr(d, method)(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    got = compiled(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    for g, e in zip(_outputs(got), _outputs(expected), strict=True):
        torch.testing.assert_close(g, e)
