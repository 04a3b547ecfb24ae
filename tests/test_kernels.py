"""Every kernel adapter that can run here agrees with its op's fp32 reference."""
import pytest
import torch

from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature

SHAPES = {
    "attention.prefill": ({"hq": 4, "hkv": 2, "d": 32}, ("causal",), {"batch": 2, "seq": 33}),
    "attention.decode": ({"hq": 4, "hkv": 1, "d": 64}, (), {"batch": 3, "kv_len": 70}),
    "norm.rms": ({"hidden": 256}, (), {"tokens": 9}),
    "norm.rms_add": ({"hidden": 256}, (), {"tokens": 9}),
    "norm.layer": ({"hidden": 192}, (), {"tokens": 9}),
    "posenc.rope": ({"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, (), {"tokens": 11}),
    "act.swiglu": ({"width": 96}, (), {"tokens": 7}),
    "act.geglu": ({"width": 96}, (), {"tokens": 7}),
    "act.gelu": ({"width": 96}, (), {"tokens": 7}),
    "linear": ({"k": 64, "n": 48}, ("bias",), {"tokens": 5}),
}


def cases(device_type):
    here = device_info(device_type) if device_type == "cpu" else None
    for spec in registry.REGISTRY.values():
        for op in sorted(spec.ops):
            for dtype in ("bf16", "fp16", "fp32"):
                static, flags, dims = SHAPES[op]
                sig = Signature.make(op, static, flags, dtype)
                if here is None or not spec.check(sig, here):
                    yield pytest.param(spec.kernel_id, sig, dims, id=f"{spec.kernel_id}-{op}-{dtype}")


def check(kernel_id, sig, dims, device):
    contract = CONTRACTS[sig.op]
    gen = torch.Generator(device=device).manual_seed(7)
    for _ in range(2):  # fresh inputs each time
        args = contract.make_inputs(sig, dims, torch.device(device), gen)
        ok, errors, message = compare(registry.get(kernel_id).impl(*args), contract.reference(*to_fp32(args)),
                                      contract.tolerances[sig.dtype])
        assert ok, f"{kernel_id} on {sig}: {message}"


@pytest.mark.parametrize("kernel_id,sig,dims", list(cases("cpu")))
def test_cpu_kernel_parity(kernel_id, sig, dims):
    check(kernel_id, sig, dims, "cpu")


def test_rope_layouts_differ():
    """A kernel that ignored the layout flag would pass one layout and fail the other."""
    q = torch.randn(1, 2, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    rope = registry.get("eager.rope").impl
    assert not torch.allclose(rope(q, q, cos, sin, True)[0], rope(q, q, cos, sin, False)[0])


@pytest.mark.gpu
def test_cuda_kernel_parity():
    here = device_info("cuda")
    failures = []
    for spec in registry.REGISTRY.values():
        for op in sorted(spec.ops):
            for dtype in ("bf16", "fp16", "fp32"):
                static, flags, dims = SHAPES[op]
                sig = Signature.make(op, static, flags, dtype)
                if spec.check(sig, here):
                    continue
                try:
                    check(spec.kernel_id, sig, dims, "cuda")
                except AssertionError as e:
                    failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kernel_id,op,static", [
    ("compile.rms_norm", "norm.rms", {"hidden": 256}),
    ("compile.swiglu", "act.swiglu", {"width": 128}),
    ("compile.rms_norm_add", "norm.rms_add", {"hidden": 256}),
    ("compile.rope", "posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}),
])
def test_compiled_kernels_trace_one_graph_for_every_token_count(kernel_id, op, static):
    """Token dims are unbacked: no specialisation on the first shape seen (nor on 1), so the
    kernel measured at one call order is the kernel served at any other."""
    from torch._dynamo.utils import counters

    sig = Signature.make(op, static, (), "fp32")
    contract, gen = CONTRACTS[op], torch.Generator().manual_seed(0)
    impl = registry.get(kernel_id).impl
    reference = registry.get(kernel_id.replace("compile.", "eager.")).impl
    graphs = []
    for tokens in (3, 1, 17, 300):
        args = contract.make_inputs(sig, {"tokens": tokens}, torch.device("cpu"), gen)  # gate, up: strided views
        got, expected = impl(*args), reference(*args)
        for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1:] == graphs[:-1], "no token count after the first one traced a new graph"
