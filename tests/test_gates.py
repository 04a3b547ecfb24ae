"""The parity gate turns every kind of misbehaviour into a Reason, never a crash."""
import dataclasses

import pytest
import torch

from lzsolve.bench import CpuHarness
from lzsolve.gates import parity_gate
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.ops import Signature

SIG = Signature.make("norm.rms", {"hidden": 128}, (), "bf16")
good = registry.get("torch.rms_norm")


def run(impl):
    spec = dataclasses.replace(good, kernel_id="test.bad", impl=impl)
    args = CONTRACTS[SIG.op].make_inputs(SIG, {"tokens": 4}, torch.device("cpu"), torch.Generator().manual_seed(0))
    return parity_gate(CONTRACTS[SIG.op], spec, SIG, args, CpuHarness())


def test_good_kernel_is_admitted_with_first_call_time():
    p = run(good.impl)
    assert p.reason is None and p.first_call_ms > 0 and p.errors["rel_l2"] < 1e-2


def oom(*args):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")


@pytest.mark.parametrize("impl,code", [
    (lambda x, w, eps: (_ for _ in ()).throw(RuntimeError("No available kernel")), "RAISED"),
    (lambda x, w, eps: torch.full_like(x, float("nan")), "PARITY_FAILED"),
    (lambda x, w, eps: x * w, "PARITY_FAILED"),  # forgot to normalise
    (lambda x, w, eps: good.impl(x, w, eps)[:-1], "PARITY_FAILED"),  # wrong shape
    (lambda x, w, eps: good.impl(x, torch.ones_like(w), eps), "PARITY_FAILED"),  # ignores the weight
    (oom, "OOM"),
])
def test_misbehaving_kernels_get_reasons(impl, code):
    p = run(impl)
    assert p.reason is not None and p.reason.code == code, p


FP8 = Signature.make("linear.fp8", {"k": 64, "n": 48}, ("per_channel",), "bf16")
FP8_LINEAR = registry.get("eager.linear_fp8").impl


@pytest.mark.parametrize("impl,code", [
    (FP8_LINEAR, None),
    # a per-tensor kernel handed per-channel scales: the first channel's scale for every row
    (lambda x, w, scale, bias: FP8_LINEAR(x, w, scale[:1], bias), "PARITY_FAILED"),
    # the scales applied along the input dim instead of the output channels
    (lambda x, w, scale, bias: x @ (w.to(x.dtype) * scale[:1].to(x.dtype)).T, "PARITY_FAILED"),
    # the activations left unquantised (W8A16: another format, ~2.5% from W8A8's result)
    (lambda x, w, scale, bias: torch.nn.functional.linear(x, w.to(x.dtype) * scale.to(x.dtype)[:, None], bias),
     "PARITY_FAILED"),
])
def test_an_fp8_kernel_with_the_wrong_scale_layout_is_rejected(impl, code):
    spec = dataclasses.replace(registry.get("eager.linear_fp8"), kernel_id="test.fp8", impl=impl)
    args = CONTRACTS[FP8.op].make_inputs(FP8, {"tokens": 5}, torch.device("cpu"), torch.Generator().manual_seed(0))
    p = parity_gate(CONTRACTS[FP8.op], spec, FP8, args, CpuHarness())
    assert (p.reason.code if p.reason else None) == code, p
