"""Every kernel adapter that can run here agrees with its op's fp32 reference."""
import fnmatch
import os
import time

import pytest
import torch

from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.hardware import device_info
from runtime_loader.ops import Signature

# Each op's cases (lzsolve/ops: OpContract.cases) exercise every feature combination a kernel can
# claim, at odd sizes; a new op gets parity coverage through its contract.
CASES = {op: contract.cases for op, contract in CONTRACTS.items()}
# On a GPU, attention kernels that compile per shape family (FlashInfer's JIT takes up to a minute
# per head dim and dtype) are checked in every feature combination at head_dim 128, not at every head dim.
JIT_HEAD_DIMS = (128,)


def selected(kernel_id: str) -> bool:
    """LZSOLVE_TEST_KERNELS / LZSOLVE_TEST_EXCLUDE (comma-separated globs) split a device session's parity run."""
    def matches(variable: str, default: str) -> bool:
        globs = [g.strip() for g in os.environ.get(variable, default).split(",") if g.strip()]
        return any(fnmatch.fnmatchcase(kernel_id, g) for g in globs)
    return matches("LZSOLVE_TEST_KERNELS", "*") and not matches("LZSOLVE_TEST_EXCLUDE", "")


def cases(device_type):
    """(kernel id, signature, dims) for every case a kernel admits: on CPU all of them (compiled
    kernels: the first case per op, as each new shape is a compile); on CUDA every case in bf16
    and the first in fp16 and fp32 (JIT kernels: head_dim 128 only)."""
    here = device_info(device_type)
    for spec in registry.REGISTRY.values():
        for op in sorted(spec.ops):
            for index, (static, flags, dims) in enumerate(CASES[op]):
                for dtype in ("bf16", "fp16", "fp32"):
                    first_only = spec.jit if device_type == "cpu" else dtype != "bf16"
                    if index and first_only:
                        continue
                    if device_type == "cuda" and spec.jit and op.startswith("attention") and \
                            static["d"] not in JIT_HEAD_DIMS:
                        continue
                    sig = Signature.make(op, static, flags, dtype)
                    if not spec.check(sig, here) and selected(spec.kernel_id):
                        yield spec.kernel_id, sig, dims


def check(kernel_id, sig, dims, device):
    contract = CONTRACTS[sig.op]
    gen = torch.Generator(device=device).manual_seed(7)
    for _ in range(2):  # fresh inputs each time
        args = contract.make_inputs(sig, dims, torch.device(device), gen)
        reference = contract.reference(*to_fp32(args))  # first: norm.rms_add may overwrite its inputs
        ok, errors, message = compare(registry.get(kernel_id).impl(*args), reference, contract.tolerances[sig.dtype])
        assert ok, f"{kernel_id} on {sig}: {message}"


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_case_is_admitted_by_its_fallback(op):
    """A case no kernel admits would be skipped silently: the fallback must take every one."""
    here = device_info("cpu")
    for static, flags, _ in CASES[op]:
        for dtype in ("bf16", "fp16", "fp32"):
            sig = Signature.make(op, static, flags, dtype)
            reasons = registry.fallback_for(sig).check(sig, here)
            assert not reasons, f"{sig}: {reasons}"


@pytest.mark.parametrize("kernel_id,sig,dims", [pytest.param(k, s, d, id=f"{k}-{s}-{d}") for k, s, d in cases("cpu")])
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
    """Every adapter that can run on this GPU, on every case it admits; failures are collected
    so one run names all of them (and prints what passed, for the session log)."""
    failures, passed = [], 0
    for kernel_id, sig, dims in cases("cuda"):
        started = time.perf_counter()
        try:
            check(kernel_id, sig, dims, "cuda")
            passed += 1
            print(f"ok {time.perf_counter() - started:6.1f}s {kernel_id} {sig} {dims}", flush=True)
        except Exception as e:  # a raising adapter is a failure to report, not a reason to stop
            failures.append(f"{kernel_id} on {sig} {dims}: {type(e).__name__}: {str(e)[:300]}")
    print(f"{passed} (kernel, case) pairs agree with the reference")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kernel_id,op,static", [
    ("compile.rms_norm", "norm.rms", {"hidden": 256}),
    ("compile.swiglu", "act.swiglu", {"width": 128}),
    ("compile.rms_norm_add", "norm.rms_add", {"hidden": 256}),
    ("compile.rope", "posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}),
    ("compile.moe_router", "moe.router", {"experts": 16, "top_k": 4}),
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


@pytest.mark.gpu
def test_cuda_searched_configs_are_right_or_refused():
    """Configurations at the corners of each search space and the ones every study starts from: a
    config may fail to compile (too much shared memory: the search prunes it), but one that runs
    must agree with the reference."""
    from lzsolve.measure.search import load_spaces
    from runtime_loader.specs import config_id

    here = device_info("cuda")
    wrong, refused, passed = [], [], 0
    for space in load_spaces().values():
        if not selected(space.kernel):
            continue
        family = registry.TUNABLES[space.kernel]
        corners = [family.default, *space.starts, {k: v[0] for k, v in space.params.items()},
                   {k: v[-1] for k, v in space.params.items()}]
        for config in corners:
            kernel_id = config_id(space.kernel, config)
            for op in family.spec.ops:
                for static, flags, dims in CASES[op]:
                    sig = Signature.make(op, static, flags, "bf16")
                    if family.spec.check(sig, here):  # e.g. a unit_offset norm: not declared, never run
                        continue
                    try:
                        check(kernel_id, sig, dims, "cuda")
                        passed += 1
                    except AssertionError as e:
                        wrong.append(str(e))
                    except Exception as e:
                        refused.append(f"{kernel_id} on {sig}: {type(e).__name__}: {str(e)[:200]}")
    print(f"{passed} (config, case) pairs agree; {len(refused)} refused:\n" + "\n".join(refused))
    assert not wrong, "\n".join(wrong)


def test_the_fp8_scale_is_computed_alike_on_every_device():
    """eager.quantize_per_token's scale is amax times the fp32 reciprocal of 448, the way torch
    divides by a number on CUDA. A division (what torch's CPU kernels and Triton's div_rn do)
    differs in the last bit on about half of these rows, and that moves e4m3 elements on about
    2% of 1024-wide bf16 rows (x / scale lands near a rounding midpoint): a one-token linear whose
    row it is then fails parity, for every kernel that quantises otherwise than the reference
    (an H100 tune rejected all of them at o_proj's 2 tokens, benchmark log §16.7)."""
    from runtime_loader.quant import quantize_per_token

    x = torch.randn(2000, 1024, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    _, scale = quantize_per_token(x)
    amax = x.abs().amax(-1, keepdim=True).float()
    assert torch.equal(scale, amax * (torch.tensor(1.0) / torch.tensor(448.0)))
    assert not torch.equal(scale, amax / 448.0), "these rows tell a division apart"


@pytest.mark.gpu
def test_cuda_fp8_quantisation_is_eagers():
    """The Triton per-token quantisation (triton.linear_fp8's, the norms' and SwiGLU's) gives
    eager's e4m3 values and scales exactly: the reference quantises as eager does, so any element
    rounded otherwise is error charged to the kernel. The interpreter's cast differs
    (tests/triton_interpret_check.py); this is the GPU's. Before row_scale multiplied by the
    reciprocal, the values matched and the scales differed in their last bit on an H100."""
    from runtime_loader.kernels.triton_ops import fp8
    from runtime_loader.quant import quantize_per_token as eager_quantisation

    gen, mismatches = torch.Generator(device="cuda").manual_seed(0), []
    for dtype in (torch.bfloat16, torch.float32):
        for tokens, width in ((1, 8192), (1, 3584), (33, 1024)):
            x = (torch.randn(tokens, width, device="cuda", generator=gen) * 3).to(dtype)
            q, scale = fp8.quantize_per_token(x, 4)
            expected_q, expected_scale = eager_quantisation(x)
            differ = int((q.float() != expected_q.float()).sum())
            if differ or not torch.equal(scale, expected_scale):
                mismatches.append(f"{dtype} {tokens} x {width}: {differ} elements differ, scales equal "
                                  f"{torch.equal(scale, expected_scale)}")
    assert not mismatches, "\n".join(mismatches)
