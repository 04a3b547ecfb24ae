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

# Per op, shapes that exercise every feature combination a kernel can claim (causal or not,
# GQA or not, both RoPE layouts, bias or not, sliding window, softcap, (1 + weight) norms...)
# and odd sizes that do not fill a tile; attention covers its combinations at head_dim 128 (and
# batch 1 and 2: some libraries take another path for a batch), then head dims 64 and 256.
# Windows are shorter than the sequence and softcaps small enough to bend N(0, 1) scores, so a
# kernel that ignored either would fail. (static dims, flags, dynamic dims)
CASES = {
    "attention.prefill": [({"hq": 8, "hkv": 1, "d": 128}, ("causal",), {"batch": 1, "seq": 257}),
                          ({"hq": 4, "hkv": 2, "d": 128}, ("causal",), {"batch": 2, "seq": 33}),
                          ({"hq": 4, "hkv": 4, "d": 128}, (), {"batch": 1, "seq": 70}),
                          ({"hq": 4, "hkv": 2, "d": 128}, ("causal", "qk_norm"), {"batch": 2, "seq": 33}),
                          ({"hq": 4, "hkv": 2, "d": 128, "window": 16}, ("causal",), {"batch": 2, "seq": 70}),
                          ({"hq": 4, "hkv": 2, "d": 128, "softcap": 1.0}, ("causal",), {"batch": 2, "seq": 33}),
                          ({"hq": 4, "hkv": 4, "d": 128, "window": 16, "softcap": 2.0}, ("causal",),
                           {"batch": 1, "seq": 40}),
                          ({"hq": 4, "hkv": 2, "d": 64}, ("causal",), {"batch": 2, "seq": 33}),
                          ({"hq": 2, "hkv": 1, "d": 256}, ("causal",), {"batch": 2, "seq": 40})],
    "attention.decode": [({"hq": 8, "hkv": 1, "d": 128}, (), {"batch": 2, "kv_len": 300}),
                         ({"hq": 4, "hkv": 4, "d": 128}, (), {"batch": 1, "kv_len": 129}),
                         ({"hq": 8, "hkv": 2, "d": 128}, ("qk_norm",), {"batch": 2, "kv_len": 70}),
                         ({"hq": 8, "hkv": 2, "d": 128, "window": 32}, (), {"batch": 2, "kv_len": 70}),
                         ({"hq": 8, "hkv": 2, "d": 128, "softcap": 1.0}, (), {"batch": 2, "kv_len": 70}),
                         ({"hq": 4, "hkv": 1, "d": 64}, (), {"batch": 3, "kv_len": 70}),
                         ({"hq": 4, "hkv": 4, "d": 256}, (), {"batch": 1, "kv_len": 129})],
    "norm.rms": [({"hidden": 256}, (), {"tokens": 9}), ({"hidden": 8192}, (), {"tokens": 3}),
                 ({"hidden": 640}, ("unit_offset",), {"tokens": 9})],
    "norm.rms_add": [({"hidden": 256}, (), {"tokens": 9}), ({"hidden": 8192}, (), {"tokens": 3}),
                     ({"hidden": 640}, ("unit_offset",), {"tokens": 9})],
    "norm.qk": [({"heads": 8, "d": 128}, (), {"tokens": 9}), ({"heads": 2, "d": 256}, ("unit_offset",), {"tokens": 5})],
    "norm.layer": [({"hidden": 192}, (), {"tokens": 9}), ({"hidden": 2048}, (), {"tokens": 3})],
    "posenc.rope": [({"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, (), {"tokens": 11}),
                    ({"hq": 4, "hkv": 2, "d": 64, "layout": "interleaved"}, (), {"tokens": 11}),
                    ({"hq": 8, "hkv": 8, "d": 128, "layout": "split_half"}, (), {"tokens": 5})],
    "posenc.learned": [({"hidden": 768}, (), {"tokens": 9}), ({"hidden": 96}, (), {"tokens": 1})],
    "embedding": [({"vocab": 1000, "hidden": 256}, (), {"tokens": 9}),
                  ({"vocab": 3000, "hidden": 640}, ("scaled",), {"tokens": 5})],
    "act.swiglu": [({"width": 96}, (), {"tokens": 7}), ({"width": 3584}, (), {"tokens": 2})],
    "act.geglu": [({"width": 96}, (), {"tokens": 7}), ({"width": 3584}, (), {"tokens": 2})],
    "act.gelu": [({"width": 96}, (), {"tokens": 7}), ({"width": 3072}, (), {"tokens": 2})],
    "act.sigmoid_gate": [({"width": 96}, (), {"tokens": 7}), ({"width": 4096}, (), {"tokens": 2})],
    "linear": [({"k": 64, "n": 48}, ("bias",), {"tokens": 5}), ({"k": 256, "n": 384}, (), {"tokens": 33}),
               ({"k": 1024, "n": 256}, (), {"tokens": 1})],
    # prefill from no state (GQA-like hv > hk), a decode step from a state, and q, k normalised by the caller
    "recurrent.gated_deltanet": [({"hk": 2, "hv": 4, "dk": 64, "dv": 32}, ("qk_l2norm",), {"batch": 2, "seq": 33}),
                                 ({"hk": 2, "hv": 2, "dk": 128, "dv": 64}, ("qk_l2norm",), {"batch": 3, "seq": 1}),
                                 ({"hk": 1, "hv": 2, "dk": 32, "dv": 32}, (), {"batch": 1, "seq": 20})],
}
# On a GPU, attention kernels that compile per shape family (FlashInfer's JIT takes up to a minute
# per head dim and dtype) are checked in every feature combination at head_dim 128, not at every head dim.
JIT_HEAD_DIMS = (128,)


def selected(kernel_id: str) -> bool:
    """LZSOLVE_TEST_KERNELS / LZSOLVE_TEST_EXCLUDE (globs) split a device session's parity run."""
    only, exclude = os.environ.get("LZSOLVE_TEST_KERNELS", "*"), os.environ.get("LZSOLVE_TEST_EXCLUDE", "")
    return fnmatch.fnmatchcase(kernel_id, only) and not (exclude and fnmatch.fnmatchcase(kernel_id, exclude))


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
    """Configurations at the corners of each search space: a config may fail to compile (too much
    shared memory: the search prunes it), but one that runs must agree with the reference."""
    from lzsolve.search import load_spaces
    from runtime_loader.specs import config_id

    here = device_info("cuda")
    wrong, refused, passed = [], [], 0
    for space in load_spaces().values():
        if not selected(space.kernel):
            continue
        family = registry.TUNABLES[space.kernel]
        corners = [family.default, {k: v[0] for k, v in space.params.items()}, {k: v[-1] for k, v in space.params.items()}]
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
